"""The in-main confirmation's error rates and power (``harness.batch.tune.tune_confirm``), simulated.

    .venv/bin/python -m benchmarks.in_main_confirmation [--jobs 2000]

Each simulated job is what the rule sees: the engine defaults' trial (one run, 4 blocks) and the main phase on the
candidate (one run, a block after each commit); every block of a run shares that run's log-normal offset
(``run``: the spread of two runs of one config) with its own noise (``block``), and the main phase may run
``drift`` slower or faster than trial 0 (the host changed between them). Counted: jobs that keep the candidate.
Where the candidate is as fast as the defaults (A/A), that is the false-winner rate; where it is slower, the rate
of keeping a loser; where it is faster, the power. ``bare`` is the rule with no run allowance (``run_spread=0``):
the blocks' own spread only, which treats blocks of one run as independent runs.
"""

from __future__ import annotations

import argparse
import math
import platform
import subprocess
import time
from datetime import datetime, timezone

import numpy as np

from harness.batch.tune.tune_confirm import KEEP, Alternation, InMainRule, merge
from harness.report.verdict import MIN_RUNS


def simulate(rule: InMainRule, run_sigma: float, block_sigma: float, drift: float, jobs: int,
             candidate_gain: float = 0.0, seed: int = 0, default_blocks: int = 4) -> float:
    """Share of ``jobs`` in which the rule keeps the candidate (see the module's notes)."""
    rng = np.random.default_rng(seed)
    kept = 0
    for _ in range(jobs):
        defaults = np.exp(rng.normal(0, run_sigma) + rng.normal(0, block_sigma, default_blocks)) * 1000
        offset = rng.normal(0, run_sigma) + drift + math.log1p(candidate_gain)
        blocks = np.exp(offset + rng.normal(0, block_sigma, rule.last_samples)) * 1000
        for n in range(MIN_RUNS, rule.last_samples + 1):
            action = rule.look(list(blocks[:n]), list(defaults)).action
            if action is not None:
                kept += action == KEEP
                break
    return kept / jobs


def simulate_jobs(rule: InMainRule, run_sigma: float, block_sigma: float, drift: float, jobs: int,
                  rates: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0), seed: int = 0, trial_blocks: int = 4,
                  merged: int | None = None) -> float:
    """Share of ``jobs`` that finish on a config other than the engine defaults, the whole tuning path: ``rates`` are
    the configs' true rates (the defaults first, trial 0); each trial's value is its run's mean block (its run's
    offset and its blocks' noise: trial 0's low run both loses the ranking and lowers the defaults' side, the
    selection the rule must survive); the best trial, where not the defaults, starts the main phase, whose blocks
    (a new run's offset, ``drift``) meet trial 0's at the looks; a switch back or the defaults' own win finishes on
    the defaults. Where a trial gives more blocks than the last look compares (``trial_blocks`` over
    ``rule.last_samples``), both sides' samples are merged as the confirmation merges them
    (``tune_confirm.merge``; ``merged=1``: the rule before it merged, on the first blocks of each side)."""
    rng = np.random.default_rng(seed)
    other = 0
    merged = merged or rule.per_sample(trial_blocks)
    for _ in range(jobs):
        runs = [np.exp(math.log(r) + rng.normal(0, run_sigma) + rng.normal(0, block_sigma, trial_blocks)) * 1000
                for r in rates]
        best = int(np.argmax([blocks.mean() for blocks in runs]))
        if best == 0:
            continue
        offset = math.log(rates[best]) + rng.normal(0, run_sigma) + drift
        blocks = merge(list(np.exp(offset + rng.normal(0, block_sigma, merged * rule.last_samples)) * 1000), merged)
        defaults = merge(list(runs[0]), merged)
        for n in range(MIN_RUNS, rule.last_samples + 1):
            action = rule.look(blocks[:n], defaults).action
            if action is not None:
                other += action == KEEP
                break
    return other / jobs


