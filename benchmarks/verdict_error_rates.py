"""The decision rule's error rate and power, measured by simulation (no engine): the figures in docs/verdicts.md.

    .venv/bin/python benchmarks/verdict_error_rates.py [--trials 4000] [--seed 0]

Each simulated comparison draws n per-run rates a side from one model of run-to-run
spread on these hosts: log-normal with standard deviation ``sigma`` of the log rate
(≈ the coefficient of variation), optionally with outliers (a share ``outliers`` of runs
slowed to 0.7×, like the 661 tok/s run in the old README example). Side A's rates are
``ratio`` × side B's in distribution; ``harness.report.verdict.compare`` judges A against B.
With ``ratio`` = 1 (A/A) any "clear winner" is false; with ``ratio`` > 1 the share of
"clear winner" for A is the power.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.report.verdict import CLEAR, CLOSE, EQUIVALENT, MIN_EFFECT, compare  # noqa: E402

# sigma of log per-run rates: a quiet host (README runs 1,014/991/985: 1.5%), typical, noisy, and a host loaded
# by other agents (docs/verdicts.md's A/A run: about 40%)
SPREADS = (0.02, 0.05, 0.10, 0.30)


def draw(generator: np.random.Generator, n: int, sigma: float, outliers: float = 0.0) -> np.ndarray:
    rates = 1000 * np.exp(generator.normal(0.0, sigma, n))
    return np.where(generator.random(n) < outliers, rates * 0.7, rates)


def simulate(n_a: int, n_b: int, sigma: float, ratio: float = 1.0, trials: int = 1000, seed: int = 0,
             outliers: float = 0.0, min_effect: float = MIN_EFFECT) -> dict[str, float]:
    """Share of each verdict over ``trials`` comparisons; ``clear_a``/``clear_b``: a clear winner for A / for B."""
    generator = np.random.default_rng(seed)
    counts = {"clear_a": 0, "clear_b": 0, EQUIVALENT: 0, CLOSE: 0}
    for _ in range(trials):
        verdict = compare(list(ratio * draw(generator, n_a, sigma, outliers)), list(draw(generator, n_b, sigma, outliers)),
                          min_effect)
        key = ("clear_a" if verdict.winner == "a" else "clear_b") if verdict.verdict == CLEAR else verdict.verdict
        counts[key] += 1
    return {k: v / trials for k, v in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.trials} simulated comparisons per cell, min effect {MIN_EFFECT:.0%}, equal runs a side")
    print("| spread (sd of log rate) | outliers | runs a side | A/A: false clear winner | A/A: equivalent | "
          "power at +5% | power at +10% |")
    print("|---|---|---|---|---|---|---|")
    for sigma in SPREADS:
        for outliers in (0.0, 0.1):
            for n in (3, 5, 10):
                aa = simulate(n, n, sigma, 1.0, args.trials, args.seed, outliers)
                p5 = simulate(n, n, sigma, 1.05, args.trials, args.seed + 1, outliers)
                p10 = simulate(n, n, sigma, 1.10, args.trials, args.seed + 2, outliers)
                print(f"| {sigma:.0%} | {outliers:.0%} | {n} | {aa['clear_a'] + aa['clear_b']:.1%} | "
                      f"{aa[EQUIVALENT]:.1%} | {p5['clear_a']:.1%} | {p10['clear_a']:.1%} |", flush=True)


if __name__ == "__main__":
    main()
