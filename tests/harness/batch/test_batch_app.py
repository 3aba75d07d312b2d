"""``troughput-batch`` end to end on the scripted engine: outputs, errors, resume, kill -9, SLURM array."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import batch_app, chat, completion, numbered, read_jsonl, troughput_batch, write_jsonl

FAKE = f"engine.name={FAKE_ENGINE}"
GREEDY = "batch.sampling=benchmark"  # the scripted engine decodes greedily only


def test_outputs_one_line_per_request_and_errors_beside(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "batch.jsonl", [
        chat("ünïcødé-1 ✓", "hello", max_tokens=3),
        completion("plain", "once upon a time", max_tokens=2),
        chat("parts", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], max_completion_tokens=2),
        completion("no-max", "how long"),
        chat("n2", "two please", n=2),
        '{"custom_id": "broken", ',
        chat("image", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], max_tokens=2),
        completion("plain", "again", max_tokens=2),
    ])
    out = tmp_path / "out"
    proc = troughput_batch(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}",
                           "batch.shard_size=3", "batch.default_max_tokens=5")
    assert proc.returncode == 0, proc.stderr
    outputs = {o["custom_id"]: o for o in read_jsonl(out / "output.jsonl")}
    errors = {e["custom_id"]: e for e in read_jsonl(out / "errors.jsonl")}
    assert list(outputs) == ["ünïcødé-1 ✓", "plain", "parts", "no-max"]
    assert sorted(errors, key=str) == sorted(["n2", None, "image", "plain"], key=str)
    assert outputs["no-max"]["response"]["body"]["usage"]["completion_tokens"] == 5
    assert outputs["ünïcødé-1 ✓"]["response"]["body"]["object"] == "chat.completion"
    assert outputs["plain"]["response"]["body"]["object"] == "text_completion"
    reasons = {cid: e["response"]["body"]["error"]["message"] for cid, e in errors.items()}
    assert f"{path}, line 5: field 'body.n' must be 1" in reasons["n2"]
    assert f"{path}, line 6: invalid JSON" in reasons[None]
    assert f"{path}, line 7:" in reasons["image"] and "takes no images" in reasons["image"]
    assert f"{path}, line 8: duplicate id 'plain' (first used on line 2)" in reasons["plain"]
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["kind"] == "batch" and row["status"] == "ok" and row["shards"] == 3
    assert (row["requests_ok"], row["requests_failed"]) == (4, 4)
    assert row["output_tokens"] == 3 + 2 + 2 + 5 and row["output_tok_s"] > 0
    assert "4 ok, 4 failed" in proc.stdout


def test_requests_an_engine_cannot_honour_are_errors_not_silently_greedy(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "batch.jsonl", [completion("sampled", "x", max_tokens=2, temperature=0.8),
                                                  completion("json", "y", max_tokens=2,
                                                             response_format={"type": "json_object"})])
    out = tmp_path / "out"
    proc = batch_app(tmp_path, FAKE, f"batch.input={path}", f"batch.output_dir={out}")
    assert proc.returncode == 1 and "FAILED: no request succeeded" in proc.stdout, proc.stderr  # nothing answered
    assert read_jsonl(out / "output.jsonl") == []
    reasons = {e["custom_id"]: e["response"]["body"]["error"]["message"] for e in read_jsonl(out / "errors.jsonl")}
    assert "line 1: engine" in reasons["sampled"] and "decodes greedily only" in reasons["sampled"]
    assert "line 2: engine" in reasons["json"] and "cannot constrain outputs" in reasons["json"]


def test_a_rerun_skips_committed_shards_and_a_changed_job_is_refused(tmp_path: Path) -> None:
    path = numbered(tmp_path / "batch.jsonl", 6)
    out = tmp_path / "out"
    args = [FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}", "batch.shard_size=2"]
    assert batch_app(tmp_path, *args).returncode == 0
    first = (out / "output.jsonl").read_text()
    again = batch_app(tmp_path, *args)
    assert again.returncode == 0 and "0 ok, 0 failed this run; 3 of 3 shards committed (3 before" in again.stdout
    assert (out / "output.jsonl").read_text() == first
    changed = batch_app(tmp_path, *args[:-1], "batch.shard_size=3")
    assert changed.returncode == 2 and "different shard_size" in changed.stderr


def test_kill_9_mid_run_then_rerun_gives_every_custom_id_once(tmp_path: Path) -> None:
    count, size = 40, 4
    path = numbered(tmp_path / "batch.jsonl", count)
    out = tmp_path / "out"
    args = [FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}", f"batch.shard_size={size}",
            "engine.replicas=2", "batch.in_flight=2", "+engine.knobs.sleep_s=0.4"]
    proc = troughput_batch(tmp_path, *args, popen=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards = out / "shards"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(shards.glob("0*"))) < 3:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {int(p.name) for p in shards.glob("0*")}
    in_flight = {int(p.name[:8]) for p in (out / "work").glob("0*-*")} - done
    committed = len(done)
    assert 3 <= committed < count // size, "killed mid-run, with shards done and shards left"
    assert len(in_flight) >= 2, "more than one shard was in flight when it was killed"
    assert not (out / "output.jsonl").exists()
    rerun = batch_app(tmp_path, *args)
    assert rerun.returncode == 0, rerun.stderr
    ids = [o["custom_id"] for o in read_jsonl(out / "output.jsonl")]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(count)) and len(ids) == len(set(ids)) == count
    assert read_jsonl(out / "errors.jsonl") == []
    row = read_rows(tmp_path / "results", "batch")[-1]
    assert row["shards_before"] >= committed and row["shards_run"] == count // size - row["shards_before"]


def test_engines_that_fail_leave_the_job_incomplete_and_a_fixed_rerun_finishes_it(tmp_path: Path) -> None:
    path = numbered(tmp_path / "batch.jsonl", 4)
    out = tmp_path / "out"
    args = [FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}", "batch.shard_size=2"]
    failed = batch_app(tmp_path, *args, "+engine.knobs.fail_in=start")
    assert failed.returncode == 1 and "incomplete" in failed.stdout
    assert "0 of 2 shards committed; rerun the same command" in failed.stdout
    assert "scripted failure in start" in failed.stdout
    fixed = batch_app(tmp_path, *args)
    assert fixed.returncode == 0 and len(read_jsonl(out / "output.jsonl")) == 4
    rows = read_rows(tmp_path / "results", "batch")
    assert [r["status"] for r in sorted(rows, key=lambda r: r["timestamp"])] == ["incomplete", "ok"]


def test_a_fault_hook_left_set_warns_and_shows_in_the_row_and_a_bad_value_stops_the_engine_naming_it(
        tmp_path: Path) -> None:
    """``TROUGHPUT_FAULT_AFTER_STEPS`` (a test hook, ``engines.faults``) set by mistake: before, an engine without
    the hook (the scripted one) said nothing, even of a value like ``twenty``; vLLM, which has it, failed mid-job
    with nothing in the row to say why it was asked to, or at its start with Python's bare ``invalid literal for
    int()``. Now every engine checks the value before it starts and says the hook is set (a warning in its log,
    ``engine_info.fault_hook`` in the row)."""
    path = numbered(tmp_path / "batch.jsonl", 4)
    args = [FAKE, GREEDY, f"batch.input={path}", "batch.shard_size=2"]
    ran = batch_app(tmp_path, *args, f"batch.output_dir={tmp_path / 'set'}", "+engine.env.TROUGHPUT_FAULT_AFTER_STEPS=5")
    assert ran.returncode == 0, ran.stderr
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["engine_info.fault_hook"] == ("TROUGHPUT_FAULT_AFTER_STEPS=5 is set, but engine 'fake' has no such "
                                             "hook: it has no effect")
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "logs").glob("*.worker*.log"))
    assert "troughput: warning: TROUGHPUT_FAULT_AFTER_STEPS=5 is set" in logs
    bad = batch_app(tmp_path, *args, f"batch.output_dir={tmp_path / 'bad'}",
                    "+engine.env.TROUGHPUT_FAULT_AFTER_STEPS=twenty")
    assert bad.returncode == 1 and "TROUGHPUT_FAULT_AFTER_STEPS='twenty': must be an integer >= 0" in bad.stdout
    rows = sorted(read_rows(tmp_path / "results", "batch"), key=lambda r: r["timestamp"])
    assert [r["status"] for r in rows] == ["ok", "incomplete"] and rows[1]["engine_info.fault_hook"] is None


def test_slurm_array_through_submitit_local(tmp_path: Path) -> None:
    path = numbered(tmp_path / "batch.jsonl", 10)
    out = tmp_path / "out"
    proc = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}",
                     "batch.shard_size=2", "batch.scale=slurm", "batch.slurm.tasks=2", "batch.slurm.cluster=local")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    ids = [o["custom_id"] for o in read_jsonl(out / "output.jsonl")]
    assert ids == [f"req-{i}" for i in range(10)]
    metas = [json.loads((d / "meta.json").read_text()) for d in sorted((out / "shards").iterdir())]
    assert [m["index"] for m in metas] == [0, 1, 2, 3, 4]
    task_logs = list((out / "slurm").rglob("*_0_log.out")) + list((out / "slurm").rglob("*_1_log.out"))
    assert len(task_logs) == 2, "two array tasks ran"
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["scale"] == "slurm" and row["shards_run"] == 5 and row["requests_ok"] == 10


def _shard_metas(out: Path) -> list[dict]:
    return [json.loads((d / "meta.json").read_text()) for d in sorted((out / "shards").iterdir())]


def test_a_streaming_engine_is_fed_the_next_shard_while_the_current_one_generates(tmp_path: Path) -> None:
    """Shard 1 reaches the engine with shard 0 (two in flight): fed at once, no idle wait, its span covers shard 0's."""
    path = numbered(tmp_path / "batch.jsonl", 12, max_tokens=4)
    spans = {}
    for mode, knobs in (("stream", ["+engine.knobs.token_s=0.05"]), ("serial", ["+engine.knobs.step_s=0.2"])):
        out = tmp_path / mode
        proc = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}",
                         "batch.shard_size=4", "batch.in_flight=2", "+engine.knobs.max_num_seqs=4", *knobs)
        assert proc.returncode == 0, proc.stderr
        assert len(read_jsonl(out / "output.jsonl")) == 12
        spans[mode] = _shard_metas(out)
    stream, serial = spans["stream"], spans["serial"]
    assert stream[1]["idle_before_s"] == 0.0
    assert stream[1]["span_s"] > stream[1]["engine_s"] + 0.1  # it waited in the engine behind shard 0
    assert all(m["span_s"] == m["engine_s"] for m in serial)   # one generate per shard: no overlap
    rows = {r["output_dir"]: r for r in read_rows(tmp_path / "results", "batch")}
    assert rows[str(tmp_path / "stream")]["engine_idle_s"] >= 0.0


