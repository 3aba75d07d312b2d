"""Generated workloads: unique prompts, prefix-heavy groups, and prompts with images.

Each generator owns a ``numpy`` RNG seeded from its config, so the same config
always yields the same requests (and the same fingerprint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.base import Request
from harness.distributions import sample_lengths
from harness.tokens import Vocabulary
from harness.workloads.base import Workload
from harness.workloads.images import ImagePool


def unique(cfg: Mapping[str, Any], vocab: Vocabulary, **_: Any) -> Workload:
    """``num_requests`` prompts of random ordinary tokens; nothing shared between them."""
    rng = np.random.default_rng(int(cfg["seed"]))
    n = int(cfg["num_requests"])
    input_lens = sample_lengths(cfg["input_len"], n, rng)
    output_lens = sample_lengths(cfg["output_len"], n, rng)
    requests = [
        Request(f"u{i:06d}", vocab.random_tokens(int(input_lens[i]), rng), int(output_lens[i]))
        for i in range(n)
    ]
    return Workload(cfg["name"], requests)


def prefix_heavy(cfg: Mapping[str, Any], vocab: Vocabulary, **_: Any) -> Workload:
    """``num_groups`` x ``prompts_per_group`` prompts; each group shares one prefix.

    A prefix cache can serve (P-1)/P of the prefix tokens; ``ideal_prefix_hit_tokens``
    records that ceiling so measured hit rates can be read against it.
    """
    rng = np.random.default_rng(int(cfg["seed"]))
    groups, per_group = int(cfg["num_groups"]), int(cfg["prompts_per_group"])
    prefix_lens = sample_lengths(cfg["prefix_len"], groups, rng)
    suffix_lens = sample_lengths(cfg["suffix_len"], groups * per_group, rng)
    output_lens = sample_lengths(cfg["output_len"], groups * per_group, rng)
    requests, labels = [], []
    for g in range(groups):
        prefix = vocab.random_tokens(int(prefix_lens[g]), rng)
        for p in range(per_group):
            i = g * per_group + p
            suffix = vocab.random_tokens(int(suffix_lens[i]), rng)
            requests.append(Request(f"g{g:04d}-p{p:04d}", prefix + suffix, int(output_lens[i])))
            labels.append(f"g{g:04d}")
    ideal = int(sum(int(length) * (per_group - 1) for length in prefix_lens))
    return Workload(cfg["name"], requests, labels, info={
        "prefix_groups": groups, "shared_prefix_tokens": int(prefix_lens.sum()), "ideal_prefix_hit_tokens": ideal})


def multimodal(cfg: Mapping[str, Any], vocab: Vocabulary, *, model: Mapping[str, Any], image_dir: Path,
               **_: Any) -> Workload:
    """Text prompts with ``images_per_request`` synthetic images each.

    Each image is new with probability 1 - ``duplicate_rate``, otherwise a repeat
    of an earlier one, so that encoder-output caching has something to find.
    One placeholder token per image leads the prompt; the engine expands it.
    """
    placeholder = model.get("image_token")
    if not placeholder:
        from harness.errors import TroughputError

        raise TroughputError(f"model {model.get('name')!r} takes no images; use a vision-language model "
                             "(e.g. model=tiny_vlm) for the multimodal workload")
    image_id = vocab.token_id(placeholder)
    rng = np.random.default_rng(int(cfg["seed"]))
    n, per_request = int(cfg["num_requests"]), int(cfg["images_per_request"])
    input_lens = sample_lengths(cfg["input_len"], n, rng)
    output_lens = sample_lengths(cfg["output_len"], n, rng)
    pool = ImagePool(image_dir, int(cfg["image_width"]), int(cfg["image_height"]), rng)
    requests = []
    for i in range(n):
        images = [pool.draw(float(cfg["duplicate_rate"])) for _ in range(per_request)]
        prompt = [image_id] * len(images) + vocab.random_tokens(int(input_lens[i]), rng)
        requests.append(Request(f"m{i:06d}", prompt, int(output_lens[i]), images))
    return Workload(cfg["name"], requests)
