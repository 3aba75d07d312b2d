"""``troughput-batch batch.scale=ray`` against a Ray head started separately and joined by its address."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.results import read_rows
from tests.conftest import FAKE_ENGINE, ROOT
from tests.harness.batch.conftest import numbered, read_jsonl, troughput_batch

RAY = Path(sys.executable).with_name("ray")
# A private test cluster: no token shared through ~/.ray with other clusters on this host.
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(not RAY.exists(), reason="ray is not installed (the ray extra)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"no Ray head on port {port} after {timeout_s} s")


@pytest.fixture
def ray_head():
    """A one-node Ray cluster of its own (own port, own temp dir), stopped by killing only its processes."""
    port, temp = _free_port(), tempfile.mkdtemp(prefix="tb-ray-", dir="/tmp")
    head = subprocess.Popen([str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=4", "--include-dashboard=false", f"--temp-dir={temp}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    try:
        _wait_for(port, 90)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_shards_run_on_ray_actors_of_a_running_cluster(tmp_path: Path, ray_head: str) -> None:
    path = numbered(tmp_path / "batch.jsonl", 8)
    out = tmp_path / "out"
    proc = troughput_batch(tmp_path, f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", f"batch.input={path}",
                           f"batch.output_dir={out}", "batch.shard_size=2", "batch.scale=ray",
                           f"batch.ray.address={ray_head}", "batch.ray.actors=2", env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [o["custom_id"] for o in read_jsonl(out / "output.jsonl")] == [f"req-{i}" for i in range(8)]
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["scale"] == "ray" and row["shards_run"] == 4 and row["requests_ok"] == 8
