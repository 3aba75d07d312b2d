"""Llama-3.1-8B on one H100 SXM and one H200 SXM: speed of light and the uncalibrated simulator vs published
offline throughput.

Published numbers (output tokens/s, offline, all requests queued at once):

- NVIDIA TensorRT-LLM "Performance Overview" (docs/source/performance/perf-overview.md in
  github.com/NVIDIA/TensorRT-LLM, read at commit 00f37686aa854010d68bcbd0f4ab000221541ca6), table
  "Llama 3.1 8B", columns "H200 TP1 (FP8)" and "H100 TP1 (FP8)", nvidia/Llama-3.1-8B-Instruct-FP8,
  trtllm-bench throughput, fixed ISL/OSL, every row of the table (``TABLE`` below, with the
  request counts of the same page's ``$num_requests`` table). The a-priori efficiencies were set
  with the H100 column in view, so the H100 part is in-sample; the H200 column is out-of-sample
  (same factors, the H200 datasheet).
- AIMultiple, "LLM inference engines" (research.aimultiple.com/inference-engines): Llama 3.1 8B-Instruct,
  bf16, one H100 80GB, gpu memory utilization 0.8, 1,000 ShareGPT prompts: vLLM 12,553, SGLang 16,215,
  LMDeploy 16,132 output tok/s.
  ShareGPT lengths for that tokenizer: vLLM PR #18566 (github.com/vllm-project/vllm/pull/18566) lists 1,000
  ShareGPT requests to Llama-3.1-8B-Instruct as 229,711 input and 203,068 generated tokens; we draw lognormal
  lengths (sigma 1, our assumption) with those means.

The simulator is uncalibrated here (a-priori efficiencies: 65% of peak FLOP/s, 85% of peak bandwidth, no
per-step overhead), with vLLM 0.32's defaults for an 80+ GB GPU (max_num_seqs 1024, max_num_batched_tokens
16384), at most ``--max-requests`` requests per case. Per part it prints the median absolute error of the
simulator (sim ÷ published − 1) and the range of published ÷ speed of light.

Usage: ``.venv/bin/python benchmarks/sol_h100.py [--max-requests 3000]`` (a few minutes).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engines.base import Request  # noqa: E402
from engines.sim import SimEngine  # noqa: E402
from engines.perfmodel import HardwareSpec, ModelSpec, speed_of_light  # noqa: E402

FP8 = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
SOURCE = "TensorRT-LLM perf overview, TP1 FP8"
# (input length, output length, requests in the published run, published output tok/s per hardware config)
TABLE = [(128, 128, 30000, {"h200": 27911, "h100": 28312}), (128, 2048, 3000, {"h200": 26221, "h100": 22714}),
         (128, 4096, 1500, {"h200": 18027, "h100": 14325}), (500, 2000, 3000, {"h200": 20770, "h100": 17660}),
         (1000, 1000, 3000, {"h200": 17744, "h100": 15220}), (1000, 2000, 1500, {"h200": 16828, "h100": 13899}),
         (2048, 128, 3000, {"h200": 3538, "h100": 3450}), (2048, 2048, 1500, {"h200": 12194, "h100": 9305}),
         (5000, 500, 1500, {"h200": 3902, "h100": 3459}), (20000, 2000, 1000, {"h200": 1804, "h100": 1351})]
PARTS = [("h100", "H100 column (in-sample: the a-priori factors were set with it in view)"),
         ("h200", "H200 column (out-of-sample)")]
SHAREGPT = ("ShareGPT-like", 229.711, 203.068, 1000, {"vLLM": 12553, "SGLang": 16215}, "AIMultiple, bf16, util 0.8",
            {"gpu_memory_utilization": 0.8})


def requests_for(n: int, isl: float, osl: float, lognormal: bool, rng: random.Random) -> list[Request]:
    def length(mean: float, cap: int) -> int:
        return max(1, min(cap, round(rng.lognormvariate(math.log(mean) - 0.5, 1.0)))) if lognormal else int(mean)

    return [Request(f"r{i}", [rng.randrange(1000, 120000) for _ in range(length(isl, 1024))], length(osl, 1024))
            for i in range(n)]


def predict(model: dict, spec: dict, requests: list[Request], knobs: dict) -> tuple[float, float]:
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in requests)
    sim = SimEngine(model, {"hardware_spec": spec, "max_model_len": max(8192, longest), **knobs})
    sim.validate()
    sim.start()
    t0 = time.perf_counter()
    sim.generate(requests)
    return sum(r.max_tokens for r in requests) / sim.simulated_seconds(), time.perf_counter() - t0


def report(label: str, published: float, sol: float, bound: str, sim: float, host_s: float, source: str) -> None:
    print(f"{label:20s} {published:10,.0f} {sol:9,.0f} {bound:>9s} {published / sol:8.2f} "
          f"{sim:9,.0f} {sim / published:8.2f} {host_s:6.1f}  {source}", flush=True)


def summarize(part: str, ratios: list[float], shares: list[float]) -> None:
    errors = [abs(r - 1) for r in ratios]
    print(f"  {part}: {len(ratios)} cases; simulator median |error| {statistics.median(errors):.1%}, "
          f"sim/published {min(ratios):.2f}-{max(ratios):.2f} (median {statistics.median(ratios):.2f}); "
          f"published/SoL {min(shares):.2f}-{max(shares):.2f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-requests", type=int, default=3000, help="cap on simulated requests per case")
    args = parser.parse_args()
    from omegaconf import OmegaConf

    from tests.conftest import compose

    model_spec = ModelSpec.load(None, "llama-3.1-8b")
    model = {"name": "llama-3.1-8b", "path": "meta-llama/Llama-3.1-8B-Instruct", "local_dir": None}
    header = (f"{'case':20s} {'published':>10s} {'SoL':>9s} {'bound':>9s} {'pub/SoL':>8s} {'sim':>9s} "
              f"{'sim/pub':>8s} {'sim s':>6s}  source")
    print(f"Llama-3.1-8B: {model_spec.weight_bytes() / 1e9:.2f} GB bf16, KV {model_spec.kv_bytes_per_token():,} "
          f"B/token; output tok/s\n")
    specs = {}
    for hardware_name, part in PARTS:
        spec = specs[hardware_name] = OmegaConf.to_container(compose(f"hardware={hardware_name}").hardware.spec,
                                                             resolve=True)
        hardware = HardwareSpec.from_config(spec)
        print(f"{part}: {hardware.name}, {hardware.peak_flops_bf16 / 1e12:.0f} TFLOP/s bf16, "
              f"{hardware.peak_flops_fp8 / 1e12:.0f} fp8, {hardware.bandwidth_bytes_s / 1e12:.2f} TB/s")
        print(header)
        rng = random.Random(0)
        ratios, shares = [], []
        for isl, osl, n, published_by_hardware in TABLE:
            published = published_by_hardware[hardware_name]
            n = min(n, args.max_requests)
            summary = {"requests": n, "input_tokens_requested": n * isl, "output_tokens_requested": n * osl}
            sol = speed_of_light(model_spec, hardware, summary, FP8)
            sim, host_s = predict(model, spec, requests_for(n, isl, osl, False, rng), FP8)
            report(f"{isl}/{osl}", published, sol.tok_s, sol.bound, sim, host_s, SOURCE)
            ratios.append(sim / published)
            shares.append(published / sol.tok_s)
        summarize(part, ratios, shares)
    label, isl, osl, n, published_by_engine, source, knobs = SHAREGPT
    hardware = HardwareSpec.from_config(specs["h100"])
    print(f"{label} on {hardware.name}, bf16 (in-sample)")
    print(header)
    requests = requests_for(n, isl, osl, True, random.Random(0))
    summary = {"requests": n, "input_tokens_requested": sum(len(r.prompt_token_ids) for r in requests),
               "output_tokens_requested": sum(r.max_tokens for r in requests)}
    sol = speed_of_light(model_spec, hardware, summary, knobs)
    sim, host_s = predict(model, specs["h100"], requests, knobs)
    for engine, value in published_by_engine.items():
        report(f"{label} {engine}", value, sol.tok_s, sol.bound, sim, host_s, source)


if __name__ == "__main__":
    main()
