"""In-job tuning against the same job on the default config and on the grid's best config, in alternating rounds.

    .venv/bin/python -m benchmarks.in_job_tuning --count 26000 --rounds 3 --trials 4 --shard-size 64 \\
        --min-run 256 --space vllm_cpu_replicas_backlog --grid-cell cpu_replicas \\
        --grid results/search_efficiency/cpu_replicas-3pt --out /tmp/ijt

The job: ``workload=backlog_cpu``'s generator (lognormal prompts, median 128 tokens; lognormal
outputs, median 64, sigma 1.0, up to 512), ``--count`` requests, written as an OpenAI Batch file
of ``/v1/completions`` lines whose ``prompt`` is the token ids, run greedy with exact lengths
(``batch.sampling=benchmark``) with the CPU cell's 16 MiB KV budget
(``hardware.canonical.kv_memory_bytes=16777216``) on the tiny model; ``--kv-bytes`` and
``--shape input_len.median=512 ...`` (changes to the workload's YAML) make another cell, for
which ``--grid`` does not apply; ``--space`` another search space (e.g. ``vllm_cpu``, replicas and
KV bytes too; ``--grid`` needs the grid cell's). Three arms, their order rotated each round so
that other load on a shared host falls on each alike:

- ``in-job``: ``batch.tune.trials=--trials`` over ``conf/tune/<--space>.yaml``;
- ``default``: the same job on the engine defaults;
- ``grid-best``: the same job on the best config of the exhaustive grid over that space
  (``--grid``: a ``benchmarks/search_efficiency.py --cell <--grid-cell>`` grid folder, whose
  cells missing from it run first; or ``--grid-best`` overrides given by hand). The grid's
  cells are runs of ``backlog_cpu``'s 256 requests, not of this job.

``--virtual`` runs another benchmark: the real tuner driven on a virtual clock with runs from the
simulator (one H100, Llama-3.1-8B, a long-tailed backlog; ``benchmarks/virtual_tuning.py`` has its
arguments, docs/benchmarks.md "In-job tuning on a virtual clock" its figures).

Each arm's figure is the job's whole time (its row's ``wall_s``: scan, tuning phase, main phase,
merge; every engine start included). Prints per round and the medians, the in-job arm's
ratios to the others with the verdict rule's interval (docs/verdicts.md) on the job times, the
in-job rows' predicted against measured rest of the job, and, with ``--grid``, the live
study's trials to come within 2% of the grid's best (each live trial's config measured at its
nearest grid point, as the replay of ``search_efficiency.py`` measures its proposals) beside
that replay's figure for the same sampler. Writes ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KV_BYTES = 16777216   # search_efficiency.py --cell cpu's KV budget
SPACE = "vllm_cpu_backlog"
DEFAULTS_AT_GRID = {"engine.replicas": 1}   # where an unset knob lies on a grid (knobs left to the engine: none)


def write_job(path: Path, count: int, seed: int = 0, shape: list[str] = ()) -> dict[str, Any]:
    """``backlog_cpu``'s requests, ``count`` of them, as an OpenAI Batch file; returns its token counts.
    ``shape``: dotted ``key=value`` changes to that workload (e.g. ``input_len.median=512``)."""
    from omegaconf import OmegaConf

    from harness.core.models import resolve_model
    from harness.workloads import build_workload

    config = OmegaConf.load(ROOT / "conf" / "workload" / "backlog_cpu.yaml")
    config.merge_with_dotlist(list(shape))
    workload = OmegaConf.to_container(config)
    workload.update(num_requests=count, seed=seed)
    model = resolve_model(OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / "tiny.yaml")),
                          sys.executable)
    requests = build_workload(workload, model, path.parent / "images").requests
    with open(path, "w") as f:
        for r in requests:
            body = {"model": "tiny", "prompt": list(r.prompt_token_ids), "max_tokens": r.max_tokens}
            f.write(json.dumps({"custom_id": r.id, "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
    return {"requests": len(requests), "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
            "output_tokens": sum(r.max_tokens for r in requests)}


def cell(args: argparse.Namespace) -> list[str]:
    """The hardware cell: the CPU with ``--kv-bytes`` of KV cache (16 MiB: search_efficiency.py's cpu cell)."""
    return ["hardware=cpu", f"hardware.canonical.kv_memory_bytes={args.kv_bytes}"]


def arm_overrides(arm: str, args: argparse.Namespace) -> list[str]:
    if arm == "in-job":
        return [f"batch.tune.trials={args.trials}", f"tune={args.space}", f"batch.tune.min_run_requests={args.min_run}",
                f"batch.tune.max_share={args.max_share}", f"batch.tune.seed={args.seed}"]
    if arm == "grid-best":
        return [f"++{kv}" for kv in args.grid_best]
    return []


def run_arm(arm: str, data: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One job, start to end, in its own folder; its row."""
    tag = f"{arm}-{time.strftime('%H%M%S')}"
    results, out_dir = work / f"results-{tag}", work / f"out-{tag}"
    cmd = [str(Path(sys.executable).parent / "troughput-batch"), f"batch.input={data}", f"batch.output_dir={out_dir}",
           "batch.sampling=benchmark", f"batch.shard_size={args.shard_size}", f"run.results_dir={results}",
           "run.progress=false", *cell(args), *arm_overrides(arm, args), *args.overrides]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    rows = [json.loads(p.read_text()) for p in sorted((results / "batch").glob("*.json"))]
    if proc.returncode != 0 or len(rows) != 1 or rows[0].get("status") != "ok":
        raise SystemExit(f"{arm} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    row = rows[0]
    keep = {k: v for k, v in row.items() if (k.startswith("tune.") and k != "tune.runs")
            or k.startswith(("prediction.rest_", "prediction.full_engine."))}
    return {"arm": arm, "job_s": row["wall_s"], "process_wall_s": wall, "output_tok_s": row["output_tok_s"],
            "output_tokens": row["output_tokens"], "startup_s": row["startup_s"], "commit": row.get("git_commit"),
            "load_1min": os.getloadavg()[0], "command": " ".join(cmd), **keep,
            "trials": [{k: r[k] for k in ("label", "values", "output_tok_s", "status")}
                       for r in row.get("tune.runs", []) if r["kind"] == "trial"]}


def load_grid(args: argparse.Namespace) -> Any:
    """The ``--grid-cell`` grid stored in ``--grid`` (cells it lacks would run first); refuses another cell."""
    from benchmarks.search_efficiency import CELLS, run_grid

    cell = CELLS[args.grid_cell]
    if not (args.grid / "optuna.db").exists():
        raise SystemExit(f"--grid {args.grid}: no optuna.db there; run benchmarks/search_efficiency.py --cell "
                         f"{args.grid_cell} first (its folder: results/search_efficiency/{args.grid_cell}-<n>pt)")
    if f"tune={args.space}" not in cell.overrides or f"hardware.canonical.kv_memory_bytes={args.kv_bytes}" \
            not in cell.overrides or args.shape:
        raise SystemExit(f"--grid is search_efficiency.py's {args.grid_cell} cell ({' '.join(cell.overrides)}): "
                         f"give the in-job arm the same space and KV bytes (--space, --kv-bytes), no --shape")
    return run_grid(cell, args.grid, args.grid_override)


def grid_best_overrides(grid: Any) -> list[str]:
    """The grid's best cell as overrides for the grid-best arm."""
    return [f"{p}={v}" for p, v in grid.best_cell.items()]


def live_trials_to_2pct(records: list[dict[str, Any]], grid: Any) -> dict[str, Any]:
    """Each in-job study's trials, measured at their nearest grid point, until within 2% of the grid's best;
    beside the replay of the same sampler (multivariate TPE) with the same seed trials first."""
    import optuna

    from benchmarks.search_efficiency import position, replay, trials_to

    target = 0.98 * grid.best
    numeric = {p: not isinstance(v[0], (bool, str)) for p, v in grid.values.items()}
    out = []
    for rec in records:
        seen = []
        for trial in rec["trials"]:
            values = trial["values"]
            if not values:
                seen.append(grid.seeds.get("engine defaults", ({}, None))[1])
                continue
            measured = [v for params, v in grid.seeds.values() if params == values]
            if measured:   # a seed trial the grid ran as it is: its own measurement, not the nearest cell's
                seen.append(measured[0])
                continue
            values = {**DEFAULTS_AT_GRID, **values}   # a knob a trial leaves unset is at the engine's default
            if any(p not in values for p in grid.values):   # unset, and its default is not on the grid
                seen.append(None)
                continue
            # half up (not half-to-even; 1e-9 for the logs' rounding): 16 MiB is halfway from 4 to 64 MiB on a log scale
            key = tuple(grid.values[p][min(max(math.floor(position(grid.values[p], values[p]) + 0.5 + 1e-9), 0),
                                           len(grid.values[p]) - 1)] if numeric[p] else values[p]
                        for p in grid.values)
            seen.append(grid.cells.get(key))
        out.append({"round_arm": rec.get("round"), "seen": seen, "trials_to_2pct": trials_to(seen, target)})
    seeds = [s for s in grid.seeds if s != "real-time config"]   # the space's seed trials, as the live study's
    replayed = [trials_to(replay(grid, optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True),
                                 seeds, grid.valid()), target) for seed in range(5)]
    return {"grid_best": grid.best, "grid_cells": len(grid.cells), "grid_seeds": seeds, "live": out,
            "replay_trials_to_2pct_seeds_0_4": replayed}


def main(argv: list[str] | None = None) -> int:
    from harness.report.verdict import compare

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--virtual" in argv:   # the real tuner on a virtual clock (benchmarks/virtual_tuning.py)
        from benchmarks.virtual_tuning import main as virtual

        return virtual([a for a in argv if a != "--virtual"])

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=16000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--shard-size", type=int, default=64)
    parser.add_argument("--min-run", type=int, default=128, help="batch.tune.min_run_requests")
    parser.add_argument("--max-share", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grid", type=Path, default=None,
                        help="a search_efficiency.py grid folder (results/search_efficiency/<cell>-<n>pt); its best "
                             "cell is the grid-best arm unless --grid-best is given")
    parser.add_argument("--grid-cell", default="cpu", help="search_efficiency.py's cell that --grid holds")
    parser.add_argument("--grid-override", action="append", default=[], metavar="K=V",
                        help="an override the grid was run with (repeatable; e.g. run.repeats=3 for a grid made by "
                        "search_efficiency.py ... run.repeats=3), so it resumes as it was made")
    parser.add_argument("--grid-best", nargs="*", default=[], help="the grid's best config as K=V overrides")
    parser.add_argument("--arms", default="in-job,default,grid-best")
    parser.add_argument("--kv-bytes", type=int, default=KV_BYTES, help="the cell's KV cache bytes")
    parser.add_argument("--space", default=SPACE, help="the in-job arm's search space (conf/tune/<space>.yaml)")
    parser.add_argument("--shape", nargs="*", default=[],
                        help="changes to backlog_cpu's requests, e.g. input_len.median=512 output_len.median=16")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    arms = args.arms.split(",")
    grid = load_grid(args) if args.grid else None
    if grid is not None and not args.grid_best:
        args.grid_best = grid_best_overrides(grid)
        print(f"grid-best arm: the grid's best cell, {grid.best:,.1f} output tok/s at {args.grid_best}", flush=True)
    if "grid-best" in arms and not args.grid_best:
        raise SystemExit("the grid-best arm needs --grid (a grid folder) or --grid-best K=V ... (the grid's best "
                         "cell, e.g. from docs/benchmarks.md 'Does the search pay?')")
    data = args.out / "backlog_cpu.jsonl"
    shape = write_job(data, args.count, args.seed, args.shape)
    host = {"cpu": platform.processor() or platform.machine(), "flags": _isa_flags(), "nproc": os.cpu_count()}
    print(f"{data}: {shape}; host {host}", flush=True)
    times: dict[str, list[float]] = {a: [] for a in arms}
    records = []
    for r in range(args.rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            got = run_arm(arm, data, args.out, args)
            times[arm].append(got["job_s"])
            records.append({"round": r + 1, **got})
            extra = ""
            if arm == "in-job":
                after = got.get("tune.phase_share_after_start")
                extra = (f"  tuning {got.get('tune.phase_s', 0):,.0f} s ({got.get('tune.phase_share') or 0:.1%} of the "
                         f"job's runs; after the job's first start of {got.get('tune.first_start_s') or 0:.1f} s, "
                         f"which any job pays: {'-' if after is None else format(after, '.1%')}), "
                         f"{got.get('tune.engine_starts')} engine starts for {got.get('tune.distinct_configs')} "
                         f"configs, candidate {got.get('tune.candidate')}, switched back {got.get('tune.switched')} "
                         f"({got.get('tune.confirm.reason') or got.get('tune.verdict')}), "
                         f"chosen {got.get('tune.chosen')}, "
                         f"rest predicted {got.get('tune.predicted_rest_s') or 0:,.0f} s measured "
                         f"{got.get('tune.measured_rest_s') or 0:,.0f} s ({got.get('tune.prediction_method')}); "
                         f"in the main phase, after {got.get('tune.in_main_prediction_at_s') or 0:,.0f} s: "
                         f"predicted {got.get('prediction.rest_in_main.predicted') or 0:,.0f} s measured "
                         f"{got.get('prediction.rest_in_main.measured') or 0:,.0f} s")
            print(f"round {r + 1} {arm:>9}: job {got['job_s']:8,.1f} s ({got['output_tok_s']:,.1f} output tok/s, "
                  f"load {got['load_1min']:.1f}){extra}", flush=True)
    medians = {a: statistics.median(v) for a, v in times.items()}
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "host": host, "job": shape,
                               "medians_job_s": medians, "runs": records}
    for other in (a for a in arms if a != "in-job"):
        if "in-job" in times:
            v = compare([1 / t for t in times["in-job"]], [1 / t for t in times[other]])
            summary[f"in-job_over_{other}"] = {"ratio_of_medians": medians["in-job"] / medians[other],
                                               "speed_verdict": v.verdict, "speed_interval": v.interval_text()}
            print(f"in-job ÷ {other}: job time {medians['in-job'] / medians[other]:.3f} (medians); speed "
                  f"{v.interval_text()} {v.verdict}")
    predictions = [(x["tune.predicted_rest_s"], x["tune.measured_rest_s"]) for x in records
                   if x["arm"] == "in-job" and x.get("tune.predicted_rest_s") and x.get("tune.measured_rest_s")]
    summary["prediction"] = [{"predicted_s": p, "measured_s": m, "measured_over_predicted": m / p}
                             for p, m in predictions]
    for p, m in predictions:
        print(f"rest of the job: predicted {p:,.1f} s, measured {m:,.1f} s ({m / p:.3f})")
    in_main = [(x["prediction.rest_in_main.predicted"], x["prediction.rest_in_main.measured"]) for x in records
               if x["arm"] == "in-job" and x.get("prediction.rest_in_main.predicted")
               and x.get("prediction.rest_in_main.measured")]
    summary["prediction_in_main"] = [{"predicted_s": p, "measured_s": m, "measured_over_predicted": m / p}
                                     for p, m in in_main]
    for p, m in in_main:
        print(f"rest of the main phase, predicted inside it: {p:,.1f} s, measured {m:,.1f} s ({m / p:.3f})")
    if grid is not None:
        summary["trials_to_2pct"] = live_trials_to_2pct([x for x in records if x["arm"] == "in-job"], grid)
        print(f"trials to 2% of the grid's best: {summary['trials_to_2pct']}")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


def _isa_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return ""
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags)


if __name__ == "__main__":
    sys.exit(main())