def simulate_alternating(rule: InMainRule, run_sigma: float, block_sigma: float, drift: float, jobs: int,
                         rates: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0), seed: int = 0, blocks: int = 40,
                         trend: bool = False) -> float:
    """``simulate_jobs`` with the confirmation by alternating runs (``tune_confirm.Alternation``): every run (trial or
    main phase) a new run offset, a sample its ``blocks`` blocks' geometric mean; the trials rank the configs (trial
    0 the defaults), the best other than the defaults is the candidate; the main phase's runs alternate, the
    defaults first, ``drift`` on every one of them (the host changed since the trials, both sides alike), or with
    ``trend`` ``drift`` × the run's place in the main phase (a host that keeps speeding up or slowing down, which
    favours the side that runs later: the candidate); the looks at whole runs with no run allowance."""
    rng = np.random.default_rng(seed)
    alternation = Alternation(rule, None)
    other = 0

    def run(rate: float, shift: float = 0.0) -> float:
        return math.exp(math.log(rate) + shift + rng.normal(0, run_sigma) + rng.normal(0, block_sigma, blocks).mean())

    for _ in range(jobs):
        trials = [run(r) for r in rates]
        best = int(np.argmax(trials))
        if best == 0:
            continue
        alternation.made, candidate, defaults = [], [], []
        while (side := alternation.next(candidate, defaults)) is not None:
            shift = drift * (len(candidate) + len(defaults) + 1) if trend else drift
            (candidate if side else defaults).append(run(rates[best] if side else rates[0], shift))
        other += alternation.action == KEEP
    return other / jobs


JOB_CASES = [   # (label, run, block, drift, rates: the defaults first)
    ("A/A: 4 configs alike, runs 3%, blocks 3%", 0.03, 0.03, 0.0, (1.0, 1.0, 1.0, 1.0)),
    ("A/A: runs 5%, blocks 3%", 0.05, 0.03, 0.0, (1.0, 1.0, 1.0, 1.0)),
    ("A/A: runs 3%, blocks 3%, main +3% (drift)", 0.03, 0.03, 0.03, (1.0, 1.0, 1.0, 1.0)),
    ("best candidate 5% slower, runs 3%", 0.03, 0.03, 0.0, (1.0, 0.95, 0.9, 0.8)),
    ("best candidate 10% slower, runs 3%", 0.03, 0.03, 0.0, (1.0, 0.9, 0.85, 0.8)),
    ("best candidate 5% slower, runs 5%", 0.05, 0.03, 0.0, (1.0, 0.95, 0.9, 0.8)),
    ("a candidate 15% faster, runs 3%", 0.03, 0.03, 0.0, (1.0, 1.15, 0.9, 0.8)),
    ("a candidate 2.3x (the real CPU job's), runs 5%", 0.05, 0.03, 0.0, (1.0, 2.3, 1.2, 0.9)),
    # GPU scale: trials of 80 blocks of 10% noise (the virtual H100's at 10^6 requests), merged 16 a sample
    ("A/A, 80 blocks a trial (merged), runs 2%, blocks 10%", 0.02, 0.10, 0.0, (1.0, 1.0, 1.0, 1.0), 80),
    ("A/A, 80 blocks a trial (merged), runs 3%, blocks 10%", 0.03, 0.10, 0.0, (1.0, 1.0, 1.0, 1.0), 80),
    ("A/A, 80 blocks a trial (merged), runs 5%, blocks 10%", 0.05, 0.10, 0.0, (1.0, 1.0, 1.0, 1.0), 80),
    ("best candidate 5% slower, 80 blocks (merged), runs 3%", 0.03, 0.10, 0.0, (1.0, 0.95, 0.9, 0.8), 80),
    ("a candidate 9% faster, 80 blocks (merged), runs 2%", 0.02, 0.10, 0.0, (1.0, 1.09, 0.9, 0.8), 80),
    ("a candidate 9% faster, 80 blocks, not merged, runs 2%", 0.02, 0.10, 0.0, (1.0, 1.09, 0.9, 0.8), 80, 1),
]

