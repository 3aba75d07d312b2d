"""What a study optimises, read from a results row.

- ``output_tok_s`` (default): maximise the config's full-engine rate (``full_engine_tok_s``: the step
  model fitted to the trial's own steps, its requests replayed with the engine kept full), where the
  row has one, else its measured rate: a trial whose run is one draining batch reads its config low,
  and more so the more sequences the config runs at once. Reports rank by measured rates.
- ``total_tok_s``: maximise the measured total rate.
- ``job_time``: minimise startup + ``backlog_tokens`` ÷ measured total tok/s
  (``harness.run.cost.job_seconds``, which the report's planner uses too), so an
  engine that compiles for minutes pays for it on a small backlog (every adapter's
  ``startup_s`` times the engine constructor, compile included; ``compile_s`` is that part).
  Without ``backlog_tokens`` the backlog is the measured workload itself: startup + its
  pass (``engine=ray``'s space does this: a Ray Data job starts its replicas inside the pass).
- ``multi_objective: true`` adds a second objective, startup seconds (compile
  included, minimised); the study then keeps a Pareto front.

Constraints, set on each trial with ``Trial.set_constraint`` (a value <= 0 is feasible),
which Optuna's samplers and its Pareto front respect, and which the ranking, the
confirmation and the written config all honour (``harness.tune.ranking``):

- ``max_preemption_rate``: preemptions per request at most this;
- ``min_agreement`` (the quality guard): ``quality.token_agreement`` with the engine's
  default config at least this (``harness.quality``; the tuner then runs every trial with
  ``quality.reference=default``); a row without it (its reference failed) is infeasible;
- ``min_parse_rate`` (structured workloads): ``quality.parsed_rate`` at least this.
"""

from __future__ import annotations

from typing import Any, Mapping

from harness.core.errors import TroughputError
from harness.run.cost import job_seconds

OBJECTIVES = ("output_tok_s", "total_tok_s", "job_time")
FLOORS = {"min_agreement": "agreement", "min_parse_rate": "parse_rate"}   # tune key -> constraint name
QUALITY_COLUMNS = {"agreement": "quality.token_agreement", "parse_rate": "quality.parsed_rate"}


class Objective:
    def __init__(self, tune: Mapping[str, Any]):
        self.name = tune.get("objective", "output_tok_s")
        if self.name not in OBJECTIVES:
            raise TroughputError(f"unknown objective {self.name!r}; use one of {', '.join(OBJECTIVES)}")
        self.backlog_tokens = float(tune.get("backlog_tokens") or 0)
        if self.backlog_tokens < 0:
            raise TroughputError(f"tune.backlog_tokens={self.backlog_tokens:g}: must be > 0, or null for the workload's own")
        self.multi = bool(tune.get("multi_objective"))
        self.max_preemption_rate = tune.get("max_preemption_rate")
        self.floors = {name: float(tune[key]) for key, name in FLOORS.items() if tune.get(key) is not None}

    @property
    def directions(self) -> list[str]:
        first = "minimize" if self.name == "job_time" else "maximize"
        return [first, "minimize"] if self.multi else [first]

    def values(self, row: Mapping[str, Any], measured: bool = False) -> list[float]:
        """The trial's value(s); ``measured``: the measured rate even where a full-engine rate exists (a
        verdict rests on measurements)."""
        setup = setup_seconds(row)
        if self.name == "job_time":
            backlog = self.backlog_tokens or float(row["input_tokens"]) + float(row["output_tokens"])
            first = job_seconds(setup, backlog, row["total_tok_s"])
        elif self.name == "output_tok_s" and row.get("full_engine_tok_s") and not measured:
            first = float(row["full_engine_tok_s"])
        else:
            first = float(row[self.name])
        return [first, setup] if self.multi else [first]

    def value_source(self, row: Mapping[str, Any]) -> str:
        """Which figure ``values`` took from ``row``: ``full_engine`` (its step model) or ``measured``."""
        return "full_engine" if self.name == "output_tok_s" and row.get("full_engine_tok_s") else "measured"

    @property
    def needs_reference(self) -> bool:
        """Whether trials must be compared with the engine's default config (``min_agreement``)."""
        return "agreement" in self.floors

    def constraint_values(self, row: Mapping[str, Any]) -> dict[str, float]:
        """Named constraint values for ``Trial.set_constraint`` (feasible when <= 0)."""
        values: dict[str, float] = {}
        if self.max_preemption_rate is not None:
            rate = (row.get("preemptions") or 0) / max(int(row.get("requests_done") or 1), 1)
            values["preemption_rate"] = rate - float(self.max_preemption_rate)
        for name, floor in self.floors.items():
            measured = row.get(QUALITY_COLUMNS[name])
            values[name] = 1.0 if measured is None else floor - float(measured)
        return values

    def broken(self, row: Mapping[str, Any]) -> list[str]:
        """Why ``row`` breaks the constraints, one phrase each (``[]`` when feasible)."""
        reasons = []
        for name, value in self.constraint_values(row).items():
            if value <= 0:
                continue
            if name == "preemption_rate":
                reasons.append(f"preemption rate {value + float(self.max_preemption_rate):.3f} > "
                               f"max {self.max_preemption_rate}")
            else:
                measured = row.get(QUALITY_COLUMNS[name])
                shown = "not measured" if measured is None else f"{float(measured):.4f}"
                reasons.append(f"{name} {shown} < min {self.floors[name]} (quality guard)")
        return reasons

    def describe(self, row: Mapping[str, Any]) -> str:
        text = f"{self.name}={self.values(row)[0]:,.1f}"
        if self.name == "output_tok_s" and row.get("full_engine_tok_s"):
            text = f"full-engine output_tok_s={self.values(row)[0]:,.1f} (measured {row['output_tok_s']:,.1f})"
        elif self.name != "output_tok_s":
            text += f" (output_tok_s={row['output_tok_s']:,.1f})"
        text += f", preemptions={row.get('preemptions')}"
        for name in self.floors:
            if row.get(QUALITY_COLUMNS[name]) is not None:
                text += f", {name}={float(row[QUALITY_COLUMNS[name]]):.4f}"
        return text


def setup_seconds(row: Mapping[str, Any]) -> float:
    """Seconds before the first token: the engine's startup, which includes its compile."""
    return float(row.get("startup_s") or 0.0)
