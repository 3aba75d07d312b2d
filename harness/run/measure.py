"""From what the worker measured to the measurement columns of a results row."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np


def pass_throughput(measured: dict[str, Any]) -> float:
    return measured["output_tokens"] / measured["wall_s"] if measured["wall_s"] > 0 else 0.0


def energy_columns(measured: dict[str, Any]) -> dict[str, Any]:
    """``energy_j`` over a timed pass, ``j_per_output_token``, the source, per device, and why null where it is."""
    joules = measured.get("energy_j")
    tokens = measured.get("output_tokens")
    return {"energy_j": joules, "j_per_output_token": joules / tokens if joules is not None and tokens else None,
            "energy_source": measured.get("energy_source"),
            "energy_reason": None if joules is not None else measured.get("energy_reason", "not metered"),
            **{f"energy_j.{k}": v for k, v in (measured.get("energy_j_by_device") or {}).items()}}


def median_pass_index(passes: list[dict[str, Any]]) -> int | None:
    """Which timed pass speaks for the run: the median by output tok/s (the low one of two)."""
    if not passes:
        return None
    rates = [pass_throughput(p) for p in passes]
    return rates.index(statistics.median_low(rates))


def measurement_columns(result: dict[str, Any]) -> dict[str, Any]:
    """Columns for a worker result; the median timed pass (by output tok/s) speaks for the run.

    Token counts are what the engine returned. Per-pass throughputs are kept so
    that reports can draw error bars.
    """
    start = result.get("start") or {}
    columns: dict[str, Any] = {
        "startup_s": start.get("startup_s"),
        "compile_s": start.get("compile_s"),
        "engine_version": start.get("engine_version"),
        "peak_rss_bytes": result.get("peak_rss_bytes"),
        "peak_gpu_bytes": result.get("peak_gpu_bytes"),
        "peak_gpu_process_bytes": result.get("peak_gpu_process_bytes"),
        **{f"peak_gpu_bytes.{i}": v for i, v in (result.get("peak_gpu_bytes_by_device") or {}).items()},
        **{f"engine_info.{k}": v for k, v in (start.get("extra") or {}).items()},
        # statistics the engine (or the GPU memory sampler) could not give: their columns are null
        "engine_info.stat_warnings": list(result.get("stat_warnings") or []),
    }
    passes = result.get("passes") or []
    if not passes:
        return columns
    rates = [pass_throughput(p) for p in passes]
    median = passes[median_pass_index(passes)]
    wall = median["wall_s"]
    stats = median["stats"]
    queries, hits = stats.get("prefix_cache_queries"), stats.get("prefix_cache_hits")
    finished = np.asarray(median["finished_s"], dtype=float)
    engine_start = start.get("startup_s")
    inside = float(median.get("startup_s") or 0.0)  # replicas started inside the pass (engine=ray)
    columns.update({
        # one rate definition for every engine: output tokens over the generation span (wall_s);
        # engine and replica start-up in startup_s; start-up plus the whole pass in job_wall_s
        "startup_s": None if engine_start is None and not inside else (engine_start or 0.0) + inside,
        "job_wall_s": (engine_start or 0.0) + float(median.get("pass_s", wall)),
        "wall_s": wall,
        "requests_done": median["requests"],
        "input_tokens": median["prompt_tokens"],
        "output_tokens": median["output_tokens"],
        "cached_tokens": median.get("cached_tokens"),
        "req_s": median["requests"] / wall,
        "output_tok_s": median["output_tokens"] / wall,
        "total_tok_s": (median["prompt_tokens"] + median["output_tokens"]) / wall,
        "output_tok_s_passes": rates,
        "predicted": bool(median.get("predicted", False)),
        "preemptions": stats.get("preemptions"),
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        # a counter the engine could not give (None, with a stat warning) leaves the rate unknown, not 0
        "prefix_cache_hit_rate": (None if hits is None or queries is None else hits / queries if queries else 0.0),
        "mm_cache_queries": stats.get("mm_cache_queries"),
        "mm_cache_hits": stats.get("mm_cache_hits"),
        **energy_columns(median),
        **{f"stat.{k}": v for k, v in (stats.get("extra") or {}).items()},
    })
    if len(finished):
        p50, p90, p99 = np.percentile(finished, [50, 90, 99])
        columns.update(completion_p50_s=float(p50), completion_p90_s=float(p90), completion_p99_s=float(p99))
    return columns
