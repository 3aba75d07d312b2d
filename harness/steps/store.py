"""Step traces on disk: one Parquet file per run beside the row, and the row's summary of it.

A run's trace is every timed pass of every replica (columns ``engines.steptrace.STEP_FIELDS``
plus ``pass`` and ``replica``), written once, atomically, to ``results/steps/<run_id>.parquet``;
the row keeps ``steps.file`` and a summary (``engines.steptrace.summary``) of the median pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from engines.steptrace import STEP_FIELDS, summary

STEPS_DIR = "steps"


def trace_frame(passes: list[dict[str, Any]]) -> pd.DataFrame:
    """Every pass's steps (each pass a list of per-replica traces, or one trace) as one frame."""
    parts = []
    for index, measured in enumerate(passes):
        traces = measured.get("steps_by_replica") or [measured.get("steps")]
        for replica, trace in enumerate(traces):
            if trace and trace.get("weight"):
                frame = pd.DataFrame({name: trace[name] for name in STEP_FIELDS})
                parts.append(frame.assign(**{"pass": index, "replica": replica}))
    if not parts:
        return pd.DataFrame(columns=[*STEP_FIELDS, "pass", "replica"])
    return pd.concat(parts, ignore_index=True)


def write_trace(results_dir: str | os.PathLike, run_id: str, frame: pd.DataFrame) -> Path:
    """``results/steps/<run_id>.parquet``, written whole (a temporary file renamed into place)."""
    target = Path(results_dir) / STEPS_DIR / f"{run_id}.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".parquet.tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, target)
    return target


def read_trace(results_dir: str | os.PathLike, run_id: str) -> pd.DataFrame | None:
    """A run's trace, or None where it kept none."""
    path = Path(results_dir) / STEPS_DIR / f"{run_id}.parquet"
    return pd.read_parquet(path) if path.exists() else None


def job_trace_columns(results_dir: str | os.PathLike, run_id: str, trace: dict[str, list[float]]) -> dict[str, Any]:
    """A batch job's engines' steps (every shard's, in the order they finished) to its file; the row's columns."""
    frame = trace_frame([{"steps": trace}])
    if frame.empty:
        return {"steps.file": None}
    path = write_trace(results_dir, run_id, frame)
    return {"steps.file": str(path), **{f"steps.{k}": v for k, v in summary(trace).items()}}


def trace_columns(results_dir: str | os.PathLike, run_id: str, result: dict[str, Any],
                  median_pass: int | None) -> dict[str, Any]:
    """Write the run's trace (where any pass recorded steps) and return the row's ``steps.*`` columns."""
    passes = result.get("passes") or []
    gap = next((p.get("step_trace_gap") for p in passes if p.get("step_trace_gap")), None)
    frame = trace_frame(passes)
    if frame.empty:
        return {"steps.file": None, "steps.gap": gap or ("no step recorded" if passes else None)}
    try:
        path = write_trace(results_dir, run_id, frame)
    except ImportError as e:   # no Parquet engine (pyarrow) on this driver: the row says so, the run stands
        return {"steps.file": None, "steps.gap": f"the trace was not kept: {e}"}
    chosen = frame[frame["pass"] == (median_pass if median_pass is not None else 0)]
    columns = {f"steps.{k}": v for k, v in summary({c: chosen[c].tolist() for c in STEP_FIELDS}).items()}
    return {"steps.file": str(path), "steps.gap": None, **columns}
