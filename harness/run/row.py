"""The results row: its columns named in one place, and the one function that builds a row from its parts.

A row is flat (dotted keys for nested values) and is built once per run by
``build_row`` from six parts, in this order (later parts never overwrite earlier
ones except where noted):

- identity (``IDENTITY``): which run, engine, model, workload and ordering;
- the workload's build facts (``workload_info.*``) and the knobs as given
  (``knob.*``, plus ``knob.replicas`` above 1) and as canonical names (``canon.*``);
- the run's settings (``SETTINGS``) and how it went (``STATUS``, ``run_seconds``, ``log_path``);
- the measurements (``harness.run.measure.measurement_columns``: ``MEASUREMENTS``,
  ``engine_info.*``, ``stat.*``) and the output quality (``quality.*``, ``harness.quality``);
- the host (``harness.run.environment.capture``: ``env.*``, ``git_commit``) and the labels
  (``run.labels``, ``command``, ``hardware``, ``round``, ``sweep_id``, ``study``, ``trial``;
  a label may replace any column above);
- the speed of light (``SPEED_OF_LIGHT``, ``hw.*``) and what re-simulating the run needs
  (``workload_cfg.*``, ``ordering_cfg.*``), from ``engines.perfmodel.sol_columns``;
- the step trace's file and summary (``steps.*``, ``harness.steps.store``) and, for a vLLM run, the
  simulator's prediction made before it ran beside what it measured (``prediction.sim.*``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from engines.knobs import canonical_view
from engines.perfmodel import sol_columns
from harness.run import environment
from harness.run.measure import measurement_columns
from harness.run.results import prefixed
from harness.run.spec import RunSpec

IDENTITY = ("run_id", "timestamp", "engine", "engine_python", "model", "model_path", "workload",
            "workload_fingerprint", "ordering")
STATUS = ("status", "error", "failed_phase")
SETTINGS = ("replicas", "repeats", "warmup_requests", "time_limit_s", "memory_limit_bytes")
MEASUREMENTS = ("startup_s", "compile_s", "engine_version", "peak_rss_bytes", "peak_gpu_bytes",
                "peak_gpu_process_bytes", "wall_s", "job_wall_s",
                "requests_done", "input_tokens", "output_tokens", "cached_tokens", "req_s", "output_tok_s",
                "total_tok_s", "output_tok_s_passes", "full_engine_tok_s", "full_engine_note", "predicted", "preemptions", "prefix_cache_queries",
                "prefix_cache_hits", "prefix_cache_hit_rate", "mm_cache_queries", "mm_cache_hits",
                "completion_p50_s", "completion_p90_s", "completion_p99_s", "energy_j", "j_per_output_token",
                "energy_source", "energy_reason")
SPEED_OF_LIGHT = ("sol_tok_s", "sol_fraction", "sol_exceeded", "sol_bound")
PREFIXES = ("workload_info.", "knob.", "canon.", "engine_info.", "stat.", "env.", "hw.", "workload_cfg.",
            "peak_gpu_bytes.", "energy_j.", "quality.",
            "ordering_cfg.", "steps.", "prediction.")


def build_row(spec: RunSpec, run_id: str, started: datetime, result: dict[str, Any], run_seconds: float,
              log_path: str, quality: dict[str, Any] | None = None) -> dict[str, Any]:
    """The row of one run: ``spec`` is what was asked, ``result`` what the worker(s) reported."""
    summary = spec.workload.summary()
    status = result.get("status", "crash")
    row: dict[str, Any] = {
        "run_id": run_id,
        "timestamp": started.isoformat(),
        "status": status,
        "error": result.get("error") or "",
        "failed_phase": None if status == "ok" else result.get("phase"),
        "engine": spec.engine,
        "engine_python": spec.python,
        "model": spec.model.get("name"),
        "model_path": spec.model.get("path"),
        "workload": spec.workload.name,
        "workload_fingerprint": spec.workload.fingerprint,
        **{f"workload_info.{k}": v for k, v in summary.items()},
        "ordering": spec.ordering.get("name"),
        **prefixed("knob", spec.knobs),
        **({"knob.replicas": spec.replicas} if spec.replicas > 1 else {}),
        **prefixed("canon", canonical_view(spec.engine, spec.knobs)),
        "replicas": spec.replicas,
        "repeats": spec.repeats,
        "warmup_requests": spec.warmup_requests,
        "time_limit_s": spec.time_limit_s,
        "memory_limit_bytes": spec.memory_limit_bytes,
        "run_seconds": run_seconds,
        "log_path": log_path,
        **measurement_columns(result),
        **(quality or {}),
        **environment.capture(),
        **spec.labels,
    }
    row.update(prefixed("workload_cfg", spec.workload_cfg or {}))
    row.update(prefixed("ordering_cfg", spec.ordering))
    row.update(sol_columns(spec.model.get("local_dir"), str(spec.model.get("name") or ""), spec.hardware_spec,
                           summary, spec.knobs, row.get("output_tok_s"), engine=spec.engine,
                           replicas=spec.replicas))
    return row
