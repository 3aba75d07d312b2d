"""A batch job's engines as Ray actors: each holds one of troughput's engine adapters, started once.

The driver keeps the shards: it sends an actor a shard's requests, gets back the completions
(``engines.batch_worker.run_shard``) and writes them beside the shard as a local worker
would, so committing, resuming and the output are the same as on one node. Actors run in
the cluster's own Python (``engine.python`` does not apply) and are placed by Ray
(``batch.ray.num_cpus`` / ``num_gpus`` each). ``batch.ray.address`` joins a running cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engines.batch_worker import ShardActor, read_requests, write_whole
from engines.common import PROJECT_ROOT
from harness.batch.plan import Plan
from harness.errors import TroughputError


class RayPool:
    """``batch.ray.actors`` engines in a Ray cluster, the same interface as ``LocalPool``."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.settings = plan.ray or {}
        self.actors: list[Any] = []
        self.alive: list[bool] = []
        self.outstanding: list[int] = []
        self.pending: dict[Any, tuple[int, str | None]] = {}  # object ref -> (actor, shard dir or None for start)
        self.connected = False

    def start(self) -> None:
        import ray

        from harness.batch.pool import engine_limits

        env = {**{k: str(v) for k, v in self.plan.env.items()},
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
        address = self.settings.get("address") or None
        local = {} if address else {"include_dashboard": False}
        try:
            ray.init(address=address, runtime_env={"env_vars": env}, ignore_reinit_error=True, log_to_driver=False,
                     **local)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise TroughputError(f"cannot join the Ray cluster at {self.settings.get('address')!r}: {e}") from None
        self.connected = True
        actor_class = ray.remote(num_cpus=float(self.settings.get("num_cpus", 1)),
                                 num_gpus=float(self.settings.get("num_gpus", 0)), max_restarts=0)(ShardActor)
        job = {"engine": self.plan.engine, "knobs": self.plan.knobs,
               "model": {**self.plan.model, **engine_limits(self.plan)}}
        for i in range(int(self.settings.get("actors", 1))):
            actor = actor_class.remote(job)
            self.actors.append(actor)
            self.alive.append(True)
            self.outstanding.append(0)
            self.pending[actor.start.remote()] = (i, None)

    def free(self) -> int:
        return sum(self.plan.in_flight - n for n, alive in zip(self.outstanding, self.alive) if alive)

    def any_alive(self) -> bool:
        return any(self.alive)

    def submit(self, shard_dir: Path, index: int, count: int = 0) -> int:  # count: LocalPool's, unused here
        i = min((n, i) for i, (n, alive) in enumerate(zip(self.outstanding, self.alive)) if alive)[1]
        requests = [r.to_dict() for r in read_requests(shard_dir / "requests.jsonl")]
        self.outstanding[i] += 1
        self.pending[self.actors[i].run.remote(requests, index)] = (i, str(shard_dir))
        return i

    def next_event(self, timeout: float | None = None) -> tuple[int, dict[str, Any]] | None:
        import ray

        if not self.pending:
            return None
        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=timeout)
        if not ready:
            return None
        i, shard_dir = self.pending.pop(ready[0])
        try:
            value = ray.get(ready[0])
        except ray.exceptions.RayError as e:
            self.alive[i] = False
            return i, {"event": "exit", "code": None, "error": f"Ray actor {i + 1}: {str(e).splitlines()[0][:500]}"}
        if shard_dir is None:
            return i, {"event": "started", "start": value}
        self.outstanding[i] -= 1
        write_whole(Path(shard_dir) / "result.json", value)
        return i, {"event": "shard_done", "shard": shard_dir, **value["measured"], "errors": len(value["errors"])}

    def close(self, kill: bool = False) -> None:
        import ray

        if not self.connected:
            return
        for actor, alive in zip(self.actors, self.alive):
            if alive and not kill:
                try:
                    ray.get(actor.stop.remote(), timeout=60)
                except ray.exceptions.RayError:
                    pass
            ray.kill(actor)
        ray.shutdown()
        self.connected = False
