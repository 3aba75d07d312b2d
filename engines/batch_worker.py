"""Batch worker: ``python -m engines.batch_worker JOB_DIR``: one engine started once, fed shard after shard.

Reads ``job.json`` (engine, model, knobs), starts the engine and says ``started``. Each line
on stdin, ``{"shard": DIR, "index": N}``, names a shard directory; a reader thread queues
them, and the worker hands each shard's ``requests.jsonl`` to the engine as soon as it
arrives, while earlier shards still generate (``engines.feeding``: the engine's queue does
not run dry at a shard boundary). When a shard's last request finishes, its ``result.json``
(the completions, the per-request errors, and ``measured``: its span from feed to last
finish, the engine-busy seconds it accounts for, and the engine's idle seconds just before
it was fed) is written whole and renamed into place before ``shard_done`` is said. A request
the engine cannot take (a constraint or sampling it lacks, an input it rejects with
``ValueError``) is a per-request error; any other failure says ``shard_failed`` and ends the
worker. End of stdin, once every fed shard is done, stops the engine. ``{"restart": {"job": ...}}``
restarts the engine in this process with another job (an in-job tuning's next run);
``{"park": true}`` stops it and leaves the process waiting for the next restart (a slot an
in-job tuning's run with fewer replicas does not use, ``harness.batch.scale.pool``); a ``job.json`` of
``{"park": true}`` starts the worker parked. A park that names its ``engine`` imports the engine's
package while parked (``Engine.preload``), so the slot's first start does not wait for the import. A job's ``cores`` (a run on fewer replicas than the
pool's workers, on the CPU) pins the engine to them before it starts; its ``generation`` (the
pool's run number) comes back in ``started``. ``start_engine`` and
``feed_until_closed`` are also ``batch.scale=ray``'s engine stage (``harness.batch.scale.ray_stages``).
Standard library only, besides the adapter and its engine.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engines import faults, get_engine_class
from engines.base import Engine, Request
from engines.feeding import Feeder, ShardOutput, feeder_for
from engines.worker import emit, peak_rss_bytes, pin_to_cores, reserve_stdout_for_events


def start_engine(job: dict[str, Any]) -> tuple[Engine, dict[str, Any]]:
    """The job's engine, validated and started; with its ``StartInfo`` as a dict."""
    engine = get_engine_class(job["engine"])(job["model"], job.get("knobs") or {})
    engine.validate()
    faults.after_steps()   # a test hook's bad value stops the start before the engine loads (engines.faults)
    start = asdict(engine.start())
    start["extra"]["scheduler"] = engine.schedules_like   # whether the simulator can replay its steps
    faults.announce(start["extra"], engine.name)   # a test hook left set warns, and the start info says so
    return engine, start


def screen(engine: Engine, requests: list[Request]) -> dict[str, str]:
    """Errors for the requests needing what the engine lacks; they are not sent."""
    errors = {}
    for request in requests:
        why = _unsupported(engine, request)
        if why:
            errors[request.id] = why
    return errors


def _unsupported(engine: Engine, request: Request) -> str | None:
    if request.constraint and not getattr(engine, "supports_constraints", False):
        return (f"engine {engine.name!r} cannot constrain outputs (response_format / structured_outputs) in this "
                f"version of troughput; the request was not run rather than run unconstrained")
    if request.sampling and not getattr(engine, "supports_sampling", False):
        return f"engine {engine.name!r} decodes greedily only; run this file with batch.sampling=benchmark"
    return None


def shard_result(out: ShardOutput, errors: dict[str, str], busy_s: float, idle_before_s: float) -> dict[str, Any]:
    """A finished shard as ``result.json``: ``measured.wall_s`` is the engine-busy time it accounts for.

    ``span_s`` runs from feed to last finish (spans of shards fed while others generate
    overlap); ``busy_s`` (= ``wall_s``) is the part of the engine's busy time since the
    previous shard finished, so the shards' ``wall_s`` add up to the engine's busy time;
    ``idle_before_s`` is how long the engine had nothing to do just before this shard was fed;
    ``startup_s`` the replica start-up inside its generate calls (``engine=ray``), outside both.
    """
    completions = out.completions
    cached = [c.cached_tokens for c in completions]
    measured = {"wall_s": busy_s, "span_s": out.span_s, "idle_before_s": idle_before_s, "startup_s": out.startup_s,
                "requests": len(completions), "prompt_tokens": sum(c.prompt_tokens for c in completions),
                "output_tokens": sum(len(c.output_token_ids) for c in completions),
                "cached_tokens": None if None in cached or not completions else sum(cached),  # type: ignore[arg-type]
                "predicted": out.simulated_span_s is not None}
    return {"measured": measured, "errors": {**errors, **out.errors},
            "completions": [{"id": c.id, "prompt_tokens": c.prompt_tokens, "output_token_ids": c.output_token_ids,
                             "cached_tokens": c.cached_tokens, "finish_reason": c.finish_reason, "text": c.text,
                             "finished_at": c.finished_at}  # perf_counter (a simulated engine's: its own clock)
                            for c in completions]}


