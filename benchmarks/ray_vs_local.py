"""``troughput-batch`` on Ray against one node on the long-tailed OpenAI Batch file: same config, alternating rounds.

    python -m benchmarks.ray_vs_local --out /tmp/rvl [--requests 3000] [--rounds 3] [--shard-sizes 1000,100]
                                      [--ray-address HOST:PORT] [HYDRA_OVERRIDES ...]

Writes the long-tailed file of ``benchmarks.batch_vs_run`` (``--requests`` completions, lognormal ``max_tokens``,
median 50, sigma 0.9, cap 480, seed 0: at 3,000 requests 225,163 output tokens, the docs' file), then, round after
round and for each shard size, runs ``troughput-batch`` on it with ``batch.scale=local`` and ``batch.scale=ray``
(``batch.ray.actors=1``: one engine on each side), the same engine, model, knobs and shard size, greedy with exact
lengths (``batch.sampling=benchmark``). Which side goes first alternates by round. Ray runs against one head for the
whole benchmark (``tests/ray_head.py``, 4 logical CPUs, started here unless ``--ray-address`` names one); it stays
up during the one-node runs too, so its processes share the cores with both sides alike.

Reads each job's row: ``engine_steps``, ``occupancy`` (mean running sequences / the engine's max_num_seqs),
``output_tok_s``. Prints a line per run, then per shard size the medians, Ray's steps over one node's, the
occupancy difference in points, the tok/s ratio, and whether the bar holds: the medians' engine steps within 5%
and occupancy within 5 points (output tok/s is reported, not the bar: Ray's own processes share the cores). Every
round is judged the same way beside it. Writes ``<out>/summary.json``; exits 1 where a run fails or the two sides'
output tokens differ.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.batch_vs_run import write_file

ROOT = Path(__file__).resolve().parent.parent
STEPS_BAR = 0.05       # Ray's engine steps within 5% of one node's
OCCUPANCY_BAR = 0.05   # occupancy (a fraction) within 5 points
SCALES = ("local", "ray")


def command(scale: str, data: Path, shard_size: int, work: Path, tag: str, address: str | None,
            overrides: list[str]) -> list[str]:
    ray = ["batch.ray.actors=1", f"batch.ray.address={address}"] if scale == "ray" else []
    return [sys.executable, "-m", "harness.batch.cli", f"batch.input={data}", f"batch.output_dir={work / f'out-{tag}'}",
            "batch.sampling=benchmark", f"batch.shard_size={shard_size}", f"batch.scale={scale}", *ray,
            f"run.results_dir={work / f'results-{tag}'}", "run.progress=false",
            f"hydra.run.dir={work / f'hydra-{tag}'}",
            *overrides]


def run_one(scale: str, data: Path, shard_size: int, work: Path, rnd: int, address: str | None,
            env: dict[str, str], overrides: list[str]) -> dict[str, Any]:
    tag = f"r{rnd}-{scale}-{shard_size}"
    cmd = command(scale, data, shard_size, work, tag, address, overrides)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    rows = [json.loads(p.read_text()) for p in sorted((work / f"results-{tag}" / "batch").glob("*.json"))]
    if proc.returncode != 0 or len(rows) != 1 or rows[0].get("status") != "ok":
        raise SystemExit(f"{tag} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-3000:]}")
    row = rows[0]
    return {"round": rnd, "scale": scale, "shard_size": shard_size, "engine_steps": row.get("engine_steps"),
            "occupancy": row.get("occupancy"), "output_tok_s": row.get("output_tok_s"),
            "output_tokens": row.get("output_tokens"), "engine_idle_s": row.get("engine_idle_s"),
            "generation_s": row.get("generation_s"), "startup_s": row.get("startup_s"), "process_wall_s": wall,
            "load_1min": os.getloadavg()[0], "commit": row.get("git_commit"), "host_id": row.get("env.host_id"),
            "command": " ".join(cmd)}


def compare(local: dict[str, float], ray: dict[str, float]) -> dict[str, Any]:
    """Ray against one node on one set of figures (a round's, or the medians)."""
    steps = ray["engine_steps"] / local["engine_steps"] if local["engine_steps"] and ray["engine_steps"] else None
    points = (ray["occupancy"] - local["occupancy"]) * 100 \
        if ray["occupancy"] is not None and local["occupancy"] is not None else None
    rate = ray["output_tok_s"] / local["output_tok_s"] if local["output_tok_s"] and ray["output_tok_s"] else None
    holds = steps is not None and points is not None and abs(steps - 1) <= STEPS_BAR and \
        abs(points) <= OCCUPANCY_BAR * 100
    return {"steps_ratio": steps, "occupancy_points": points, "tok_s_ratio": rate, "bar_holds": holds}


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shard-sizes", default="1000,100")
    parser.add_argument("--ray-address", default=None, help="a running Ray head (host:port); default: one started here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both sides (engine, knobs)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "skewed.jsonl"
    lengths = write_file(data, args.requests, 50, 0.9, 480)
    print(f"{data}: {args.requests} completions, output tokens {sum(lengths):,}, median "
          f"{statistics.median(lengths)}, max {max(lengths)}, past 450: {sum(n > 450 for n in lengths)}", flush=True)
    sizes = [int(s) for s in args.shard_sizes.split(",")]
    head_gen = None
    if args.ray_address:
        address, env = args.ray_address, {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    else:
        sys.path.insert(0, str(ROOT))
        from tests.ray_head import start_head

        head_gen = start_head(num_cpus=4)
        head = next(head_gen)
        address, env = head.address, head.driver_env
    runs: list[dict[str, Any]] = []
    try:
        for rnd in range(1, args.rounds + 1):
            for size in sizes:
                for scale in (SCALES if rnd % 2 else SCALES[::-1]):
                    got = run_one(scale, data, size, args.out, rnd, address, env, args.overrides)
                    runs.append(got)
                    print(f"round {rnd} shard {size:>5} {scale:>5}: steps {_f(got['engine_steps'], ',.0f'):>7}  "
                          f"occupancy {_f(got['occupancy'], '.3f')}  "
                          f"{_f(got['output_tok_s'], ',.1f'):>9} output tok/s  "
                          f"(idle {_f(got['engine_idle_s'], '.2f')} s, wall {got['process_wall_s']:.0f} s, "
                          f"load {got['load_1min']:.1f})", flush=True)
    finally:
        if head_gen is not None:
            next(head_gen, None)
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "output_tokens": sum(lengths),
                               "bar": {"steps_within": STEPS_BAR, "occupancy_points_within": OCCUPANCY_BAR * 100},
                               "runs": runs, "sizes": {}}
    ok = True
    print(f"\n{'shard':>6} {'side':>6} {'steps (median)':>15} {'occupancy':>10} {'output tok/s':>13}")
    for size in sizes:
        sides = {s: [r for r in runs if r["shard_size"] == size and r["scale"] == s] for s in SCALES}
        tokens = {r["output_tokens"] for r in runs if r["shard_size"] == size}
        if len(tokens) != 1:
            print(f"shard {size}: output tokens differ between runs: {sorted(tokens)}")
            ok = False
        medians = {s: {k: median_of(sides[s], k) for k in ("engine_steps", "occupancy", "output_tok_s")}
                   for s in SCALES}
        for s in SCALES:
            print(f"{size:>6} {s:>6} {_f(medians[s]['engine_steps'], ',.0f'):>15} "
                  f"{_f(medians[s]['occupancy'], '.3f'):>10} {_f(medians[s]['output_tok_s'], ',.1f'):>13}")
        overall = compare(medians["local"], medians["ray"])
        rounds = [compare(lo, ra) for lo, ra in zip(sides["local"], sides["ray"])]
        print(f"shard {size}: Ray/one node steps {_f(overall['steps_ratio'], '.3f')}, occupancy "
              f"{_f(overall['occupancy_points'], '+.1f')} points, output tok/s {_f(overall['tok_s_ratio'], '.3f')} "
              f"(not the bar) -> bar (steps within 5%, occupancy within 5 points) "
              f"{'HOLDS' if overall['bar_holds'] else 'DOES NOT HOLD'}; rounds holding it: "
              f"{sum(r['bar_holds'] for r in rounds)} of {len(rounds)}")
        summary["sizes"][str(size)] = {"medians": medians, "medians_compared": overall, "rounds_compared": rounds}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
