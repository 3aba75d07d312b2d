"""In-job tuning on a virtual clock (``benchmarks/in_job_tuning.py --virtual``): the real tuner, runs from the
virtual engine (``benchmarks.virtual_engine``: one H100, or the GPU ``--hardware`` names, Llama-3.1-8B, a backlog of
lengths; ``benchmarks.virtual_job``).

    .venv/bin/python -m benchmarks.in_job_tuning --virtual --out results/virtual \\
        --sizes 50000,200000,1000000 --restarts 60,30,120 --seeds 5   # in-job against default and grid-best
    .venv/bin/python -m benchmarks.in_job_tuning --virtual --out results/virtual --no-jobs --aa 1000     # A/A
    .venv/bin/python -m benchmarks.in_job_tuning --virtual --out results/virtual --no-jobs --slower 1000

**Jobs** (``--sizes``, ``--seeds``): each job of each size and seed runs through ``InJobTuning`` (``batch.tune``:
``--trials``, ``--max-share``, ``--min-run``, the space ``--space``), seed ``s`` being the tuner's seed
(``batch.tune.seed``: shard sample and sampler) and the noise's. Its time on the virtual clock is the sum of
its runs' starts (``--restarts``: seconds per engine start) and generation. The tuner's decisions read rates
and step traces, never a start's seconds (``tests/benchmarks/test_virtual_job.py`` checks it), so each job runs
once, at the first restart cost, and its runs are priced at the others (``--per-restart``: one job per restart
cost instead, for a tuner that reads them).

**Default and grid-best jobs**: the whole job on the engine defaults, or on the grid's best, one start each,
its generation from the config's ``steady`` run (the first ``--cap`` requests simulated, the rest at that
run's steady rate; simulated once per config and reused across seeds), times the seed's run noise. The grid:
every cell of the space at ``--grid-points`` values a param (``SearchSpace.grid``, as ``tune.sampler=grid``
has them), valid by the space's constraints, ranked by the true cost at ``--grid-size`` requests
(5×10^4: each cell's first ``--grid-requests`` requests simulated, the rest at their steady rate; prefix
caching on and off share one schedule: the prompts are unique), then its ``--leaders`` leading cells run at
each job size (the ``steady`` of ``--cap`` requests) and the best of them is the grid-best job.

**The tuner's path** (``harness.batch.tune.tuning``): trials (trial 0: the engine defaults), then the main
phase on the best trial's config (the candidate), confirmed as its shards commit (``tune_confirm``: its blocks
against trial 0's, at looks that may switch, only the last keeping); a loser, a tie or no clear winner by the
last look stops the candidate (its shards in flight finish) and the rest runs on the defaults, one more engine
start. The virtual engine tells each run's ``on_commit`` as its shards finish (``VirtualEngine.run_phase``: one
engine fed shard by shard as the pool feeds it), so the blocks, the looks and the stop are the tuner's own. A
job's record keeps its engine starts, whether the main phase switched back, the looks made and their action.

**A/A** (``--aa N``) and **a slower candidate** (``--slower N``): ``N`` jobs of ``--count-size`` requests in
which every config runs as the engine defaults, as fast, or every config but the defaults ``--slowdown``
(drawn per job, uniform) slower; counted: jobs that finished on a config other than the defaults, beside how
many had a candidate, how many switched back, the looks made and why the last look decided. The cheap path
(``--count-replay`` off, the default): the engine does not offer its steps for replay, so the tuner values
trials by their plain rates and predicts nothing (the path it takes for an engine whose steps it cannot
replay); the confirmation, which decides, is the same. The confirmation needs ``MIN_RUNS`` blocks of trial 0,
which come only from commits while shards are left to hand over: a trial of no more shards than an engine
holds (8 of 50 requests) gives none, and its job finishes on the defaults whatever the candidate (at
``--count-size`` 5×10^4, ``--max-share`` 0.04 and 6 trials a trial is 6 shards: use 0.10, the batch default).

Results go to ``--out``: ``grid.json``, ``jobs.jsonl`` (one line a job, resumed: a job already there is not
run again), ``counts.jsonl`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from engines.base import KnobError

from benchmarks.virtual_engine import CAP, HARDWARE, HARDWARES, ROOT, WORKLOAD, Backlog, Truth, config_seed, \
    scheduler_config, simulate, steady_of
from benchmarks.virtual_job import SPACE, JobResult, MainCache, Setup, VirtualEngine, job_setup, knobs_key, \
    run_virtual_job

log = logging.getLogger("troughput.virtual")
BAR = 0.95   # in-job ÷ default at or under this: the job is past break-even


DRIVER = 3   # the driver's version: 2 since an aggregated run's ``SoFar.left`` counts its shards past its start; 3 since
#            a main run simulates its start for as many shards as its largest trial (``VirtualEngine.prefix_shards``)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a job's result depends on besides its size, seed and restart cost (a stored job with others is rerun;
    the hardware is named only where it is not the H100). ``driver``: a job stored by an older driver is rerun."""
    keys = ("workload", "space", "trials", "max_share", "min_run", "shard_size", "run_sigma", "step_sigma", "cap",
            "overrides")
    return {k: getattr(args, k) for k in keys} | named_hardware(args) | {"driver": DRIVER}


