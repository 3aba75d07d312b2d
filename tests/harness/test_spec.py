"""One spec builder: the CLI, the tuner and the benchmarks build runs through ``harness.run.spec``."""

import harness.run.spec
from harness.run.spec import build_inputs, build_spec
from tests.conftest import compose


def counting_builds(monkeypatch):
    builds = []
    real = harness.run.spec.build_workload

    def counted(*args, **kwargs):
        builds.append(args[0].get("name"))
        return real(*args, **kwargs)

    monkeypatch.setattr(harness.run.spec, "build_workload", counted)
    return builds


def test_inputs_are_reused_only_for_the_model_and_workload_they_were_built_for(monkeypatch, tmp_path):
    builds = counting_builds(monkeypatch)
    cfg = compose("engine=sim", "workload=unique", "workload.num_requests=8", f"run.image_dir={tmp_path}")
    inputs = build_inputs(cfg)
    trial = compose("engine=sim", "workload=unique", "workload.num_requests=8", f"run.image_dir={tmp_path}",
                    "engine.knobs.max_num_seqs=4")
    spec = build_spec(trial, inputs)
    assert spec.workload is inputs.workload and spec.knobs["max_num_seqs"] == 4 and builds == ["unique"]
    other = compose("engine=sim", "workload=unique", "workload.num_requests=9", f"run.image_dir={tmp_path}")
    assert len(build_spec(other, inputs).workload.requests) == 9 and builds == ["unique", "unique"]


def test_a_study_builds_its_workload_once_for_every_trial_and_confirmation_run(monkeypatch, tmp_path):
    from harness.tune.cli import tune

    builds = counting_builds(monkeypatch)
    summary = tune(compose("engine=sim", "workload=unique", "workload.num_requests=32", "run.warmup_requests=0",
                           "tune.n_trials=3", "tune.confirm_rounds=2", f"run.results_dir={tmp_path}",
                           "run.progress=false", config_name="tuning"))
    assert summary["finished"] == 3 and "confirm" in summary, "trials and confirmation runs both ran"
    assert builds == ["unique"], "built once per study, not per trial"
