"""Llama-3.1-8B on one H100 SXM: speed of light and the uncalibrated simulator vs published offline throughput.

Published numbers (output tokens/s, offline, all requests queued at once):

- NVIDIA TensorRT-LLM "Performance Overview" (docs/source/performance/perf-overview.md in
  github.com/NVIDIA/TensorRT-LLM, read at commit 00f37686aa854010d68bcbd0f4ab000221541ca6), table
  "Llama 3.1 8B", column "H100 TP1 (FP8)", nvidia/Llama-3.1-8B-Instruct-FP8, trtllm-bench throughput,
  fixed ISL/OSL: 128/128 28,312; 128/2048 22,714; 500/2000 17,660; 1000/1000 15,220; 1000/2000 13,899;
  2048/128 3,450; 2048/2048 9,305; 5000/500 3,459.
- AIMultiple, "LLM inference engines" (research.aimultiple.com/inference-engines): Llama 3.1 8B-Instruct,
  bf16, one H100 80GB, gpu memory utilization 0.8, 1,000 ShareGPT prompts: vLLM 12,553, SGLang 16,215,
  LMDeploy 16,132 output tok/s.
  ShareGPT lengths for that tokenizer: vLLM PR #18566 (github.com/vllm-project/vllm/pull/18566) lists 1,000
  ShareGPT requests to Llama-3.1-8B-Instruct as 229,711 input and 203,068 generated tokens; we draw lognormal
  lengths (sigma 1, our assumption) with those means.

The simulator is uncalibrated here (a-priori efficiencies: 65% of peak FLOP/s, 85% of peak bandwidth, no
per-step overhead), with vLLM 0.32's H100 defaults (max_num_seqs 1024, max_num_batched_tokens 16384).

Usage: ``.venv/bin/python benchmarks/sol_h100.py [--max-requests 3000]`` (about a minute).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engines.base import Request  # noqa: E402
from engines.sim import SimEngine  # noqa: E402
from harness.perfmodel import HardwareSpec, ModelSpec, speed_of_light  # noqa: E402

FP8 = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
# (label, input length, output length, requests in the published run, published output tok/s, source, precision)
TRTLLM = "TensorRT-LLM perf overview, H100 TP1 FP8"
CASES = [("128/128", 128, 128, 30000, 28312, TRTLLM, FP8), ("128/2048", 128, 2048, 3000, 22714, TRTLLM, FP8),
         ("500/2000", 500, 2000, 3000, 17660, TRTLLM, FP8), ("1000/1000", 1000, 1000, 3000, 15220, TRTLLM, FP8),
         ("1000/2000", 1000, 2000, 1500, 13899, TRTLLM, FP8), ("2048/128", 2048, 128, 3000, 3450, TRTLLM, FP8),
         ("2048/2048", 2048, 2048, 1500, 9305, TRTLLM, FP8), ("5000/500", 5000, 500, 1500, 3459, TRTLLM, FP8)]
SHAREGPT = ("ShareGPT-like", 229.711, 203.068, 1000, {"vLLM": 12553, "SGLang": 16215}, "AIMultiple, bf16, util 0.8",
            {"gpu_memory_utilization": 0.8})


def requests_for(n: int, isl: float, osl: float, lognormal: bool, rng: random.Random) -> list[Request]:
    def length(mean: float, cap: int) -> int:
        return max(1, min(cap, round(rng.lognormvariate(math.log(mean) - 0.5, 1.0)))) if lognormal else int(mean)

    return [Request(f"r{i}", [rng.randrange(1000, 120000) for _ in range(length(isl, 1024))], length(osl, 1024))
            for i in range(n)]


def predict(model: dict, spec: dict, requests: list[Request], knobs: dict) -> tuple[float, float]:
    sim = SimEngine(model, {"hardware_spec": spec, "max_model_len": 8192, **knobs})
    sim.validate()
    sim.start()
    t0 = time.perf_counter()
    sim.generate(requests)
    return sum(r.max_tokens for r in requests) / sim.simulated_seconds(), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-requests", type=int, default=3000, help="cap on simulated requests per case")
    args = parser.parse_args()
    from omegaconf import OmegaConf

    from tests.conftest import compose

    spec = OmegaConf.to_container(compose("hardware=h100").hardware.spec, resolve=True)
    hardware = HardwareSpec.from_config(spec)
    model_spec = ModelSpec.load(None, "llama-3.1-8b")
    model = {"name": "llama-3.1-8b", "path": "meta-llama/Llama-3.1-8B-Instruct", "local_dir": None}
    print(f"Llama-3.1-8B ({model_spec.weight_bytes() / 1e9:.2f} GB bf16, KV {model_spec.kv_bytes_per_token():,} "
          f"B/token) on {hardware.name}: {hardware.peak_flops_bf16 / 1e12:.0f} TFLOP/s bf16, "
          f"{hardware.peak_flops_fp8 / 1e12:.0f} fp8, {hardware.bandwidth_bytes_s / 1e12:.2f} TB/s\n")
    print(f"{'case':14s} {'published':>10s} {'SoL':>9s} {'bound':>9s} {'pub/SoL':>8s} {'sim':>9s} "
          f"{'sim/pub':>8s} {'sim s':>6s}  source")
    rng = random.Random(0)
    for label, isl, osl, n, published, source, knobs in CASES:
        n = min(n, args.max_requests)
        summary = {"requests": n, "input_tokens_requested": n * isl, "output_tokens_requested": n * osl}
        sol = speed_of_light(model_spec, hardware, summary, knobs)
        sim, host_s = predict(model, spec, requests_for(n, isl, osl, False, rng), knobs)
        print(f"{label:14s} {published:10,d} {sol.tok_s:9,.0f} {sol.bound:>9s} {published / sol.tok_s:8.2f} "
              f"{sim:9,.0f} {sim / published:8.2f} {host_s:6.1f}  {source}")
    label, isl, osl, n, published, source, knobs = SHAREGPT
    requests = requests_for(n, isl, osl, True, rng)
    summary = {"requests": n, "input_tokens_requested": sum(len(r.prompt_token_ids) for r in requests),
               "output_tokens_requested": sum(r.max_tokens for r in requests)}
    sol = speed_of_light(model_spec, hardware, summary, knobs)
    sim, host_s = predict(model, spec, requests, knobs)
    for engine, value in published.items():
        print(f"{label + ' ' + engine:14s} {value:10,d} {sol.tok_s:9,.0f} {sol.bound:>9s} {value / sol.tok_s:8.2f} "
              f"{sim:9,.0f} {sim / value:8.2f} {host_s:6.1f}  {source}")


if __name__ == "__main__":
    main()
