"""Ray Data LLM beside vLLM's offline engine: job time and throughput at several job sizes, alternating.

    .venv/bin/python benchmarks/ray_vs_vllm.py [--sizes 50,200,800] [--rounds 2] [--results-dir DIR]
                                               [--ray OVERRIDE ...] [--vllm OVERRIDE ...] [HYDRA_OVERRIDES ...]

Each size is ``workload.num_requests`` of the workload (default ``workload=unique``); each round runs
every size once per engine, ``engine=ray`` and ``engine=vllm`` in turn (which goes first alternates
by round and size), each run a normal ``harness.run.runner.execute`` (its own worker process) with no
warm-up and one pass, as a batch job runs. ``--ray``/``--vllm`` add overrides to one side only
(e.g. ``--ray engine.knobs.concurrency=2 --vllm engine.replicas=2``).

Per run it prints the job time (``run_seconds``: worker launch to exit, imports and engine start
included: what a user waits for), the engine start-up, the timed pass and output tok/s of the pass;
then per size the medians over rounds, the Ray/vLLM job-time ratio, and the size at which Ray's job
time catches up with vLLM's: the smallest measured size where its median is not larger, else the
crossing of straight lines fitted to job time against size (marked as an extrapolation), or that
Ray stays behind. Output token counts must be equal on both sides (exits 1 otherwise).
``--summarize --results-dir DIR`` prints that summary from the rows of an earlier (interrupted) run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("ray", "vllm")
DEFAULTS = ["workload=unique", "run.warmup_requests=0", "run.repeats=1", "run.progress=false"]


def fit(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """Least-squares line through (size, job time): (seconds at size 0, seconds per request)."""
    mean_n, mean_t = statistics.fmean(sizes), statistics.fmean(times)
    spread = sum((n - mean_n) ** 2 for n in sizes)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in zip(sizes, times)) / spread if spread else 0.0
    return mean_t - slope * mean_n, slope


def catch_up(sizes: list[int], ray: list[float], vllm: list[float]) -> str:
    """Where Ray's job time reaches vLLM's: measured, extrapolated, or not at all."""
    for size, r, v in zip(sizes, ray, vllm):
        if r <= v:
            return f"Ray's job time catches up at {size} requests (measured: {r:.1f} s vs vLLM {v:.1f} s)"
    if len(sizes) < 2:
        return "Ray stays behind at the one size measured"
    (ray_fixed, ray_per), (vllm_fixed, vllm_per) = fit(sizes, ray), fit(sizes, vllm)
    line = (f"fitted job time: Ray {ray_fixed:.1f} s + {ray_per * 1000:.1f} ms/request, "
            f"vLLM {vllm_fixed:.1f} s + {vllm_per * 1000:.1f} ms/request")
    if ray_per <= 0 or vllm_per <= 0:
        return (f"Ray stays behind at every size measured; {line}: a slope that is not positive is noise, "
                "so no crossing is extrapolated (measure on a quieter host or with more rounds)")
    if ray_per >= vllm_per:
        return f"Ray stays behind at every size measured, and its per-request time is not lower: {line}"
    crossing = (ray_fixed - vllm_fixed) / (vllm_per - ray_per)
    return (f"Ray stays behind up to {max(sizes)} requests; {line}; the lines cross near "
            f"{crossing:,.0f} requests (an extrapolation, not measured)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,800", help="comma-separated workload.num_requests")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results-dir", type=Path, default=None, help="rows go here (default: a temporary dir)")
    parser.add_argument("--ray", action="append", default=[], help="an override for engine=ray only")
    parser.add_argument("--vllm", action="append", default=[], help="an override for engine=vllm only")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: summarize the rows already in --results-dir (an interrupted run)")
    args, overrides = parser.parse_known_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.summarize:
        sys.path.insert(0, str(ROOT))
        summarize(*rows_of(args.results_dir))
        return 0
    results_dir = args.results_dir or Path(tempfile.mkdtemp(prefix="ray-vs-vllm-"))

    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir

    from harness.run.runner import execute
    from harness.run.spec import build_inputs, build_spec

    own = {"ray": args.ray, "vllm": args.vllm}
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {}
    tokens_equal = True
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        def config(engine: str, size: int):
            return compose("config", overrides=[*DEFAULTS, *overrides, f"engine={engine}",
                                                f"workload.num_requests={size}", f"run.results_dir={results_dir}",
                                                *own[engine]])

        inputs = {size: build_inputs(config("vllm", size)) for size in sizes}
        print(f"rows in {results_dir}; sizes {sizes}; {args.rounds} rounds; overrides {overrides}, "
              f"ray {args.ray}, vllm {args.vllm}", flush=True)
        for round_ in range(args.rounds):
            for index, size in enumerate(sizes):
                order = ENGINES if (round_ + index) % 2 == 0 else ENGINES[::-1]
                tokens = {}
                for engine in order:
                    row = execute(build_spec(config(engine, size), inputs[size]), progress=False)
                    if row["status"] != "ok":
                        print(f"round {round_ + 1} size {size} {engine}: {row['status']}: "
                              f"{(row['error'] or '').splitlines()[:1]}", flush=True)
                        continue
                    measured.setdefault((engine, size), []).append(row)
                    tokens[engine] = row["output_tokens"]
                    print(f"round {round_ + 1} size {size:>5} {engine:>4}: job {row['run_seconds']:6.1f} s "
                          f"(startup {row['startup_s']:5.1f} s incl. replicas, generation {row['wall_s']:6.1f} s"
                          + (f", of it engine span {row['stat.ray_engine_span_s']:5.1f} s"
                             if engine == "ray" else "")
                          + f"), {row['output_tok_s']:7.1f} out tok/s, {row['output_tokens']} tokens", flush=True)
                if len(set(tokens.values())) > 1:
                    tokens_equal = False
                    print(f"  output tokens differ: {tokens}", flush=True)

    summarize(sizes, measured)
    print("output token counts equal on both sides" if tokens_equal else "OUTPUT TOKEN COUNTS DIFFER")
    return 0 if tokens_equal else 1


def summarize(sizes: list[int], measured: dict[tuple[str, int], list[dict[str, Any]]]) -> None:
    """The medians per size and engine, their ratio and the rule's verdict, and where Ray catches up."""
    from harness.report.verdict import compare

    print("\nmedians over rounds (job = worker launch to exit; tok/s = output tokens / timed pass)")
    print(f"{'requests':>8} | {'Ray job s':>9} | {'vLLM job s':>10} | {'Ray/vLLM job':>12} | "
          f"{'Ray tok/s':>9} | {'vLLM tok/s':>10} | runs")
    done, ray_times, vllm_times = [], [], []
    for size in sizes:
        ray, vllm = measured.get(("ray", size), []), measured.get(("vllm", size), [])
        if not ray or not vllm:
            print(f"{size:>8} | missing runs (ray {len(ray)}, vllm {len(vllm)})")
            continue
        r, v = (statistics.median(x["run_seconds"] for x in rows) for rows in (ray, vllm))
        rt, vt = (statistics.median(x["output_tok_s"] for x in rows) for rows in (ray, vllm))
        print(f"{size:>8} | {r:9.1f} | {v:10.1f} | {r / v:12.2f} | {rt:9.1f} | {vt:10.1f} | {len(ray)}+{len(vllm)}")
        verdict = compare(*([1 / x["run_seconds"] for x in rows] for rows in (ray, vllm)))
        print(f"{'':>8}   verdict (docs/verdicts.md), Ray ÷ vLLM job speed (1 / job s): {verdict.named('Ray', 'vLLM')}; "
              f"{verdict.reason}")
        done.append(size)
        ray_times.append(r)
        vllm_times.append(v)
    if done:
        print(catch_up(done, ray_times, vllm_times))


def rows_of(results_dir: Path) -> tuple[list[int], dict[tuple[str, int], list[dict[str, Any]]]]:
    """The ok rows already in ``results_dir`` by (engine, requests), for ``--summarize``."""
    from harness.run.results import read_rows

    measured: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in read_rows(results_dir):
        if row.get("status") == "ok" and row.get("engine") in ENGINES:
            measured.setdefault((row["engine"], int(row["requests_done"])), []).append(row)
    return sorted({size for _, size in measured}), measured


if __name__ == "__main__":
    sys.exit(main())
