"""Batch files for troughput-batch tests, the app run as a user runs it (a subprocess, or in this process)."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT
from tests.in_process import run_app


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
    command = [sys.executable, "-m", "harness.batch.cli", *_common(tmp_path, args)]
    if popen:
        return subprocess.Popen(command, cwd=ROOT, text=True, **kwargs)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)


def batch_app(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``troughput-batch`` as ``troughput_batch`` runs it, but in this process (``tests/in_process.py``)."""
    from harness.batch.cli import main

    return run_app(main, "troughput-batch", _common(tmp_path, args), cwd=ROOT)


def _common(tmp_path: Path, args: tuple[str, ...]) -> list[str]:
    return [*args, f"run.results_dir={tmp_path / 'results'}", "run.progress=false", f"hydra.run.dir={tmp_path / 'hydra'}"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
