"""``batch.scale=ray``: a job's uncommitted shards as one Ray Data pipeline (stages in ``ray_stages``).

The driver joins the cluster (``batch.ray.address``; none: a local Ray) with troughput's code
as the job's ``runtime_env`` ``working_dir``, builds read → convert → engine → commit, and
reads back one small row per committed shard for the progress bar. Reading and committing
run on the driver's node (``label_selector`` on its node id), so the input and
``batch.output_dir`` need only be there; conversion and engines run anywhere. What this
invocation did is counted from the shards' ``meta.json`` afterwards, so shards committed
before Ray gave up still count.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engines import registry, registry_env
from engines.common import PROJECT_ROOT
from harness.batch.job.job import ShardsRun, job_id, shard_records
from harness.batch.job.plan import Plan
from harness.batch.job.progress import Progress
from harness.batch.job.shards import Index
from harness.batch.job.state import JobState
from harness.core.errors import TroughputError

log = logging.getLogger(__name__)

# Kept out of the working_dir Ray uploads (it also skips what .gitignore names); at most 512 MiB.
EXCLUDES = [".git", ".venv", ".venvs", ".cache", "results", "reports", "outputs", "multirun", "docs", "*.log"]
NODE_LABEL = "ray.io/node-id"
SMALL_TASK_CPUS = 0.25  # read, convert and commit tasks: whole CPUs would starve the engines on a small node


def runtime_env(plan: Plan) -> dict[str, Any]:
    """troughput's code for every worker, a plugin engine's package too, and the job's environment variables
    (``hardware.env``, ``engine.env``)."""
    env = {"working_dir": str(PROJECT_ROOT), "excludes": EXCLUDES,
           "env_vars": {**{k: str(v) for k, v in plan.env.items()}, **registry_env()}}   # no metadata on nodes
    plugin = plugin_package(plan.engine)
    if plugin is not None:
        env["py_modules"] = [str(plugin)]
    return env


def plugin_package(engine: str) -> Path | None:
    """The folder of the top-level package holding ``engine``'s unit, where it lies outside troughput's checkout
    (a plugin installed on the driver only): Ray ships it to the nodes as a ``py_modules`` entry."""
    import importlib.util

    target = registry().get(engine) or (engine if ":" in engine else None)
    spec = importlib.util.find_spec(target.split(":")[0].split(".")[0]) if target else None
    if spec is None or not spec.submodule_search_locations:
        return None   # unknown, or a single-module plugin: it must be installed on the nodes
    folder = Path(next(iter(spec.submodule_search_locations))).resolve()
    return None if folder.is_relative_to(PROJECT_ROOT.resolve()) else folder


def settings(plan: Plan) -> dict[str, Any]:
    """``batch.ray`` checked: actors (unset: ``engine.replicas``, so a decision's replicas are its engine actors),
    CPUs and GPUs per actor, placement bundles."""
    ray = {"actors": None, "num_cpus": 1, "num_gpus": 0, "bundles": None, "max_restarts": 10, **(plan.ray or {})}
    if ray["actors"] is None:
        ray["actors"] = plan.replicas
    if isinstance(ray["actors"], bool) or not isinstance(ray["actors"], int) or ray["actors"] < 1:
        raise TroughputError(f"batch.ray.actors={ray['actors']!r}: must be an integer >= 1")
    if isinstance(ray["max_restarts"], bool) or not isinstance(ray["max_restarts"], int) or ray["max_restarts"] < 0:
        raise TroughputError(f"batch.ray.max_restarts={ray['max_restarts']!r}: must be an integer >= 0 (-1, "
                             f"unbounded, would loop on a shard that fails every engine)")
    for key in ("num_cpus", "num_gpus"):
        if isinstance(ray[key], bool) or not isinstance(ray[key], (int, float)) or ray[key] < 0:
            raise TroughputError(f"batch.ray.{key}={ray[key]!r}: must be a number >= 0")
    bundles = ray["bundles"]
    if bundles is not None and (not isinstance(bundles, list) or not bundles
                                or not all(isinstance(b, dict) and b for b in bundles)):
        raise TroughputError(f"batch.ray.bundles={bundles!r}: give a list of resource dicts, one per engine "
                             "worker, e.g. [{GPU: 1, CPU: 1}, {GPU: 1, CPU: 1}] for tensor_parallel_size=2")
    return ray


def run_ray(plan: Plan, state: JobState, index: Index, progress: bool = True,
            wanted: Callable[[int], bool] | None = None, cluster: Any = None) -> ShardsRun:
    """Run every uncommitted shard of ``plan`` (that ``wanted`` accepts) on Ray Data; what this invocation
    committed, from the shards. Each call is one pipeline whose engine actors start with ``plan``'s knobs;
    ``cluster``: a ``session`` already joined (an in-job tuning's phases share one), else one for this call."""
    opts = settings(plan)
    before = state.committed()
    todo = [i for i in range(index.shards(plan.shard_size)) if i not in before and (wanted is None or wanted(i))]
    run = ShardsRun()
    if not todo:
        return run
    if cluster is None:
        with session(plan) as joined:
            return run_ray(plan, state, index, progress, wanted, joined)
    total = sum(shard_records(index, plan.shard_size, i) for i in range(index.shards(plan.shard_size)))
    bar = Progress(total, total - sum(shard_records(index, plan.shard_size, i) for i in todo), progress)
    began = time.time()  # when the pipeline starts (after joining the cluster)
    groups: list[Any] = []  # the placement groups its engine actors were given (batch.ray.bundles)
    key = uuid.uuid4().hex  # where its engine actors say why they ended themselves (``ray_stages.say``)
    try:
        for row in pipeline(plan, index, todo, {**opts, "gpus": cluster.gpus, "groups": groups,
                                                "report_key": key}).iter_rows():
            meta = json.loads(row["meta"])
            if not meta.get("dropped"):
                bar.shard_done(-1, meta["requests"], meta["output_tokens"])
                run.steps.extend(json.loads(row.get("steps") or "null"))  # the job's trace, as on one node
    except Exception as e:  # noqa: BLE001 - Ray gave up; what was committed stays, a rerun resumes
        run.errors.append(f"the Ray Data job stopped: {explain(e, key)}")
        log.error("Ray Data job failed", exc_info=True)
    finally:
        bar.close()
        release(groups)
        _forget(key)
    return tally(state, sorted(state.committed() - before), run, began)


def _forget(key: str) -> None:
    """What this pipeline's engine actors left in Ray's store removed (``ray_stages.forget``)."""
    from harness.batch.scale.ray_stages import forget

    try:
        forget(key)
    except Exception:  # noqa: BLE001 - the store is gone with the session
        log.debug("could not clear the actors' reports of pipeline %s", key, exc_info=True)


def explain(error: Exception, key: str) -> str:
    """Why Ray gave up, in one line: what the engine actors that ended themselves said (Ray's message for a dead actor
    has no reason: ``ray_stages.say``), else the error's last line."""
    from harness.batch.scale.ray_stages import said

    lines = str(error).strip().splitlines()
    ray_said = f"{type(error).__name__}: {lines[-1][:300] if lines else ''}"
    try:
        reasons = said(key)
    except Exception:  # noqa: BLE001 - the store is gone with the session: Ray's own words
        reasons = []
    if not reasons:
        return ray_said
    more = f" (and {len(reasons) - 1} more such exits)" if len(reasons) > 1 else ""
    return f"an engine actor ended itself: {reasons[-1]}{more}; Ray then gave up ({ray_said[:200]})"


def release(groups: list[Any]) -> int:
    """Remove the placement groups a pipeline's engine actors were given, once it is over (its actors are gone, or
    go with them): each run of a job (an in-job tuning's phase) shares one Ray session, and a group left behind
    keeps its GPUs reserved for the session's later runs. Returns how many were removed."""
    if not groups:
        return 0
    from ray.util.placement_group import remove_placement_group

    removed = 0
    while groups:
        group = groups.pop()
        try:
            remove_placement_group(group)
            removed += 1
        except Exception as e:  # noqa: BLE001 - one that cannot be removed must not hide the job's outcome
            log.warning("could not remove placement group %s: %s", getattr(group, "id", group), e)
    return removed


@contextmanager
def session(plan: Plan) -> Iterator[Any]:
    """The job's Ray cluster joined (``batch.ray.address``, else a new local one), left at the end."""
    import ray

    from engines.ray_cluster import connect

    address = settings(plan).get("address") or None
    try:
        cluster = connect(address, None, runtime_env=runtime_env(plan))
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise TroughputError(f"cannot join the Ray cluster at {address!r}: {e}") from None
    try:
        yield cluster
    finally:
        ray.shutdown()


def pipeline(plan: Plan, index: Index, todo: list[int], opts: dict[str, Any]) -> Any:
    """read → convert (tasks) → engine (actor pool) → commit (tasks), lazily; nothing runs until iterated.

    With ``engine=ray`` the engine and commit stages are Ray Data LLM's processor and ``ray_llm``'s.
    """
    import ray
    from ray.data import ActorPoolStrategy, TaskPoolStrategy

    from harness.batch.job.feeding import most_held
    from harness.batch.scale.pool import engine_limits
    from harness.batch.scale.ray_stages import EngineStage, commit, convert, shard_source

    here = {NODE_LABEL: ray.get_runtime_context().get_node_id()}
    plan_json = plan.to_json()
    job = {"engine": plan.engine, "knobs": plan.knobs, "model": {**plan.model, **engine_limits(plan)}}
    ds = ray.data.read_datasource(shard_source(plan.input, plan.format, plan.shard_size, todo),
                                  num_cpus=SMALL_TASK_CPUS, label_selector=here)
    # At most as many shards converted (and committed) at once as the engines take at once: more only buffers
    # ahead, and each task slot is a worker process that imports the tokenizer (8 shards at once on a 2-core
    # node starved the engine actor's start for minutes).
    ahead = TaskPoolStrategy(size=opts["actors"] * plan.in_flight)
    ds = ds.map_batches(convert, batch_size=1, num_cpus=SMALL_TASK_CPUS, compute=ahead,
                        fn_kwargs={"plan_json": plan_json, "duplicates": index.duplicates})
    if plan.engine == "ray":
        return _through_ray_llm(ds, plan, opts, here, ahead)
    # up to the one-node rule's most shards (feeding.most_held, at the knobs' max_num_seqs) calls on each actor; its
    # gate feeds each to the engine by that rule (its unfinished requests), the rest wait there, shard converted
    feeding = {"in_flight": plan.in_flight, "shard_size": plan.shard_size}
    ds = ds.map_batches(EngineStage, batch_size=1,
                        fn_constructor_kwargs={"job": job, "feeding": feeding, "exit_on_failure": True,
                                               "stall_timeout_s": plan.stall_timeout_s,
                                               "report_key": opts.get("report_key")},
                        compute=ActorPoolStrategy(size=opts["actors"],
                                                  max_concurrent_calls_per_actor=most_held(
                                                      plan.shard_size, plan.in_flight, _max_num_seqs(plan)),
                                                  enable_true_multi_threading=True),  # calls feed one engine
                        max_restarts=opts["max_restarts"], max_task_retries=-1,   # a failed engine's actor exits
                        **engine_resources(opts))
    return ds.map_batches(commit, batch_size=1, num_cpus=SMALL_TASK_CPUS, label_selector=here, compute=ahead,
                          fn_kwargs={"plan_json": plan_json, "job": job_id(plan)})


def _max_num_seqs(plan: Plan) -> int | None:
    """The engines' ``max_num_seqs`` where the plan's knobs set it (Ray's concurrency is fixed before they start)."""
    value = plan.knobs.get("max_num_seqs")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def _through_ray_llm(ds: Any, plan: Plan, opts: dict[str, Any], here: dict[str, str], ahead: Any) -> Any:
    from ray.data import ActorPoolStrategy

    from harness.batch.scale.ray_llm import ShardAssembler, explode, processor

    ds = ds.map_batches(explode, batch_size=1, num_cpus=SMALL_TASK_CPUS, compute=ahead)
    ds = processor(plan, opts["gpus"], opts["actors"])(ds)
    return ds.map_batches(ShardAssembler, batch_format="pandas", num_cpus=SMALL_TASK_CPUS, label_selector=here,
                          compute=ActorPoolStrategy(size=1),
                          fn_constructor_kwargs={"plan_json": plan.to_json(), "job": job_id(plan)})


def engine_resources(opts: dict[str, Any]) -> dict[str, Any]:
    """Each engine actor's resources: ``num_cpus``/``num_gpus``, or a placement group of ``bundles`` (TP, PP), one
    per actor Ray Data creates (``ray_remote_args_fn`` runs in ``ActorPoolMapOperator._start_actor``); an actor Ray
    restarts (``batch.ray.max_restarts``) keeps its creation options, so it goes back into its own group, and no new
    one is made. Each group made is appended to ``opts["groups"]``, which ``run_ray`` releases when its pipeline is
    over (``release``)."""
    bundles = opts.get("bundles")
    if not bundles:
        return {"num_cpus": float(opts["num_cpus"]), "num_gpus": float(opts["num_gpus"])}

    def in_placement_group() -> dict[str, Any]:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group([{k: float(v) for k, v in b.items()} for b in bundles], strategy="PACK")
        opts.setdefault("groups", []).append(group)
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_capture_child_tasks=True)}

    # Ray Data's only per-actor hook for a placement group (deprecated for Ray 2.64); the actor
    # itself takes the first bundle's share, vLLM's Ray executor (distributed_executor_backend=ray)
    # places its workers in the group.
    return {"num_cpus": 0, "num_gpus": 0, "ray_remote_args_fn": in_placement_group}


