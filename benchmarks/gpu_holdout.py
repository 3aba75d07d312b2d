"""Held-out GPU figures: the uncalibrated simulator against published H100/H200 throughput no factor was set with.

The figures, their sources and the assumptions are named in docs/benchmarks.md ("GPU figures held out"),
written and committed before this script first ran. The simulator (engine=sim, hardware from
conf/hardware/h100.yaml / h200.yaml) runs with the a-priori efficiencies of ``engines.perfmodel.Efficiency``
(65% of peak FLOP/s, 85% of peak bandwidth, no per-step overhead), as benchmarks/sol_h100.py does; nothing is
fitted to these figures. Per case it prints published, speed of light, simulator, sim ÷ published; then the
median absolute error of sim ÷ published − 1 over the held-out figures alone (the MLPerf row counted at its
assumed 800-token mean prompt; the 600 and 1,000 rows show what that guess weighs and are not counted).

Usage: ``.venv/bin/python benchmarks/gpu_holdout.py [--max-requests 3000]`` (a few minutes).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engines.perfmodel import HardwareSpec, ModelSpec, speed_of_light  # noqa: E402
from sol_h100 import predict, requests_for  # noqa: E402

MLPERF = "MLPerf v5.1 Red Hat, vLLM 0.10.0"
TRTLLM = "TensorRT-LLM perf overview 03e27c7d"
# (label, model, hardware, input, output, published requests, published output tok/s per GPU, source, knobs, counted)
FP8_VLLM = {"quantization": "fp8"}  # FP8 weights; KV cache left at vLLM's default (the checkpoint's bf16)
FP8_TP2 = {"quantization": "fp8", "kv_cache_dtype": "fp8", "tensor_parallel_size": 2}
CASES = [
    ("MLPerf 8B ~800/128", "llama-3.1-8b", "h100", 800, 128, 28802, 5777.08, MLPERF, FP8_VLLM, True),
    ("  (if 600/128)", "llama-3.1-8b", "h100", 600, 128, 28802, 5777.08, MLPERF, FP8_VLLM, False),
    ("  (if 1000/128)", "llama-3.1-8b", "h100", 1000, 128, 28802, 5777.08, MLPERF, FP8_VLLM, False),
    ("70B H200 1000/1000", "llama-3.3-70b", "h200", 1000, 1000, 3000, 2587, TRTLLM, FP8_TP2, True),
    ("70B H200 1024/1024", "llama-3.3-70b", "h200", 1024, 1024, 3000, 2582, TRTLLM, FP8_TP2, True),
    ("70B H200 1024/8192", "llama-3.3-70b", "h200", 1024, 8192, 1500, 2009, TRTLLM, FP8_TP2, True),
    ("70B H200 8192/1024", "llama-3.3-70b", "h200", 8192, 1024, 1500, 537, TRTLLM, FP8_TP2, True),
    ("70B H200 32768/1024", "llama-3.3-70b", "h200", 32768, 1024, 1000, 120, TRTLLM, FP8_TP2, True),
    ("70B H100 1000/1000", "llama-3.3-70b", "h100", 1000, 1000, 3000, 2209, TRTLLM, FP8_TP2, True),
    ("70B H100 8192/1024", "llama-3.3-70b", "h100", 8192, 1024, 1500, 398, TRTLLM, FP8_TP2, True),
]
MODELS = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct", "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-requests", type=int, default=3000, help="cap on simulated requests per case")
    args = parser.parse_args()
    from omegaconf import OmegaConf

    from tests.conftest import compose

    specs = {name: OmegaConf.to_container(compose(f"hardware={name}").hardware.spec, resolve=True)
             for name in ("h100", "h200")}
    print(f"{'case':22s} {'published':>10s} {'SoL':>8s} {'bound':>9s} {'pub/SoL':>8s} {'sim':>8s} {'sim/pub':>8s} "
          f"{'sim s':>6s}  source  (tok/s per GPU)", flush=True)
    errors = []
    for label, model_name, hardware_name, isl, osl, published_n, published, source, knobs, counted in CASES:
        model_spec = ModelSpec.load(None, model_name)
        hardware = HardwareSpec.from_config(specs[hardware_name])
        devices = int(knobs.get("tensor_parallel_size", 1))
        n = min(published_n, args.max_requests)
        summary = {"requests": n, "input_tokens_requested": n * isl, "output_tokens_requested": n * osl}
        sol = speed_of_light(model_spec, hardware, summary, knobs)
        model = {"name": model_name, "path": MODELS[model_name], "local_dir": None}
        sim, host_s = predict(model, specs[hardware_name], requests_for(n, isl, osl, False, random.Random(0)), knobs)
        sim, sol_tok_s = sim / devices, sol.tok_s / devices
        ratio = sim / published
        if counted:
            errors.append(abs(ratio - 1))
        print(f"{label:22s} {published:10,.0f} {sol_tok_s:8,.0f} {sol.bound:>9s} {published / sol_tok_s:8.2f} "
              f"{sim:8,.0f} {ratio:8.2f} {host_s:6.1f}  {source}", flush=True)
    print(f"\nheld out: {len(errors)} figures; simulator median |sim/published - 1| {statistics.median(errors):.1%}, "
          f"worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
