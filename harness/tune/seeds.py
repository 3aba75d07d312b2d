"""First trials, enqueued before the sampler takes over.

From the tune config's ``seeds`` list (the engine's defaults = the real-time
config, a batch-oriented recipe, ...) and TensorRT-LLM's published sizing
heuristic (``trtllm-bench``'s ``tuning/heuristics.py``): max resident requests
= 0.95 × (memory − weights) ÷ (KV bytes per token × (ISL + OSL)), with KV bytes
per token = 2 · layers · kv_heads · head_dim · bytes per element. Weights are the
checkpoint's files, or the architecture's parameter count
(``engines.perfmodel.ModelSpec``) where there are none (dummy weights).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping

import optuna

from engines.perfmodel import ModelSpec
from harness.core.errors import TroughputError
from harness.tune.ranking import ranked
from harness.tune.space import SearchSpace

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


def weight_bytes(model_dir: str | Path) -> float:
    """The checkpoint's safetensors bytes; without weight files (a metadata-only folder, dummy
    weights) the architecture's parameter count times its dtype's bytes (``ModelSpec``)."""
    files = sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
    return float(files) if files else ModelSpec.load(model_dir).weight_bytes()


def enqueue_seeds(study: optuna.Study, tune: Mapping[str, Any], space: SearchSpace, base: Mapping[str, Any],
                  workload_summary: Mapping[str, Any], model_dir: str,
                  order: Callable[[list[tuple[str, dict[str, Any]]]], list[tuple[str, dict[str, Any]]]] | None = None
                  ) -> list[str]:
    """Enqueue the configured seeds and the heuristic; already-enqueued ones are skipped. Returns their names.

    Args:
        tune: the ``tune`` config (``seeds``, ``heuristic``, ``seed_from_study`` and its ``storage``).
        model_dir: the model's local folder (its ``config.json``, and weight files if it has any).
        order: reorders the seeds, as (name, clipped params) pairs; none: as listed.
    """
    seeds = [dict(s) for s in tune.get("seeds") or []]
    heuristic = tune.get("heuristic")
    if heuristic and heuristic.get("memory_bytes"):
        n = workload_summary["requests"]
        isl = workload_summary["input_tokens_requested"] / n
        osl = workload_summary["output_tokens_requested"] / n
        weights = weight_bytes(model_dir) if heuristic.get("weights_in_memory", True) else 0
        value = resident_requests(model_dir, float(heuristic["memory_bytes"]), weights, isl, osl)
        seeds.append({"name": f"trtllm heuristic ({value} resident requests)",
                      "params": {**(heuristic.get("params") or {}), heuristic["param"]: value}})
    if tune.get("seed_from_study"):
        seeds.extend(study_seeds(tune["storage"], tune["seed_from_study"], space))
    clipped = [(seed["name"], space.clip(seed.get("params") or {}, base)) for seed in seeds]
    if order is not None:
        clipped = order(clipped)
    for name, params in clipped:
        study.enqueue_trial(params, user_attrs={"seed": name}, skip_if_exists=True)
    return [name for name, _ in clipped]


def study_seeds(storage: str | optuna.storages.BaseStorage, source: str | Mapping[str, Any],
                space: SearchSpace) -> list[dict[str, Any]]:
    """The best feasible completed trials of another study in ``storage``, as seeds for this one.

    For tuning on the simulator first: ``tune.seed_from_study=<sim study>`` (or
    ``{study: <name>, top_k: 5}``) enqueues its top ``top_k`` (default 3) configs,
    ranked by ``harness.tune.ranking.ranked`` (constraint-breaking trials are left out).
    Param paths are matched through the canonical knob table, so a study over
    ``engine.knobs.max_num_seqs`` seeds one over ``engine.canonical.max_seqs``;
    params this space lacks are dropped, and trials of engine defaults are skipped.
    """
    name, top_k = (source, 3) if isinstance(source, str) else (source["study"], int(source.get("top_k", 3)))
    try:
        other = optuna.load_study(study_name=name, storage=storage)
    except KeyError as e:
        raise TroughputError(f"tune.seed_from_study: no study {name!r} in this storage "
                             f"(known: {', '.join(optuna.get_all_study_names(storage)) or 'none'})") from e
    order = ranked(other)
    targets = {knob_key(p.path): p.path for p in space.params}
    seeds = []
    for trial in order:
        params = {targets[knob_key(path)]: value for path, value in trial.params.items() if knob_key(path) in targets}
        if not params:
            continue
        seeds.append({"name": f"{name} #{len(seeds) + 1} (trial {trial.number}, {trial.values[0]:,.1f})",
                      "params": params})
        if len(seeds) == top_k:
            break
    log.info("seeding from study %r: %d of its %d feasible completed trials", name, len(seeds), len(order))
    return seeds


def knob_key(path: str) -> str:
    """What a param path sets, engine-neutrally: the canonical knob name where one maps to it, else the path."""
    from engines.knobs import canonical_of

    if path.startswith("engine.canonical."):
        return path.removeprefix("engine.canonical.")
    if path.startswith("engine.knobs."):
        return canonical_of(path.removeprefix("engine.knobs.")) or path
    return path
