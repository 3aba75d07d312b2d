"""What keeping the step trace costs vLLM: the same runs with and without ``enable_logging_iteration_details``.

    .venv/bin/python -m benchmarks.step_trace_overhead --rounds 3 --out /tmp/sto

vLLM on the tiny model, ``workload=unique``, one multirun whose round dimension comes first, so the
two configs alternate (trace on, trace off, trace on, ...) and host drift falls on both; each run is
its own process (independent runs, the verdict rule's samples). Without the iteration details the
engine core attaches nothing to its stats and the run keeps no step trace; everything else is the
same (the stat loggers, troughput's ``StepLogger`` attached, the requests, sampling, warm-up).
Prints each run's output tok/s and the verdict of trace-on ÷ trace-off (docs/verdicts.md) with its
interval, and writes ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KNOB = "+engine.knobs.enable_logging_iteration_details"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workload", default="unique")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    results = args.out / "results"
    rounds = ",".join(str(r) for r in range(1, args.rounds + 1))
    command = [str(ROOT / ".venv/bin/troughput-run"), "-m", f"run.round={rounds}", f"{KNOB}=true,false",
               f"workload={args.workload}", "engine=vllm", f"run.results_dir={results}", "run.progress=false",
               f"hydra.sweep.dir={args.out / 'multirun'}"]
    subprocess.run(command, cwd=ROOT, check=True)

    sys.path.insert(0, str(ROOT))
    from harness.report.verdict import compare
    from harness.run.results import read_rows

    rates: dict[str, list[float]] = {"true": [], "false": []}
    runs = []
    for row in sorted(read_rows(results), key=lambda r: r["timestamp"]):
        on = str(row.get("knob.enable_logging_iteration_details")).lower()
        if row.get("status") != "ok" or on not in rates:
            continue
        rates[on].append(float(row["output_tok_s"]))
        runs.append({"trace": on, "round": row.get("round"), "output_tok_s": row["output_tok_s"],
                     "steps_file": bool(row.get("steps.file")), "commit": row.get("git_commit")})
        print(f"round {row.get('round')}: trace {on:5s} {row['output_tok_s']:10,.1f} output tok/s "
              f"(step trace kept: {bool(row.get('steps.file'))})")
    verdict = compare(rates["true"], rates["false"])
    print(f"trace on ÷ trace off: {verdict.interval_text()}, {verdict.verdict}")
    summary = {"command": " ".join(command), "host": {"machine": platform.machine(), "nproc": os.cpu_count()},
               "runs": runs, "ratio": verdict.ratio, "low": verdict.low, "high": verdict.high,
               "verdict": verdict.verdict}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
