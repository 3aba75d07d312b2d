"""Failures inside a living Ray engine actor (``batch.scale=ray``, the scripted engine, the session's Ray head): an
engine that fails mid-shard makes its actor exit, Ray restarts it and reruns the shards it held (every custom_id
once); one that fails on every engine ends the job after ``batch.ray.max_restarts``, not in a loop; a hung engine
start is detected after ``batch.stall_timeout_s`` as on one node."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import numbered, read_jsonl, troughput_batch
from tests.ray_head import RayHead


def _ray_job(tmp_path: Path, ray_head: RayHead, count: int, *args: str, timeout: float = 600):
    path = numbered(tmp_path / "batch.jsonl", count, max_tokens=8)
    return troughput_batch(tmp_path, f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", f"batch.input={path}",
                           f"batch.output_dir={tmp_path / 'out'}", "batch.shard_size=4", "batch.scale=ray",
                           f"batch.ray.address={ray_head.address}", "batch.ray.actors=1",
                           "+engine.knobs.token_s=0.01", *args, env=ray_head.driver_env, timeout=timeout)


@pytest.mark.engine   # joins the session's Ray head and runs a Ray Data job
@pytest.mark.xdist_group("ray")
def test_an_engine_that_fails_mid_shard_inside_its_actor_is_restarted_and_its_shards_rerun(tmp_path: Path,
                                                                                          ray_head: RayHead) -> None:
    """The first engine fails after 20 steps (mid-job, its actor's process alive; shards of 8 steps finish before,
    so that a loaded host still commits some on it); before, the stage raised in every call and Ray Data stopped
    the job (Python errors are not retried): incomplete, exit 1."""
    proc = _ray_job(tmp_path, ray_head, 24, "+engine.knobs.fail_after_steps=20",
                    f"+engine.knobs.fail_file={tmp_path / 'failures'}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (tmp_path / "failures").read_text() == "1", "one engine failed (the restarted one did not)"
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(24)) and len(ids) == 24
    assert read_jsonl(tmp_path / "out" / "errors.jsonl") == []
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "ok" and row["requests_ok"] == 24
    pids = {m["engine_pid"] for m in (read_jsonl(p)[0] for p in (tmp_path / "out" / "shards").glob("*/meta.json"))}
    assert len(pids) == 2, "shards committed by the first engine's actor and by its restart"


@pytest.mark.engine   # joins the session's Ray head and runs a Ray Data job
@pytest.mark.xdist_group("ray")
def test_an_engine_that_fails_every_time_ends_the_job_after_the_restarts_allowed(tmp_path: Path,
                                                                                ray_head: RayHead) -> None:
    proc = _ray_job(tmp_path, ray_head, 8, "+engine.knobs.fail_after_steps=2", f"+engine.knobs.fail_file="
                    f"{tmp_path / 'failures'}", "+engine.knobs.fail_times=100", "batch.ray.max_restarts=1")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "incomplete" in proc.stdout
    assert "an engine actor ended itself: its engine failed inside the actor (RuntimeError: scripted engine failure " \
           "after 2 steps)" in proc.stdout
    assert (tmp_path / "failures").read_text() == "2", "the first engine and one restart, no more"


@pytest.mark.engine   # joins the session's Ray head and runs a Ray Data job
@pytest.mark.xdist_group("ray")
def test_a_hung_engine_start_on_ray_is_detected_after_the_stall_timeout(tmp_path: Path, ray_head: RayHead) -> None:
    """Before, a Ray job whose engine start hung waited for ever (no watchdog on Ray). Then the watchdog ended the
    actor's process, which Ray restarts (a process that exits in ``__init__`` is a crash, not an error of the
    creation task): every restart hung again, ``batch.ray.max_restarts`` + 1 starts of ``batch.stall_timeout_s``
    each (11 × 1,800 s with the defaults) before the job stopped. The engine starts are counted (``start_file``):
    exactly one, whatever ``max_restarts`` allows."""
    t0 = time.monotonic()
    proc = _ray_job(tmp_path, ray_head, 4, "+engine.knobs.hang_in=start", "batch.stall_timeout_s=5",
                    f"+engine.knobs.start_file={tmp_path / 'starts'}", "batch.ray.max_restarts=10", timeout=420)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    starts = int((tmp_path / "starts").read_text())
    assert starts == 1, f"{starts} engine starts: the hung actor was restarted (and hung again)"
    assert "an engine actor ended itself: the engine was still starting after 5 s: it looks hung" in proc.stdout
    assert "more such exits" not in proc.stdout, "one actor ended itself, once"
    assert "batch.stall_timeout_s=5" in proc.stdout
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "incomplete" and "it looks hung" in row["error"]
    assert time.monotonic() - t0 < 240
