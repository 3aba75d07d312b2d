"""Held-out GPU figures: the uncalibrated simulator against published H100/H200 throughput no factor was set with.

Two sets, reported apart. The first (docs/benchmarks.md "GPU figures held out") was run before the roofline
gained tensor parallelism's all-reduces and attention at the KV cache's precision (commit 42d8650); its
errors were seen before that change, so it no longer counts as held out and is printed as "seen before the
model change". The second (docs/benchmarks.md "GPU figures held out, second set") was named and committed
before the changed simulator first ran on it; it is the held-out result. The simulator (engine=sim,
hardware from conf/hardware/h100.yaml / h200.yaml) runs with the a-priori efficiencies of
``engines.perfmodel.Efficiency`` (65% of peak FLOP/s, 85% of peak bandwidth, 82% of the NVLink line rate,
no per-step overhead), as benchmarks/sol_h100.py does; nothing is fitted to these figures. Per case it prints
published, speed of light, simulator, sim ÷ published (output tok/s per GPU); per set the median and worst
absolute error of sim ÷ published − 1 over its counted figures (rows marked "not counted" show what an
assumption weighs).

Usage: ``.venv/bin/python benchmarks/gpu_holdout.py [--max-requests 3000] [--set first|second|both]``
(several minutes).
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
# Second set: TensorRT-LLM perf overview 00f37686, "Total Output Throughput" (all GPUs together, so divided by the
# GPU count below to print per GPU). KV cache bf16: the 405B FP8 card quantizes only the linear layers (an
# assumption for the 70B); rows "(if FP8 KV)" show what that weighs and are not counted.
TRTLLM_OLD = "TensorRT-LLM perf overview 00f37686"
FP8_TP8 = {"quantization": "fp8", "tensor_parallel_size": 8}
FP8_TP8_KV8 = {**FP8_TP8, "kv_cache_dtype": "fp8"}
FP8_TP1 = {"quantization": "fp8"}
FP8_TP1_KV8 = {**FP8_TP1, "kv_cache_dtype": "fp8"}
# (input, output, requests in the published run) of the page's $num_requests table; then per column the total
LENGTHS = [(128, 128, 30000), (128, 2048, 3000), (128, 4096, 1500), (500, 2000, 3000), (1000, 1000, 3000),
           (1000, 2000, 1500), (2048, 128, 3000), (2048, 2048, 1500), (5000, 500, 1500), (20000, 2000, 1000)]
COLUMNS = [("405B H200 TP8", "llama-3.1-405b", "h200", FP8_TP8, FP8_TP8_KV8,
            [3814, 5348, 4741, 4724, 3330, 3722, 456, 2948, 650, 505]),
           ("405B H100 TP8", "llama-3.1-405b", "h100", FP8_TP8, FP8_TP8_KV8,
            [3627, 4340, 3116, 3994, 2919, 2895, 453, 2296, 610, 345]),
           ("70B H200 TP1", "llama-3.3-70b", "h200", FP8_TP1, FP8_TP1_KV8,
            [3803, 4336, 2872, 3666, 2909, 2994, 442, 2003, 566, 283])]
SECOND = []
for name, model_name, hardware_name, knobs, fp8_kv, totals in COLUMNS:
    devices = int(knobs.get("tensor_parallel_size", 1))
    for (isl, osl, n), total in zip(LENGTHS, totals):
        SECOND.append((f"{name} {isl}/{osl}", model_name, hardware_name, isl, osl, n, total / devices, TRTLLM_OLD,
                       knobs, True))
        if (isl, osl) == (1000, 1000):
            SECOND.append(("  (if FP8 KV)", model_name, hardware_name, isl, osl, n, total / devices, TRTLLM_OLD,
                           fp8_kv, False))
SETS = {"first": ("first set: SEEN BEFORE THE MODEL CHANGE (no longer held out)", CASES),
        "second": ("second set: held out (named and committed before this simulator ran on it)", SECOND)}
MODELS = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct", "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
          "llama-3.1-405b": "meta-llama/Llama-3.1-405B-Instruct"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-requests", type=int, default=3000, help="cap on simulated requests per case")
    parser.add_argument("--set", choices=("first", "second", "both"), default="both", help="which set to run")
    args = parser.parse_args()
    from omegaconf import OmegaConf

    from tests.conftest import compose

    specs = {name: OmegaConf.to_container(compose(f"hardware={name}").hardware.spec, resolve=True)
             for name in ("h100", "h200")}
    summaries = []
    for key in (("first", "second") if args.set == "both" else (args.set,)):
        title, cases = SETS[key]
        print(f"\n{title}")
        print(f"{'case':24s} {'published':>10s} {'SoL':>8s} {'bound':>9s} {'pub/SoL':>8s} {'sim':>8s} "
              f"{'sim/pub':>8s} {'sim s':>6s}  source  (tok/s per GPU)", flush=True)
        errors = []
        for label, model_name, hardware_name, isl, osl, published_n, published, source, knobs, counted in cases:
            model_spec = ModelSpec.load(None, model_name)
            hardware = HardwareSpec.from_config(specs[hardware_name])
            devices = int(knobs.get("tensor_parallel_size", 1))
            n = min(published_n, args.max_requests)
            summary = {"requests": n, "input_tokens_requested": n * isl, "output_tokens_requested": n * osl}
            sol = speed_of_light(model_spec, hardware, summary, knobs)
            model = {"name": model_name, "path": MODELS[model_name], "local_dir": None}
            sim, host_s = predict(model, specs[hardware_name], requests_for(n, isl, osl, False, random.Random(0)),
                                  knobs)
            sim, sol_tok_s = sim / devices, sol.tok_s / devices
            ratio = sim / published
            if counted:
                errors.append(abs(ratio - 1))
            print(f"{label:24s} {published:10,.0f} {sol_tok_s:8,.0f} {sol.bound:>9s} {published / sol_tok_s:8.2f} "
                  f"{sim:8,.0f} {ratio:8.2f} {host_s:6.1f}  {source}{'' if counted else '  (not counted)'}",
                  flush=True)
        summaries.append(f"{title}: {len(errors)} figures; simulator median |sim/published - 1| "
                         f"{statistics.median(errors):.1%}, worst {max(errors):.1%}")
    print("\n" + "\n".join(summaries))


if __name__ == "__main__":
    main()
