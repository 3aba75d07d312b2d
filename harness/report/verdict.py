"""The one decision rule: is config A faster than config B, the same, or too close to call?

Inputs are per-run rates (one number per independent run, one engine process each, e.g.
each run's median-pass output tok/s), at least ``MIN_RUNS`` a side. The rule works on
their logarithms, so a ratio of rates is a difference of means and run-to-run noise,
which is multiplicative on a shared host, is symmetric:

- **Welch's t** on the log rates, two-sided at ``ALPHA`` = 0.05, gives a 95% interval
  for the ratio of geometric means (exp of the interval of the difference of means).
  Welch rather than an exact permutation test: with 3 runs a side a permutation test has
  20 equally likely splits, so its smallest two-sided p-value is 0.1 and it can never
  decide at 0.05; and it gives a p-value, not an interval for the ratio. Welch allows
  the two configs different spreads (a config with outliers does not borrow the other's
  steadiness). It assumes roughly normal log rates; tests/harness/test_verdict.py
  measures its false-winner rate on simulated runs with outliers as well.
- ``clear winner``: the interval excludes 1 **and** the point estimate clears the
  minimum effect (``MIN_EFFECT``, 2% by default, configurable): a difference must be
  both real and large enough to matter.
- ``equivalent``: the whole interval lies within ± the minimum effect (in log terms:
  ratio between 1/(1+m) and 1+m).
- ``too close to call``: anything else; ``rounds_needed`` says how many runs a side
  would likely decide it if the estimate and spread seen so far held.
- ``insufficient data``: fewer than ``MIN_RUNS`` runs on a side.

Pure standard library (no numpy, no pandas, no SciPy), so the benchmarks, the tuner and
the report all call this same function. docs/verdicts.md states the measured error rate
and power.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

CLEAR, EQUIVALENT, CLOSE, INSUFFICIENT = "clear winner", "equivalent", "too close to call", "insufficient data"
VERDICTS = (CLEAR, EQUIVALENT, CLOSE, INSUFFICIENT)
DECIDED = (CLEAR, EQUIVALENT)
ALPHA = 0.05        # two-sided
MIN_EFFECT = 0.02   # a ratio within 1 ± 2% is "no difference that matters"
MIN_RUNS = 3        # independent runs per side the rule needs
MAX_ROUNDS_SEARCHED = 200
METHOD = (f"Welch's t on log per-run rates, {1 - ALPHA:.0%} two-sided interval of the ratio of geometric means; "
          "clear winner: interval excludes 1 and estimate clears the minimum effect; equivalent: interval "
          "within ± the minimum effect")


@dataclass(frozen=True)
class Verdict:
    """What the rule says about ``a`` against ``b``; ``ratio`` is a ÷ b (geometric means)."""

    verdict: str
    winner: str | None          # "a", "b" or None (only for a clear winner)
    ratio: float | None
    low: float | None
    high: float | None
    n_a: int
    n_b: int
    min_effect: float
    spread: float | None        # pooled sample std of the log rates (≈ the runs' coefficient of variation)
    rounds_needed: int | None   # runs a side that would likely decide it (too close to call only)
    reason: str

    @property
    def decided(self) -> bool:
        return self.verdict in DECIDED

    def named(self, a: str, b: str) -> str:
        """The verdict naming the winner: ``clear winner: <a or b>``, else the verdict alone."""
        return f"{self.verdict}: {a if self.winner == 'a' else b}" if self.winner else self.verdict

    def interval_text(self) -> str:
        """``1.127x [1.026, 1.536]``, ``1.127x (no interval)`` with too few runs, ``-`` without an estimate."""
        if self.ratio is None:
            return "-"
        if self.low is None or self.high is None:
            return f"{self.ratio:.3f}x (no interval)"
        return f"{self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}]"


def compare(a: Sequence[float], b: Sequence[float], min_effect: float = MIN_EFFECT, alpha: float = ALPHA,
            min_runs: int = MIN_RUNS, estimate_rounds: bool = True) -> Verdict:
    """Apply the rule to per-run rates ``a`` and ``b`` (higher is better; any positive unit).

    ``estimate_rounds=False`` skips the search for ``rounds_needed`` (left None) where only the verdict is
    wanted: the verdict does not depend on it (the A/A loop simulations use this; it is most of the cost).
    """
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be in [0, 1), got {min_effect}")
    if any(not (x > 0 and math.isfinite(x)) for x in [*a, *b]):
        raise ValueError("per-run rates must be positive and finite")
    base = dict(n_a=len(a), n_b=len(b), min_effect=min_effect)
    if len(a) < min_runs or len(b) < min_runs:
        ratio = _geomean(a) / _geomean(b) if a and b else None
        return Verdict(INSUFFICIENT, None, ratio, None, None, spread=None, rounds_needed=min_runs, **base,
                       reason=f"the rule needs {min_runs} independent runs a side; there are {len(a)} and {len(b)}")
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    va, vb = statistics.variance(la), statistics.variance(lb)
    diff = statistics.fmean(la) - statistics.fmean(lb)
    half = _half_width(va, vb, len(a), len(b), alpha)
    ratio, low, high = math.exp(diff), math.exp(diff - half), math.exp(diff + half)
    margin = math.log1p(min_effect)
    spread = math.sqrt((va * (len(a) - 1) + vb * (len(b) - 1)) / (len(a) + len(b) - 2))
    text = f"{ratio:.3f}x [{low:.3f}, {high:.3f}] ({1 - alpha:.0%}, {len(a)} vs {len(b)} runs)"
    base |= dict(ratio=ratio, low=low, high=high, spread=spread)
    if (low > 1 or high < 1) and abs(diff) >= margin:
        return Verdict(CLEAR, "a" if diff > 0 else "b", rounds_needed=None, **base,
                       reason=f"{text} excludes 1 and clears the {min_effect:.0%} minimum effect")
    if abs(diff) + half <= margin:
        return Verdict(EQUIVALENT, None, rounds_needed=None, **base,
                       reason=f"{text} lies within ±{min_effect:.0%}")
    needed = rounds_needed(va, vb, diff, margin, alpha, start=max(len(a), len(b))) if estimate_rounds else None
    why = ("the interval includes 1" if low <= 1 <= high else f"the estimate is within the {min_effect:.0%} "
           "minimum effect but the interval is not")
    likely = (f"about {needed} runs a side would likely decide it at this spread" if needed
              else "runs needed not estimated" if not estimate_rounds
              else f"more than {MAX_ROUNDS_SEARCHED} runs a side would be needed at this spread")
    return Verdict(CLOSE, None, rounds_needed=needed, **base, reason=f"{text}: {why}; {likely}")


def rounds_needed(va: float, vb: float, diff: float, margin: float, alpha: float = ALPHA,
                  start: int = MIN_RUNS) -> int | None:
    """Smallest runs a side (> ``start``) at which the rule would decide if ``diff`` and the variances held.

    The half-width shrinks as runs are added, so the first deciding count is found by bisection.
    """
    def decides(n: int) -> bool:
        half = _half_width(va, vb, n, n, alpha)
        return (abs(diff) >= margin and half < abs(diff)) or abs(diff) + half <= margin

    low, high = start, MAX_ROUNDS_SEARCHED
    if not decides(high):
        return None
    while high - low > 1:   # decides(high) holds, decides(low) does not (or low is the start)
        mid = (low + high) // 2
        if decides(mid):
            high = mid
        else:
            low = mid
    return high


def _half_width(va: float, vb: float, na: int, nb: int, alpha: float) -> float:
    """Half-width of Welch's interval for the difference of means (Welch–Satterthwaite df)."""
    sa, sb = va / na, vb / nb
    se2 = sa + sb
    if se2 == 0:
        return 0.0
    df = se2 ** 2 / (sa ** 2 / (na - 1) + sb ** 2 / (nb - 1))
    return t_quantile(1 - alpha / 2, df) * math.sqrt(se2)


def _geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in values))


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function (any real ``df`` > 0), via the regularised incomplete beta."""
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom.

    Newton steps on ``t_cdf`` from the Cornish–Fisher start, kept inside a bisection bracket.
    """
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    z = statistics.NormalDist().inv_cdf(p)
    t = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    low, high = 0.0, 1e6
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    for _ in range(100):
        if not low < t < high:
            t = (low + high) / 2 if high < 1e6 else max(2 * low, 1.0)
        error = t_cdf(t, df) - p
        if abs(error) < 1e-13:
            break
        if error < 0:
            low = t
        else:
            high = t
        density = math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))
        t -= error / density
    return t


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (continued fraction, Numerical Recipes' betacf)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 3e-14:
            break
    return h
