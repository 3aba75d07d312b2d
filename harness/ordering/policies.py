"""Ordering policies: pure functions from a request list to the order the engine sees.

In offline batch work the whole dataset is known up front, so the harness may
reorder it before the engine sees it. Each policy is ``policy(requests, cfg) ->
requests`` (a permutation; ``cfg`` is the ``ordering`` config) and deterministic.
``POLICIES`` maps names to policies, so that sweeps and tuners can choose by name.

- ``as_given``, ``shuffled`` (seeded): baselines.
- ``prefix_grouped``: requests sharing a prefix made contiguous, in depth-first order of
  a prefix tree over the prompt token ids (``harness.workloads.prefix_tree``), so that a prefix is
  used up before it is evicted.
- ``length_bucketed``: by output length (``max_tokens``) and input length, in buckets,
  longest first, to cut the variance inside a batch and the straggling tail.
- ``blended``: prefix groups kept together, in length order inside and across groups;
  ``min_shared_tokens`` trades prefix locality against length order.

The runner always maps completions back by request id, so users get their
results in the original order with the original ids whatever the policy.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from engines.base import Request
from harness.core.errors import TroughputError
from harness.workloads.prefix_tree import PrefixTree, prompt_keys

Policy = Callable[[list[Request], Mapping[str, Any]], list[Request]]


def as_given(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """The workload's own order."""
    return list(requests)


def shuffled(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """A seeded random permutation (``ordering.seed``)."""
    permutation = np.random.default_rng(int(cfg.get("seed", 0))).permutation(len(requests))
    return [requests[i] for i in permutation]


def prefix_grouped(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """Depth-first over the prefix tree of the prompts (``block_size`` tokens per tree block).

    Each subtree is contiguous, so every shared prefix is used by all its requests in one
    stretch. Siblings keep the order in which they first appear, and requests that share
    no whole block with any other keep their relative input order.
    """
    tree = _tree(requests, cfg)
    return [requests[i] for i in tree.order().tolist()]


def length_bucketed(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """Sorted by (output bucket, input bucket), longest first unless ``descending`` is false.

    Stable: requests in the same bucket keep their input order.
    """
    key = _length_key(requests, cfg)
    return [requests[i] for i in np.argsort(key, kind="stable").tolist()]


def blended(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """Prefix groups first, then length order inside and across groups.

    Requests sharing a prefix of at least ``min_shared_tokens`` form a group and stay
    contiguous; groups (and ungrouped requests) are ordered by their mean length key, and
    the requests of a group by their own, with depth-first order breaking ties. A small
    ``min_shared_tokens`` keeps every shared prefix together (closest to ``prefix_grouped``);
    a large one leaves most requests ungrouped (closest to ``length_bucketed``).
    """
    tree = _tree(requests, cfg)
    n = len(requests)
    dfs = np.empty(n, dtype=np.int64)
    dfs[tree.order()] = np.arange(n)
    key = _length_key(requests, cfg).astype(np.float64)
    group = tree.groups(int(cfg.get("min_shared_tokens", 256)))
    unit = np.where(group >= 0, group, group.max(initial=-1) + 1 + np.arange(n))  # ungrouped: units of one
    _, unit = np.unique(unit, return_inverse=True)
    counts = np.bincount(unit)
    unit_key = np.bincount(unit, weights=key) / counts
    unit_first = np.full(len(counts), n, dtype=np.int64)
    np.minimum.at(unit_first, unit, dfs)
    order = np.lexsort((dfs, key, unit_first[unit], unit_key[unit]))
    return [requests[i] for i in order.tolist()]


def _tree(requests: list[Request], cfg: Mapping[str, Any]) -> PrefixTree:
    block = int(cfg.get("block_size", 16))
    if block < 1:
        raise TroughputError(f"ordering.block_size must be a positive number of tokens, got {block}")
    return PrefixTree(prompt_keys(requests), block)


def _length_key(requests: list[Request], cfg: Mapping[str, Any]) -> np.ndarray:
    """One integer per request: output bucket, then input bucket; negated when longest comes first."""
    widths = {}
    for name in ("input_bucket", "output_bucket"):
        width = cfg.get(name, 64 if name == "input_bucket" else 32)
        if width is not None and int(width) < 0:
            raise TroughputError(f"ordering.{name} must be >= 0 tokens (0 or null: ignore that length), got {width}")
        widths[name] = int(width or 0)
    inputs = np.fromiter((len(r.prompt_token_ids) for r in requests), dtype=np.int64, count=len(requests))
    outputs = np.fromiter((r.max_tokens for r in requests), dtype=np.int64, count=len(requests))
    in_bucket = inputs // widths["input_bucket"] if widths["input_bucket"] else np.zeros_like(inputs)
    out_bucket = outputs // widths["output_bucket"] if widths["output_bucket"] else np.zeros_like(outputs)
    key = out_bucket * (int(in_bucket.max(initial=0)) + 1) + in_bucket
    return -key if cfg.get("descending", True) else key


POLICIES: dict[str, Policy] = {
    "as_given": as_given,
    "shuffled": shuffled,
    "prefix_grouped": prefix_grouped,
    "length_bucketed": length_bucketed,
    "blended": blended,
}


def apply_ordering(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """Reorder ``requests`` by the policy named in ``cfg["name"]``."""
    name = cfg.get("name", "as_given")
    if name not in POLICIES:
        raise TroughputError(f"unknown ordering {name!r}; known: {', '.join(POLICIES)}")
    ordered = POLICIES[name](requests, cfg)
    if sorted(r.id for r in ordered) != sorted(r.id for r in requests):
        raise AssertionError(f"ordering {name!r} lost or duplicated requests")
    return ordered
