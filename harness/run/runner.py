"""The runner: one run = one worker process per replica under a time limit = one results row, whatever happens.

The engine runs in ``python -m engines.worker`` started with the engine's own
interpreter, one worker per data-parallel replica (harness/run/replicas.py). A crash,
an OOM, a kill or a time-out costs one failed row, never the sweep; the engine's
log is kept under ``results/logs/``.
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
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from engines import registry_env
from engines.base import Completion
from engines.common import PROJECT_ROOT
from harness import quality
from harness.core.errors import TroughputError
from harness.ordering.policies import apply_ordering
from harness.run.hostspec import complete_run_spec
from harness.run.replicas import device_envs, merge_results, shard_requests
from harness.run.results import new_run_id, write_row
from harness.run.row import build_row
from harness.run.spec import RunSpec
from harness.run.measure import median_pass_index
from harness.run.stepmodels import calibrate_sim_spec, full_engine_columns, predict_run
from harness.steps.predict import prediction_columns
from harness.steps.store import trace_columns
from harness.workloads import Workload

log = logging.getLogger(__name__)


def execute(spec: RunSpec, progress: bool = True) -> dict[str, Any]:
    """Run ``spec`` in worker processes (one per replica) and write its row; return the row."""
    spec = complete_run_spec(spec)  # this host's measured rates where the hardware config leaves them null (cached)
    spec = calibrate_sim_spec(spec)  # engine=sim: the step model fitted on this host, or a refit from its traces
    prediction = predict_run(spec)  # a real run's rate as the step model predicts it, before it runs
    run_id = new_run_id()
    results_dir = Path(spec.results_dir)
    (results_dir / "jobs").mkdir(parents=True, exist_ok=True)
    log_paths = [results_dir / "logs" / (f"{run_id}.log" if i == 0 else f"{run_id}.replica{i + 1}.log")
                 for i in range(spec.replicas)]
    log_paths[0].parent.mkdir(parents=True, exist_ok=True)
    ordered = apply_ordering(spec.workload.requests, spec.ordering)
    started = datetime.now(timezone.utc)
    job_dirs: list[Path] = []
    try:
        try:
            shards = shard_requests(ordered, spec.replicas)
            device_env = device_envs(spec.replicas, (spec.hardware_spec or {}).get("kind", "cpu"), spec.env)
        except TroughputError as e:
            outcome = {"result": {"status": "invalid", "phase": "launch", "error": str(e)}, "seconds": 0.0}
        else:
            for shard in shards:
                job_dirs.append(Path(tempfile.mkdtemp(prefix=f"{run_id}-", dir=results_dir / "jobs")))
                _write_job(job_dirs[-1], spec, shard)
            outcome = _supervise(spec, job_dirs, device_env, log_paths, progress)
        result = outcome["result"]
        quality_columns: dict[str, Any] = {}
        checks_quality = quality.wanted(spec)
        if result.get("status") == "ok" and (spec.save_outputs or checks_quality):
            records = _read_completions(job_dirs, spec.workload)
            if spec.save_outputs:
                _save_outputs(records, results_dir / "outputs" / f"{run_id}.jsonl")
            if checks_quality:
                try:
                    quality_columns = quality.assess(spec, run_id, [_completion(r) for r in records], execute)
                except Exception as e:  # noqa: BLE001 - the measured run keeps its row; the row says why
                    quality_columns = {"quality.error": f"{type(e).__name__}: {e}"}
    finally:
        for job_dir in job_dirs:
            shutil.rmtree(job_dir, ignore_errors=True)
    steps = trace_columns(results_dir, run_id, result, median_pass_index(result.get("passes") or []))
    row = build_row(spec, run_id, started, result, outcome["seconds"], str(log_paths[0]), {**quality_columns, **steps})
    row.update(full_engine_columns(spec, row))
    if prediction is not None:
        row.update(prediction_columns("sim", prediction.rate, row.get("output_tok_s"), "output tok/s",
                                      prediction.interval, prediction.note))
    write_row(results_dir, row)
    return row


def _write_job(job_dir: Path, spec: RunSpec, requests: list) -> None:
    job = {"engine": spec.engine, "model": spec.model, "knobs": spec.knobs, "repeats": spec.repeats,
           "warmup_requests": spec.warmup_requests, "barrier": spec.replicas > 1}
    (job_dir / "job.json").write_text(json.dumps(job))
    with open(job_dir / "requests.jsonl", "w") as f:
        for request in requests:
            f.write(json.dumps(request.to_dict()) + "\n")


def _supervise(spec: RunSpec, job_dirs: list[Path], device_env: list[dict[str, str]], log_paths: list[Path],
               progress: bool) -> dict[str, Any]:
    """Start one worker per replica, follow their events, enforce the limits, and say how the run ended."""
    env = {**os.environ, **{k: str(v) for k, v in spec.env.items()}, **registry_env(),   # the worker needs no metadata
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    procs: list[subprocess.Popen] = []
    with ExitStack() as stack:
        for job_dir, extra, log_path in zip(job_dirs, device_env, log_paths):
            log_file = stack.enter_context(open(log_path, "w"))
            try:
                procs.append(subprocess.Popen(
                    [spec.python, "-m", "engines.worker", str(job_dir)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log_file, text=True, env={**env, **extra},
                    cwd=PROJECT_ROOT, start_new_session=True))
            except OSError as e:
                for proc in procs:
                    _kill_group(proc)
                return {"result": {"status": "invalid", "phase": "launch",
                                   "error": f"cannot start the worker with {spec.python!r}: {e}; "
                                            f"set engine.python to an interpreter that has the engine installed"},
                        "seconds": 0.0}
        phases = [{"name": "launch"} for _ in procs]
        barrier = PassBarrier(procs)
        readers = [threading.Thread(target=_follow_events, args=(proc, phase, spec, progress and i == 0, barrier),
                                    daemon=True) for i, (proc, phase) in enumerate(zip(procs, phases))]
        for reader in readers:
            reader.start()
        ending, rss, culprit = _watch(procs, spec, t0)
        for reader in readers:
            reader.join(timeout=10)
        for proc in procs:
            proc.stdin.close()  # type: ignore[union-attr]
    seconds = time.monotonic() - t0
    phase = phases[culprit or 0]["name"]
    if ending == "timeout":
        result = {"status": "timeout", "phase": phase,
                  "error": f"time limit of {spec.time_limit_s:g} s exceeded during {phase}; worker killed"}
    elif ending == "memory":
        result = {"status": "oom", "phase": phase,
                  "error": f"memory limit of {spec.memory_limit_bytes:,} bytes exceeded during {phase} "
                           f"(worker and children at {rss:,} bytes resident); worker killed"}
    else:
        results = [_worker_result(*args) for args in zip(procs, job_dirs, phases, log_paths)]
        result = merge_results(results, culprit)
    return {"result": result, "seconds": seconds}


def _worker_result(proc: subprocess.Popen, job_dir: Path, phase: dict[str, str], log_path: Path) -> dict[str, Any]:
    """What the worker wrote, or why it wrote nothing."""
    result_path = job_dir / "result.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    return {"status": "crash", "phase": phase["name"],
            "error": f"{_exit_reason(proc.returncode)} during {phase['name']}; last log lines:\n{_tail(log_path)}"}


class PassBarrier:
    """Releases every replica into its next timed pass once all of them are ready for it."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs
        self.ready = 0
        self.lock = threading.Lock()

    def arrive(self) -> None:
        with self.lock:
            self.ready += 1
            if self.ready < len(self.procs):
                return
            self.ready = 0
            for proc in self.procs:
                try:
                    proc.stdin.write("go\n")  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]
                except (OSError, ValueError):  # that replica is gone; the watcher ends the run
                    pass


