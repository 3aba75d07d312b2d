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

from engines.knobs import canonical_view
from harness import environment
from harness.measure import measurement_columns
from harness.ordering import apply_ordering
from harness.perfmodel import sol_columns
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
    memory_limit_bytes: int | None = None
    results_dir: Path = Path("results")
    save_outputs: bool = False
    labels: dict[str, Any] = field(default_factory=dict)
    hardware_spec: dict[str, Any] | None = None  # the hardware config's spec: block, for the speed of light
    workload_cfg: dict[str, Any] | None = None   # the workload config, kept in the row to re-simulate the run


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
        **flatten("canon", canonical_view(spec.engine, spec.knobs)),
        "repeats": spec.repeats,
        "warmup_requests": spec.warmup_requests,
        "time_limit_s": spec.time_limit_s,
        "memory_limit_bytes": spec.memory_limit_bytes,
        "run_seconds": outcome["seconds"],
        "log_path": str(log_path),
        **measurement_columns(result),
        **environment.capture(),
        **spec.labels,
    }
    row.update(_speed_of_light_columns(spec, row))
    write_row(results_dir, row)
    return row


def _speed_of_light_columns(spec: RunSpec, row: dict[str, Any]) -> dict[str, Any]:
    """``sol_tok_s``, ``sol_fraction`` (None when unknown), ``hw.*``, and ``workload_cfg.*``/``ordering_cfg.*``
    so that ``troughput-calibrate`` can re-simulate the run (see harness/perfmodel.py)."""
    columns = {**flatten("workload_cfg", spec.workload_cfg or {}), **flatten("ordering_cfg", spec.ordering)}
    columns.update(sol_columns(spec.model.get("local_dir"), str(spec.model.get("name") or ""), spec.hardware_spec,
                               spec.workload.summary(), spec.knobs, row.get("output_tok_s")))
    return columns


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
        ending, rss = _watch(proc, spec, t0)
        reader.join(timeout=10)
    seconds = time.monotonic() - t0
    result_path = job_dir / "result.json"
    if ending == "timeout":
        result = {"status": "timeout", "phase": phase["name"],
                  "error": f"time limit of {spec.time_limit_s:g} s exceeded during {phase['name']}; worker killed"}
    elif ending == "memory":
        result = {"status": "oom", "phase": phase["name"],
                  "error": f"memory limit of {spec.memory_limit_bytes:,} bytes exceeded during {phase['name']} "
                           f"(worker and children at {rss:,} bytes resident); worker killed"}
    elif result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        result = {"status": "crash", "phase": phase["name"],
                  "error": f"{_exit_reason(proc.returncode)} during {phase['name']}; last log lines:\n"
                           f"{_tail(log_path)}"}
    return {"result": result, "seconds": seconds}


def _watch(proc: subprocess.Popen, spec: RunSpec, t0: float) -> tuple[str, int]:
    """Wait for the worker; kill its process group past the time or memory limit.

    Returns how it ended (``exited``, ``timeout`` or ``memory``) and the resident
    bytes last seen. Memory is the summed RSS of the worker and its descendants.
    """
    rss = 0
    while True:
        try:
            proc.wait(timeout=0.5)
            return "exited", rss
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() - t0 > spec.time_limit_s:
            _kill_group(proc)
            return "timeout", rss
        if spec.memory_limit_bytes:
            rss = _tree_rss_bytes(proc.pid)
            if rss > spec.memory_limit_bytes:
                _kill_group(proc)
                return "memory", rss


def _tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants, from /proc (0 where /proc is absent)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            parents[int(entry.name)] = int(fields[1])
            rss[int(entry.name)] = int(fields[21]) * page
        except (OSError, ValueError, IndexError):
            continue
    total, frontier = 0, [root]
    while frontier:
        pid = frontier.pop()
        total += rss.get(pid, 0)
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return total


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
