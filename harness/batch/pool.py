"""This node's engines for a batch job: one ``engines.batch_worker`` per replica, started once, fed shards.

Each replica gets its own GPUs or CPU cores (``harness.run.replicas.device_envs``, as a
measured run's replicas do) and ``in_flight`` shards at once, all fed to its engine; beyond
that, another shard whenever fewer than ``feed_below(shard_size)`` of the requests handed to it
are unfinished (a shard commits only when its longest request finishes, so on skewed output
lengths shards-in-flight alone would let the engine's queue run dry behind a few long tails),
up to ``MAX_IN_FLIGHT_FACTOR × in_flight`` shards. Events from all workers arrive on one queue
as ``(worker, event)``; a worker that ends says ``exit``.
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

from engines import registry_env
from engines.common import PROJECT_ROOT
from harness.batch.plan import Plan
from harness.core.errors import TroughputError
from harness.run.replicas import device_envs
from harness.run.runner import _kill_group


MAX_IN_FLIGHT_FACTOR = 4  # bounds the shards one engine holds (work redone after a crash)


def feed_below(shard_size: int) -> int:
    """Unfinished requests under which an engine is handed another shard: two shards' worth, at least 512
    (about twice a typical ``max_num_seqs``), so that freed sequence slots always find queued requests."""
    return max(2 * shard_size, 512)


class LocalPool:
    """Batch workers on this node."""

    def __init__(self, plan: Plan, run_dir: Path, log_dir: Path):
        self.plan = plan
        self.run_dir, self.log_dir = run_dir, log_dir
        self.procs: list[subprocess.Popen] = []
        self.outstanding: list[int] = []
        self.sent: list[int] = []      # requests submitted to each worker
        self.pending: list[int] = []   # its engine's unfinished requests, as last reported
        self.fed: list[int] = []       # requests the worker had fed by then (-1: never reported)
        self.alive: list[bool] = []
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.log_paths: list[Path] = []
        self.closed = False
        self.restarting: list[bool] = []  # a worker told to restart: its events from before are stale until ``started``
        self.up: list[bool] = []  # its engine said ``started`` (since the last restart)

    def start(self) -> None:
        """Start one worker per replica; their engines come up in the background (``started`` events)."""
        plan = self.plan
        extra = device_envs(plan.replicas, plan.device_kind, plan.env)
        env = {**os.environ, **{k: str(v) for k, v in plan.env.items()}, **registry_env(),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
        job = worker_job(plan)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i, device in enumerate(extra):
            job_dir = self.run_dir / f"worker{i + 1}"
            job_dir.mkdir(parents=True, exist_ok=True)
            (job_dir / "job.json").write_text(json.dumps(job))
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
            self.fed.append(-1)
            self.alive.append(True)
            self.restarting.append(False)
            self.up.append(False)
            threading.Thread(target=self._follow, args=(i, proc), daemon=True).start()

    @property
    def started(self) -> bool:
        """Workers were started and the pool is not closed."""
        return bool(self.procs) and not self.closed

    def restart(self, plan: Plan) -> None:
        """Each live worker's engine restarted in its process with ``plan``'s knobs (an in-job tuning's next run).

        The worker stops its engine once every shard fed so far is done (the driver has collected
        them all), starts the new one and says ``started``; the shards submitted after this go to it.
        """
        if not self.restartable(plan):
            raise ValueError("a restart keeps the engine, the replicas and the environment; start a new pool")
        self.plan = plan
        for i, proc in enumerate(self.procs):
            self.outstanding[i], self.sent[i], self.pending[i], self.fed[i] = 0, 0, 0, -1
            self.restarting[i], self.up[i] = True, False
            if self.alive[i]:
                with suppress(OSError, ValueError):
                    proc.stdin.write(json.dumps({"restart": {"job": worker_job(plan)}}) + "\n")  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]

    def restartable(self, plan: Plan) -> bool:
        """Whether ``plan`` can run on these workers with their engines restarted: same engine, replicas, env."""
        return (self.started and all(self.alive) and plan.engine == self.plan.engine
                and plan.replicas == self.plan.replicas and plan.env == self.plan.env
                and plan.python == self.plan.python)

    def _follow(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            with suppress(json.JSONDecodeError):
                self.events.put((i, json.loads(line)))
        self.events.put((i, {"event": "exit", "code": proc.wait()}))

    def _takes(self, i: int) -> bool:
        """Whether worker ``i`` should be handed another shard now."""
        if not self.alive[i]:
            return False
        if self.outstanding[i] < self.plan.in_flight:
            return True
        if self.fed[i] < 0:  # the worker has not said how many requests it holds (a serial feeder never does)
            return False
        unfinished = self.pending[i] + self.sent[i] - self.fed[i]  # reported, plus sent but not yet fed
        return (self.outstanding[i] < MAX_IN_FLIGHT_FACTOR * self.plan.in_flight
                and unfinished < feed_below(self.plan.shard_size))

    def free(self) -> int:
        """How many more shards the live workers can take now (0 or more; one at a time past ``in_flight``)."""
        return sum(max(self.plan.in_flight - n, 1) for i, n in enumerate(self.outstanding) if self._takes(i))

    def submit(self, shard_dir: Path, index: int, requests: int = 0) -> int:
        """Queue a shard on a live worker that takes one (the fewest shards first); return its number."""
        takers = [i for i in range(len(self.procs)) if self._takes(i)] or [i for i, a in enumerate(self.alive) if a]
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
            self.restarting[i], self.up[i] = False, True
        elif self.restarting[i] and event["event"] == "progress":
            return None  # the previous engine's last word on its (finished) work
        if event["event"] == "progress" and "pending" in event:
            self.pending[i], self.fed[i] = int(event["pending"]), int(event["fed"])
        if event["event"] in ("shard_done", "shard_failed"):
            self.outstanding[i] = max(0, self.outstanding[i] - 1)
        if event["event"] in ("exit", "shard_failed"):
            self.alive[i] = False
        return i, event

    def any_alive(self) -> bool:
        return any(self.alive)

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


def worker_job(plan: Plan) -> dict[str, Any]:
    """The worker's ``job.json`` (and a restart's): the engine, its knobs, the model with the job's limits."""
    return {"engine": plan.engine, "knobs": plan.knobs, "model": {**plan.model, **engine_limits(plan)}}


def engine_limits(plan: Plan) -> dict[str, Any]:
    """What ``engines.worker.workload_limits`` tells an adapter, for requests not seen yet: the model's limits."""
    limits: dict[str, Any] = {"workload_needs_tokenizer": True, "workload_constrained": True}
    if plan.max_model_len:
        limits |= {"workload_max_prompt_tokens": plan.max_model_len, "workload_max_seq_tokens": plan.max_model_len}
    return limits
