"""What ``harness.report.sequential.RESERVE`` buys: the whole ``run.rounds=auto`` loop's false-winner rate and
power with reserves of 0.0, 0.1, 0.2 and 0.3 (the figures beside the constant in docs/verdicts.md).

    PYTHONPATH=. .venv/bin/python benchmarks/sequential_reserve.py [--trials 1000] [--seed 0] [--looks 10]

A plan of more than one look spends α × (1 − reserve) (0.05, 0.045, 0.04, 0.035): the boundaries are exact
for z statistics, and Welch's t, which re-estimates the spread at every look, crosses a little more often.
Each line runs the real loop (``rounds.add_rounds``, through ``benchmarks/verdict_error_rates.py``), the
first look at 3 runs a side and ``--looks`` looks (10: a cap of 12), on:

- A/A, no drift, 5% spread: log-normal runs, where t and z differ most at few runs;
- A/A, resampled real runs: ``benchmarks/data/per_run_rates.json``;
- power: a true +5% and +10% (side A's rates × 1.05 or × 1.10) at 5% spread: the share of loops that name A.

Every reserve sees the same loops (the same seeds), so the lines differ by the reserve alone.

About 30 s at the default 1,000 loops a line on one core (each A/A share is ± about 0.7 points; use
``--trials 10000`` to tell 5.5% from 5%, about five minutes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.verdict_error_rates import drifting, loop_rates, resampled, sequential, shifted  # noqa: E402
from harness.report.sequential import RESERVE  # noqa: E402
from harness.report.verdict import ALPHA, MIN_RUNS  # noqa: E402

RESERVES = (0.0, 0.1, 0.2, 0.3)


def table(trials: int, seed: int, looks: int) -> None:
    print(f"{trials} loops a cell, looks at {MIN_RUNS} to {MIN_RUNS + looks - 1} runs a side, O'Brien–Fleming, "
          f"α = {ALPHA}, min effect 2%; the reserve in use is {RESERVE}")
    print("| reserve | α spent | A/A false winners: no drift, 5% spread | A/A false winners: resampled real runs | "
          "power at +5%, 5% spread | power at +10%, 5% spread |")
    print("|---|---|---|---|---|---|")
    quiet = drifting(0.05, 0.0)
    for reserve in RESERVES:
        rule = sequential(reserve=reserve)
        aa = loop_rates(quiet, rule, looks, trials, seed)["false"]
        real = loop_rates(resampled(), rule, looks, trials, seed + 1)["false"]
        p5 = loop_rates(shifted(1.05, quiet), rule, looks, trials, seed + 2)["clear_a"]
        p10 = loop_rates(shifted(1.10, quiet), rule, looks, trials, seed + 3)["clear_a"]
        print(f"| {reserve:.1f} | {ALPHA * (1 - reserve):.3f} | {aa:.1%} | {real:.1%} | {p5:.1%} | {p10:.1%} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--looks", type=int, default=10)
    args = parser.parse_args()
    start = time.monotonic()
    table(args.trials, args.seed, args.looks)
    print(f"{time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
