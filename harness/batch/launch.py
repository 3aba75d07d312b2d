"""One invocation of a batch job: adopt the folder, scan the file, run the shards where ``scale`` says, merge, record."""

from __future__ import annotations

import json
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.batch.job.job import ShardsRun, SoFar, run_shards
from harness.batch.job.plan import Plan
from harness.batch.job.row import BATCH_TABLE, batch_row
from harness.batch.job.shards import scan
from harness.batch.job.state import JobState
from harness.batch.scale.node import load_index, make_pool
from harness.core.errors import TroughputError
from harness.run.results import new_run_id, write_row
from harness.steps.store import job_trace_columns

SCALES = ("local", "ray", "slurm")
log = logging.getLogger("troughput.batch.tune")


def run_job(plan: Plan, progress: bool = True, tuning: tuple[Callable[..., Plan], dict[str, Any]] | None = None
            ) -> dict[str, Any]:
    """Run what is left of ``plan``'s job; merge the outputs when every shard is committed; return its row.

    ``tuning``: ``(plan_for, base config)`` for a job with ``plan.tune`` (``harness.batch.tune.tune_config``):
    its tuning phase and main phase run here (``harness.batch.tune.tuning``).
    """
    if plan.scale not in SCALES:
        raise TroughputError(f"batch.scale={plan.scale!r}: use one of {', '.join(SCALES)}")
    if plan.engine == "ray" and plan.scale != "ray":  # its local worker would run one Ray Data job per shard
        raise TroughputError(f"engine=ray with batch.scale={plan.scale} would start its vLLM replicas again for "
                             "every shard (each generate call is one Ray Data job): use batch.scale=ray, where Ray "
                             "Data LLM's processor is the engine stage, started once (no batch.ray.address: a local "
                             "Ray)")
    started, t0, run_id = datetime.now(timezone.utc), time.monotonic(), new_run_id()
    state = JobState(plan.output_dir)
    scanning = time.monotonic()
    index = scan(Path(plan.input), plan.format)  # the one pass over every line: counts, repeated ids, content hash
    scan_s = time.monotonic() - scanning
    if index.records == 0:
        raise TroughputError(f"{plan.input} holds no records")
    plan.input_digest = index.digest
    state.adopt(plan)
    (state.root / "index.json").write_text(json.dumps(asdict(index)))
    extra: dict[str, Any] = {}
    if plan.tune:
        run, extra = _tuned(plan, state, index, tuning, progress)
    elif plan.scale == "slurm":
        from harness.batch.scale.slurm import run_array

        run = run_array(plan, state)
    elif plan.scale == "ray":
        from harness.batch.scale.ray_job import run_ray

        run = run_ray(plan, state, index, progress)
    else:
        run = run_shards(plan, state, index, lambda _: True, make_pool(plan, state, run_id), progress)
    committed = len(state.committed())
    outputs: dict[str, str | None] = {"output": None, "errors": None}
    merge_s = None   # no merge while shards are left
    if committed == index.shards(plan.shard_size):
        merging = time.monotonic()
        output, errors = state.merge(committed)
        merge_s = time.monotonic() - merging
        outputs = {"output": str(output), "errors": str(errors)}
    # answered over the whole job: read from the shards' metas only when this run answered none (a rerun of a
    # finished job runs nothing, yet its job did answer)
    job_ok = None if run.requests_ok else sum(int(state.meta(i)["ok"]) for i in state.committed())
    row = batch_row(plan, run_id, started, index, run, committed, time.monotonic() - t0, peak_rss_bytes(), outputs,
                    {"scan_s": scan_s, "merge_s": merge_s, **(extra or {}),
                     **job_trace_columns(plan.results_dir, run_id, run.steps.snapshot())}, job_ok)
    write_row(plan.results_dir, row, kind=BATCH_TABLE)
    return row