def test_a_decision_whose_winner_has_two_replicas_drives_a_job_with_two_engines(tmp_path: Path) -> None:
    from harness.run.results import write_row

    write_row(tmp_path / "results", {
        "decision_id": "d2", "model": "tiny", "verdict": "clear winner", "workload": "unique",
        "chosen.engine": "vllm", "chosen.ordering": "as_given", "chosen.knob.max_num_seqs": 16,
        "chosen.knob.replicas": 2, "chosen.output_tok_s": 900.0, "chosen.req_s": 90.0},
        kind="decisions", id_key="decision_id")
    path = numbered(tmp_path / "batch.jsonl", 8)
    out = tmp_path / "out"
    # the decision's vLLM config on the scripted engine (engine.name is no engine/ordering choice, so it may be set)
    proc = batch_app(tmp_path, "batch.decision=d2", FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}",
                     "batch.shard_size=2")
    assert proc.returncode == 0, proc.stderr
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["replicas"] == 2 and "knob.replicas" not in row
    assert row["knob.max_num_seqs"] == 16 and row["requests_ok"] == 8
    logs = sorted(p.name.rsplit(".", 2)[-2] for p in (tmp_path / "results" / "logs").glob("*.worker*.log"))
    assert logs == ["worker1", "worker2"], "two engines, one per replica"


