"""Comparison reports and recorded engine-choice decisions, built from the results table only.

``troughput-report`` reads ``results/runs/`` (filtered), groups rows into configs,
decides per cell (workload, model, hardware) which engine and config to use and how
sure that is (recorded append-only in ``results/decisions/``), and writes
``reports/<name>/index.html`` (self-contained) and ``reports/<name>/report.md`` (plots
as PNG files beside it). Writers form a small registry, one ``write(report, out_dir)``
each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from harness.report import html, markdown
from harness.report.data import Filters
from harness.report.planner import PlannerInputs
from harness.report.report import Report, ReportOptions, build_report

WRITERS: dict[str, Callable[[Report, Path], Path]] = {"html": html.write, "markdown": markdown.write}


def write_report(report: Report, out_dir: str | Path, formats: tuple[str, ...] = tuple(WRITERS)) -> list[Path]:
    """Write ``report`` in each of ``formats`` into ``out_dir``; returns the files written."""
    unknown = [f for f in formats if f not in WRITERS]
    if unknown:
        from harness.core.errors import TroughputError

        raise TroughputError(f"unknown report format(s) {unknown}: known formats are {', '.join(WRITERS)}")
    return [WRITERS[f](report, Path(out_dir)) for f in formats]


__all__ = ["WRITERS", "Filters", "PlannerInputs", "Report", "ReportOptions", "build_report", "write_report"]
