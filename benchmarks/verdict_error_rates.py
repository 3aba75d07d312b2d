"""The decision rule's error rate and power, measured by simulation (no engine): the figures in docs/verdicts.md.

    .venv/bin/python benchmarks/verdict_error_rates.py [--trials 4000] [--seed 0]
    .venv/bin/python benchmarks/verdict_error_rates.py --loops [--trials 2000]   # rounds=auto's whole loop, A/A

``--loops`` drives the loop ``run.rounds=auto`` runs (``harness.report.rounds.add_rounds``) on simulated
and resampled A/A rates, its rounds run by the simulation instead of engines.

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
import json
import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.report import rounds  # noqa: E402
from harness.report.sequential import RESERVE, SIMULATED, SequentialPlan  # noqa: E402
from harness.report.verdict import CLEAR, CLOSE, EQUIVALENT, MIN_EFFECT, MIN_RUNS, Verdict, compare  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "data" / "per_run_rates.json"
Round = Callable[[np.random.Generator, int], tuple[float, float]]   # (generator, round index) -> (rate A, rate B)

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


# --- the whole loop under repeated looks (run.rounds=auto, the tuner's added confirmation rounds) ---------------

def walking(noise: Callable[[np.random.Generator], float], drift: float = 0.0) -> Callable[[], Round]:
    """A/A rounds on a host that drifts: log rate = a random walk over the runs in execution order (step ``drift`` a
    run, so rounds late in the loop sit apart from early ones) + each run's own ``noise(generator)``. The order
    within a round rotates each round, as ``rounds.py`` runs it. Returns a factory: one fresh walk per loop."""
    def factory() -> Round:
        level = [0.0]

        def one_round(generator: np.random.Generator, index: int) -> tuple[float, float]:
            runs = []
            for _ in range(2):
                level[0] += generator.normal(0.0, drift)
                runs.append(1000 * math.exp(level[0] + noise(generator)))
            first, second = runs
            return (first, second) if index % 2 == 0 else (second, first)

        return one_round
    return factory


def drifting(sigma: float = 0.05, drift: float = 0.03, outliers: float = 0.0) -> Callable[[], Round]:
    """``walking`` with log-normal run noise ``sigma``, a share ``outliers`` of runs at 0.7x."""
    def noise(generator: np.random.Generator) -> float:
        x = generator.normal(0.0, sigma)
        return x + math.log(0.7) if generator.random() < outliers else x
    return walking(noise, drift)


def shifted(ratio: float, source: Callable[[], Round]) -> Callable[[], Round]:
    """``source``'s rounds with side A's rate ``ratio`` times side B's: not A/A; a clear winner for A is right."""
    def factory() -> Round:
        inner = source()
        return lambda generator, index: (lambda x, y: (ratio * x, y))(*inner(generator, index))
    return factory


def real_deviations(path: Path = FIXTURE) -> list[list[list[float]]]:
    """Per series, per config: each real run's log deviation from its config's mean log rate, widened by
    sqrt(n / (n - 1)) for the mean it was taken from (``benchmarks/data/per_run_rates.json``)."""
    out = []
    for series in json.loads(path.read_text())["series"]:
        logs = [np.log(np.asarray(v, dtype=float)) for v in series["values"]]
        out.append([list((x - x.mean()) * math.sqrt(len(x) / (len(x) - 1))) for x in logs])
    return out


def resampled(path: Path = FIXTURE, drift: float = 0.0) -> Callable[[], Round]:
    """A/A runs resampled from real measured runs: every run of both sides draws, independently and with
    replacement, one of the real runs' deviations from its config's geometric mean (all series pooled: quiet
    and loaded hosts, their outlier runs included), on a host that drifts by ``drift`` a run (``walking``)."""
    pool = [d for series in real_deviations(path) for config in series for d in config]
    return walking(lambda generator: pool[generator.integers(len(pool))], drift)


def resampled_rounds(path: Path = FIXTURE) -> Callable[[], Round]:
    """A/A rounds resampled whole from real interleaved comparisons: each round is a real round (two of its
    configs, in random order, each as its deviation from its own geometric mean), so rounds that swing
    together on a loaded host (drift shared by both sides) are kept as measured."""
    rounds = [tuple(config[r] for config in series) for series in real_deviations(path) for r in range(len(series[0]))]

    def factory() -> Round:
        def one_round(generator: np.random.Generator, index: int) -> tuple[float, float]:
            chosen = rounds[generator.integers(len(rounds))]
            i, j = generator.choice(len(chosen), size=2, replace=False)
            return 1000 * math.exp(chosen[i]), 1000 * math.exp(chosen[j])
        return one_round
    return factory


class Naive:
    """The loop before: the plain rule at α = 0.05 at every look (what ``rounds.add_rounds`` judged by before
    ``harness.report.sequential``), as a plan the real loop can take."""

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last

    def judge(self, a: list, b: list, min_effect: float = MIN_EFFECT, estimate_rounds: bool = True) -> Verdict:
        return compare(a, b, min_effect, estimate_rounds=estimate_rounds)

    def describe(self, min_effect: float | None = None) -> str:
        return f"the plain rule at α = 0.05 at every look, {self.first} to {self.last} runs a side"


Rule = Callable[[int, int], SequentialPlan]   # (first, last) -> the plan the loop judges by


def naive() -> Rule:
    """The loop before: the plain rule at α = 0.05 at every look."""
    return Naive