def test_a_tuned_source_predicts_the_jobs_rate_and_the_row_keeps_it_beside_what_the_job_measured(tmp_path: Path):
    """A decision whose config has a full-engine rate predicts that (req/s scaled alike); a tuned engine file whose
    run has none predicts the run's measured rate; a decision measured on another host predicts nothing comparable:
    no ``prediction.batch_rate.*`` columns, and the row says so."""
    from harness.run.results import write_row
    from harness.run.stepmodels import this_host_id

    results, here = tmp_path / "results", this_host_id()
    for decision_id, host in (("d3", here), ("d4", "another-host")):
        write_row(results, {
            "decision_id": decision_id, "model": "tiny", "verdict": "clear winner", "workload": "unique",
            "chosen.engine": "vllm", "chosen.ordering": "as_given", "chosen.knob.max_num_seqs": 4,
            "chosen.output_tok_s": 900.0, "chosen.req_s": 90.0, "chosen.full_engine_tok_s": 1200.0,
            "host_id": host}, kind="decisions", id_key="decision_id")
    write_row(results, {"run_id": "r9", "workload": "unique", "output_tok_s": 321.0, "req_s": 9.0,
                        "full_engine_tok_s": None, "env.host_id": here})
    tuned = tmp_path / "fake-tuned.yaml"
    tuned.write_text(f"# Tuned by troughput-tune, study 'fake-tiny', trial 2, run r9\nname: {FAKE_ENGINE}\n"
                     "python: null\nenv: {}\nreplicas: 1\nknobs:\n  max_num_seqs: 4\ncanonical: {}\n")
    path = numbered(tmp_path / "batch.jsonl", 6)
    sources = {"d3": ["batch.decision=d3", FAKE], "d4": ["batch.decision=d4", FAKE],
               "file": [f"batch.engine_file={tuned}"]}
    for name, source in sources.items():
        proc = batch_app(tmp_path, *source, GREEDY, f"batch.input={path}", f"batch.output_dir={tmp_path / name}",
                         "batch.shard_size=3")
        assert proc.returncode == 0, proc.stderr
    rows = {Path(r["output_dir"]).name: r for r in read_rows(results, "batch")}
    decision = rows["d3"]
    assert decision["config_source.predicted_method"] == "full engine (step model)"
    assert decision["predicted_output_tok_s"] == 1200.0 and decision["predicted_req_s"] == pytest.approx(120.0)
    assert decision["prediction.batch_rate.predicted"] == 1200.0
    assert decision["prediction.batch_rate.measured"] == decision["output_tok_s"] > 0
    assert decision["prediction.batch_rate.error"] == pytest.approx(decision["output_tok_s"] / 1200.0 - 1)
    assert decision["prediction.batch_rate.unit"] == "output tok/s"
    assert decision["prediction.batch_rate.note"] == "full engine (step model) of decision"
    assert decision["predicted_other_host"] is False
    tuned_row = rows["file"]
    assert tuned_row["config_source.run_id"] == "r9" and tuned_row["predicted_req_s"] == 9.0
    assert tuned_row["prediction.batch_rate.predicted"] == 321.0
    assert tuned_row["prediction.batch_rate.measured"] == tuned_row["output_tok_s"] > 0
    assert tuned_row["prediction.batch_rate.note"] == "measured rate of engine_file"
    elsewhere = rows["d4"]
    assert elsewhere["predicted_other_host"] is True and elsewhere["predicted_output_tok_s"] == 1200.0
    assert not any(k.startswith("prediction.batch_rate.") for k in elsewhere), "not compared across hosts"


