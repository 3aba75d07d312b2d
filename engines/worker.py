"""Worker entry point: ``python -m engines.worker JOB_DIR``, run under the engine's interpreter.

Reads ``job.json`` and ``requests.jsonl`` from JOB_DIR, runs warm-up and the
timed passes, and writes ``result.json`` (plus ``completions.jsonl`` of the last
pass). Progress and phase changes go to stdout as JSON lines; everything the
engine prints goes to stderr. A replica of a data-parallel run (``job["barrier"]``)
says ``ready`` before each timed pass and waits for ``go`` on stdin, so that all
replicas time the same interval; ``TROUGHPUT_CPU_AFFINITY`` pins it to its cores.
Standard library only, besides the adapter and its engine.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from engines import faults, get_engine_class
from engines.base import Completion, Engine, EngineUnavailable, KnobError, Request
from engines.decoding import needs_tokenizer, unsupported
from engines.devices import per_replica
from engines.energy import EnergyMeter
from engines.gpumem import GpuMemorySampler

OOM_MARKERS = ("out of memory", "outofmemory", "cannot allocate memory", "insufficient memory",
               "not enough memory", "less than desired")


_events = sys.stdout


def emit(event: str, **fields: Any) -> None:
    """One JSON line on the events stream (the original stdout) for the driver."""
    _events.write(json.dumps({"event": event, **fields}) + "\n")
    _events.flush()


def reserve_stdout_for_events() -> None:
    """Engines print logs to stdout; send those to stderr and keep stdout for events."""
    global _events
    _events = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)


def wait_for_go(phase: str) -> None:
    """Tell the driver this replica is ready for ``phase``; block until it says go."""
    emit("ready", phase=phase)
    if sys.stdin.readline().strip() != "go":
        raise RuntimeError(f"the driver stopped the run before {phase} (another replica failed)")


def pin_to_cores() -> None:
    """Restrict this process (and the engine's threads) to the cores the driver gave this replica."""
    cores = os.environ.get("TROUGHPUT_CPU_AFFINITY")
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})


def classify_failure(text: str) -> str:
    """``oom`` when the error text says memory ran out, else ``crash``."""
    lowered = text.lower()
    return "oom" if any(marker in lowered for marker in OOM_MARKERS) else "crash"


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed_pass(engine: Engine, requests: list[Request], index: int,
               energy: EnergyMeter | None = None) -> tuple[dict[str, Any], list[Completion]]:
    """Generate once for all requests; time only the generate call, less any replica start-up inside it,
    and meter its energy (``energy``)."""
    total = len(requests)
    done = 0
    last_emit = 0.0

    def on_finish(n: int = 1) -> None:
        nonlocal done, last_emit
        done += n
        now = time.monotonic()
        if now - last_emit > 0.5 or done == total:
            last_emit = now
            emit("progress", phase=f"pass {index + 1}", done=done, total=total)

    before = engine.stats()
    engine.step_trace.take()  # steps before this pass (warm-up) are not its steps
    if energy is not None:
        energy.start()
    t0 = time.perf_counter()
    completions = engine.generate(requests, on_finish=on_finish)
    pass_s = time.perf_counter() - t0
    steps = engine.step_trace.take() if engine.records_steps else None
    joules = energy.stop() if energy is not None else {"energy_j": None, "energy_reason": "not metered"}
    inside = engine.startup_in_last_generate()  # replicas started inside the call: start-up, not generation
    wall_s, t0 = pass_s - inside, t0 + inside
    simulated = engine.simulated_seconds()
    if simulated is not None:  # a simulator: its predicted clock, on which finish times start at 0
        wall_s, pass_s, t0 = simulated, simulated, 0.0
        joules = {"energy_j": None, "energy_reason": "a simulated pass uses no energy worth metering"}
    counters = engine.stats().minus(before)
    if [c.id for c in completions] != [r.id for r in requests]:
        raise RuntimeError("engine returned completions out of order or incomplete")
    finished = sorted(c.finished_at - t0 for c in completions if c.finished_at is not None)
    return {
        "wall_s": wall_s,            # the generation span: the rate's denominator for every engine
        "startup_s": inside,         # replica start-up inside the call (engine=ray), outside the rate
        "pass_s": pass_s,            # the whole call
        "requests": len(completions),
        "prompt_tokens": sum(c.prompt_tokens for c in completions),
        "output_tokens": sum(len(c.output_token_ids) for c in completions),
        "cached_tokens": (sum(c.cached_tokens for c in completions)
                          if all(c.cached_tokens is not None for c in completions) else None),
        "finished_s": finished,
        "stats": asdict(counters),
        "predicted": simulated is not None,
        "steps": steps,              # the pass's step trace (engines.steptrace), None where not recorded
        "step_trace_gap": None if engine.records_steps else engine.step_trace_gap,
        **joules,
    }, completions