def write_whole(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, appearing whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_requests(path: Path) -> list[Request]:
    with open(path) as f:
        return [Request.from_dict(json.loads(line)) for line in f if line.strip()]


def serve(job_dir: Path) -> int:
    """Start the engine, then feed it the shards named on stdin until it closes and every shard is done.

    ``{"restart": {"job": {...}}}`` on stdin (an in-job tuning's next run): once every shard fed
    so far is done, the engine stops and a new one starts in this process with that job's knobs and
    model limits (no new worker, no second import of the engine) and says ``started`` again; later
    shards go to it. ``{"park": true}``: the engine stops the same way, no new one starts (no weights or
    KV cache held, no engine threads), the worker says ``phase: parked`` and waits for a restart; a shard
    sent to a parked worker is an error.
    """
    job: dict[str, Any] | None = json.loads((job_dir / "job.json").read_text())
    engine: Engine | None = None
    feeder: Feeder | None = None
    commands = _stdin_commands()
    try:
        while True:
            if job is None or job.get("park"):
                emit("phase", phase="parked")
                if job and job.get("engine"):   # import the engine now, not at this slot's first start
                    _preload(job["engine"])
                command = _while_parked(commands)
            else:
                emit("phase", phase="start")
                if job.get("cores"):   # this run's own cores (a run on fewer replicas than the pool's slots)
                    os.sched_setaffinity(0, set(job["cores"]))
                engine, start = start_engine(job)
                emit("started", start=start, **({"generation": job["generation"]} if "generation" in job else {}))
                feeder = feeder_for(engine)
                command = feed_until_closed(engine, feeder, commands, _write_result,
                                            capacity=(start.get("extra") or {}).get("max_num_seqs"))
                feeder.close()
                engine.stop()
                engine, feeder = None, None
                gc.collect()
            if command is None:
                return 0
            job = command["restart"]["job"] if "restart" in command else command   # a park
    except BaseException as e:  # noqa: BLE001 - the driver must hear why
        emit("shard_failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        return 3
    finally:
        if feeder is not None:
            feeder.close()
        if engine is not None and engine.started:
            engine.stop()


def _stdin_commands() -> queue.Queue[dict[str, Any] | None]:
    """The commands on stdin, parsed on a thread as they arrive; ``None`` at end of stdin."""
    commands: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        try:
            for line in sys.stdin:
                if line.strip():
                    commands.put(json.loads(line))
        except Exception as e:  # noqa: BLE001 - ends the worker with the reason, in its main thread
            commands.put({"error": f"bad command on stdin: {type(e).__name__}: {e}"})
        commands.put(None)

    threading.Thread(target=read, name="troughput-stdin", daemon=True).start()
    return commands


def _preload(engine: str) -> None:
    """Import ``engine``'s package (``Engine.preload``) and say so: ``phase: preloaded``, its modules and seconds.
    A failure is said too and is not the worker's end: the slot's first start imports again and reports it."""
    t0 = time.perf_counter()
    try:
        cls = get_engine_class(engine)
        cls.preload()
    except Exception as e:  # noqa: BLE001 - the start reports it with the engine's own error path
        emit("phase", phase="preloaded", modules=[], error=f"{type(e).__name__}: {e}"[:500])
        return
    emit("phase", phase="preloaded", modules=[m for m in cls.preload_modules if m in sys.modules],
         seconds=round(time.perf_counter() - t0, 3))


def _while_parked(commands: queue.Queue[dict[str, Any] | None]) -> dict[str, Any] | None:
    """A parked worker's next restart, or ``None`` at end of input; another park changes nothing."""
    while True:
        command = commands.get()
        if command is None or "restart" in command:
            return command
        if "park" not in command:
            raise RuntimeError(command.get("error") or f"a parked worker takes no shard: {command}")


def _write_result(shard: str, result: dict[str, Any]) -> None:
    """A finished shard's ``result.json`` in its directory, then ``shard_done`` for the driver."""
    result["peak_rss_bytes"] = peak_rss_bytes()
    write_whole(Path(shard) / "result.json", result)
    emit("shard_done", shard=shard, **result["measured"], errors=len(result["errors"]))


def feed_until_closed(engine: Engine, feeder: Feeder, commands: queue.Queue[dict[str, Any] | None],
                      finish: Callable[[str, dict[str, Any]], None],
                      progress: bool | Callable[[dict[str, Any]], None] = True,
                      capacity: int | None = None) -> dict[str, Any] | None:
    """Feed each shard as it arrives, hand each to ``finish`` as it finishes; return at end of input.

    A command is ``{"shard": DIR}`` (its ``requests.jsonl`` is read) or ``{"shard": KEY,
    "requests": [...]}`` (a Ray actor's call); ``None`` ends the input. ``finish(shard, result)``
    gets the shard's ``result.json`` contents (``shard_result``) in the order shards finish.
    A ``{"restart": ...}`` or ``{"park": ...}`` command also ends it, once every shard fed before it
    is done; it is returned (commands after it stay queued for the next engine), ``None`` at end of input.
    ``capacity``: the sequences the engine holds at once (its start's ``max_num_seqs``), in each result's
    ``measured.max_num_seqs``: the driver's occupancy is its steps' mean running over it (``engines.steptrace``).
    ``progress``: ``True``, progress events on stdout (``_progress``); a function, called with the same dict
    instead (a Ray actor's feeding gate, ``harness.batch.scale.ray_stages``); ``False``, none. Each result's
    ``measured.shards_in_engine`` is how many shards the engine held once it was fed (itself included).
    """
    shards: dict[str, tuple[dict[str, str], float, int]] = {}  # shard -> (screened errors, idle before it,
    #                                                             shards in the engine once it was fed)
    idle_since: float | None = time.perf_counter()  # the engine has nothing to do from here
    last_finish = time.perf_counter()
    last_progress = 0.0
    fed = 0  # requests handed over (screened ones included), reported with each progress event
    closed = False
    restart: dict[str, Any] | None = None
    while not (closed and feeder.idle()):
        try:  # wait for work only when the engine has none
            if closed:
                raise queue.Empty  # a restart waits for the shards fed before it; later commands wait for it
            command = commands.get(timeout=None if feeder.idle() else 0)
            while True:
                if command is None or "restart" in command or "park" in command:
                    closed, restart = True, command
                    break
                elif "error" in command:
                    raise RuntimeError(command["error"])
                else:
                    shard = str(command["shard"])
                    requests = (command["requests"] if "requests" in command
                                else read_requests(Path(shard) / "requests.jsonl"))
                    errors = screen(engine, requests)
                    now = time.perf_counter()
                    idle_before = now - idle_since if idle_since is not None and feeder.idle() else 0.0
                    idle_since = None
                    shards[shard] = (errors, idle_before, len(shards) + 1)
                    feeder.feed(shard, [r for r in requests if r.id not in errors])
                    fed += len(requests)
                command = commands.get_nowait()
        except queue.Empty:
            pass
        finished = feeder.collect(timeout=0.05)
        for out in finished:
            errors, idle_before, in_engine = shards.pop(out.shard)
            busy = (out.span_s if out.simulated_span_s is not None
                    else out.finished_at - max(out.fed_at, last_finish) - out.startup_s)
            last_finish = max(last_finish, out.finished_at)
            result = shard_result(out, errors, max(0.0, busy), idle_before)
            result["measured"]["streams"] = feeder.streams  # finish times per request, on this host's clock
            result["measured"]["engine_steps"] = engine.stats().extra.get("engine_steps")  # since start, where known
            result["measured"]["max_num_seqs"] = capacity
            result["measured"]["shards_in_engine"] = in_engine
            # the engine's steps since the last shard finished on it (engines.steptrace): every step once
            result["steps"] = engine.step_trace.take() if engine.records_steps else None
            finish(out.shard, result)
        if feeder.idle() and idle_since is None:
            idle_since = time.perf_counter()
        if progress:
            last_progress = _progress(feeder, last_progress, fed, force=bool(finished),
                                      report=progress if callable(progress) else None)
    return restart


def _progress(feeder: Feeder, last: float, fed: int, force: bool = False,
              report: Callable[[dict[str, Any]], None] | None = None) -> float:
    """Every half second (and when a shard finished): requests finished in shards not yet done, for the
    progress bar, and ``pending``, the requests in the engine not finished yet, with ``fed``, all requests
    handed over so far: the driver hands this engine another shard when few are pending
    (``harness.batch.scale.pool``)."""
    now = time.monotonic()
    if now - last < 0.5 and not force:
        return last
    done = sum(len(s.done) + len(s.errors) for s in feeder.open.values())
    total = sum(len(s.requests) for s in feeder.open.values())
    flow = {"pending": total - done, "fed": fed} if feeder.streams else {}  # a serial feeder gains nothing from more
    if report is not None:
        report({"done": done, "total": total, **flow})
    else:
        emit("progress", done=done, total=total, **flow)
    return now


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m engines.batch_worker JOB_DIR\n")
        return 2
    reserve_stdout_for_events()
    pin_to_cores()
    return serve(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
