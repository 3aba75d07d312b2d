"""Search spaces over config paths, with constraints between knobs and a learned memory edge.

A space (``conf/tune/<name>.yaml``) maps dotted config paths to distributions::

    params:
      engine.canonical.max_seqs: {type: int, low: 4, high: 512, log: true, memory: true}
      engine.canonical.max_tokens_per_step: {type: int, low: 256, high: 16384, log: true, memory: true}
      ordering: {type: categorical, choices: [as_given, shuffled]}
    constraints:
      - {param: engine.canonical.max_tokens_per_step, at_least: engine.canonical.max_seqs}
      - {param: engine.canonical.max_tokens_per_step, at_least: model.canonical.context_length,
         unless: engine.canonical.chunked_prefill}

Parameters are suggested in order; an ``at_least`` bound is read from a parameter
suggested before it, or from the base config, and raises the parameter's low end,
so invalid combinations are never proposed. ``memory: true`` marks knobs whose
larger values need more memory: after a trial fails for memory, later proposals
stay below the smallest failing value ("dial back one notch").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna

from engines.knobs import lookup
from harness.core.errors import TroughputError

TYPES = ("int", "float", "categorical")
NOTCH = 0.85  # after a memory failure at value v, propose at most NOTCH * v


@dataclass
class Param:
    path: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Any] = field(default_factory=list)
    memory: bool = False

    def grid(self, points: int = 4) -> list[Any]:
        """Values for a grid search: all choices, or ``points`` values spread over the range."""
        if self.type == "categorical":
            return list(self.choices)
        lo, hi = float(self.low), float(self.high)  # type: ignore[arg-type]
        if self.log:
            values = [math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (points - 1)) for i in range(points)]
        else:
            values = [lo + i * (hi - lo) / (points - 1) for i in range(points)]
        return sorted({int(round(v)) for v in values}) if self.type == "int" else values


@dataclass
class Constraint:
    param: str
    at_least: str
    unless: str | None = None


class SearchSpace:
    """Parameters, constraints and the memory edge learned from failed trials."""

    def __init__(self, spec: Mapping[str, Any]):
        self.params = [_param(path, dict(p)) for path, p in (spec.get("params") or {}).items()]
        if not self.params:
            raise TroughputError("the search space has no params (tune.space.params)")
        self.constraints = [Constraint(**c) for c in spec.get("constraints") or []]
        order = {p.path: i for i, p in enumerate(self.params)}
        for c in self.constraints:
            if c.param not in order:
                raise TroughputError(f"constraint on {c.param!r}, which is not a param of the space")
            for other in (c.at_least, c.unless):
                if other in order and order[other] > order[c.param]:
                    raise TroughputError(f"param {other!r} must come before {c.param!r} in the space: "
                                         "params are suggested in order and the constraint reads it")
        self.memory_caps: dict[str, float] = {}

    def suggest(self, trial: optuna.Trial, base: Mapping[str, Any]) -> dict[str, Any]:
        """Suggest a value for every parameter, respecting constraints and memory caps."""
        values: dict[str, Any] = {}
        for p in self.params:
            if p.type == "categorical":
                values[p.path] = trial.suggest_categorical(p.path, p.choices)
                continue
            low, high = self._bounds(p, values, base)
            if p.type == "int":
                values[p.path] = trial.suggest_int(p.path, int(math.ceil(low)), int(high), log=p.log,
                                                   step=int(p.step or 1))
            else:
                values[p.path] = trial.suggest_float(p.path, low, high, log=p.log, step=p.step)
        return values

    def check(self, values: Mapping[str, Any], base: Mapping[str, Any]) -> str | None:
        """Why ``values`` (e.g. an enqueued first trial) breaks a constraint, or ``None``."""
        for c in self.constraints:
            if c.param in values and not self._waived(c, values, base):
                bound = _lookup(c.at_least, values, base)
                if bound is not None and values[c.param] < bound:
                    return f"{c.param}={values[c.param]} < {c.at_least}={bound}"
        return None

    def clip(self, values: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` moved into their ranges and constraints (for seeds written by hand or a heuristic)."""
        clipped: dict[str, Any] = {}
        for p in self.params:
            if p.path not in values:
                continue
            value = values[p.path]
            if p.type != "categorical":
                low, high = self._bounds(p, {**values, **clipped}, base)
                value = min(max(value, low), high)
                value = int(round(value)) if p.type == "int" else float(value)
            clipped[p.path] = value
        return clipped

    def learn_memory_edge(self, values: Mapping[str, Any]) -> None:
        """A trial failed for memory: cap each memory knob below the value it had."""
        for p in self.params:
            if p.memory and p.path in values:
                cap = self.memory_caps.get(p.path, math.inf)
                self.memory_caps[p.path] = min(cap, float(values[p.path]))

    def _bounds(self, p: Param, values: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[float, float]:
        low, high = float(p.low), float(p.high)  # type: ignore[arg-type]
        for c in self.constraints:
            if c.param == p.path and not self._waived(c, values, base):
                bound = _lookup(c.at_least, values, base)
                if bound is not None:
                    low = max(low, float(bound))
        if p.path in self.memory_caps:
            high = min(high, max(self.memory_caps[p.path] * NOTCH, low))
        if low > high:
            raise TroughputError(f"no valid value left for {p.path}: needs >= {low:g} but at most {high:g}")
        return low, high

    @staticmethod
    def _waived(c: Constraint, values: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
        return bool(c.unless) and bool(_lookup(c.unless, values, base))


def _param(path: str, spec: dict[str, Any]) -> Param:
    kind = spec.pop("type", None)
    if kind not in TYPES:
        raise TroughputError(f"search space param {path!r}: type must be one of {', '.join(TYPES)}, got {kind!r}")
    if kind != "categorical" and ("low" not in spec or "high" not in spec or spec["low"] > spec["high"]):
        raise TroughputError(f"search space param {path!r}: needs low <= high")
    if kind == "categorical" and not spec.get("choices"):
        raise TroughputError(f"search space param {path!r}: categorical needs choices")
    try:
        return Param(path=path, type=kind, **spec)
    except TypeError as e:
        raise TroughputError(f"search space param {path!r}: {e}") from e


def _lookup(path: str, values: Mapping[str, Any], base: Mapping[str, Any]) -> Any:
    """A suggested value, else the base config's value at the dotted ``path`` (``None`` if absent)."""
    return values[path] if path in values else lookup(base, path)
