"""Batch files for troughput-batch tests, the app run as a user runs it, and a Ray head for the session."""

from __future__ import annotations

import atexit
import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

RAY = Path(sys.executable).with_name("ray")
# A private test cluster: no token shared through ~/.ray with other clusters on this host, no usage report.
RAY_ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}


def chat(cid: str, content: Any, **body: Any) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": content}], **body}}


def completion(cid: str, prompt: Any, **body: Any) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "tiny", "prompt": prompt, **body}}


def png_data_url(color: tuple[int, int, int] = (200, 30, 30)) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records),
                    encoding="utf-8")
    return path


def numbered(path: Path, count: int, max_tokens: int = 2) -> Path:
    """``count`` small requests, chat and completions alternating, ids ``req-0 ...``."""
    return write_jsonl(path, [chat(f"req-{i}", f"question {i}", max_tokens=max_tokens) if i % 2 else
                              completion(f"req-{i}", f"prompt number {i}", max_tokens=max_tokens) for i in range(count)])


def troughput_batch(tmp_path: Path, *args: str, timeout: float = 300, popen: bool = False, **kwargs: Any):
    """``troughput-batch`` in a subprocess, results under ``tmp_path``; ``popen``: started, not waited for."""
    command = [sys.executable, "-m", "harness.batch.cli", *args, f"run.results_dir={tmp_path / 'results'}",
               "run.progress=false", f"hydra.run.dir={tmp_path / 'hydra'}"]
    if popen:
        return subprocess.Popen(command, cwd=ROOT, text=True, **kwargs)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, head: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and head.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"no Ray head on 127.0.0.1:{port} after {timeout_s} s (exit code {head.poll()})")


def _stop(head: subprocess.Popen, temp: str) -> None:
    """Kill this head's process group only (never ``ray stop``: other clusters share this host)."""
    if head.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_head() -> Iterator[str]:
    """One Ray head for the whole session, started as a user does (``ray start --head``), on a free port of
    127.0.0.1 with 4 logical CPUs (two engine actors and the small stages), its own temp dir, and a clean
    environment (no PYTHONPATH and another working directory: code reaches workers through ``runtime_env``)."""
    if not RAY.exists():
        pytest.skip("ray is not installed (the ray extra)")
    port, temp = _free_port(), tempfile.mkdtemp(prefix="tb-ray-", dir="/tmp")
    head = subprocess.Popen([str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=4", "--include-dashboard=false", f"--temp-dir={temp}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=RAY_ENV, cwd=temp,
                            start_new_session=True)
    atexit.register(_stop, head, temp)   # also when the session ends without teardown
    try:
        _wait_for(port, head, 120)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(head, temp)
