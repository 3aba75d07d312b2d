"""The runner against a scripted engine in a real worker process: every ending becomes a row."""

import json
import os
import sys

import pytest

from engines.base import Request
from harness.run.results import read_rows
from harness.run.runner import RunSpec, execute
from harness.workloads.base import Workload
from tests.conftest import FAKE_ENGINE

WORKLOAD = Workload("w", [Request(f"r{i}", [5, 6, 7 + i], 3 + i) for i in range(6)])


def run(tmp_path, **overrides):
    settings = {"python": sys.executable, "warmup_requests": 2, **overrides}
    spec = RunSpec(engine=FAKE_ENGINE, model={"name": "fake", "path": "none"}, workload=WORKLOAD,
                   results_dir=tmp_path, **settings)
    return execute(spec, progress=False)


def test_ok_row_counts_what_the_engine_returned(tmp_path):
    row = run(tmp_path, repeats=3, ordering={"name": "shuffled", "seed": 0}, save_outputs=True)
    assert row["status"] == "ok" and row["error"] == ""
    assert row["requests_done"] == 6 and row["output_tokens"] == sum(3 + i for i in range(6))
    assert row["input_tokens"] == 18 and len(row["output_tok_s_passes"]) == 3
    assert row["output_tok_s"] == pytest.approx(row["output_tokens"] / row["wall_s"])
    assert row["engine_version"] == "fake-1" and row["workload_fingerprint"] == WORKLOAD.fingerprint
    assert row["completion_p50_s"] <= row["completion_p99_s"] <= row["wall_s"]
    assert read_rows(tmp_path)[0]["run_id"] == row["run_id"]
    outputs = [json.loads(line) for line in open(tmp_path / "outputs" / f"{row['run_id']}.jsonl")]
    assert [o["id"] for o in outputs] == [r.id for r in WORKLOAD.requests], "original order whatever the ordering"
    assert [len(o["output_token_ids"]) for o in outputs] == [r.max_tokens for r in WORKLOAD.requests]


@pytest.mark.parametrize("knobs, status, phase, message", [
    ({"nonsense": 1}, "invalid", "validate", "unknown fake knob"),
    ({"fail_in": "start"}, "crash", "start", "scripted failure in start"),
    ({"fail_in": "generate"}, "crash", "warmup", "scripted failure in generate"),
    ({"oom": True}, "oom", "warmup", "out of memory"),
    ({"kill_self": True}, "crash", "warmup", "killed by SIGKILL"),
])
def test_failures_become_rows_with_their_reason(tmp_path, knobs, status, phase, message):
    row = run(tmp_path, knobs=knobs)
    assert (row["status"], row["failed_phase"]) == (status, phase)
    assert message in row["error"]
    assert read_rows(tmp_path)[0]["status"] == status


def test_time_limit_kills_the_worker_and_says_where(tmp_path):
    # The scripted sleep outlasts the test's own timeout: only the runner's kill lets this test finish.
    row = run(tmp_path, knobs={"sleep_s": 3600}, time_limit_s=4, warmup_requests=0)
    assert row["status"] == "timeout" and row["failed_phase"] == "pass 1"
    assert "time limit of 4 s exceeded during pass 1" in row["error"]


def test_memory_limit_kills_the_worker_and_says_oom(tmp_path):
    row = run(tmp_path, knobs={"hold_mb": 600, "sleep_s": 3600}, memory_limit_bytes=400 << 20, warmup_requests=0)
    assert row["status"] == "oom" and row["failed_phase"] == "pass 1"
    assert "memory limit of 419,430,400 bytes exceeded during pass 1" in row["error"]


def test_a_roomy_memory_limit_changes_nothing(tmp_path):
    row = run(tmp_path, knobs={"hold_mb": 50}, memory_limit_bytes=2 << 30)
    assert row["status"] == "ok" and row["memory_limit_bytes"] == 2 << 30


def test_missing_interpreter_is_an_invalid_row(tmp_path):
    row = run(tmp_path, python="/nonexistent/python")
    assert row["status"] == "invalid" and "engine.python" in row["error"]


def test_replicas_split_the_requests_and_add_up(tmp_path):
    row = run(tmp_path, replicas=2, repeats=2, save_outputs=True)
    assert row["status"] == "ok" and row["replicas"] == 2 and row["knob.replicas"] == 2
    assert row["requests_done"] == 6 and row["output_tokens"] == sum(3 + i for i in range(6))
    assert len(row["output_tok_s_passes"]) == 2 and row["prefix_cache_queries"] == 0
    outputs = [json.loads(line) for line in open(tmp_path / "outputs" / f"{row['run_id']}.jsonl")]
    assert [o["id"] for o in outputs] == [r.id for r in WORKLOAD.requests]
    assert row["engine_info.replica"] == "1/2"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_each_replica_is_pinned_to_its_own_cores(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    row = run(tmp_path, replicas=2)
    assert row["engine_info.cores"] == ",".join(map(str, cores[:len(cores) // 2]))


def test_one_failed_replica_fails_the_run_and_stops_the_others(tmp_path):
    # Replica 1 would sleep past the time limit: a crash row, not a timeout, means it was stopped.
    row = run(tmp_path, replicas=2, knobs={"fail_replica": 2, "sleep_s": 120}, time_limit_s=60)
    assert row["status"] == "crash" and row["failed_phase"] == "warmup"
    assert row["error"].startswith("replica 2 of 2: RuntimeError: scripted failure")


def test_more_replicas_than_devices_is_an_invalid_row(tmp_path):
    row = run(tmp_path, replicas=len(os.sched_getaffinity(0)) + 1)
    assert row["status"] == "invalid" and "needs at least" in row["error"] and "CPU cores" in row["error"]


def test_a_run_ends_when_its_worker_exits_not_on_the_watchers_next_tick(tmp_path, monkeypatch):
    """The watcher waits on the worker process (woken by its exit); it never sleeps a fixed quarter second,
    which each of a study's many short runs paid (up to 0.25 s each)."""
    import threading

    from harness.run import runner

    sleeps, sleep, me = [], runner.time.sleep, threading.get_ident()

    def recorded(seconds):
        if threading.get_ident() == me:
            sleeps.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(runner.time, "sleep", recorded)
    assert run(tmp_path, knobs={"sleep_s": 0.6}, warmup_requests=0)["status"] == "ok"
    assert sleeps and max(sleeps) < 0.25, f"the watcher slept {max(sleeps, default=0)} s at a time"
