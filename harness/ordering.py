"""Ordering policies: pure functions from a request list to the order the engine sees.

The runner always maps completions back by request id, so users get their
results in the original order whatever the policy.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from engines.base import Request
from harness.errors import TroughputError


def as_given(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """The workload's own order."""
    return list(requests)


def shuffled(requests: list[Request], cfg: Mapping[str, Any]) -> list[Request]:
    """A seeded random permutation (``ordering.seed``)."""
    permutation = np.random.default_rng(int(cfg.get("seed", 0))).permutation(len(requests))
    return [requests[i] for i in permutation]


POLICIES: dict[str, Callable[[list[Request], Mapping[str, Any]], list[Request]]] = {
    "as_given": as_given,
    "shuffled": shuffled,
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
