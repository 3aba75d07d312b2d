"""The results row of a batch job (table ``batch``): what ran, how fast, and what was predicted beside it.

Measured rates are this invocation's: output tokens over ``generation_s`` (from the moment
every engine was up to the last shard committed; engine start excluded, as a measured
run's timed pass excludes it). ``predicted_job_s`` is this job's output tokens at the
predicted rate, beside ``generation_s``. ``startup_s`` holds the engines' start (and replica
start-up inside shards, ``engine=ray``), ``wall_s`` the whole invocation; ``engine_s`` sums the
engine-busy seconds the shards account for and ``engine_idle_s`` the seconds engines waited with
nothing fed (``engines.batch_worker``): the same rate definition as a measured run's row.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from engines.knobs import canonical_view
from harness.batch.job.job import ShardsRun
from harness.batch.job.plan import Plan
from harness.batch.job.shards import Index
from harness.run import environment
from harness.run.results import BATCH_DIR, prefixed
from harness.steps.predict import prediction_columns

BATCH_TABLE = BATCH_DIR


def batch_row(plan: Plan, run_id: str, started: datetime, index: Index, run: ShardsRun, committed: int,
              wall_s: float, peak_driver_rss_bytes: int, outputs: dict[str, str | None],
              extra: dict[str, Any] | None = None, job_ok: int | None = None) -> dict[str, Any]:
    """The job's row; ``extra``: more columns (an in-job tuning's ``tune.*``); ``job_ok``: requests answered over
    the whole job (every committed shard, this run's and earlier ones'), where known.

    ``status``: ``ok``; ``failed`` when every shard is committed but no request of the job was answered (every
    line is in the errors file: the job produced nothing, whatever its exit looked like before); ``incomplete``
    while shards are left."""
    shards = index.shards(plan.shard_size)
    complete = committed == shards and not run.shards_failed and not run.errors
    nothing = complete and (job_ok if job_ok is not None else run.requests_ok) == 0
    rate = run.output_tokens / run.generation_s if run.generation_s > 0 else None
    req_rate = run.requests_ok / run.generation_s if run.generation_s > 0 else None
    predicted = plan.source.get("predicted_output_tok_s")
    env = environment.capture()
    there = plan.source.get("predicted_host_id")
    row: dict[str, Any] = {
        "run_id": run_id, "kind": "batch", "timestamp": started.isoformat(),
        "status": "failed" if nothing else "ok" if complete else "incomplete",
        "error": _nothing(index, outputs.get("errors")) if nothing else "" if complete else
        _incomplete(run, shards, committed),
        "engine": plan.engine, "engine_python": plan.python, "model": plan.model_name,
        "model_path": plan.model.get("path"), "ordering": plan.ordering.get("name"),
        "input": plan.input, "input_format": plan.format, "input_digest": plan.input_digest,
        "output_dir": plan.output_dir, **{f"output.{k}": v for k, v in outputs.items()},
        "sampling": plan.sampling, "scale": plan.scale, "replicas": plan.replicas, "shard_size": plan.shard_size,
        "records": index.records, "shards": shards, "shards_committed": committed,
        "shards_before": committed - run.shards_run, "shards_run": run.shards_run,
        "shards_failed": len(run.shards_failed),
        "requests_ok": run.requests_ok, "requests_failed": run.requests_failed,
        "requests_other_model": run.requests_other_model,
        "input_tokens": run.prompt_tokens, "output_tokens": run.output_tokens,
        "startup_s": run.startup_s, "engine_s": run.engine_s,
        "engine_idle_s": run.engine_idle_s, "engine_steps": run.engine_steps if run.engine_steps is not None
        else run.traced_steps or None, "occupancy": run.occupancy, "generation_s": run.generation_s, "wall_s": wall_s,
        "output_tok_s": rate, "req_s": req_rate,
        "peak_driver_rss_bytes": peak_driver_rss_bytes, "peak_worker_rss_bytes": run.peak_worker_rss_bytes or None,
        # a test hook set in the engines' environment (engines.faults): never silent, whether or not it fired
        "engine_info.fault_hook": "; ".join(run.fault_hooks) or None,
        **prefixed("config_source", plan.source),
        "predicted_output_tok_s": predicted, "predicted_req_s": plan.source.get("predicted_req_s"),
        "predicted_job_s": run.output_tokens / predicted if predicted else None,
        "measured_over_predicted": rate / predicted if rate and predicted else None,
        # a prediction measured on another kind of machine (or on one not recorded) is labelled, not compared silently
        "predicted_other_host": bool(predicted) and there != env["env.host_id"],
        **(prediction_columns("batch_rate", predicted, rate, "output tok/s",
                              note=f"{plan.source.get('predicted_method')} of {plan.source.get('kind')}")
           if predicted and there == env["env.host_id"] else {}),
        **prefixed("knob", plan.knobs),
        **prefixed("canon", canonical_view(plan.engine, plan.knobs)),
        **env,
        **plan.labels,
        **(extra or {}),
    }
    return row


def _nothing(index: Index, errors: str | None) -> str:
    """Why a complete job answered nothing: the count, where the errors are, and the first one's reason."""
    first = ""
    if errors and Path(errors).is_file():
        with open(errors, encoding="utf-8") as f:
            line = f.readline()
        if line.strip():
            body = json.loads(line)["response"]["body"]
            first = f"; the first: {str(body.get('error', {}).get('message', ''))[:300]}"
    return (f"no request succeeded: all {index.records:,} records of the input are error lines "
            f"(in {errors or 'the shards'}){first}")


def _incomplete(run: ShardsRun, shards: int, committed: int) -> str:
    failed = "; ".join([*(f"shard {i}: {why.splitlines()[0][:300]}" for i, why in sorted(run.shards_failed.items())[:3]),
                        *run.errors[:3]])
    return (f"{committed} of {shards} shards committed; rerun the same command to finish the rest"
            + (f" ({failed})" if failed else ""))