def tally(state: JobState, indices: list[int], run: ShardsRun, began: float | None = None) -> ShardsRun:
    """``run`` with the shards ``indices`` (committed by this invocation) counted from their ``meta.json``.

    ``began``: when the pipeline started (``time.time()``); where no shard records its engine's start
    (``engine=ray``: Ray Data LLM starts its replicas inside the pipeline), ``startup_s`` is the time
    until the first request reached an engine, as ``troughput-run engine=ray`` counts it.
    """
    starts, ends, startups = [], [], []
    for i in indices:
        meta = state.meta(i)
        run.add(meta)
        # the engine's own step count (its latest, per actor process: a restarted actor's engine counts anew), as
        # the local runner takes it from each worker's results
        run.engine_counted(f"{meta.get('engine_node')}/{meta.get('engine_pid')}", meta.get("engine_steps_since_start"))
        run.peak_worker_rss_bytes = max(run.peak_worker_rss_bytes, meta.get("peak_rss_bytes") or 0)
        if meta.get("started_at"):
            starts.append(meta["started_at"])
            ends.append(meta["committed_at"])
        if meta.get("startup_s") is not None:
            startups.append(float(meta["startup_s"]))
    if starts:  # first shard's generation to last commit; engine start-up outside, restarts inside
        run.generation_s = max(ends) - min(starts)
    run.startup_s = max(startups, default=None)
    if run.startup_s is None and starts and began is not None:
        run.startup_s = max(0.0, min(starts) - began)
    return run