def sequential(spending: str = "obrien-fleming", reserve: float = RESERVE) -> Rule:
    """The loop now: each look at its group-sequential level (``harness.report.sequential``)."""
    return lambda first, last: SequentialPlan(first, last, spending=spending, reserve=reserve)


def run_loop(one_round: Round, rule: Rule, last: int, generator: np.random.Generator,
             min_effect: float = MIN_EFFECT) -> str:
    """One loop driven through ``harness.report.rounds.add_rounds``, the loop ``run.rounds=auto`` runs: round 1
    (Hydra's), then the real loop's plan, looks and added rounds up to ``last`` (``run.max_rounds``), with one A/B
    pair's rates for round k from ``one_round(generator, k - 1)`` and each look judging them by the loop's plan, as
    the report's decision does. Returns ``clear_a``, ``clear_b``, ``equivalent`` or ``undecided``."""
    a: list[float] = []
    b: list[float] = []

    def run_round(index: int, open_cells: set, plan: SequentialPlan) -> None:
        x, y = one_round(generator, index - 1)
        a.append(x)
        b.append(y)

    def look(plan: SequentialPlan) -> dict[str, dict]:
        verdict = plan.judge(a, b, min_effect, estimate_rounds=False)
        return {"a/b": {"verdict": verdict.verdict, "winner": verdict.winner, "flags": []}}

    run_round(1, set(), None)
    decisions, _ = rounds.add_rounds(1, last, look, run_round, plan_for=rule, say=lambda line: None)
    ending = decisions["a/b"]
    if ending["verdict"] == CLEAR:
        return "clear_a" if ending["winner"] == "a" else "clear_b"
    return EQUIVALENT if ending["verdict"] == EQUIVALENT else "undecided"


def loop_rates(source: Callable[[], Round], rule: Rule, looks: int, trials: int = 1000, seed: int = 0
               ) -> dict[str, float]:
    """Shares of each ending over ``trials`` A/A loops of ``looks`` looks (the first at ``MIN_RUNS`` runs a side, as
    ``run.rounds=auto`` after one Hydra round: ``run.max_rounds`` = ``MIN_RUNS + looks - 1``); ``false`` is the share
    that named a winner."""
    generator = np.random.default_rng(seed)
    counts = dict.fromkeys(("clear_a", "clear_b", EQUIVALENT, "undecided"), 0)
    for _ in range(trials):
        counts[run_loop(source(), rule, MIN_RUNS + looks - 1, generator)] += 1
    shares = {k: v / trials for k, v in counts.items()}
    return shares | {"false": shares["clear_a"] + shares["clear_b"]}


LOOP_SOURCES = {"drift 3%/run, 5% spread": drifting(0.05, 0.03),
                "drift 5%/run, 30% spread, 10% outliers": drifting(0.30, 0.05, 0.1),
                "no drift, 5% spread": drifting(0.05, 0.0), "resampled real runs": resampled(),
                "resampled real runs, drift 3%/run": resampled(drift=0.03),
                "resampled real rounds (paired)": resampled_rounds()}


def loop_table(trials: int, seed: int) -> None:
    print(f"{trials} simulated A/A loops per cell, first look at {MIN_RUNS} runs a side, one look per added round, "
          f"min effect {MIN_EFFECT:.0%}: share of loops that named a false winner (and that ended equivalent)")
    print("| data | looks | before (α = 0.05 at every look) | after (O'Brien–Fleming spending) | after (Pocock) |")
    print("|---|---|---|---|---|")
    for name, source in LOOP_SOURCES.items():
        for looks in [last - first + 1 for first, last in SIMULATED]:   # first == MIN_RUNS, as loop_rates plans
            cells = [loop_rates(source, rule, looks, trials, seed)
                     for rule in (naive(), sequential(), sequential(spending="pocock"))]
            print(f"| {name} | {looks} | " + " | ".join(f"{c['false']:.1%} ({c[EQUIVALENT]:.1%})" for c in cells)
                  + " |", flush=True)


def loop_power(trials: int, seed: int) -> None:
    """What the spending costs: the share of 10-look loops that find a true difference, before and after."""
    print(f"{trials} simulated loops per cell, 10 looks (3 to 12 runs a side), no drift, min effect "
          f"{MIN_EFFECT:.0%}: share that called the truly faster config a clear winner")
    print("| spread | true difference | before (α = 0.05 at every look) | after (O'Brien–Fleming spending) |")
    print("|---|---|---|---|")
    for sigma in (0.02, 0.05):
        for ratio in (1.05, 1.10):
            cells = [loop_rates(shifted(ratio, drifting(sigma, 0.0)), rule, 10, trials, seed)
                     for rule in (naive(), sequential())]
            print(f"| {sigma:.0%} | +{ratio - 1:.0%} | " + " | ".join(f"{c['clear_a']:.1%}" for c in cells) + " |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loops", action="store_true",
                        help="the whole rounds=auto loop on every plan of sequential.SIMULATED (1, 3, 4, 8, 10 looks)")
    parser.add_argument("--loop-power", action="store_true",
                        help="the power the 10-look loop keeps at +5% and +10%, before and after the spending")
    args = parser.parse_args()
    if args.loop_power:
        loop_power(args.trials, args.seed)
        return
    if args.loops:
        loop_table(args.trials, args.seed)
        return
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
