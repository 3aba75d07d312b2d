"""Replay a recorded in-job job's rest-of-job predictions offline, with other fits, at its main phase's first look.

For each ``batch.output_dir`` of an in-job tuning job (its ``tune/steps/*.parquet`` and ``tune/runs.jsonl``), the
main phase's trace is cut where its engines reached the first look's full steps (``--at`` an engine, 3 × 128 by
default; the steps' own clock gives the seconds run by then), and the main phase's own requests are replayed
with step models fitted to:

- ``trials``: the chosen config's trial runs (the prediction made as the tuning ends);
- ``trials + main``: those and the main phase's steps so far (``tune_predict.RestInMain``'s fit);
- ``main``: the main phase's steps so far alone;
- ``scaled``: the trials' fit scaled to the main phase's steps so far (their measured ÷ modelled seconds).

Prints measured ÷ predicted for the rest after the cut, and the median |error| of each fit over the jobs:

    .venv/bin/python -m benchmarks.rest_refit /tmp/ijt22/out-in-job-124902 /tmp/ijt1[1-5]/out-in-job-*
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import fields, replace
from pathlib import Path

import pandas as pd

from engines.stepmodel import StepModel
from harness.batch.job.plan import Plan
from harness.batch.job.shards import scan
from harness.batch.tune.tune_predict import engine_share, trace_paths
from harness.batch.tune.tune_runs import RunLog, sample_requests
from harness.steps.fit import fit_step_model, run_errors
from harness.steps.predict import replay

HARDWARE = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": 1e12, "bandwidth_bytes_s": 1e11,
            "memory_bytes": float(1 << 40)}
TIMED = [f.name for f in fields(StepModel) if f.name.endswith("_s")]   # the parts' seconds (knees aside)


def scaled(model, factor: float):
    """The step model with every part's seconds × ``factor``."""
    return replace(model, knees=tuple((k, v * factor) for k, v in model.knees),
                   **{name: getattr(model, name) * factor for name in TIMED})


def one_job(out: Path, at: int) -> dict[str, float]:
    plan = Plan.from_json((out / "plan.json").read_text())
    runs = RunLog(out / "tune").read()
    main = next(r for r in runs if r.kind == "main")
    chosen = [trace_paths(out / "tune", r.label)[0] for r in runs if r.kind == "trial" and r.values == main.values]
    trials = {path.stem: pd.read_parquet(path) for path in chosen if path.exists()}
    steps = pd.read_parquet(trace_paths(out / "tune", "main")[0]).sort_values("t").reset_index(drop=True)
    meta = json.loads(trace_paths(out / "tune", "main")[1].read_text())
    full = ((steps["waiting"] > 0) * steps["weight"]).cumsum()
    if full.iloc[-1] < at * meta["engines"]:
        raise SystemExit(f"{out}: its main phase ran {full.iloc[-1]:.0f} full steps, under --at {at} an engine")
    cut = int((full >= at * meta["engines"]).idxmax())
    elapsed = float(steps["t"][cut] - steps["t"].min())
    share = engine_share(sample_requests(plan, scan(Path(plan.input), plan.format), set(meta["shards"])),
                         meta["engines"])
    so_far = {"main": steps[:cut]}
    trial_fit = fit_step_model(trials)
    fits = {"trials": trial_fit, "trials + main": fit_step_model({**trials, **so_far}),
            "main": fit_step_model(so_far),
            "scaled": scaled(trial_fit, 1 / (1 + run_errors(trial_fit, so_far)["main"]))}
    measured = main.generation_s - elapsed
    got = {}
    for name, model in fits.items():
        predicted = replay(model, share, meta["knobs"], plan.model, HARDWARE).seconds - elapsed
        got[name] = measured / predicted
    print(f"{out}: cut {elapsed:.1f} s into {main.generation_s:.1f} s; measured ÷ predicted rest "
          + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="+", type=Path, help="in-job tuning jobs' batch.output_dir folders")
    parser.add_argument("--at", type=int, default=3 * 128, help="full steps an engine at the cut (the first look)")
    args = parser.parse_args(argv)
    results = [one_job(job, args.at) for job in args.jobs]
    for name in results[0]:
        print(f"{name}: median |error| {statistics.median(abs(r[name] - 1) for r in results):.1%} over {len(results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
