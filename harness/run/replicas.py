"""Data-parallel replicas: one engine per slice of the devices, each with a contiguous share of the requests.

For an offline job the simplest scale-out is often the best one: ``engine.replicas=K``
starts K independent workers, gives each its own GPUs (``CUDA_VISIBLE_DEVICES``) or
CPU cores (its affinity), and splits the ordered requests into K contiguous shards
of nearly equal tokens, so prefix groups stay together. The runner starts every
timed pass on all replicas at once; here their results become one.
"""

from __future__ import annotations

import os
from typing import Any

from engines.base import Request
from harness.core.errors import TroughputError
from harness.run import environment

AFFINITY_ENV = "TROUGHPUT_CPU_AFFINITY"  # read by engines.worker before the engine is imported
REPLICA_ENV = "TROUGHPUT_REPLICA"        # "<index>/<count>", 1-based, for logs and tests


def shard_requests(requests: list[Request], replicas: int) -> list[list[Request]]:
    """``replicas`` contiguous shards of ``requests`` with nearly equal prompt + output tokens; order kept."""
    if replicas < 1:
        raise TroughputError(f"engine.replicas={replicas}: must be at least 1")
    if replicas > max(len(requests), 1):
        raise TroughputError(f"engine.replicas={replicas} is more than the workload's {len(requests)} requests")
    weights = [len(r.prompt_token_ids) + r.max_tokens for r in requests]
    total = sum(weights)
    shards: list[list[Request]] = [[] for _ in range(replicas)]
    done = 0
    for request, weight in zip(requests, weights):
        index = min(replicas - 1, int(done * replicas / total)) if total else 0
        shards[index].append(request)
        done += weight
    if not all(shards):  # a few huge requests: split by count instead, so that every replica gets some
        shards = [requests[i * len(requests) // replicas:(i + 1) * len(requests) // replicas]
                  for i in range(replicas)]
    return shards


def device_envs(replicas: int, kind: str, env: dict[str, str]) -> list[dict[str, str]]:
    """The environment each replica adds: its GPUs (``kind == "gpu"``) or its CPU cores, and its index.

    GPUs are the ones ``CUDA_VISIBLE_DEVICES`` names (in ``env`` or this process's
    environment), else all that ``nvidia-smi`` lists; CPU cores are this process's
    affinity. Each replica gets an equal, disjoint slice; one replica changes nothing.
    """
    if replicas == 1:
        return [{}]
    if kind == "gpu":
        visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        devices = ([d.strip() for d in visible.split(",") if d.strip()] if visible is not None
                   else [str(i) for i in range(environment.gpu_count())])
        name, variable = "GPUs", "CUDA_VISIBLE_DEVICES"
    else:
        devices = [str(core) for core in sorted(os.sched_getaffinity(0))]
        name, variable = "CPU cores", AFFINITY_ENV
    per_replica = len(devices) // replicas
    if per_replica == 0:
        raise TroughputError(f"engine.replicas={replicas} needs at least {replicas} {name}; "
                             f"this run has {len(devices)} ({', '.join(devices) or 'none'})")
    return [{variable: ",".join(devices[i * per_replica:(i + 1) * per_replica]), REPLICA_ENV: f"{i + 1}/{replicas}"}
            for i in range(replicas)]


def merge_results(results: list[dict[str, Any]], culprit: int | None = None) -> dict[str, Any]:
    """One worker result for replicas that ran side by side.

    A pass lasts as long as its slowest replica; tokens, requests and counters add
    up; resident memory adds up (the replicas share the host), GPU memory is the
    largest of any one replica. A failed replica speaks for all: ``culprit``, the
    first to fail (the others were stopped because of it), else the first not ok.
    """
    if len(results) == 1:
        return results[0]
    failed = [culprit] if culprit is not None else [i for i, r in enumerate(results) if r.get("status") != "ok"]
    if failed:
        result = results[failed[0]]
        return {**result, "error": f"replica {failed[0] + 1} of {len(results)}: {result.get('error', '')}"}
    starts = [r.get("start") or {} for r in results]
    compile_times = [s["compile_s"] for s in starts if s.get("compile_s") is not None]
    merged = dict(results[0])
    merged.update(
        start={**starts[0], "startup_s": max(s.get("startup_s") or 0.0 for s in starts),
               "compile_s": max(compile_times) if compile_times else None},
        passes=[_merge_pass(list(p)) for p in zip(*(r["passes"] for r in results))],
        final_stats=_sum_stats([r.get("final_stats") or {} for r in results]),
        peak_rss_bytes=sum(r.get("peak_rss_bytes") or 0 for r in results),
        peak_gpu_bytes=max((r["peak_gpu_bytes"] for r in results if r.get("peak_gpu_bytes") is not None),
                           default=None),
        stat_warnings=list(dict.fromkeys(w for r in results for w in r.get("stat_warnings") or [])),
    )
    return merged


def _merge_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    cached = [p.get("cached_tokens") for p in passes]
    return {
        "wall_s": max(p["wall_s"] for p in passes),
        "requests": sum(p["requests"] for p in passes),
        "prompt_tokens": sum(p["prompt_tokens"] for p in passes),
        "output_tokens": sum(p["output_tokens"] for p in passes),
        "cached_tokens": None if None in cached else sum(cached),
        "finished_s": sorted(t for p in passes for t in p["finished_s"]),
        "stats": _sum_stats([p["stats"] for p in passes]),
        "predicted": any(p.get("predicted") for p in passes),
        "steps_by_replica": [p.get("steps") for p in passes],
        "step_trace_gap": next((p.get("step_trace_gap") for p in passes if p.get("step_trace_gap")), None),
        **_merge_energy(passes),
    }


def _merge_energy(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Replicas' energy: GPUs (NVML) are each replica's own, so their joules add up; RAPL meters the
    package all replicas share, so each replica read the same counter and the largest reading stands."""
    joules = [p.get("energy_j") for p in passes]
    if None in joules:
        reason = next((p.get("energy_reason") for p in passes if p.get("energy_j") is None), None)
        return {"energy_j": None, "energy_reason": reason, "energy_source": passes[0].get("energy_source")}
    source = passes[0].get("energy_source")
    by_device: dict[str, float] = {}
    for p in passes:
        for device, value in (p.get("energy_j_by_device") or {}).items():
            by_device[device] = max(by_device.get(device, 0.0), value) if source == "rapl" else value
    total = max(joules) if source == "rapl" else sum(joules)
    return {"energy_j": total, "energy_j_by_device": by_device, "energy_source": source, "energy_reason": None}


def _sum_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Counters added up; a counter one replica lacks (None) is unknown for all."""
    keys = [k for k in stats[0] if k != "extra"]
    total: dict[str, Any] = {}
    for key in keys:
        values = [s.get(key) for s in stats]
        total[key] = None if None in values else sum(values)
    extras = [s.get("extra") or {} for s in stats]
    total["extra"] = {k: sum(e.get(k, 0.0) for e in extras) for k in extras[0]}
    return total