def _watch(procs: list[subprocess.Popen], spec: RunSpec, t0: float) -> tuple[str, int, int | None]:
    """Wait for the workers; kill them all past the time or memory limit, or when one of them fails.

    Returns how the run ended (``exited``, ``timeout`` or ``memory``), the resident
    bytes last seen (all workers and their descendants), and the index of the
    first worker that failed (None when none did).
    """
    rss = 0
    while True:
        codes = [proc.poll() for proc in procs]
        culprit = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if culprit is not None or None not in codes:
            if culprit is not None:
                for proc in procs:
                    _kill_group(proc)
            return "exited", rss, culprit
        if time.monotonic() - t0 > spec.time_limit_s:
            for proc in procs:
                _kill_group(proc)
            return "timeout", rss, None
        if spec.memory_limit_bytes:
            rss = _tree_rss_bytes([proc.pid for proc in procs])
            if rss > spec.memory_limit_bytes:
                for proc in procs:
                    _kill_group(proc)
                return "memory", rss, None
        try:   # woken by the first running worker's exit, so a run ends when its workers do, not on a tick
            next(proc for proc, code in zip(procs, codes) if code is None).wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            pass


def _tree_rss_bytes(roots: list[int]) -> int:
    """Resident bytes of ``roots`` and all their descendants, from one read of /proc (0 where it is absent)."""
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
    total, frontier = 0, list(roots)
    while frontier:
        pid = frontier.pop()
        total += rss.get(pid, 0)
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return total


def _follow_events(proc: subprocess.Popen, phase: dict[str, str], spec: RunSpec, progress: bool,
                   barrier: PassBarrier) -> None:
    """Read a worker's JSON-line events: keep its current phase, meet the pass barrier, drive a progress bar."""
    bar = None
    label = f"{spec.engine}/{spec.workload.name}" + (f" replica 1 of {spec.replicas}" if spec.replicas > 1 else "")
    for line in proc.stdout:  # type: ignore[union-attr]
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        phase["name"] = event.get("phase", phase["name"])
        if event["event"] == "ready":
            barrier.arrive()
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


def _read_completions(job_dirs: list[Path], workload: Workload) -> list[dict[str, Any]]:
    """Every replica's completion records, in the workload's original order with the original ids."""
    by_id: dict[str, Any] = {}
    for job_dir in job_dirs:
        with open(job_dir / "completions.jsonl") as f:
            by_id.update((c["id"], c) for c in map(json.loads, f))
    return [by_id[request.id] for request in workload.requests]


def _completion(record: dict[str, Any]) -> Completion:
    return Completion(id=record["id"], prompt_tokens=0, output_token_ids=record["output_token_ids"],
                      cached_tokens=record.get("cached_tokens"), finish_reason=record.get("finish_reason"),
                      text=record.get("text"))


def _save_outputs(records: list[dict[str, Any]], target: Path) -> None:
    """The generated tokens (and finish reasons, and text where detokenized), one line per request."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(tmp, target)
