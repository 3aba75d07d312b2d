"""Length distributions for synthetic workloads, sampled from a caller-owned RNG."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from harness.core.errors import TroughputError

KINDS = ("fixed", "uniform", "normal", "lognormal")


def sample_lengths(spec: Mapping[str, Any] | int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` positive integer lengths.

    Args:
        spec: an int (fixed) or a mapping with ``kind`` and its parameters:
            ``fixed: value``; ``uniform: low, high`` (inclusive);
            ``normal: mean, std``; ``lognormal: median, sigma``.
            Optional ``min``/``max`` clip the result (default min 1).
        n: how many.
        rng: the caller's generator (never global state).

    Returns:
        An int64 array of length ``n``.
    """
    if isinstance(spec, (int, np.integer)):
        spec = {"kind": "fixed", "value": int(spec)}
    kind = spec.get("kind", "fixed")
    try:
        if kind == "fixed":
            values = np.full(n, float(spec["value"]))
        elif kind == "uniform":
            values = rng.integers(int(spec["low"]), int(spec["high"]) + 1, size=n).astype(float)
        elif kind == "normal":
            values = rng.normal(float(spec["mean"]), float(spec["std"]), size=n)
        elif kind == "lognormal":
            values = rng.lognormal(np.log(float(spec["median"])), float(spec["sigma"]), size=n)
        else:
            raise TroughputError(f"unknown length distribution {kind!r}; use one of {', '.join(KINDS)}")
    except KeyError as e:
        raise TroughputError(f"length distribution {kind!r} needs parameter {e.args[0]!r} (got {dict(spec)})") from e
    low = int(spec.get("min", 1))
    high = spec.get("max")
    values = np.clip(np.rint(values), max(low, 1), None if high is None else int(high))
    return values.astype(np.int64)
