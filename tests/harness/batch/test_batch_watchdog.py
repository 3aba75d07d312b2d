"""A hung engine start in ``troughput-batch`` (``batch.stall_timeout_s``): killed, its shards retried or failed
with the reason, never a job that waits for ever; a running engine is never killed for being slow. Scripted
engine (``hang_in``), real worker processes; the driver in the test's process."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.batch.cli import _stall_timeout
from harness.core.errors import TroughputError
from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import batch_app, numbered, read_jsonl

# A healthy scripted start takes well under a second: 5 s leaves room for a loaded host.
ARGS = [f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", "batch.shard_size=2", "batch.stall_timeout_s=5"]
pytestmark = pytest.mark.timeout(120)   # without the watchdog these jobs would wait for ever


def test_an_engine_hung_in_start_fails_its_shards_with_the_reason(tmp_path: Path) -> None:
    """(That a rerun then finishes such an incomplete job: test_batch_app's failed-engine test.)"""
    path, out = numbered(tmp_path / "batch.jsonl", 4), tmp_path / "out"
    hung = batch_app(tmp_path, *ARGS, f"batch.input={path}", f"batch.output_dir={out}",
                           "+engine.knobs.hang_in=start")
    assert hung.returncode == 1 and "incomplete" in hung.stdout, hung.stdout + hung.stderr[-2000:]
    assert "its engine was still starting after" in hung.stdout and "batch.stall_timeout_s=5" in hung.stdout
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "incomplete" and row["shards_committed"] == 0


def test_a_replica_hung_in_start_is_killed_and_its_shards_finish_on_the_other(tmp_path: Path) -> None:
    path, out = numbered(tmp_path / "batch.jsonl", 8), tmp_path / "out"
    proc = batch_app(tmp_path, *ARGS, f"batch.input={path}", f"batch.output_dir={out}", "engine.replicas=2",
                     "+engine.knobs.hang_in=start", "+engine.knobs.hang_replica=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "worker 2: its engine was still starting after" in proc.stdout
    assert "worker 1:" not in proc.stdout, "the healthy replica is not killed"
    assert [o["custom_id"] for o in read_jsonl(out / "output.jsonl")] == [f"req-{i}" for i in range(8)]
    assert read_jsonl(out / "errors.jsonl") == []
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "ok" and row["requests_ok"] == 8


def test_a_running_engine_whose_requests_outlast_the_limit_is_not_killed(tmp_path: Path) -> None:
    """Each request streams for 6 s (0.5 s a token), longer than the 5 s limit: slow is not hung."""
    path, out = numbered(tmp_path / "batch.jsonl", 4, max_tokens=12), tmp_path / "out"
    proc = batch_app(tmp_path, *ARGS, f"batch.input={path}", f"batch.output_dir={out}",
                     "+engine.knobs.token_s=0.5", "+engine.knobs.max_num_seqs=8")
    assert proc.returncode == 0 and "killed" not in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert len(read_jsonl(out / "output.jsonl")) == 4


@pytest.mark.parametrize("value", [0, -1, "soon", True])
def test_a_stall_timeout_that_is_not_seconds_is_refused_before_any_engine_starts(value) -> None:
    with pytest.raises(TroughputError, match=r"batch.stall_timeout_s=.*must be seconds > 0, or null"):
        _stall_timeout(value)
    assert _stall_timeout(None) is None and _stall_timeout(90) == 90.0
