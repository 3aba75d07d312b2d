"""Generated workloads: unique prompts, prefix-heavy groups, and prompts with images.

Each generator owns a ``numpy`` RNG seeded from its config, so the same config
always yields the same requests (and the same fingerprint).

Prefix groups arrive in the order ``arrival`` names (``ARRIVALS``): real files hold
requests of many templates mixed together, so the default, ``interleaved``, takes
one request from each group in turn; ``grouped`` emits each group back to back (the
order a prefix-aware reordering would produce), ``shuffled`` a seeded permutation.
The prompts are the same whatever the arrival; only their order (and so the
fingerprint, which covers the order) changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.base import Request
from harness.core.errors import TroughputError
from harness.core.tokens import Vocabulary
from harness.workloads.base import Workload
from harness.workloads.distributions import sample_lengths
from harness.workloads.images import ImagePool

ARRIVALS = ("interleaved", "grouped", "shuffled")  # arrival orders of prefix groups; the first is the default


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
    records that ceiling so measured hit rates can be read against it. The requests
    arrive in ``arrival`` order (default ``interleaved``, see ``arrival_order``).
    """
    arrival = str(cfg.get("arrival", "interleaved"))
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
    order = arrival_order(arrival, groups, per_group, rng)  # drawn after the prompts: same prompts for every arrival
    ideal = int(sum(int(length) * (per_group - 1) for length in prefix_lens))
    return Workload(cfg["name"], [requests[i] for i in order], [labels[i] for i in order], info={
        "prefix_groups": groups, "shared_prefix_tokens": int(prefix_lens.sum()), "ideal_prefix_hit_tokens": ideal,
        "arrival": arrival})


def arrival_order(arrival: str, groups: int, per_group: int, rng: np.random.Generator) -> list[int]:
    """Indices into generation order (group by group, ``g * per_group + p``) in the order requests arrive.

    Args:
        arrival: ``grouped`` (generation order), ``interleaved`` (round-robin: the p-th request of
            every group, then the (p+1)-th, so neighbours never share a group when there are
            two or more) or ``shuffled`` (a permutation drawn from ``rng``).
        groups: number of prefix groups.
        per_group: requests per group.
        rng: the generator's own RNG, used by ``shuffled`` only.
    """
    if arrival not in ARRIVALS:
        raise TroughputError(f"workload.arrival={arrival!r} is not an arrival order; choose one of "
                             f"{', '.join(ARRIVALS)}")
    if arrival == "grouped":
        return list(range(groups * per_group))
    if arrival == "interleaved":
        return [g * per_group + p for p in range(per_group) for g in range(groups)]
    return rng.permutation(groups * per_group).tolist()


def multimodal(cfg: Mapping[str, Any], vocab: Vocabulary, *, model: Mapping[str, Any], image_dir: Path,
               **_: Any) -> Workload:
    """Text prompts with ``images_per_request`` synthetic images each.

    Each image is new with probability 1 - ``duplicate_rate``, otherwise a repeat
    of an earlier one, so that encoder-output caching has something to find.
    One placeholder token per image leads the prompt; the engine expands it.
    """
    placeholder = model.get("image_token")
    if not placeholder:
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