def named_hardware(args: argparse.Namespace) -> dict[str, str]:
    """The GPU, for the keys stored results are matched on: named only where it is not the H100 (whose results were
    stored before ``--hardware``)."""
    return {"hardware": args.hardware} if args.hardware != HARDWARE else {}


def tuner_overrides(args: argparse.Namespace) -> list[str]:
    return [f"batch.tune.trials={args.trials}", f"batch.tune.max_share={args.max_share}",
            f"batch.tune.min_run_requests={args.min_run}", *args.overrides]


# ---- the grid --------------------------------------------------------------------------------------------------

def grid_cells(setup: Setup, points: int) -> list[dict[str, Any]]:
    """Every cell of the space's grid that its constraints allow, with the knobs each maps to."""
    from harness.batch.tune.tune_config import phase_planner
    from harness.tune.space import SearchSpace

    space = SearchSpace(setup.plan.tune["space"])
    plan_for = phase_planner(setup.cfg, setup.plan)
    names = [p.path for p in space.params]
    cells = []
    for combo in itertools.product(*(p.grid(points) for p in space.params)):
        values = dict(zip(names, combo))
        if space.check(values, setup.base) is None:
            cells.append({"values": values, "knobs": plan_for(values, {}).knobs})
    return cells


def run_grid(setup: Setup, backlog: Backlog, truth: Truth, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The grid ranked by the true cost at ``--grid-size`` requests (stored in ``grid.json``; reused if its settings
    match)."""
    path = out / "grid.json"
    key = {"workload": args.workload, "space": args.space, "points": args.grid_points, "requests": args.grid_requests,
           "size": args.grid_size, "step_sigma": args.step_sigma} | named_hardware(args)
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("settings") == key:
            return stored
    t0 = time.perf_counter()
    cells = grid_cells(setup, args.grid_points)
    n = min(args.grid_requests, len(backlog))
    prompt, output = backlog.prompt[:n], backlog.output[:n]
    size_tokens = int(backlog.output[:args.grid_size].sum())
    schedules: dict[str, list[dict[str, Any]]] = {}
    for cell in cells:   # prefix caching on and off: one schedule (unique prompts), two prices
        shared = {k: v for k, v in cell["knobs"].items() if k != "enable_prefix_caching"}
        schedules.setdefault(knobs_key(shared), []).append(cell)
    for i, (key_s, group) in enumerate(schedules.items()):
        try:
            config, _ = scheduler_config(group[0]["knobs"], truth_model(), truth_spec(args.hardware))
        except (MemoryError, KnobError) as e:   # a cell vLLM would refuse to start: no time
            for cell in group:
                cell["failed"] = f"{type(e).__name__}: {e}"
            continue
        prices = [lambda s, on=_caching(c): truth.seconds(s, on) for c in group]
        sims = simulate(config, prompt, output, prices, 1.0, args.step_sigma, config_seed(key_s))
        for cell, sim in zip(group, sims):
            steady = steady_of(sim, output)
            cell.update(rate=steady.rate, seconds=steady.seconds_for(size_tokens))
        log.info("grid: %d of %d schedules (%.0f s)", i + 1, len(schedules), time.perf_counter() - t0)
    ranked = sorted((c for c in cells if "seconds" in c), key=lambda c: c["seconds"])
    grid = {"settings": key, "cells": ranked, "failed": [c for c in cells if "failed" in c],
            "schedules": len(schedules), "host_s": time.perf_counter() - t0}
    path.write_text(json.dumps(grid, indent=1, default=str))
    return grid


def _caching(cell: dict[str, Any]) -> bool:
    return cell["knobs"].get("enable_prefix_caching", True) is not False


_SPEC: dict[str, Any] = {}


def truth_model() -> Any:
    from engines.perfmodel import ModelSpec

    if "model" not in _SPEC:
        _SPEC["model"] = ModelSpec.load(None, "llama-3.1-8b")
    return _SPEC["model"]


def truth_spec(hardware: str = HARDWARE) -> dict[str, Any]:
    """The virtual GPU's spec (``conf/hardware/<hardware>.yaml``), loaded once."""
    from benchmarks.virtual_engine import hardware_spec

    if ("spec", hardware) not in _SPEC:
        _SPEC["spec", hardware] = hardware_spec(hardware)
    return _SPEC["spec", hardware]


# ---- jobs ------------------------------------------------------------------------------------------------------

def job_record(size: int, seed: int, restart: float, result: JobResult, engine: VirtualEngine,
               args: argparse.Namespace) -> dict[str, Any]:
    cols = result.columns
    return {"size": size, "seed": seed, "restart_s": restart, "settings": settings(args),
            "runs": [{"kind": r.kind, "label": r.label, "config": r.config, "requests": r.requests,
                      "output_tokens": r.output_tokens, "generation_s": r.generation_s, "start_s": r.start_s,
                      "status": r.status} for r in result.runs],
            "chosen": result.chosen, "candidate": cols.get("tune.candidate"), "verdict": cols.get("tune.verdict"),
            "switched": cols.get("tune.switched"), "engine_starts": cols.get("tune.engine_starts"),
            "distinct_configs": cols.get("tune.distinct_configs"), "confirm_looks": cols.get("tune.confirm.looks"),
            "confirm_action": cols.get("tune.confirm.action"), "confirm_reason": cols.get("tune.confirm.reason"),
            "defaults_blocks": len(cols.get("tune.confirm.defaults_blocks") or []),
            "candidate_blocks": len(cols.get("tune.confirm.candidate_blocks") or []),
            "shards_per_run": cols.get("tune.shards_per_run"), "trials": cols.get("tune.trials"),
            "tuner_phase_share": cols.get("tune.phase_share"), "tuner_restarts": cols.get("tune.restarts"),
            "predicted_rest_s": cols.get("tune.predicted_rest_s"), "measured_rest_s": cols.get("tune.measured_rest_s"),
            "chosen_knobs": cols.get("tune.chosen_knobs"), "alternate": cols.get("tune.confirm.alternate"),
            "host_s": result.host_s,
            "simulated_requests": engine.simulated}


def priced_at(record: dict[str, Any], restart: float) -> dict[str, float]:
    """A job's runs with every engine start at ``restart`` seconds: its time, tuning phase and starts."""
    starts = sum(r["start_s"] > 0 for r in record["runs"])
    generation = sum(r["generation_s"] for r in record["runs"])
    tuning = sum(r["generation_s"] + (restart if r["start_s"] > 0 else 0) for r in record["runs"]
                 if r["kind"] != "main")
    job = generation + restart * starts
    return {"job_s": job, "tuning_s": tuning, "tuning_share": tuning / job, "starts": starts}


def noise(seed: int, size: int, arm: int, sigma: float) -> float:
    """A fixed-config job's run noise (log-normal, median 1), its own draw per seed, size and arm."""
    return float(np.exp(sigma * np.random.default_rng([seed, size, arm, 4040]).standard_normal()))


def load_jobs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_jobs(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    truth = Truth.llama(truth_model(), truth_spec(args.hardware))
    cache = MainCache()
    largest = Backlog.draw(max(args.sizes + [args.grid_size]), args.workload)
    setup = job_setup(args.grid_size, args.shard_size, tuner_overrides(args), args.space, out / "setup", args.hardware)
    grid = run_grid(setup, largest, truth, args, out)
    leaders = grid["cells"][:args.leaders]
    jobs_path = out / "jobs.jsonl"
    done = {(j["size"], j["seed"], j["restart_s"]) for j in load_jobs(jobs_path) if j["settings"] == settings(args)}
    restarts = args.restarts if args.per_restart else args.restarts[:1]
    for size in args.sizes:
        backlog = Backlog(largest.prompt[:size], largest.output[:size])
        setup = job_setup(size, args.shard_size, tuner_overrides(args), args.space, out / "setup", args.hardware)
        for seed in args.seeds:
            for restart in restarts:
                if (size, seed, restart) in done:
                    continue
                engine = VirtualEngine(backlog, args.shard_size, truth, restart, args.run_sigma, args.step_sigma, seed,
                                       cache=cache, cap=args.cap, model=truth_model(),
                                       spec=truth_spec(args.hardware))
                result = run_virtual_job(setup, engine, seed)
                record = job_record(size, seed, restart, result, engine, args)
                with open(jobs_path, "a") as f:
                    f.write(json.dumps(record, default=str) + "\n")
                p = priced_at(record, restart)
                print(f"size {size:>9,} seed {seed} restart {restart:g} s: in-job {p['job_s']:,.0f} s, tuning "
                      f"{p['tuning_share']:.1%}, {p['starts']} starts, chosen {record['chosen'] or 'engine defaults'} "
                      f"(candidate {record['candidate'] or 'none'}, switched back {record['switched']}, "
                      f"{record['confirm_looks'] or 0} looks: {record['verdict']}), host {result.host_s:.0f} s",
                      flush=True)
    return summarize(args, out, setup, largest, truth, cache, grid, leaders)


def summarize(args: argparse.Namespace, out: Path, setup: Setup, largest: Backlog, truth: Truth, cache: MainCache,
              grid: dict[str, Any], leaders: list[dict[str, Any]]) -> dict[str, Any]:
    jobs = [j for j in load_jobs(out / "jobs.jsonl") if j["settings"] == settings(args) and j["size"] in args.sizes
            and j["seed"] in args.seeds]
    table = []
    fixed: dict[int, dict[str, float]] = {}
    for size in args.sizes:
        engine = VirtualEngine(Backlog(largest.prompt[:size], largest.output[:size]), args.shard_size, truth, 0.0,
                               args.run_sigma, args.step_sigma, 0, cache=cache, cap=args.cap, model=truth_model(),
                               spec=truth_spec(args.hardware))
        at_size = {knobs_key(c["knobs"]): engine.fixed_job(c["knobs"]) for c in leaders}
        best = min(at_size, key=at_size.get)
        fixed[size] = {"default": engine.fixed_job(setup.plan.knobs), "grid": at_size[best]}
        fixed[size]["grid_cell"] = next(c["values"] for c in leaders if knobs_key(c["knobs"]) == best)  # type: ignore
        for restart in args.restarts:
            rows = []
            for seed in args.seeds:
                mine = [j for j in jobs if j["size"] == size and j["seed"] == seed
                        and (j["restart_s"] == restart or not args.per_restart)]
                if not mine:
                    continue
                p = priced_at(mine[0], restart)
                default = restart + fixed[size]["default"] * noise(seed, size, 1, args.run_sigma)
                gridjob = restart + fixed[size]["grid"] * noise(seed, size, 2, args.run_sigma)
                rows.append({"seed": seed, "in_job_s": p["job_s"], "default_s": default, "grid_s": gridjob,
                             "over_default": p["job_s"] / default, "over_grid": p["job_s"] / gridjob,
                             "tuning_share": p["tuning_share"], "starts": p["starts"],
                             "chosen": mine[0]["chosen"] or "engine defaults", "verdict": mine[0]["verdict"],
                             "switched": mine[0]["switched"], "looks": mine[0]["confirm_looks"]})
            if rows:
                table.append({"size": size, "restart_s": restart, "seeds": len(rows),
                              "over_default": statistics.median(r["over_default"] for r in rows),
                              "over_grid": statistics.median(r["over_grid"] for r in rows),
                              "tuning_share": statistics.median(r["tuning_share"] for r in rows),
                              "starts": statistics.median(r["starts"] for r in rows),
                              "kept_defaults": sum(r["chosen"] == "engine defaults" for r in rows),
                              "switched_back": sum(bool(r["switched"]) for r in rows), "jobs": rows})
    summary = {"host": host(), "command": " ".join(sys.argv), "settings": settings(args), "table": table,
               "break_even": break_even(table, args.restarts), "fixed_jobs": fixed,
               "grid": {"best": grid["cells"][0] if grid["cells"] else None, "cells": len(grid["cells"]),
                        "schedules": grid["schedules"], "host_s": grid["host_s"],
                        "defaults_at_grid_size": None}, "steady_host_s": cache.host_s}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print_table(summary)
    return summary


def break_even(table: list[dict[str, Any]], restarts: list[float]) -> dict[str, Any]:
    """Per restart cost, the first size whose median in-job ÷ default is ≤ ``BAR``, and a log-linear interpolation
    between the sizes either side of it."""
    out = {}
    for restart in restarts:
        rows = sorted((r for r in table if r["restart_s"] == restart), key=lambda r: r["size"])
        first = next((i for i, r in enumerate(rows) if r["over_default"] <= BAR), None)
        if first is None:
            out[str(restart)] = {"first_size": None, "interpolated": None}
            continue
        interpolated = None
        if first > 0:
            a, b = rows[first - 1], rows[first]
            t = (a["over_default"] - BAR) / (a["over_default"] - b["over_default"])
            interpolated = math.exp(math.log(a["size"]) + t * (math.log(b["size"]) - math.log(a["size"])))
        out[str(restart)] = {"first_size": rows[first]["size"], "interpolated": interpolated}
    return out


def print_table(summary: dict[str, Any]) -> None:
    print("| requests | restart | in-job ÷ default | in-job ÷ grid's best | tuning phase | engine starts | finished on "
          "defaults | switched back |")
    print("|---|---|---|---|---|---|---|---|")
    for r in summary["table"]:
        print(f"| {r['size']:,} | {r['restart_s']:g} s | {r['over_default']:.3f} | {r['over_grid']:.3f} | "
              f"{r['tuning_share']:.1%} | {r['starts']:g} | {r['kept_defaults']}/{r['seeds']} | "
              f"{r['switched_back']}/{r['seeds']} |")
    print("break-even (median in-job ÷ default ≤ 0.95):", json.dumps(summary["break_even"]))


# ---- A/A and a slower candidate ------------------------------------------------------------------------------

def run_counts(args: argparse.Namespace, out: Path, mode: str, count: int) -> dict[str, Any]:
    """``count`` jobs in ``mode`` (``aa``, ``slower``): how many finished on a config other than the defaults."""
    truth = Truth.llama(truth_model(), truth_spec(args.hardware))
    backlog = Backlog.draw(args.count_size, args.workload)
    setup = job_setup(args.count_size, args.shard_size, tuner_overrides(args), args.space, out / "setup", args.hardware)
    path = out / "counts.jsonl"
    tag = {**settings(args), "mode": mode, "size": args.count_size, "replay": args.count_replay,
           "slowdown": args.slowdown if mode == "slower" else None, "restart_s": args.restarts[0]}
    done = {j["seed"]: j for j in load_jobs(path) if j["tag"] == tag}
    cache = MainCache()
    t0 = time.perf_counter()
    for seed in range(count):
        if seed in done:
            continue
        lo, hi = args.slowdown
        slowdown = float(np.random.default_rng([seed, 5]).uniform(lo, hi)) if mode == "slower" else 0.0
        engine = VirtualEngine(backlog, args.shard_size, truth, args.restarts[0], args.run_sigma, args.step_sigma,
                               seed, mode=mode, slowdown=slowdown, replayable=args.count_replay, cache=cache,
                               cap=args.cap, model=truth_model(), spec=truth_spec(args.hardware))
        result = run_virtual_job(setup, engine, seed)
        cols = result.columns
        done[seed] = {"tag": tag, "seed": seed, "slowdown": slowdown, "non_default": bool(result.chosen),
                      "candidate": bool(cols.get("tune.candidate")), "switched_back": bool(cols.get("tune.switched")),
                      "looks": cols.get("tune.confirm.looks") or 0, "action": cols.get("tune.confirm.action"),
                      "defaults_blocks": len(cols.get("tune.confirm.defaults_blocks") or []),
                      "verdict": cols.get("tune.verdict"), "engine_starts": cols.get("tune.engine_starts"),
                      "reason": cols.get("tune.confirm.reason"), "alternate": cols.get("tune.confirm.alternate"),
                      "host_s": result.host_s}
        with open(path, "a") as f:
            f.write(json.dumps(done[seed], default=str) + "\n")
        if (seed + 1) % 50 == 0:
            non_default = sum(j["non_default"] for j in done.values())
            print(f"{mode}: {seed + 1} jobs, {non_default} on a non-default config ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    rows = [done[s] for s in range(count)]
    non_default = sum(r["non_default"] for r in rows)
    with_candidate = [r for r in rows if r["candidate"]]
    reasons: dict[str, int] = {}
    for r in rows:
        why = "no candidate" if not r["candidate"] else ("no look (the main phase ended first)" if not r["looks"]
                                                        else str(r["verdict"]).split(": ")[-1])
        reasons[why] = reasons.get(why, 0) + 1
    summary = {"mode": mode, "jobs": count, "non_default": non_default, "share": non_default / count,
               "wilson_95": wilson(non_default, count), "with_candidate": len(with_candidate),
               "switched_back": sum(r["switched_back"] for r in rows),
               "looks": {n: sum(r["looks"] == n for r in rows) for n in sorted({r["looks"] for r in rows})},
               "actions": {str(a): sum(r["action"] == a for r in rows) for a in sorted({str(r["action"]) for r in rows})},
               "defaults_blocks_median": statistics.median(r["defaults_blocks"] for r in rows),
               "why": reasons,
               "host": host(), "command": " ".join(sys.argv), "tag": tag,
               "host_s_median": statistics.median(r["host_s"] for r in rows)}
    print(json.dumps({k: v for k, v in summary.items() if k not in ("tag",)}, indent=1, default=str))
    (out / f"counts-{mode}.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    scale = 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / scale, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / scale
    return max(0.0, centre - half), min(1.0, centre + half)


def host() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def seed_list(text: str) -> list[int]:
    """``N``: seeds 0 to N-1; ``A-B``: A to B; ``a,b,c``: those."""
    if "," in text:
        return [int(x) for x in text.split(",")]
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return list(range(int(text)))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ints = lambda text: [int(float(x)) for x in text.split(",")]   # noqa: E731
    floats = lambda text: [float(x) for x in text.split(",")]   # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sizes", type=ints, default=[50_000, 200_000, 1_000_000], help="job sizes, requests")
    p.add_argument("--restarts", type=floats, default=[60.0, 30.0, 120.0], help="seconds per engine start; the jobs "
                   "run at the first, and are priced at each")
    p.add_argument("--seeds", type=seed_list, default=list(range(5)), help="N (seeds 0..N-1), A-B or a list")
    p.add_argument("--per-restart", action="store_true", help="one job per restart cost (for a tuner that reads them)")
    p.add_argument("--run-sigma", type=float, default=0.02, help="per-run log-normal noise (sigma of its log)")
    p.add_argument("--step-sigma", type=float, default=0.05, help="per-step log-normal jitter, mean 1")
    p.add_argument("--hardware", default=HARDWARE, choices=HARDWARES, help="the virtual GPU (conf/hardware/<name>.yaml):"
                   " its spec prices the true steps and sets vLLM's defaults; the tuner's job is composed with it")
    p.add_argument("--workload", default=WORKLOAD, help="conf/workload/<name>.yaml: its input and output lengths")
    p.add_argument("--space", default=SPACE, help="conf/tune/<space>.yaml")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--max-share", type=float, default=0.04, help="batch.tune.max_share")
    p.add_argument("--min-run", type=int, default=128, help="batch.tune.min_run_requests")
    p.add_argument("--shard-size", type=int, default=50)
    p.add_argument("--cap", type=int, default=CAP, help="requests simulated step by step in a run; past it, steady")
    p.add_argument("--grid-points", type=int, default=4)
    p.add_argument("--grid-requests", type=int, default=5_000, help="requests each grid cell simulates")
    p.add_argument("--grid-size", type=int, default=50_000, help="the job size the grid is ranked at")
    p.add_argument("--leaders", type=int, default=5, help="grid cells run at each job size")
    p.add_argument("--aa", type=int, default=0, help="A/A: this many jobs, every config as fast as the defaults")
    p.add_argument("--slower", type=int, default=0, help="this many jobs, every other config --slowdown slower")
    p.add_argument("--slowdown", type=floats, default=[0.05, 0.10], help="LO,HI: drawn per job, uniform")
    p.add_argument("--count-size", type=int, default=50_000, help="requests per job of --aa and --slower")
    p.add_argument("--count-replay", action="store_true", help="--aa/--slower jobs offer their steps for replay "
                   "(the full-engine path; about 20 times slower)")
    p.add_argument("--no-jobs", action="store_true", help="only --aa/--slower")
    p.add_argument("overrides", nargs="*", help="more batch overrides for the tuner (e.g. batch.tune.run_spread=0.05)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_jobs:
        run_jobs(args, args.out)
    if args.aa:
        run_counts(args, args.out, "aa", args.aa)
    if args.slower:
        run_counts(args, args.out, "slower", args.slower)
    return 0


if __name__ == "__main__":
    sys.exit(main())
