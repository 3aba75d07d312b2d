"""The Ray cluster an ``engine=ray`` run uses: a running one by address, or a local one started here.

What the rows record of it (nodes, CPUs, GPUs), whether one engine replica fits at all
(Ray would otherwise wait forever for a GPU or an accelerator type the cluster lacks),
and how often Ray restarted an engine actor. Imported on the worker side only.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.base import EngineUnavailable

ENGINE_ACTOR = "MapWorker"   # Ray Data's actor class holding one engine replica


def connect(address: str | None, num_cpus: float | None, runtime_env: dict[str, Any] | None = None) -> Cluster:
    """``ray.init`` on ``address``; without one, a new local Ray (never one found on this host by chance).

    ``runtime_env``: the job's (``batch.scale=ray`` ships troughput's code as its ``working_dir``).
    """
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")   # no network at run time
    if address:
        if "RAY_AUTH_MODE" not in os.environ and _token_available():
            _use_token_auth()   # ray 2.60 heads use token auth by default; a joining driver must say so
        ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
    else:
        ray.init(address="local", num_cpus=num_cpus or max(4, os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=True, runtime_env=runtime_env)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    alive = [n for n in ray.nodes() if n.get("Alive")]
    resources = ray.cluster_resources()
    return Cluster(address=address or "local", nodes=len(alive), cpus=float(resources.get("CPU", 0)),
                   gpus=float(resources.get("GPU", 0)), resources=dict(resources),
                   auth=os.environ.get("RAY_AUTH_MODE", "default"))


def _use_token_auth() -> None:
    """``RAY_AUTH_MODE=token`` for this process, with Ray's cached config refreshed (``ray`` is imported by now)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        from ray._raylet import Config

        Config.initialize("")   # what ray does itself when it turns token auth on for a new cluster
    except (ImportError, AttributeError):
        pass


def _token_available() -> bool:
    """Whether this host holds a Ray auth token: ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ~/.ray/auth_token."""
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or (Path.home() / ".ray" / "auth_token").is_file())


@dataclass
class Cluster:
    address: str
    nodes: int
    cpus: float
    gpus: float
    resources: dict[str, float]
    auth: str = "default"

    def describe(self) -> dict[str, Any]:
        """What the row records (``engine_info.ray_*``)."""
        return {"ray_address": self.address, "ray_nodes": self.nodes, "ray_cpus": self.cpus, "ray_gpus": self.gpus,
                "ray_auth": self.auth}

    def check_fits(self, config: Any) -> None:
        """Raise ``EngineUnavailable`` when the cluster cannot hold the smallest pool of engine replicas."""
        per_replica = replica_resources(config)
        concurrency = config.concurrency
        smallest = concurrency[0] if isinstance(concurrency, tuple) else 1
        accelerator = config.accelerator_type
        if accelerator and f"accelerator_type:{accelerator}" not in self.resources:
            raise EngineUnavailable(f"accelerator_type={accelerator!r}: no node of the Ray cluster at "
                                    f"{self.address} has it; its resources: {sorted(self.resources)}")
        short = {name: (need * smallest, self.resources.get(name, 0.0)) for name, need in per_replica.items()
                 if need * smallest > self.resources.get(name, 0.0)}
        if short:
            wanted = ", ".join(f"{name} {need:g} (has {have:g})" for name, (need, have) in short.items())
            raise EngineUnavailable(f"{smallest} engine replica(s) of {per_replica} each do not fit the Ray "
                                    f"cluster at {self.address}: it lacks {wanted}; Ray would wait for them "
                                    "forever. Set placement_group_config, concurrency or num_cpus")


def replica_resources(config: Any) -> dict[str, float]:
    """Resources one engine replica asks for: its placement bundles, or Ray's default GPU bundle per worker."""
    engine = config.engine_kwargs
    workers = int(engine.get("tensor_parallel_size") or 1) * int(engine.get("pipeline_parallel_size") or 1)
    placement = config.placement_group_config or {}
    bundles = placement.get("bundles") or [placement.get("bundle_per_worker") or {"CPU": 1, "GPU": 1}] * workers
    total: Counter = Counter()
    for bundle in bundles:
        total.update({k: float(v) for k, v in bundle.items() if v})
    return dict(total)


def actor_restarts() -> int:
    """Restarts of Ray Data actors in this job so far (Ray restarts a replica whose process died)."""
    try:
        import ray
        from ray._private.state import actors   # Ray's own debugging view of the actor table

        job = ray.get_runtime_context().get_job_id()
        table = actors(job_id=ray.JobID.from_hex(job))
    except Exception:  # noqa: BLE001 - a missing private API must not fail a run; the row then says 0
        return 0
    return sum(int(a.get("NumRestarts") or 0) for a in table.values() if ENGINE_ACTOR in a.get("ActorClassName", ""))
