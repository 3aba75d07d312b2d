"""First trials, enqueued before the sampler takes over.

From the tune config's ``seeds`` list (the engine's defaults = the real-time
config, a batch-oriented recipe, ...) and TensorRT-LLM's published sizing
heuristic (``trtllm-bench``'s ``tuning/heuristics.py``): max resident requests
= 0.95 × (memory − weights) ÷ (KV bytes per token × (ISL + OSL)), with KV bytes
per token = 2 · layers · kv_heads · head_dim · bytes per element.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

import optuna

from sweeps.space import SearchSpace

log = logging.getLogger(__name__)


def kv_bytes_per_token(model_dir: str | Path, bytes_per_element: int = 2) -> int:
    """KV-cache bytes one token needs, from the model's ``config.json``."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    return 2 * int(text["num_hidden_layers"]) * kv_heads * head_dim * bytes_per_element


def resident_requests(model_dir: str | Path, memory_bytes: float, weight_bytes: float, isl: float, osl: float,
                      bytes_per_element: int = 2) -> int:
    """TensorRT-LLM's heuristic for the most requests the KV cache holds at once."""
    per_request = kv_bytes_per_token(model_dir, bytes_per_element) * (isl + osl)
    return max(1, int(0.95 * (memory_bytes - weight_bytes) / per_request))


def weight_bytes(model_dir: str | Path) -> int:
    """Size of the checkpoint's safetensors files (0 when absent, e.g. metadata-only snapshots)."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


def enqueue_seeds(study: optuna.Study, tune: Mapping[str, Any], space: SearchSpace, base: Mapping[str, Any],
                  workload_summary: Mapping[str, Any], model_dir: str) -> list[str]:
    """Enqueue the configured seeds and the heuristic; already-enqueued ones are skipped. Returns their names."""
    seeds = [dict(s) for s in tune.get("seeds") or []]
    heuristic = tune.get("heuristic")
    if heuristic and heuristic.get("memory_bytes"):
        n = workload_summary["requests"]
        isl = workload_summary["input_tokens_requested"] / n
        osl = workload_summary["output_tokens_requested"] / n
        weights = weight_bytes(model_dir) if heuristic.get("weights_in_memory", True) else 0
        value = resident_requests(model_dir, float(heuristic["memory_bytes"]), weights, isl, osl)
        seeds.append({"name": f"trtllm heuristic ({value} resident requests)", "params": {heuristic["param"]: value}})
    names = []
    for seed in seeds:
        params = space.clip(seed.get("params") or {}, base)
        study.enqueue_trial(params, user_attrs={"seed": seed["name"]}, skip_if_exists=True)
        names.append(seed["name"])
    return names
