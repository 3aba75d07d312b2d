"""Comparison reports and recorded engine-choice decisions, built from the results table only.

``troughput-report`` reads ``results/runs/`` (filtered), groups rows into configs,
decides per cell (workload, model, hardware) which engine and config to use and how
sure that is (recorded append-only in ``results/decisions/``), and writes
``reports/<name>/index.html`` (self-contained) and ``reports/<name>/report.md`` (plots
as PNG files beside it). Writers form a small registry, one ``write(report, out_dir)``
each.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

# Loaded on first use (PEP 562), so that ``harness.report.verdict`` (the tuner's and the batch job's rule)
# does not pull in pandas and matplotlib: importing them took about 1.3 s of every troughput-tune start.
_LAZY = {"Filters": "harness.report.data", "PlannerInputs": "harness.report.planner", "Report": "harness.report.report",
         "ReportOptions": "harness.report.report", "build_report": "harness.report.report"}


def writers() -> dict[str, Callable[[Any, Path], Path]]:
    """The report writers by format: ``write(report, out_dir)`` each."""
    from harness.report import html, markdown

    return {"html": html.write, "markdown": markdown.write}


def write_report(report: Any, out_dir: str | Path, formats: tuple[str, ...] = ("html", "markdown")) -> list[Path]:
    """Write ``report`` in each of ``formats`` into ``out_dir``; returns the files written."""
    known = writers()
    unknown = [f for f in formats if f not in known]
    if unknown:
        from harness.core.errors import TroughputError

        raise TroughputError(f"unknown report format(s) {unknown}: known formats are {', '.join(known)}")
    return [known[f](report, Path(out_dir)) for f in formats]


def __getattr__(name: str) -> Any:
    if name == "WRITERS":
        return writers()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'harness.report' has no attribute {name!r}")


__all__ = ["WRITERS", "Filters", "PlannerInputs", "Report", "ReportOptions", "build_report", "write_report", "writers"]
