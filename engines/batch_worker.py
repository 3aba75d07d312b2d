"""Batch worker: ``python -m engines.batch_worker JOB_DIR``: one engine started once, then shard after shard.

Reads ``job.json`` (engine, model, knobs), starts the engine and says ``started``. Then each
line on stdin, ``{"shard": DIR}``, names a shard directory: its ``requests.jsonl`` is
generated and ``result.json`` (the timed pass, the completions, the per-request errors) is
written whole and renamed into place before ``shard_done`` is said. A request the engine
cannot take (a constraint or sampling it lacks, a prompt it rejects with ``ValueError``) is a
per-request error; any other failure says ``shard_failed`` and ends the worker. End of stdin
stops the engine. ``start_engine`` and ``run_shard`` are also ``batch.scale=ray``'s engine stage
(``harness.batch.ray_stages``). Standard library only, besides the adapter and its engine.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engines import get_engine_class
from engines.base import Completion, Engine, Request
from engines.worker import emit, peak_rss_bytes, pin_to_cores, reserve_stdout_for_events, timed_pass


def start_engine(job: dict[str, Any]) -> tuple[Engine, dict[str, Any]]:
    """The job's engine, validated and started; with its ``StartInfo`` as a dict."""
    engine = get_engine_class(job["engine"])(job["model"], job.get("knobs") or {})
    engine.validate()
    return engine, asdict(engine.start())


def run_shard(engine: Engine, requests: list[Request], index: int) -> dict[str, Any]:
    """Generate ``requests``; return the timed pass, completions (as dicts) and per-request errors.

    Requests needing what the engine lacks are not sent; a ``ValueError`` from the engine
    (an input it rejects) is narrowed down by halving to the requests that cause it.
    """
    errors: dict[str, str] = {}
    runnable = []
    for request in requests:
        why = _unsupported(engine, request)
        if why:
            errors[request.id] = why
        else:
            runnable.append(request)
    passes, completions = _generate_isolating(engine, runnable, index, errors)
    return {"measured": _sum_passes(passes), "errors": errors,
            "completions": [{"id": c.id, "prompt_tokens": c.prompt_tokens, "output_token_ids": c.output_token_ids,
                             "cached_tokens": c.cached_tokens, "finish_reason": c.finish_reason, "text": c.text}
                            for c in completions]}


def _unsupported(engine: Engine, request: Request) -> str | None:
    if request.constraint and not getattr(engine, "supports_constraints", False):
        return (f"engine {engine.name!r} cannot constrain outputs (response_format / structured_outputs) in this "
                f"version of troughput; the request was not run rather than run unconstrained")
    if request.sampling and not getattr(engine, "supports_sampling", False):
        return f"engine {engine.name!r} decodes greedily only; run this file with batch.sampling=benchmark"
    return None


def _generate_isolating(engine: Engine, requests: list[Request], index: int,
                        errors: dict[str, str]) -> tuple[list[dict[str, Any]], list[Completion]]:
    if not requests:
        return [], []
    try:
        measured, completions = timed_pass(engine, requests, index)
        return [measured], completions
    except ValueError as e:
        if len(requests) == 1:
            errors[requests[0].id] = f"the engine rejected the request: {e}"
            return [], []
    half = len(requests) // 2
    first = _generate_isolating(engine, requests[:half], index, errors)
    second = _generate_isolating(engine, requests[half:], index, errors)
    return first[0] + second[0], first[1] + second[1]


def _sum_passes(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One timed pass for the shard (several when a rejected request split it)."""
    keys = ("wall_s", "requests", "prompt_tokens", "output_tokens")
    total: dict[str, Any] = {key: sum(p[key] for p in passes) for key in keys}
    cached = [p.get("cached_tokens") for p in passes]
    total["cached_tokens"] = None if None in cached or not passes else sum(cached)
    total["predicted"] = any(p.get("predicted") for p in passes)
    return total


def write_whole(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, appearing whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_requests(path: Path) -> list[Request]:
    with open(path) as f:
        return [Request.from_dict(json.loads(line)) for line in f if line.strip()]


def serve(job_dir: Path) -> int:
    """Start the engine, then run the shards named on stdin until it closes."""
    job = json.loads((job_dir / "job.json").read_text())
    engine: Engine | None = None
    try:
        emit("phase", phase="start")
        engine, start = start_engine(job)
        emit("started", start=start)
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            shard = Path(command["shard"])
            result = run_shard(engine, read_requests(shard / "requests.jsonl"), int(command.get("index", 0)))
            result["peak_rss_bytes"] = peak_rss_bytes()
            write_whole(shard / "result.json", result)
            emit("shard_done", shard=str(shard), **result["measured"], errors=len(result["errors"]))
        return 0
    except BaseException as e:  # noqa: BLE001 - the driver must hear why
        emit("shard_failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        return 3
    finally:
        if engine is not None and engine.started:
            engine.stop()


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