ALTERNATING_CASES = [   # (label, run, block, drift, rates: the defaults first)
    ("A/A, runs 2%, blocks 10%", 0.02, 0.10, 0.0, (1.0, 1.0, 1.0, 1.0)),
    ("A/A, runs 5%, blocks 10%", 0.05, 0.10, 0.0, (1.0, 1.0, 1.0, 1.0)),
    ("A/A, runs 10%, blocks 10%", 0.10, 0.10, 0.0, (1.0, 1.0, 1.0, 1.0)),
    ("A/A, runs 2%, main +5% (drift)", 0.02, 0.10, 0.05, (1.0, 1.0, 1.0, 1.0)),
    ("A/A, runs 2%, main -10% (drift)", 0.02, 0.10, -0.10, (1.0, 1.0, 1.0, 1.0)),
    ("A/A, runs 2%, the host 1% faster each run", 0.02, 0.10, 0.01, (1.0, 1.0, 1.0, 1.0), True),
    ("A/A, runs 2%, the host 2% faster each run", 0.02, 0.10, 0.02, (1.0, 1.0, 1.0, 1.0), True),
    ("best candidate 5% slower, runs 2%", 0.02, 0.10, 0.0, (1.0, 0.95, 0.9, 0.8)),
    ("best candidate 5% slower, runs 5%", 0.05, 0.10, 0.0, (1.0, 0.95, 0.9, 0.8)),
    ("a candidate 5% faster, runs 2%", 0.02, 0.10, 0.0, (1.0, 1.05, 0.9, 0.8)),
    ("a candidate 9% faster, runs 2%", 0.02, 0.10, 0.0, (1.0, 1.09, 0.9, 0.8)),
    ("a candidate 9% faster, runs 5%", 0.05, 0.10, 0.0, (1.0, 1.09, 0.9, 0.8)),
]

CASES = [   # (label, run, block, drift, gain)
    ("A/A, runs 2%, drift +1%", 0.02, 0.01, 0.01, 0.0),
    ("A/A, runs 3% (the allowance), no drift", 0.03, 0.01, 0.0, 0.0),
    ("A/A, runs 2%, drift -10% (main slower)", 0.02, 0.01, -0.10, 0.0),
    ("A/A, runs 2%, drift +5% (main faster)", 0.02, 0.01, 0.05, 0.0),
    ("candidate 5% slower, runs 2%, drift +1%", 0.02, 0.01, 0.01, -0.05),
    ("candidate 10% slower, runs 2%, drift +5%", 0.02, 0.01, 0.05, -0.10),
    ("candidate 10% faster, runs 2%", 0.02, 0.01, 0.0, 0.10),
    ("candidate 15% faster, runs 2%", 0.02, 0.01, 0.0, 0.15),
    ("candidate 30% faster, runs 2%, drift -10%", 0.02, 0.01, -0.10, 0.30),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--looks", type=int, default=3)
    parser.add_argument("--run-spread", type=float, default=0.03)
    parser.add_argument("--min-effect", type=float, default=0.02)
    args = parser.parse_args()
    rule, bare = (InMainRule(args.looks, args.min_effect, spread) for spread in (args.run_spread, 0.0))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, {platform.node()}, {args.jobs} jobs "
          f"a case; rule: {rule.describe()}")
    print("| case | kept (the rule) | kept (bare: no run allowance) |\n|---|---|---|")
    t0 = time.perf_counter()
    for label, run, block, drift, gain in CASES:
        print(f"| {label} | {simulate(rule, run, block, drift, args.jobs, gain):.2%} | "
              f"{simulate(bare, run, block, drift, args.jobs, gain):.2%} |")
    print(f"\n# whole jobs: trials ranked, the best confirmed in the main phase; {args.jobs} jobs a case\n"
          "| case | finished on another config than the defaults |\n|---|---|")
    for label, run, block, drift, rates, *blocks in JOB_CASES:   # blocks: trial_blocks[, merged]
        print(f"| {label} | {simulate_jobs(rule, run, block, drift, args.jobs, rates, 0, *blocks):.2%} |")
    print(f"\n# whole jobs, the confirmation by alternating runs (no run allowance: runs are its samples), 40 blocks "
          f"a run; {args.jobs} jobs a case\n| case | finished on another config than the defaults |\n|---|---|")
    for label, run, block, drift, rates, *trend in ALTERNATING_CASES:
        print(f"| {label} | {simulate_alternating(rule, run, block, drift, args.jobs, rates, 0, 40, *trend):.2%} |")
    print(f"# {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
