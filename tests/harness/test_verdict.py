"""The decision rule (harness.report.verdict): its pieces, and its error rate measured on simulated A/A comparisons."""

import itertools
import math

import numpy as np
import pytest

from benchmarks.verdict_error_rates import SPREADS, draw, simulate
from harness.report.verdict import CLEAR, CLOSE, EQUIVALENT, INSUFFICIENT, _half_width, compare, t_cdf, t_quantile


@pytest.mark.parametrize("df, quantile", [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (10, 2.2281389),
                                          (30, 2.0422725), (1000, 1.9623391)])
def test_t_quantiles_match_the_tables(df, quantile):
    assert t_quantile(0.975, df) == pytest.approx(quantile, rel=1e-6)
    assert t_cdf(quantile, df) == pytest.approx(0.975, abs=1e-7)
    assert t_quantile(0.025, df) == pytest.approx(-quantile, rel=1e-6)


def test_welch_interval_of_the_log_ratio_by_hand():
    a, b = [200, 205, 210], [100, 105, 110]
    la, lb = np.log(a), np.log(b)
    va, vb = la.var(ddof=1) / 3, lb.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    verdict = compare(a, b)
    assert verdict.ratio == pytest.approx(math.exp(la.mean() - lb.mean()))
    assert (verdict.low, verdict.high) == pytest.approx((math.exp(la.mean() - lb.mean() - half),
                                                         math.exp(la.mean() - lb.mean() + half)))
    assert verdict.verdict == CLEAR and verdict.winner == "a" and compare(b, a).winner == "b"
    assert verdict.named("A", "B") == "clear winner: A" and compare(b, a).named("B", "A") == "clear winner: A"
    assert compare([100, 100.1, 99.9], [100, 100.2, 99.8]).named("A", "B") == EQUIVALENT


def test_the_four_verdicts():
    few = compare([100, 101], [100, 100, 100])
    assert few.verdict == INSUFFICIENT and few.interval_text() == "1.005x (no interval)" and "2 and 3" in few.reason
    assert compare([100, 100.1, 99.9], [100, 100.2, 99.8]).verdict == EQUIVALENT
    close = compare([100, 130, 90], [100, 95, 105])
    assert close.verdict == CLOSE and (close.rounds_needed is None or close.rounds_needed > 3)
    small = compare([101, 101.1, 100.9], [100, 100.1, 99.9], min_effect=0.02)
    assert small.low > 1 and small.verdict == EQUIVALENT, "1% is real here but under the minimum effect"
    assert compare([101, 101.1, 100.9], [100, 100.1, 99.9], min_effect=0.005).verdict == CLEAR
    between = compare([102, 104, 100], [100, 100.5, 99.5])
    assert between.verdict == CLOSE and "includes 1" in between.reason and "runs a side would" in between.reason


def test_rounds_needed_is_what_the_rule_would_need_at_the_spread_seen():
    a, b = [100, 108, 104], [100, 96, 92]   # about +8%, 4% spread: 3 runs do not settle it
    verdict = compare(a, b)
    assert verdict.verdict == CLOSE and verdict.rounds_needed is not None
    n = verdict.rounds_needed
    la, lb = np.log(a), np.log(b)
    diff = la.mean() - lb.mean()
    half = [_half_width(la.var(ddof=1), lb.var(ddof=1), k, k, 0.05) for k in (n - 1, n)]
    assert half[1] < diff <= half[0], "n runs a side would exclude 1 at this estimate and spread; n - 1 would not"


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="positive"):
        compare([100, 0, 100], [100, 100, 100])
    with pytest.raises(ValueError, match="min_effect"):
        compare([100] * 3, [100] * 3, min_effect=1.5)


CASES = list(itertools.product(SPREADS, (0.0, 0.1), range(3, 11)))   # spread, outlier share, runs a side


def test_false_clear_winner_rate_over_a_thousand_simulated_aa_comparisons_is_at_most_5_percent():
    # A/A: both sides from one distribution; 2,560 comparisons over 4 spreads (2% to 30% of the log rate,
    # i.e. quiet to loaded hosts), with and without 10% outlier runs at 0.7x, 3 to 10 runs a side (unequal too)
    false, total = 0, 0
    for index, (sigma, outliers, n) in enumerate(CASES):
        share = simulate(n, 3 + (n * 7) % 8, sigma, 1.0, trials=40, seed=index, outliers=outliers)
        false += round((share["clear_a"] + share["clear_b"]) * 40)
        total += 40
    assert total >= 1000
    assert false / total <= 0.05, f"{false} false clear winners in {total} A/A comparisons"


def test_the_old_rule_fails_the_same_simulation():
    # every run of one side beating every run of the other (what separated bootstrap intervals of 3 runs meant)
    generator = np.random.default_rng(0)
    wins = sum(min(a) > max(b) or min(b) > max(a)
               for a, b in ((draw(generator, 3, 0.05), draw(generator, 3, 0.05)) for _ in range(2000)))
    assert wins / 2000 == pytest.approx(0.1, abs=0.02), "2 of the 20 orderings of 6 runs: the simulation can fail"


def test_the_rule_has_power_where_the_docs_say():
    # docs/verdicts.md: at 2% spread, 5 runs a side find a true 10% difference nearly always
    assert simulate(5, 5, 0.02, 1.10, trials=200, seed=7)["clear_a"] >= 0.9
    assert simulate(3, 3, 0.30, 1.10, trials=200, seed=8)["clear_a"] <= 0.2, "a loaded host cannot tell at 3 runs"
