"""The runner: one run = one worker process under a time limit = one results row, whatever happens.

The engine runs in ``python -m engines.worker`` started with the engine's own
interpreter. A crash, an OOM, a kill or a time-out costs one failed row, never
the sweep; the engine's log is kept under ``results/logs/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from harness import environment
from harness.measure import measurement_columns
from harness.ordering import apply_ordering
from harness.results import flatten, new_run_id, write_row
from harness.workloads import Workload

log = logging.getLogger(__name__)


@dataclass
class RunSpec:
    """Everything one run needs; ``labels`` (sweep id, study, trial, ...) go into the row as they are."""

    engine: str
    model: dict[str, Any]
    workload: Workload
    knobs: dict[str, Any] = field(default_factory=dict)
    ordering: dict[str, Any] = field(default_factory=lambda: {"name": "as_given"})
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    repeats: int = 1
    warmup_requests: int = 0
    time_limit_s: float = 900.0
    results_dir: Path = Path("results")
    save_outputs: bool = False
    labels: dict[str, Any] = field(default_factory=dict)


def execute(spec: RunSpec, progress: bool = True) -> dict[str, Any]:
    """Run ``spec`` in a worker process and write its row; return the row."""
    run_id = new_run_id()
    results_dir = Path(spec.results_dir)
    (results_dir / "jobs").mkdir(parents=True, exist_ok=True)
    log_path = results_dir / "logs" / f"{run_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix=f"{run_id}-", dir=results_dir / "jobs"))
    ordered = apply_ordering(spec.workload.requests, spec.ordering)
    started = datetime.now(timezone.utc)
    try:
        _write_job(job_dir, spec, ordered)
        outcome = _supervise(spec, job_dir, log_path, progress)
        result = outcome["result"]
        if result.get("status") == "ok" and spec.save_outputs:
            _save_outputs(job_dir, spec.workload, results_dir / "outputs" / f"{run_id}.jsonl")
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    row = {
        "run_id": run_id,
        "timestamp": started.isoformat(),
        "status": result.get("status", "crash"),
        "error": result.get("error") or "",
        "failed_phase": None if result.get("status") == "ok" else result.get("phase"),
        "engine": spec.engine,
        "engine_python": spec.python,
        "model": spec.model.get("name"),
        "model_path": spec.model.get("path"),
        "workload": spec.workload.name,
        "workload_fingerprint": spec.workload.fingerprint,
        **{f"workload_info.{k}": v for k, v in spec.workload.summary().items()},
        "ordering": spec.ordering.get("name"),
        **flatten("knob", spec.knobs),
        "repeats": spec.repeats,
        "warmup_requests": spec.warmup_requests,
        "time_limit_s": spec.time_limit_s,
        "run_seconds": outcome["seconds"],
        "log_path": str(log_path),
        **measurement_columns(result),
        **environment.capture(),
        **spec.labels,
    }
    write_row(results_dir, row)
    return row


def _write_job(job_dir: Path, spec: RunSpec, ordered: list) -> None:
    job = {"engine": spec.engine, "model": spec.model, "knobs": spec.knobs,
           "repeats": spec.repeats, "warmup_requests": spec.warmup_requests}
    (job_dir / "job.json").write_text(json.dumps(job))
    with open(job_dir / "requests.jsonl", "w") as f:
        for request in ordered:
            f.write(json.dumps(request.to_dict()) + "\n")


def _supervise(spec: RunSpec, job_dir: Path, log_path: Path, progress: bool) -> dict[str, Any]:
    """Start the worker, follow its events, enforce the time limit, and say how it ended."""
    env = {**os.environ, **{k: str(v) for k, v in spec.env.items()},
           "PYTHONPATH": os.pathsep.join(filter(None, [str(environment.PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    command = [spec.python, "-m", "engines.worker", str(job_dir)]
    t0 = time.monotonic()
    with open(log_path, "w") as log_file:
        try:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, text=True, env=env,
                                    cwd=environment.PROJECT_ROOT, start_new_session=True)
        except OSError as e:
            return {"result": {"status": "invalid", "phase": "launch",
                               "error": f"cannot start the worker with {spec.python!r}: {e}; "
                                        f"set engine.python to an interpreter that has the engine installed"},
                    "seconds": 0.0}
        phase = {"name": "launch"}
        reader = threading.Thread(target=_follow_events, args=(proc, phase, spec, progress), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=spec.time_limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        reader.join(timeout=10)
    seconds = time.monotonic() - t0
    result_path = job_dir / "result.json"
    if timed_out:
        result = {"status": "timeout", "phase": phase["name"],
                  "error": f"time limit of {spec.time_limit_s:g} s exceeded during {phase['name']}; worker killed"}
    elif result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        result = {"status": "crash", "phase": phase["name"],
                  "error": f"{_exit_reason(proc.returncode)} during {phase['name']}; last log lines:\n"
                           f"{_tail(log_path)}"}
    return {"result": result, "seconds": seconds}


def _follow_events(proc: subprocess.Popen, phase: dict[str, str], spec: RunSpec, progress: bool) -> None:
    """Read the worker's JSON-line events; keep the current phase and drive a progress bar."""
    bar = None
    label = f"{spec.engine}/{spec.workload.name}"
    for line in proc.stdout:  # type: ignore[union-attr]
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        phase["name"] = event.get("phase", phase["name"])
        if not progress:
            continue
        if event["event"] == "phase":
            if bar is not None:
                bar.close()
                bar = None
            if event.get("total"):
                bar = tqdm(total=event["total"], desc=f"{label} {phase['name']}", unit="req", leave=False)
            else:
                tqdm.write(f"[{label}] {phase['name']}", file=sys.stderr)
        elif event["event"] == "progress" and bar is not None:
            bar.update(event["done"] - bar.n)
    if bar is not None:
        bar.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _exit_reason(returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (the kernel's OOM killer sends SIGKILL when memory runs out)" if name == "SIGKILL" else ""
        return f"worker killed by {name}{hint}"
    return f"worker exited with code {returncode} without a result"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _save_outputs(job_dir: Path, workload: Workload, target: Path) -> None:
    """The generated tokens, in the workload's original order with the original ids."""
    with open(job_dir / "completions.jsonl") as f:
        by_id = {c["id"]: c for c in map(json.loads, f)}
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w") as f:
        for request in workload.requests:
            f.write(json.dumps(by_id[request.id]) + "\n")
