"""A batch job as a SLURM array through submitit: task ``t`` of ``T`` runs shards ``t, t + T, ...``.

Each task reads the plan and the index from the output folder (which, like the input, must
be on a filesystem every node sees), runs its shards through a ``LocalPool`` on its node
(``engine.replicas`` engines there) and commits them as a local job does; the submitting
process waits for the array and merges. A task that dies loses only its shards in flight:
rerunning the same command submits tasks for what is left. ``batch.slurm.cluster=local``
runs the tasks as local processes (submitit's ``LocalExecutor``), for tests and laptops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.batch.job.job import ShardsRun, run_shards
from harness.batch.job.plan import Plan
from harness.batch.job.state import JobState
from harness.batch.scale.node import load_index, make_pool
from harness.core.errors import TroughputError
from harness.run.results import new_run_id


def run_array(plan: Plan, state: JobState) -> ShardsRun:
    """Submit the array, wait for every task, and add up what they ran."""
    import submitit

    settings = plan.slurm or {}
    tasks = int(settings.get("tasks", 1))
    if tasks < 1:
        raise TroughputError(f"batch.slurm.tasks={tasks}: must be at least 1")
    executor = submitit.AutoExecutor(folder=state.root / "slurm" / "%j", cluster=settings.get("cluster"))
    executor.update_parameters(name="troughput-batch", **(settings.get("parameters") or {}),
                               **({"slurm_array_parallelism": tasks} if executor.cluster == "slurm" else {}))
    plan_path = state.root / "plan.json"
    jobs = executor.map_array(run_task, [str(plan_path)] * tasks, list(range(tasks)), [tasks] * tasks)
    parts, failures = [], []
    for t, job in enumerate(jobs):
        try:
            parts.append(job.result())
        except Exception as e:  # noqa: BLE001 - a failed task leaves its shards for a rerun
            failures.append(f"array task {t} ({job.job_id}) failed: {str(e).strip().splitlines()[-1][:300]}")
    run = ShardsRun.merged(parts)
    run.errors += failures
    return run


def run_task(plan_path: str, task: int, tasks: int) -> dict[str, Any]:
    """One array task: its share of the uncommitted shards, on this node's engines."""
    state = JobState(Path(plan_path).parent)
    plan = Plan.from_json(Path(plan_path).read_text())
    run = run_shards(plan, state, load_index(state), lambda i: i % tasks == task,
                     make_pool(plan, state, f"{new_run_id()}-task{task}"), progress=False)
    return run.to_dict()