def workload_limits(requests: list[Request]) -> dict[str, Any]:
    """What an adapter must know of this job's requests before it starts the engine.

    Passed inside its model dict: the longest prompt and prompt + output
    (``workload_max_prompt_tokens``, ``workload_max_seq_tokens``; TensorRT-LLM's engine
    build fixes ``max_input_len`` and ``max_seq_len`` before any request arrives), whether
    the engine must keep its tokenizer (``workload_needs_tokenizer``: grammars and stop
    strings) and whether any request is constrained (``workload_constrained``: TensorRT-LLM
    needs a grammar backend chosen at start).
    """
    if not requests:
        return {}
    return {"workload_max_prompt_tokens": max(len(r.prompt_token_ids) for r in requests),
            "workload_max_seq_tokens": max(len(r.prompt_token_ids) + r.max_tokens for r in requests),
            "workload_needs_tokenizer": needs_tokenizer(requests),
            "workload_constrained": any(r.constraint for r in requests)}


def run_job(job_dir: Path) -> int:
    job = json.loads((job_dir / "job.json").read_text())
    with open(job_dir / "requests.jsonl") as f:
        requests = [Request.from_dict(json.loads(line)) for line in f if line.strip()]
    result: dict[str, Any] = {"status": "crash", "error": "", "phase": "validate", "passes": []}

    def write_result() -> None:
        result["peak_rss_bytes"] = peak_rss_bytes()
        tmp = job_dir / "result.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, job_dir / "result.json")

    engine: Engine | None = None
    # GPU memory from the driver for the whole run (all processes on the visible devices, and this
    # process tree's share), sampled every 0.5 s on a thread; None without a driver.
    devices = per_replica(job.get("engine"), job.get("knobs"))   # the run's own GPUs, not every one on the node
    gpu_memory = GpuMemorySampler(devices=devices).start()
    energy = EnergyMeter(devices=devices)
    try:
        emit("phase", phase="validate")
        engine = get_engine_class(job["engine"])({**job["model"], **workload_limits(requests)}, job.get("knobs") or {})
        why = unsupported(job["engine"], requests, engine.supports_sampling, engine.supports_constraints)
        if why:
            raise EngineUnavailable(why)
        engine.validate()
        faults.after_steps()   # a test hook's bad value stops the run before the engine loads (engines.faults)
        result["phase"] = "start"
        emit("phase", phase="start")
        result["start"] = asdict(engine.start())
        result["start"]["extra"]["scheduler"] = engine.schedules_like   # whether the simulator can replay its steps
        faults.announce(result["start"]["extra"], engine.name)   # a test hook left set: a warning, engine_info
        warmup = requests[: int(job.get("warmup_requests", 0))]
        if warmup:
            result["phase"] = "warmup"
            emit("phase", phase="warmup", total=len(warmup))
            engine.generate([replace(r, id=f"warmup-{r.id}") for r in warmup])
            engine.reset_caches()
        completions: list[Completion] = []
        for index in range(int(job.get("repeats", 1))):
            result["phase"] = f"pass {index + 1}"
            if job.get("barrier"):
                wait_for_go(result["phase"])
            emit("phase", phase=result["phase"], total=len(requests))
            measured, completions = timed_pass(engine, requests, index, energy)
            result["passes"].append(measured)
            engine.reset_caches()
        result["final_stats"] = asdict(engine.stats())
        with open(job_dir / "completions.jsonl", "w") as f:
            for c in completions:
                f.write(json.dumps({"id": c.id, "output_token_ids": c.output_token_ids,
                                    "cached_tokens": c.cached_tokens, "finish_reason": c.finish_reason,
                                    "text": c.text}) + "\n")
        result.update(status="ok", phase="done")
    except (KnobError, EngineUnavailable) as e:
        result.update(status="invalid", error=str(e))
    except BaseException as e:  # noqa: BLE001 - every failure must become a row
        text = f"{type(e).__name__}: {e}"
        result.update(status=classify_failure(text + traceback.format_exc()), error=text,
                      traceback=traceback.format_exc()[-4000:])
    finally:
        memory = gpu_memory.stop() or {"peak_gpu_bytes": None}
        result["stat_warnings"] = [*(engine.stat_reader.warnings if engine is not None else []),
                                   *memory.pop("gpu_memory_warnings", [])]
        result.update(memory)
        if engine is not None and engine.started:
            try:
                engine.stop()
            except Exception as e:  # noqa: BLE001
                result.setdefault("stop_error", f"{type(e).__name__}: {e}")
        write_result()
        emit("phase", phase="done", status=result["status"])
    return 0 if result["status"] == "ok" else 3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m engines.worker JOB_DIR\n")
        return 2
    reserve_stdout_for_events()
    pin_to_cores()
    return run_job(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
