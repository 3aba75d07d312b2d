"""``troughput-batch`` against ``troughput-run workload=file`` on one file of long-tailed output lengths.

    python -m benchmarks.batch_vs_run --count 3000 --rounds 3 --shard-sizes 1000,250 --out /tmp/bvr [--checkout DIR]

Writes an OpenAI Batch file of ``--count`` completions whose ``max_tokens`` are lognormal
(median ``--median``, sigma ``--sigma``, capped at ``--cap``; seeded), then runs, round after
round, ``troughput-run`` on it and ``troughput-batch`` at each shard size, greedy with exact
lengths (``sampling=benchmark``: EOS ignored, so every request makes exactly its
``max_tokens``), on the same engine and config. The order rotates each round so that load
from other processes on a shared host falls on every side alike. Prints each side's
``output_tok_s`` per round (both tools: output tokens over the generation span, engine start
outside), the medians and each batch side's ratio of medians over the run's; writes them
to ``<out>/summary.json``. ``--checkout`` runs another checkout's code (a "before" commit);
``--before DIR`` adds that checkout's sides to the same rotation (``before:run``, ...), so that
before and after are measured in the same rounds, under the same load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda sigma omega rho tau".split()


def write_file(path: Path, count: int, median: float, sigma: float, cap: int, seed: int = 0) -> list[int]:
    """The batch file; returns the output lengths."""
    rng = random.Random(seed)
    lengths = []
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            n = max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))
            lengths.append(n)
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24)))
            body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
    return lengths


def side_command(side: str, data: Path, results: Path, out_dir: Path, extra: list[str]) -> list[str]:
    bin_dir = Path(sys.executable).parent
    common = [f"run.results_dir={results}", "run.progress=false", *extra]
    if side == "run":
        return [str(bin_dir / "troughput-run"), "workload=file", f"workload.path={data}", "workload.sampling=benchmark",
                "run.warmup_requests=0", *common]
    size = side.split("@")[1]
    return [str(bin_dir / "troughput-batch"), f"batch.input={data}", f"batch.output_dir={out_dir}",
            "batch.sampling=benchmark", f"batch.shard_size={size}", *common]


def run_side(label: str, data: Path, work: Path, checkout: Path, extra: list[str]) -> dict[str, Any]:
    """One invocation; its row's rate, tokens and seconds."""
    side = label.split(":")[-1]
    tag = f"{label.replace('@', '-').replace(':', '-')}-{time.strftime('%H%M%S')}"
    results, out_dir = work / f"results-{tag}", work / f"out-{tag}"
    cmd = side_command(side, data, results, out_dir, extra)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    table = "runs" if side == "run" else "batch"
    rows = [json.loads(p.read_text()) for p in sorted((results / table).glob("*.json"))]
    if proc.returncode != 0 or len(rows) != 1 or rows[0].get("status") != "ok":
        raise SystemExit(f"{side} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    row = rows[0]
    return {"side": label, "commit": row.get("git_commit"), "output_tok_s": row["output_tok_s"], "output_tokens": row.get("output_tokens"),
            "startup_s": row.get("startup_s"), "engine_idle_s": row.get("engine_idle_s"), "process_wall_s": wall,
            "load_1min": os.getloadavg()[0], "command": " ".join(cmd)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--median", type=float, default=50)
    parser.add_argument("--sigma", type=float, default=0.9)
    parser.add_argument("--cap", type=int, default=480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shard-sizes", default="1000,250")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--before", type=Path, default=None, help="a second checkout measured in the same rounds")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both tools (engine, knobs)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "skewed.jsonl"
    lengths = write_file(data, args.count, args.median, args.sigma, args.cap)
    print(f"{data}: {args.count} completions, output tokens {sum(lengths):,}, median {statistics.median(lengths)}, "
          f"max {max(lengths)}, past 450: {sum(n > 450 for n in lengths)}", flush=True)
    own = ["run", *(f"batch@{s}" for s in args.shard_sizes.split(","))]
    checkouts = {"": args.checkout.resolve(), **({"before:": args.before.resolve()} if args.before else {})}
    sides = [prefix + side for prefix in checkouts for side in own]
    measured: dict[str, list[float]] = {s: [] for s in sides}
    records = []
    for r in range(args.rounds):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            checkout = checkouts["before:" if side.startswith("before:") else ""]
            got = run_side(side, data, args.out, checkout, args.overrides)
            measured[side].append(got["output_tok_s"])
            records.append({"round": r + 1, **got})
            print(f"round {r + 1} {side:>17}: {got['output_tok_s']:8,.1f} output tok/s  "
                  f"({got['output_tokens']:,} tokens, idle {got['engine_idle_s']}, load {got['load_1min']:.1f})",
                  flush=True)
    medians = {s: statistics.median(v) for s, v in measured.items()}
    ratios = {s: medians[s] / medians[s.rsplit(":", 1)[0] + ":run" if ":" in s else "run"]
              for s in sides if s.split(":")[-1] != "run"}
    for side in sides:
        print(f"median {side:>17}: {medians[side]:8,.1f}" + (f"  ratio {ratios[side]:.3f}" if side in ratios else ""))
    (args.out / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "medians": medians, "ratios": ratios, "runs": records},
                                                      indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
