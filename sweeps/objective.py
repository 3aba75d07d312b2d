"""What a study optimises, read from a results row.

- ``output_tok_s`` (default) or ``total_tok_s``: maximise the measured rate.
- ``job_time``: minimise startup + ``backlog_tokens`` ÷ measured total tok/s
  (``harness.cost.job_seconds``, which the report's planner uses too), so an
  engine that compiles for minutes pays for it on a small backlog (every adapter's
  ``startup_s`` times the engine constructor, compile included; ``compile_s`` is that part).
- ``multi_objective: true`` adds a second objective, startup seconds (compile
  included, minimised); the study then keeps a Pareto front.

Constraint: preemptions per request at most ``max_preemption_rate``, set on each
trial with ``Trial.set_constraint`` (a value <= 0 is feasible), which Optuna's
samplers and its Pareto front respect.
"""

from __future__ import annotations

from typing import Any, Mapping

from harness.cost import job_seconds
from harness.errors import TroughputError

OBJECTIVES = ("output_tok_s", "total_tok_s", "job_time")


class Objective:
    def __init__(self, tune: Mapping[str, Any]):
        self.name = tune.get("objective", "output_tok_s")
        if self.name not in OBJECTIVES:
            raise TroughputError(f"unknown objective {self.name!r}; use one of {', '.join(OBJECTIVES)}")
        self.backlog_tokens = float(tune.get("backlog_tokens") or 0)
        if self.name == "job_time" and self.backlog_tokens <= 0:
            raise TroughputError("objective job_time needs tune.backlog_tokens > 0 (the tokens of your backlog)")
        self.multi = bool(tune.get("multi_objective"))
        self.max_preemption_rate = tune.get("max_preemption_rate")

    @property
    def directions(self) -> list[str]:
        first = "minimize" if self.name == "job_time" else "maximize"
        return [first, "minimize"] if self.multi else [first]

    def values(self, row: Mapping[str, Any]) -> list[float]:
        setup = setup_seconds(row)
        if self.name == "job_time":
            first = job_seconds(setup, self.backlog_tokens, row["total_tok_s"])
        else:
            first = float(row[self.name])
        return [first, setup] if self.multi else [first]

    def constraint_values(self, row: Mapping[str, Any]) -> dict[str, float]:
        """Named constraint values for ``Trial.set_constraint`` (feasible when <= 0)."""
        if self.max_preemption_rate is None:
            return {}
        rate = (row.get("preemptions") or 0) / max(int(row.get("requests_done") or 1), 1)
        return {"preemption_rate": rate - float(self.max_preemption_rate)}

    def describe(self, row: Mapping[str, Any]) -> str:
        text = f"{self.name}={self.values(row)[0]:,.1f}"
        if self.name != "output_tok_s":
            text += f" (output_tok_s={row['output_tok_s']:,.1f})"
        return text + f", preemptions={row.get('preemptions')}"


def setup_seconds(row: Mapping[str, Any]) -> float:
    """Seconds before the first token: the engine's startup, which includes its compile."""
    return float(row.get("startup_s") or 0.0)
