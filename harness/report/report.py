"""Build a report from the results table: rows -> configs -> decisions, planner, predictions, plots, sections.

Everything here reads the results table only (``results/runs`` and ``results/decisions``, and
``results/batch`` for the predictions batch rows keep), so a report can be rebuilt from rows copied
off a cluster.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from harness.report import decisions as decisions_mod
from harness.report import predictions as predictions_mod
from harness.report import sections
from harness.report.data import CELL, Filters, group_configs, load_runs
from harness.report.planner import PlannerInputs, plan
from harness.report.plots import Plot, all_plots, predictions as prediction_plots
from harness.report.quality import QualityGuard
from harness.report.verdict import MIN_EFFECT


@dataclass(frozen=True)
class ReportOptions:
    """How to compute and what to record; the defaults are the documented ones."""

    resamples: int = 2000
    level: float = 0.95
    seed: int = 0
    planner: PlannerInputs = field(default_factory=PlannerInputs)
    record: bool = True   # append new decisions to <results_dir>/decisions/
    guard: QualityGuard = field(default_factory=QualityGuard)   # configs too far from the reference are never chosen
    min_effect: float = MIN_EFFECT   # harness.report.verdict: a smaller ratio is never a clear winner


@dataclass
class Report:
    name: str
    created: str
    results_dir: Path
    filters: Filters
    options: ReportOptions
    frame: pd.DataFrame                 # the filtered runs, one per row
    configs: pd.DataFrame               # one per config (see data.group_configs)
    decisions: list[dict[str, Any]]     # the latest decision per cell
    history: dict[tuple, int]           # decisions recorded per cell, this one included
    plan: pd.DataFrame                  # idle-window planner lines
    plots: list[Plot]
    sections: list = field(default_factory=list)
    predictions: pd.DataFrame | None = None   # one per row and predictor (harness.report.predictions.records)

    @property
    def ok(self) -> pd.DataFrame:
        return self.frame[self.frame["status"] == "ok"]

    @property
    def failed(self) -> pd.DataFrame:
        return self.frame[self.frame["status"] != "ok"]

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "created": self.created, "results_dir": str(self.results_dir),
                "filters": self.filters.describe(), "options": asdict(self.options), "rows": len(self.frame),
                "failed": len(self.failed), "configs": len(self.configs),
                "decisions": [{k: d.get(k) for k in ("workload", "model", "hardware", "chosen.engine", "chosen.label",
                                                      "runner_up.label", "margin", "verdict", "decision_id")}
                              for d in self.decisions]}


def build_report(results_dir: str | Path, name: str, filters: Filters = Filters(),
                 options: ReportOptions = ReportOptions()) -> Report:
    """Read, group, decide (and record), plan and draw; the sections are laid out by ``sections``."""
    results_dir = Path(results_dir)
    frame = load_runs(results_dir, filters)
    configs = group_configs(frame, n_boot=options.resamples, level=options.level, seed=options.seed)
    computed = decisions_mod.decide(frame, configs, n_boot=options.resamples, level=options.level, seed=options.seed,
                                    guard=options.guard, min_effect=options.min_effect)
    if options.record:
        latest = decisions_mod.record(results_dir, computed, extra={"filters": filters.describe() or None,
                                                                    "created_by": "troughput-report"})
    else:
        latest = [d | {"recorded": "not recorded (--no-record)"} for d in computed]
    history = {cell: len(items) for cell, items in decisions_mod.history(results_dir).items()}
    predictions = predictions_mod.collect(results_dir, frame, filters)
    labels = {tuple(c[k] for k in CELL): c["cell_label"] for c in configs.to_dict("records")}
    for decision in latest:
        decision["cell_label"] = labels.get(tuple(decision.get(k) for k in CELL), decision["workload"])
    report = Report(name=name, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    results_dir=results_dir, filters=filters, options=options, frame=frame, configs=configs,
                    decisions=latest, history=history, plan=plan(frame, configs, options.planner),
                    plots=[*all_plots(frame, configs), *prediction_plots(predictions)], predictions=predictions)
    report.sections = sections.build(report)
    return report