def _tuned(plan: Plan, state: JobState, index: Any, tuning: Any, progress: bool) -> tuple[ShardsRun, dict[str, Any]]:
    """The tuning phase, then the main phase, each run one engine start on this node (but a main phase on kept
    engines, below).

    On this node, with ``batch.tune.restart=in_process``, the workers are started for the most replicas
    a run can ask for (``replica_slots``) where the run's layout allows (``pool.slot_misfit``), and kept:
    a run with fewer replicas leaves the other slots parked. A run they cannot take gets a new pool.
    The main phase goes on with the last run's engines, no restart, where they run its config already
    (``LocalPool.runs_as``: the last run of the tuning phase ran the chosen config); every other run starts
    its engines. The first run's workers may be started ahead (``start_ahead``): their import and engine start
    go on while the study is set up, and that run takes them as they are.
    """
    from harness.batch.scale.pool import slot_misfit
    from harness.batch.tune.tune_config import replica_slots
    from harness.batch.tune.tuning import InJobTuning

    if tuning is None:
        raise TroughputError("a job with batch.tune needs its config to build each trial's plan (troughput-batch)")
    plan_for, base = tuning
    pools: list[Any] = []  # the local workers, kept up between runs (engines restarted in them)
    ahead: list[Any] = []  # a pool started ahead for the first run, not yet taken by it
    in_process = plan.tune.get("restart") == "in_process"
    slots = replica_slots(plan) if in_process else 0

    def new_pool(phase: Plan, label: str, why: str) -> Any:
        if pools:
            pools[-1].close()
        refused = slot_misfit(phase, slots) if slots > phase.replicas else None
        size = slots if slots > phase.replicas and refused is None else phase.replicas
        log.info("%s: new workers (slots %d, replicas %d): %s%s", label, size, phase.replicas, why,
                 f"; not {slots} slots: {refused}" if refused else "")
        pools.append(make_pool(phase, state, new_run_id(), size))
        return pools[-1]

    def start_ahead(phase: Plan) -> None:
        """The first run's workers started now, before the run is asked for (their start goes on meanwhile)."""
        if not pools:
            new_pool(phase, phase.phase.get("run", "run"), "the first run, started ahead").start()
            ahead.append(pools[-1])

    def run_phase(phase: Plan, target: JobState, shards: set[int],
                  on_commit: Callable[[SoFar], bool] | None = None) -> ShardsRun:
        """One run of the tuned job. ``on_commit``: called as each shard commits; true stops handing over shards
        (``run_shards``)."""
        pool = pools[-1] if pools else None
        label = phase.phase.get("run", "run")
        if ahead and ahead.pop() is pool and pool.started_as(phase):
            log.info("%s: the workers started ahead for it", label)
            pool.plan = phase
            run = run_shards(phase, target, index, shards.__contains__, pool, progress, keep_open=True,
                             on_commit=on_commit)
            run.started_ahead = True
            return run
        if pool is None:
            why = "the first run"
        else:
            why = pool.unfit(phase) if in_process else "batch.tune.restart=new_worker"
        if pool is not None and phase.phase.get("phase") == "main" and pool.runs_as(phase):
            # the last run's engines already run the chosen config: no second start of it
            log.info("%s: the engines of the last run kept: they run this config already (no restart)", label)
            pool.keep(phase)
            return run_shards(phase, target, index, shards.__contains__, pool, progress, keep_open=True,
                              engines_kept=True, on_commit=on_commit)
        if why is None:
            log.info("%s: workers kept, engines restarted in %d of %d slots, %d parked", label, phase.replicas,
                     pool.slots, pool.slots - phase.replicas)
            pool.restart(phase)
        else:
            pool = new_pool(phase, label, why)
        return run_shards(phase, target, index, shards.__contains__, pool, progress, keep_open=True,
                          on_commit=on_commit)

    try:
        outcome = InJobTuning(plan, state, index, plan_for, run_phase, base, start_ahead).run()
    finally:
        if pools:
            pools[-1].close()
    return ShardsRun.sequential(outcome.runs, state.committed()), outcome.columns


def peak_rss_bytes() -> int:
    """This process's peak resident memory (the driver; engines are separate processes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


__all__ = ["ShardsRun", "load_index", "make_pool", "run_job"]
