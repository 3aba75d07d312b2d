"""How far a short run's rate understates the same engine fed without end: in-job tuning's drain-bound runs.

    .venv/bin/python benchmarks/drain_bound.py [--rounds 2] [--short 96] [--runs 3] [--long 1024] \\
        [--max-seqs 256] [--kv-bytes 1073741824]

One vLLM engine on the CPU default (the tiny model; eager; 32-token blocks; ``OMP_NUM_THREADS=1``
as hardware ``cpu`` sets), started once in this process. Requests are ``workload=backlog_cpu``'s
shape (lognormal prompts, median 128 tokens, sigma 0.8, up to 1,024; lognormal outputs, median
64, sigma 1.0, up to 512; token-id prompts, greedy, exact lengths), fresh draws for every run.
Each round runs ``--runs`` short runs of ``--short`` requests (fewer than ``--max-seqs``: every
request starts at once and the run drains, as an in-job tuning's run of one replica of 192
requests over two replicas does) and then one long run of ``--long`` requests (several times
``--max-seqs``: the engine stays full most of the run, as in the main phase). It prints each run's
output tok/s, engine steps and tokens scheduled, and two predictions of the long run's time from
the round's short runs: their plain rate (the long run's output tokens at the geometric mean of
the short runs' rates), and a linear step model fitted to them (seconds = a × steps + b ×
scheduled tokens, least squares, evaluated at the long run's own measured steps and tokens, so
it is the model's best case). Both as measured ÷ predicted.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine core in this process, as on CPU


def draw(rng: random.Random, median: float, sigma: float, top: int) -> int:
    return max(1, min(top, round(median * math.exp(rng.gauss(0.0, sigma)))))


def requests(rng: random.Random, n: int, tag: str, vocab: int) -> list:
    from engines.base import Request

    return [Request(f"{tag}{i}", [rng.randrange(5, vocab) for _ in range(draw(rng, 128, 0.8, 1024))],
                    draw(rng, 64, 1.0, 512)) for i in range(n)]


def timed(engine, batch: list) -> dict[str, float]:
    before = engine.stats().extra
    t0 = time.perf_counter()
    done = engine.generate(batch)
    seconds = time.perf_counter() - t0
    after = engine.stats().extra
    out = sum(len(c.output_token_ids) for c in done)
    return {"requests": len(batch), "seconds": seconds, "output_tokens": out, "rate": out / seconds,
            "steps": after["engine_steps"] - before.get("engine_steps", 0),
            "scheduled": after["step_tokens"] - before.get("step_tokens", 0)}


def fit(runs: list[dict[str, float]]) -> tuple[float, float]:
    """a, b of seconds = a × steps + b × scheduled tokens, least squares (normal equations)."""
    sxx = sum(r["steps"] ** 2 for r in runs)
    sxy = sum(r["steps"] * r["scheduled"] for r in runs)
    syy = sum(r["scheduled"] ** 2 for r in runs)
    sx_t = sum(r["steps"] * r["seconds"] for r in runs)
    sy_t = sum(r["scheduled"] * r["seconds"] for r in runs)
    det = sxx * syy - sxy * sxy
    return (sx_t * syy - sy_t * sxy) / det, (sy_t * sxx - sx_t * sxy) / det


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="short runs per round")
    parser.add_argument("--short", type=int, default=96)
    parser.add_argument("--long", type=int, default=1024)
    parser.add_argument("--max-seqs", type=int, default=256)
    parser.add_argument("--kv-bytes", type=int, default=1 << 30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be at least 2: the step model fits two coefficients")
    import json

    from engines.vllm import VllmEngine
    from harness.core.models import resolve_model

    from omegaconf import OmegaConf

    model = resolve_model(OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / "tiny.yaml")),
                          sys.executable)
    vocab = json.loads((Path(model["local_dir"]) / "config.json").read_text())["vocab_size"]
    knobs = {"max_num_seqs": args.max_seqs, "kv_cache_memory_bytes": args.kv_bytes, "enforce_eager": True,
             "block_size": 32, "max_model_len": 2048}
    engine = VllmEngine({**model, "path": model["local_dir"]}, knobs)
    engine.validate()
    engine.start()
    rng = random.Random(args.seed)
    flags = next((line.split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{' '.join(f for f in ('avx2', 'avx512f', 'avx512_bf16', 'amx_tile') if f in flags)}; knobs {knobs}")
    timed(engine, requests(rng, 8, "warm", vocab))
    ratios = []
    try:
        for r in range(args.rounds):
            short = [timed(engine, requests(rng, args.short, f"s{r}-{k}-", vocab)) for k in range(args.runs)]
            long = timed(engine, requests(rng, args.long, f"l{r}-", vocab))
            for label, run in [*((f"short {k + 1}", s) for k, s in enumerate(short)), ("long", long)]:
                print(f"round {r + 1} {label:8s}: {run['requests']:5d} requests, {run['seconds']:6.2f} s, "
                      f"{run['rate']:7,.0f} output tok/s, {run['steps']:5.0f} steps, {run['scheduled']:7.0f} tokens")
            plain = long["output_tokens"] / math.exp(sum(math.log(s["rate"]) for s in short) / len(short))
            a, b = fit(short)
            model_s = a * long["steps"] + b * long["scheduled"]
            ratios.append((long["seconds"] / plain, long["seconds"] / model_s))
            print(f"round {r + 1} long run: measured {long['seconds']:.2f} s; plain-rate prediction {plain:.2f} s "
                  f"(measured ÷ predicted {ratios[-1][0]:.3f}); step model (a={a * 1e3:.3f} ms/step, "
                  f"b={b * 1e6:.2f} µs/token) {model_s:.2f} s ({ratios[-1][1]:.3f})", flush=True)
    finally:
        engine.stop()
    for name, i in (("plain rate", 0), ("step model", 1)):
        print(f"{name}: measured ÷ predicted " + ", ".join(f"{r[i]:.3f}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
