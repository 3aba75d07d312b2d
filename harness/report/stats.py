"""Bootstrap statistics over a config's samples (seeded, so a report is reproducible).

A sample is one independent run (its median pass, the ``output_tok_s`` its row reports)
once a config has two or more runs; with one run the samples are its passes, which
share one engine process and cache state. The statistic is the low median of the samples,
so intervals bracket the headline numbers. These intervals describe one config; verdicts
between two configs come from ``harness.report.verdict`` alone.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

STATISTIC = ("low median of per-run output tok/s (each run's median pass) from 2 runs on; "
             "of the passes of its one run otherwise")


def representative(passes: Sequence[float]) -> float:
    """The low median: with an odd count the median, with an even count the lower middle pass."""
    values = np.sort(np.asarray(passes, dtype=float))
    return float(values[(len(values) - 1) // 2])


def spread(values: Sequence[float]) -> dict[str, float]:
    """How far independent runs disagree: ``cv`` (sample std ÷ mean) and ``range`` ((max − min) ÷ median).

    Both are NaN for fewer than two values.
    """
    array = np.asarray(values, dtype=float)
    if len(array) < 2:
        return {"cv": float("nan"), "range": float("nan")}
    return {"cv": float(array.std(ddof=1) / array.mean()),
            "range": float((array.max() - array.min()) / np.median(array))}


def rng(seed: int | tuple) -> np.random.Generator:
    """A generator seeded from ``seed`` (ints and strings hashed stably, never Python's ``hash``)."""
    if isinstance(seed, tuple):
        digest = hashlib.sha256("|".join(map(str, seed)).encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return np.random.default_rng(seed)


def resample(passes: Sequence[float], n_boot: int, generator: np.random.Generator) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the low median."""
    values = np.asarray(passes, dtype=float)
    draws = np.sort(generator.choice(values, size=(n_boot, len(values)), replace=True), axis=1)
    return draws[:, (len(values) - 1) // 2]


def interval(passes: Sequence[float], n_boot: int = 2000, level: float = 0.95,
             seed: int | tuple = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the low median; a single pass gives a zero-width interval."""
    if len(passes) < 2:
        value = representative(passes)
        return value, value
    replicates = resample(passes, n_boot, rng(seed))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)
