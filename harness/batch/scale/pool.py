"""This node's engines for a batch job: one ``engines.batch_worker`` per replica, started once, fed shards.

Each replica gets its own GPUs or CPU cores (``harness.run.replicas.device_envs``, as a
measured run's replicas do) and ``in_flight`` shards at once, all fed to its engine; beyond
that, another shard whenever fewer than ``feed_below(shard_size, capacity)`` of the requests handed to it
are unfinished (a shard commits only when its longest request finishes, so on skewed output
lengths shards-in-flight alone would let the engine's queue run dry behind a few long tails),
up to ``most_held`` shards (``harness.batch.job.feeding``; ``capacity``: the engine's ``max_num_seqs``, as its
``started`` event says). Events from all workers arrive on one queue
as ``(worker, event)``; a worker that ends says ``exit``.

Slots (an in-job tuning whose space holds ``engine.replicas``): the pool may start more workers
than the plan's replicas, ``slots``, each on the device slice ``device_envs(slots, ...)`` gives.
A run with ``r`` replicas runs engines in slots 1..r; the others are *parked* (engine stopped,
process waiting for the next ``restart``) and get no shards. So a switch between one and two
replicas restarts engines in the workers kept, with no new process and no second import of the
engine, where ``slot_misfit`` allows the run on the slots; otherwise the caller
(``harness.batch.launch``) starts a new pool. On the CPU each run's engines are pinned to that run's
own layout (``_job``: a 1-replica run on 2 slots gets all the pool's cores), not to a slot's slice.
Each engine start carries the run's number (``generation``), which ``started`` echoes, so a word
from an engine started for an earlier run is not taken for this run's. A run whose config the
engines up now already run (``runs_as``; an in-job tuning's main phase after a run of the chosen
config) can go on with them (``keep``): no restart; so can a run whose workers were started for its config
before it was asked for (``started_as``: an in-job tuning's first run, its engines up or still starting).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any

from engines import find_unit, registry_env
from engines.common import PROJECT_ROOT
from harness.batch.job.feeding import takes_another
from harness.batch.job.plan import Plan
from harness.core.errors import TroughputError
from harness.run.replicas import AFFINITY_ENV, device_envs
from harness.run.runner import _kill_group




class LocalPool:
    """Batch workers on this node."""

    def __init__(self, plan: Plan, run_dir: Path, log_dir: Path, slots: int | None = None):
        self.plan = plan
        self.slots = slots or plan.replicas  # worker processes; those past plan.replicas are parked
        self.run_dir, self.log_dir = run_dir, log_dir
        self.procs: list[subprocess.Popen] = []
        self.outstanding: list[int] = []
        self.sent: list[int] = []      # requests submitted to each worker
        self.pending: list[int] = []   # its engine's unfinished requests, as last reported
        self.fed: list[int] = []       # requests the worker had fed by then (-1: never reported)
        self.capacity: list[int | None] = []  # its engine's max_num_seqs, as its start said (None: not said)
        self.alive: list[bool] = []
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.log_paths: list[Path] = []
        self.closed = False
        self.restarting: list[bool] = []  # a worker told to restart: its events from before are stale until ``started``
        self.up: list[bool] = []  # its engine said ``started`` (since the last restart)
        self.parked: list[bool] = []  # a slot past the plan's replicas: no engine, no shards
        self.generation = 0  # the run the workers' engines are started for (``started`` echoes it)

    def start(self) -> None:
        """Start one worker per slot; the first ``plan.replicas`` start their engines in the background
        (``started`` events), the others start parked."""
        plan = self.plan
        extra = device_envs(self.slots, plan.device_kind, plan.env)
        env = {**os.environ, **{k: str(v) for k, v in plan.env.items()}, **registry_env(),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i, device in enumerate(extra):
            job_dir = self.run_dir / f"worker{i + 1}"
            job_dir.mkdir(parents=True, exist_ok=True)
            (job_dir / "job.json").write_text(json.dumps(self._job(i)))
            log_path = self.log_dir / f"{self.run_dir.name}.worker{i + 1}.log"
            self.log_paths.append(log_path)
            with open(log_path, "w") as log:
                try:
                    proc = subprocess.Popen([plan.python, "-m", "engines.batch_worker", str(job_dir)],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                            env={**env, **device}, cwd=PROJECT_ROOT, start_new_session=True)
                except OSError as e:
                    self.close()
                    raise TroughputError(f"cannot start the batch worker with {plan.python!r}: {e}; set engine.python "
                                         f"to an interpreter that has the engine installed") from None
            self.procs.append(proc)
            self.outstanding.append(0)
            self.sent.append(0)
            self.pending.append(0)
            self.capacity.append(None)
            self.fed.append(-1)
            self.alive.append(True)
            self.restarting.append(False)
            self.up.append(False)
            self.parked.append(i >= plan.replicas)
            threading.Thread(target=self._follow, args=(i, proc), daemon=True).start()

    @property
    def started(self) -> bool:
        """Workers were started and the pool is not closed."""
        return bool(self.procs) and not self.closed

    @property
    def engines(self) -> int:
        """Workers running an engine in this run (slots not parked)."""
        return self.parked.count(False)

    def restart(self, plan: Plan) -> None:
        """Each live worker's engine restarted in its process with ``plan``'s knobs (an in-job tuning's next run).

        The worker stops its engine once every shard fed so far is done (the driver has collected
        them all), starts the new one and says ``started``; the shards submitted after this go to it.
        Slots past ``plan.replicas`` are told to park instead (their engine stopped the same way);
        a parked slot told to restart starts its engine again.
        """
        why = self.unfit(plan)
        if why:
            raise ValueError(f"these workers cannot run this plan ({why}); start a new pool")
        self.plan = plan
        self.generation += 1
        for i, proc in enumerate(self.procs):
            self.outstanding[i], self.sent[i], self.pending[i], self.fed[i] = 0, 0, 0, -1
            self.capacity[i] = None
            self.restarting[i], self.up[i] = True, False  # a parked slot's events stay stale until it restarts
            self.parked[i] = i >= plan.replicas
            job = self._job(i)
            command = job if self.parked[i] else {"restart": {"job": job}}
            if self.alive[i]:
                with suppress(OSError, ValueError):
                    proc.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]

    def ready(self) -> bool:
        """Every engine of this run is up (said ``started`` since the last restart), none still restarting."""
        running = self._running()
        return self.started and bool(running) and all(self.up[i] and not self.restarting[i] for i in running)

    def runs_as(self, plan: Plan) -> bool:
        """Whether the engines up now already run ``plan``'s config, so ``plan`` can go on with them, no restart
        (``keep``)."""
        return self.ready() and self.started_as(plan)

    def started_as(self, plan: Plan) -> bool:
        """Whether the workers were started (or last restarted) for ``plan``'s config: the same workers' jobs
        (engine, knobs, model limits, cores) and replicas, their engines up or still starting."""
        if plan.replicas != self.plan.replicas or self.unfit(plan):
            return False
        return all(_same_job(self._job(i), self._job(i, plan)) for i in range(len(self.procs)))

    def keep(self, plan: Plan) -> None:
        """Go on with the engines up now for ``plan`` (``runs_as``): no restart, no new ``started``."""
        if not self.runs_as(plan):
            raise ValueError("these engines do not run this plan's config; restart them")
        self.plan = plan

    def _job(self, i: int, plan: Plan | None = None) -> dict[str, Any]:
        """Worker ``i``'s job for this run: ``{"park": true}`` past the plan's replicas; else the engine's job, with
        this run's number and, on the CPU, the cores this run's own layout gives replica ``i``
        (``device_envs(replicas)``: all of the pool's cores for one replica), so that a run with fewer replicas
        than slots is laid out as the same config run on its own would be, not on a slot's slice (and a later
        run with more gets its slices back). ``plan``: another plan's job for that worker (``runs_as``)."""
        plan = plan or self.plan
        if i >= plan.replicas:
            return {"park": True, "engine": plan.engine}   # parked, with the engine imported
        job = {**worker_job(plan), "generation": self.generation}
        if plan.device_kind == "cpu":
            cores = device_envs(plan.replicas, "cpu", plan.env)[i].get(AFFINITY_ENV)
            job["cores"] = ([int(c) for c in cores.split(",")] if cores else sorted(os.sched_getaffinity(0)))
        return job

    def unfit(self, plan: Plan) -> str | None:
        """Why ``plan`` cannot run on these workers with their engines restarted; ``None`` if it can: the same
        engine, environment and Python, every worker alive, and its replicas fit the slots (``slot_misfit``)."""
        if not self.started:
            return "the workers are not up (never started, or stopped after a failed run)"
        if not all(self.alive):
            return "a worker has ended"
        if (plan.engine, plan.env, plan.python) != (self.plan.engine, self.plan.env, self.plan.python):
            return "another engine, environment or Python"
        return slot_misfit(plan, len(self.procs))

    def _follow(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            with suppress(json.JSONDecodeError):
                self.events.put((i, json.loads(line)))
        self.events.put((i, {"event": "exit", "code": proc.wait()}))

    def _takes(self, i: int) -> bool:
        """Whether worker ``i`` should be handed another shard now."""
        if not self.alive[i] or self.parked[i]:
            return False
        return takes_another(self.outstanding[i], self.plan.in_flight, self.plan.shard_size, self.pending[i],
                             self.sent[i], self.fed[i], self.capacity[i])

    def free(self) -> int:
        """How many more shards the live workers can take now (0 or more; one at a time past ``in_flight``)."""
        return sum(max(self.plan.in_flight - n, 1) for i, n in enumerate(self.outstanding) if self._takes(i))

    def submit(self, shard_dir: Path, index: int, requests: int = 0) -> int:
        """Queue a shard on a live worker that takes one (the fewest shards first; never a parked one); return its
        number."""
        takers = [i for i in range(len(self.procs)) if self._takes(i)] or self._running()
        i = min((self.outstanding[i], i) for i in takers)[1]
        self.outstanding[i] += 1
        self.sent[i] += requests
        try:
            self.procs[i].stdin.write(json.dumps({"shard": str(shard_dir), "index": index}) + "\n")  # type: ignore[union-attr]
            self.procs[i].stdin.flush()  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass  # the worker is gone; its exit event follows
        return i

    def next_event(self, timeout: float | None = None) -> tuple[int, dict[str, Any]] | None:
        try:
            i, event = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        if event["event"] == "started":
            if event.get("generation", self.generation) != self.generation or self.parked[i]:
                return None  # an engine started for an earlier run (it got no shard there), since stopped
            self.restarting[i], self.up[i] = False, True
            self.capacity[i] = ((event.get("start") or {}).get("extra") or {}).get("max_num_seqs")
        elif self.restarting[i] and event["event"] == "progress":
            return None  # the previous engine's last word on its (finished) work
        if event["event"] == "progress" and "pending" in event:
            self.pending[i], self.fed[i] = int(event["pending"]), int(event["fed"])
        if event["event"] in ("shard_done", "shard_failed"):
            self.outstanding[i] = max(0, self.outstanding[i] - 1)
        if event["event"] in ("exit", "shard_failed"):
            self.alive[i] = False
        return i, event

    def _running(self) -> list[int]:
        """The live workers that are not parked."""
        return [i for i, alive in enumerate(self.alive) if alive and not self.parked[i]]

    def any_alive(self) -> bool:
        """Whether a worker that is not parked is alive (a parked one takes no shards)."""
        return bool(self._running())

    def kill(self, i: int) -> None:
        """Kill worker ``i``'s process group (a hung engine start); its ``exit`` event follows."""
        _kill_group(self.procs[i])

    def close(self, kill: bool = False) -> None:
        """End of stdin stops each engine; ``kill`` (or a worker that does not stop) kills its process group."""
        self.closed = True
        for proc in self.procs:
            with suppress(OSError, ValueError):
                proc.stdin.close()  # type: ignore[union-attr]
        for proc in self.procs:
            if not kill:
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
            if proc.poll() is None:
                _kill_group(proc)


def _same_job(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two workers' jobs alike but for the run number they carry."""
    return {k: v for k, v in a.items() if k != "generation"} == {k: v for k, v in b.items() if k != "generation"}


def slot_misfit(plan: Plan, slots: int) -> str | None:
    """Why ``plan``'s replicas cannot run on the first of ``slots`` workers laid out by ``device_envs(slots, ...)``;
    ``None`` if they can.

    As many replicas as slots is the plan's own layout. Fewer run on slices cut for more replicas, so
    each must be as big as a replica needs: on the CPU a slot's cores at least the engine's threads
    (``OMP_NUM_THREADS`` in the plan's env; unset: refused), on a GPU a slot's GPUs exactly the
    devices one replica occupies (tensor × pipeline parallel, the engine unit's count; an engine
    without a unit: refused). More replicas than slots never fit.
    """
    if plan.replicas > slots:
        return f"{plan.replicas} replicas on {slots} slots"
    if plan.replicas == slots:
        return None
    try:
        layout = device_envs(slots, plan.device_kind, plan.env)[0]
    except TroughputError as e:
        return str(e)
    if plan.device_kind == "cpu":
        cores = len(layout[AFFINITY_ENV].split(","))
        threads = str(plan.env.get("OMP_NUM_THREADS", ""))
        if not threads.isdigit() or not 0 < int(threads) <= cores:
            return (f"a slot has {cores} CPU cores, and the engine's threads (OMP_NUM_THREADS="
                    f"{threads or 'unset'}) are not known to fit them")
        return None
    if plan.device_kind == "gpu":
        gpus = len(layout["CUDA_VISIBLE_DEVICES"].split(","))
        try:
            engine_unit = find_unit(plan.engine)  # None for a module:Class adapter, which declares no devices
            per_replica = engine_unit.devices(plan.knobs) if engine_unit else None
        except Exception:  # noqa: BLE001 - a count that cannot be made refuses the slots
            per_replica = None
        if per_replica != gpus:
            return f"a slot has {gpus} GPUs, a replica needs {per_replica or 'an unknown number of'}"
        return None
    return f"device kind {plan.device_kind!r}"


def worker_job(plan: Plan) -> dict[str, Any]:
    """The worker's ``job.json`` (and a restart's): the engine, its knobs, the model with the job's limits."""
    return {"engine": plan.engine, "knobs": plan.knobs, "model": {**plan.model, **engine_limits(plan)}}


def engine_limits(plan: Plan) -> dict[str, Any]:
    """What ``engines.worker.workload_limits`` tells an adapter, for requests not seen yet: the model's limits."""
    limits: dict[str, Any] = {"workload_needs_tokenizer": True, "workload_constrained": True}
    if plan.max_model_len:
        limits |= {"workload_max_prompt_tokens": plan.max_model_len, "workload_max_seq_tokens": plan.max_model_len}
    return limits
