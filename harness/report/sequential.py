"""Verdicts under repeated looks: the group-sequential levels every loop that tests again must use.

A loop that applies ``harness.report.verdict.compare`` at α = 0.05 after every added round and
stops at the first decision calls false winners far more often than 5% (optional stopping: an
A/A pair gets up to ten chances to cross). The fix is alpha spending (Lan and DeMets, 1983):
the loop declares its looks in advance (``SequentialPlan``: the first look at ``first`` runs a
side, then one look per added run a side, up to ``last``), a spending function hands each look a
share of the total α, and each look's Welch interval is taken at that look's *nominal* level,
so that the whole loop's chance of any false winner stays at α (spending α × 0.8: ``RESERVE``).

The boundaries are computed for the z statistic with independent increments (information = runs a
side): the first crossing probabilities under no difference, P(|Z_1| < c_1, ..., |Z_k| ≥ c_k), are
integrated numerically (Armitage, McPherson and Rowe's recursion, Jennison and Turnbull ch. 19) to
equal each look's spent α. The verdict then applies the nominal two-sided level 2(1 − Φ(c_k)) to
Welch's t (the "significance level" approach); that the whole loop keeps its ≤ 5% with t
statistics, few runs, outlier runs, drift between rounds and resampled real runs is shown by
simulation (``benchmarks/verdict_error_rates.py --loops``, ``tests/harness/test_sequential.py``) for the
plans in ``SIMULATED`` only; ``SequentialPlan.describe`` says whether a plan is one of them. A plan never
looks past its last look (``SequentialPlan.judge``).

Spending functions (``t`` is the information fraction n_k / ``last``):

- ``obrien-fleming`` (default): α(t) = 2 − 2Φ(z_{1−α/2} / √t). Spends almost nothing early, so
  the last look is nearly a plain α = 0.05 test (power at the cap barely drops) and early stops
  need a clear difference.
- ``pocock``: α(t) = α ln(1 + (e − 1) t). Near-constant levels: earlier stops, less power at the cap.

A plan with one look (``first == last``) is the plain rule at α. In-job tuning and any later loop
that looks again reuse ``SequentialPlan.judge``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist
from typing import Sequence

import numpy as np

from harness.report.verdict import ALPHA, MIN_EFFECT, MIN_RUNS, Verdict, _half_width, compare

SPENDING = ("obrien-fleming", "pocock")
# The boundaries are exact for z statistics. Welch's t at 3-12 runs a side re-estimates the spread at every
# look, so successive looks are less correlated than z's and the loop crosses a little more often than it
# spends: spending the full 0.05 measured 5.5% false winners at 10 looks (10,000 A/A loops, no drift, 5%
# spread), 0.1 gave 4.7%, 0.2 gave 4.2% for about 2 points of power at +5% per 0.1
# (`PYTHONPATH=. .venv/bin/python benchmarks/sequential_reserve.py --trials 10000`; docs/verdicts.md, "What the
# reserve buys"). A multi-look plan therefore spends alpha × (1 − RESERVE); one look is the plain rule.
RESERVE = 0.2
# The plans (first, last runs a side) whose whole-loop false-winner rate is simulated, with O'Brien–Fleming spending at
# α = 0.05, this RESERVE and a minimum effect of 2% (a larger one only removes false winners): 1, 3, 4, 8 and 10 looks
# from the third run; (3, 6) is in-job tuning's default confirmation and (3, 10) run.rounds=auto's.
# tests/harness/test_sequential.py asserts ≤ 5% false winners on each; docs/verdicts.md tabulates them. The ≤ 5% is
# claimed for these plans only (``SequentialPlan.simulated``); others are computed the same way but not measured.
SIMULATED = ((3, 3), (3, 5), (3, 6), (3, 10), (3, 12))
SIMULATED_MIN_EFFECT = 0.02   # the smallest minimum effect the simulations used: a smaller one is not covered
GRID = 401          # points per look in the numerical integration (odd: Simpson's rule)
_NORMAL = NormalDist()


def spent(t: float, alpha: float = ALPHA, spending: str = "obrien-fleming") -> float:
    """Cumulative two-sided α spent by information fraction ``t`` (0 < t ≤ 1)."""
    if spending not in SPENDING:
        raise ValueError(f"unknown spending function {spending!r}; known: {', '.join(SPENDING)}")
    t = min(max(t, 0.0), 1.0)
    if t == 0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1) * t)
    return 2 * (1 - _NORMAL.cdf(_NORMAL.inv_cdf(1 - alpha / 2) / math.sqrt(t)))


@lru_cache(maxsize=256)
def boundaries(information: tuple[float, ...], alpha: float = ALPHA, spending: str = "obrien-fleming"
               ) -> tuple[float, ...]:
    """Two-sided z boundaries c_k for looks at ``information`` (increasing, e.g. runs a side).

    Each look's first-crossing probability under no difference equals the α the spending function
    allots it (its spent α minus the previous look's), by numerical integration over the region
    where the loop went on. ``math.inf`` where a look is allotted nothing.
    """
    if not information or any(b <= a for a, b in zip(information, information[1:])) or information[0] <= 0:
        raise ValueError(f"information levels must be positive and increasing, got {information}")
    total = information[-1]
    cuts: list[float] = []
    grid = density = weights = None
    previous_spent = 0.0
    for k, info in enumerate(information):
        now_spent = spent(info / total, alpha, spending)
        share = now_spent - previous_spent
        previous_spent = now_spent
        if k == 0:
            cut = _NORMAL.inv_cdf(1 - share / 2) if share > 0 else math.inf
            root = math.sqrt(info)
        else:
            step = math.sqrt(info - information[k - 1])
            mass = weights * density   # what went on past look k - 1, on its grid

            def tail(c: float) -> float:
                edge = c * math.sqrt(info)
                return float(np.sum(mass * (_cdf((-edge - grid) / step) + _cdf((grid - edge) / step))))

            cut = _solve(tail, share) if share > 0 else math.inf
            root = math.sqrt(info)
        cuts.append(cut)
        edge = (cut if math.isfinite(cut) else 12.0) * root
        new_grid = np.linspace(-edge, edge, GRID)
        if k == 0:
            new_density = np.exp(-0.5 * (new_grid / root) ** 2) / (root * math.sqrt(2 * math.pi))
        else:
            z = (new_grid[:, None] - grid[None, :]) / step
            new_density = (np.exp(-0.5 * z ** 2) / (step * math.sqrt(2 * math.pi))) @ mass
        grid, density, weights = new_grid, new_density, _simpson(new_grid)
    return tuple(cuts)


def nominal_levels(information: tuple[float, ...], alpha: float = ALPHA, spending: str = "obrien-fleming"
                   ) -> tuple[float, ...]:
    """Each look's nominal two-sided level, 2(1 − Φ(c_k)), from ``boundaries``."""
    return tuple(0.0 if math.isinf(c) else 2 * (1 - _NORMAL.cdf(c))
                 for c in boundaries(tuple(information), alpha, spending))


@dataclass(frozen=True)
class SequentialPlan:
    """The looks a loop may take, and the level each look's verdict uses.

    Args:
        first: runs a side at the first look that can decide (at least ``MIN_RUNS``).
        last: runs a side at the last look (the loop's cap); ``first == last`` is one look, the plain rule.
        alpha: the whole loop's two-sided false-winner rate.
        spending: ``obrien-fleming`` or ``pocock`` (see the module docstring).
        reserve: the share of ``alpha`` a plan of more than one look keeps back (``RESERVE``; other values are for
            ``benchmarks/sequential_reserve.py``, which measures what it buys).

    A plan never looks past ``last``: ``level`` refuses such a look and ``judge`` takes it as the last look (see there).
    """

    first: int
    last: int
    alpha: float = ALPHA
    spending: str = "obrien-fleming"
    reserve: float = RESERVE
    levels: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.first < MIN_RUNS:
            raise ValueError(f"the first look needs at least {MIN_RUNS} runs a side (the rule's minimum), "
                             f"got first={self.first}")
        if self.last < self.first:
            raise ValueError(f"the last look ({self.last} runs a side) comes before the first ({self.first})")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0 <= self.reserve < 1:
            raise ValueError(f"reserve must be in [0, 1), got {self.reserve}")
        looks = tuple(float(n) for n in range(self.first, self.last + 1))
        object.__setattr__(self, "levels", nominal_levels(looks, self.spent_alpha, self.spending))

    @property
    def spent_alpha(self) -> float:
        """The α the boundaries spend: ``alpha`` for one look; ``alpha × (1 − reserve)`` for more (see ``RESERVE``)."""
        return self.alpha if self.looks == 1 else self.alpha * (1 - self.reserve)

    @property
    def looks(self) -> int:
        return self.last - self.first + 1

    @property
    def simulated(self) -> bool:
        """Whether this plan's whole-loop false-winner rate is measured (``SIMULATED``): only then is "at most α"
        a measured claim rather than the design's aim."""
        return ((self.first, self.last) in SIMULATED and self.alpha == ALPHA and self.spending == "obrien-fleming"
                and self.reserve == RESERVE)

    def level(self, runs: int) -> float:
        """The nominal two-sided level of a look with ``runs`` runs on its smaller side.

        A look before ``first`` runs uses the first look's level: a look delayed by a failed run is taken at a
        level no higher than its round's. A look past ``last`` is refused (``ValueError``): the plan's α is spent
        by its last look, and any further look would spend more.
        """
        if runs > self.last:
            raise ValueError(f"a look at {runs} runs a side is past this plan's last look ({self.last} runs a side): "
                             f"it would spend more than α = {self.alpha:g}")
        return self.levels[max(runs - self.first, 0)]

    def judge(self, a: Sequence[float], b: Sequence[float], min_effect: float = MIN_EFFECT,
              estimate_rounds: bool = True) -> Verdict:
        """``compare(a, b)`` at this look's nominal level (the look is the smaller side's run count).

        With more than ``last`` runs on both sides (rows added after the loop ended) the look is the plan's last:
        the first ``last`` runs of each side (``a`` and ``b`` in the order they ran) at the last look's level, and
        the reason says the later runs are not counted; a look past the plan never spends more than its α.
        """
        if min(len(a), len(b)) <= self.last:
            return compare(a, b, min_effect=min_effect, alpha=self.level(min(len(a), len(b))),
                           estimate_rounds=estimate_rounds)
        final = compare(list(a)[:self.last], list(b)[:self.last], min_effect=min_effect,
                        alpha=self.level(self.last), estimate_rounds=False)
        return replace(final, reason=f"{final.reason}; the plan's last look is at {self.last} runs a side, so the "
                                     f"{len(a) - self.last} and {len(b) - self.last} later runs are not counted "
                                     f"(another look would spend more than α = {self.alpha:g}; report new runs "
                                     f"on their own: troughput-report --since or --sweep-id)")

    def runs_to_decide(self, verdict: Verdict) -> int | None:
        """Fewest runs a side, after the verdict's and up to ``last``, at which this plan's look would decide
        if the estimate and spread seen so far held (each look at its own level); None when no look up to
        ``last`` would. A futility rule for loops that add rounds (``verdict.rounds_needed`` assumes the
        plain level at every n, which early looks of a plan do not have)."""
        if verdict.ratio is None or verdict.spread is None:
            return None
        diff, variance = abs(math.log(verdict.ratio)), verdict.spread ** 2
        margin = math.log1p(verdict.min_effect)
        for n in range(max(verdict.n_a, verdict.n_b) + 1, self.last + 1):
            half = _half_width(variance, variance, n, n, self.level(n))
            if (diff >= margin and half < diff) or diff + half <= margin:
                return n
        return None

    def covers(self, min_effect: float | None) -> bool:
        """Whether the ≤ α claim is measured for this plan at ``min_effect`` (None: the simulated one): a plan of
        ``SIMULATED`` at a minimum effect of ``SIMULATED_MIN_EFFECT`` or more (a larger one only removes false
        winners)."""
        return self.simulated and (min_effect is None or min_effect >= SIMULATED_MIN_EFFECT)

    def describe(self, min_effect: float | None = None) -> str:
        """One line for logs, decisions and docs; ``min_effect``: the one the verdicts use, where known."""
        if self.looks == 1:
            return f"one look at {self.first} runs a side, α = {self.alpha:g}"
        shown = ", ".join(f"{n}: {lvl:.4f}" for n, lvl in zip(range(self.first, self.last + 1), self.levels))
        rate = (f"whole-loop false-winner rate at most {self.alpha:g} (simulated for this plan at a minimum effect "
                f"of {SIMULATED_MIN_EFFECT:g} or more)" if self.covers(min_effect)
                else f"aiming at a whole-loop false-winner rate of at most {self.alpha:g} (not simulated for "
                     f"this plan; docs/verdicts.md lists those that are)")
        return (f"group-sequential, {self.spending} alpha spending of {self.spent_alpha:g}, {self.looks} looks at "
                f"{self.first} to {self.last} runs a side, {rate}; nominal level per look ({shown})")


def plain(runs: int = MIN_RUNS) -> SequentialPlan:
    """A one-look plan: the plain rule at α (what a report that looks once uses)."""
    return SequentialPlan(max(runs, MIN_RUNS), max(runs, MIN_RUNS))


def _solve(tail, target: float) -> float:
    """The c where the decreasing ``tail(c)`` equals ``target`` (bisection)."""
    low, high = 0.0, 40.0
    for _ in range(80):
        mid = (low + high) / 2
        if tail(mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _simpson(grid: np.ndarray) -> np.ndarray:
    h = grid[1] - grid[0]
    w = np.ones(len(grid))
    w[1:-1:2], w[2:-1:2] = 4, 2
    return w * h / 3


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def _cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * _ERFC(-np.asarray(x, dtype=float) / math.sqrt(2)).astype(float)
