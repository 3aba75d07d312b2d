"""Each trial's and confirmation run's row carries the troughput-run command that reproduces it."""

import shlex

import optuna
import pytest
from omegaconf import OmegaConf

from harness.run.results import prefixed, read_rows
from harness.run.spec import build_spec
from harness.tune.command import hydra_value, run_command
from tests.conftest import compose
from tests.harness.tune.test_study import load, settings, tune_app


def overrides_of(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "troughput-run"
    return words[1:]


def test_the_command_keeps_the_cell_drops_the_study_and_adds_the_trials_values():
    cfg = compose("workload=unique", "tune.n_trials=5", config_name="tuning")
    given = ["workload=unique", "tune.n_trials=5", "tune=vllm_cpu", "hydra.run.dir=/tmp/x", "hydra/launcher=basic",
             "hydra.searchpath=[file:///tmp/s]", "engine.canonical.max_seqs=8", "ordering=shuffled"]
    values = {"engine.canonical.max_seqs": 64, "engine.canonical.chunked_prefill": False, "ordering": "prefix_grouped"}
    words = overrides_of(run_command(cfg, values, given))
    assert words == ["workload=unique", "hydra.searchpath=[file:///tmp/s]", "run.repeats=3",
                     "++engine.canonical.max_seqs=64", "++engine.canonical.chunked_prefill=false",
                     "ordering=prefix_grouped"]


@pytest.mark.parametrize("value", [True, False, None, 0, 17, 0.85, 1e-05, "lpm", "true", "12", "it's a:b"])
def test_values_read_back_as_the_same_type_and_value(value):
    cfg = compose(f"++engine.knobs.probe={hydra_value(value)}")
    assert cfg.engine.knobs.probe == value and type(cfg.engine.knobs.probe) is type(value)


def test_pasting_a_trial_rows_command_composes_that_rows_config(tmp_path):
    """Through the real CLI (Hydra's own overrides), then each row's command composed as troughput-run would."""
    proc = tune_app(*settings(tmp_path, 4, step_s=0.0, **{"tune.confirm_rounds": 1}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = {t.number: t for t in load(tmp_path).get_trials()}
    rows = [r for r in read_rows(tmp_path / "results") if "trial" in r or "confirm" in r]
    assert {r["trial"] for r in rows if "trial" in r} == set(trials)
    assert any("confirm" in r for r in rows), "confirmation rows too"
    for row in rows:
        params = trials[row["trial"]].params if "trial" in row else (
            {} if row["confirm"] == "default" else trials[int(row["confirm"].split()[1])].params)
        words = overrides_of(row["command"])
        assert not [w for w in words if w.startswith("tune")], "no study settings in a troughput-run command"
        assert all(f"++{path}={value}" in words for path, value in params.items()), "the trial's own knobs"
        spec = build_spec(compose(*words))
        knobs = {**prefixed("knob", spec.knobs), **({"knob.replicas": spec.replicas} if spec.replicas > 1 else {})}
        assert knobs == {k: v for k, v in row.items() if k.startswith("knob.")}, row["command"]
        assert (spec.workload.fingerprint, spec.repeats, spec.engine) == \
            (row["workload_fingerprint"], row["repeats"], row["engine"])
    assert optuna.trial.TrialState.COMPLETE in {t.state for t in trials.values()}
    assert OmegaConf.select(compose(*overrides_of(rows[0]["command"])), "run.repeats") == 3