def test_the_row_times_the_scan_of_the_input_and_the_merge_apart(tmp_path: Path, monkeypatch) -> None:
    """``scan_s`` (the one pass over the input) and ``merge_s`` (the shards into output.jsonl), each a part of
    ``wall_s``; a scan and a merge made slow by known amounts show in their own column only. While shards are left
    there is no merge: ``merge_s`` is empty."""
    from harness.batch import launch
    from harness.batch.job.state import JobState

    scan_s = merge_s = 2.0   # scripted; the real scan of 4 lines and merge of 2 shards take milliseconds
    scan, merge = launch.scan, JobState.merge
    monkeypatch.setattr(launch, "scan", lambda *a, **k: (time.sleep(scan_s), scan(*a, **k))[1])
    monkeypatch.setattr(JobState, "merge", lambda self, n: (time.sleep(merge_s), merge(self, n))[1])
    path, out = numbered(tmp_path / "batch.jsonl", 4), tmp_path / "out"
    args = [FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}", "batch.shard_size=2"]
    assert batch_app(tmp_path, *args, "+engine.knobs.fail_in=generate").returncode == 1   # incomplete: no merge
    assert batch_app(tmp_path, *args).returncode == 0
    first, second = sorted(read_rows(tmp_path / "results", "batch"), key=lambda r: r["timestamp"])
    # each column holds its own sleep (never less: the host's speed cannot break the lower bound) and not the
    # other's (it would then reach scan_s + merge_s): the real work has the other sleep's 2 s of room
    assert first["status"] == "incomplete" and first["merge_s"] is None and scan_s <= first["scan_s"] < scan_s + merge_s
    assert second["status"] == "ok" and scan_s <= second["scan_s"] < scan_s + merge_s
    assert merge_s <= second["merge_s"] < merge_s + scan_s
    assert second["scan_s"] + second["merge_s"] < second["wall_s"]
