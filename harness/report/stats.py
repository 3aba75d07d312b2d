"""Per-config statistics: the one estimate every section of a report ranks and shows configs by.

A sample is one independent run (its median pass, the ``output_tok_s`` its row reports)
once a config has two or more runs; with one run the samples are its passes, which
share one engine process and cache state. The statistic is the **geometric mean** of the
samples, the estimate the verdict rule (``harness.report.verdict``) compares (a ratio of
two configs' geometric means is its ratio), with a t interval on the log samples (the
one-sample form of the rule's Welch interval). So the recommendation, the headline table,
the plots and the decision file can never rank two configs differently. The low median
(``representative``) is still each run's own rate: the median pass of its passes.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np

STATISTIC = ("geometric mean of per-run output tok/s (each run's median pass), the estimate the verdict rule "
             "compares (one run: its median pass; its interval then over that run's passes)")


CI_METHOD = "t interval of the geometric mean (Student's t on the log samples, n - 1 degrees of freedom)"


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values`` (NaN when empty)."""
    array = np.asarray(values, dtype=float)
    if len(array) <= 1 or bool(np.all(array == array[0])):   # exact for one value (a one-run config's own rate)
        return float(array[0]) if len(array) else float("nan")
    return float(np.exp(np.log(array).mean()))


def geometric_interval(values: Sequence[float], level: float = 0.95, centre_at: float | None = None
                       ) -> tuple[float, float]:
    """A ``level`` interval for the geometric mean: exp(mean ± t · sd / sqrt(n)) of the logs, Student's t with
    n − 1 degrees of freedom (the verdict rule's own t); one value gives a zero-width interval.

    ``centre_at``: centre the same half-width on this value instead (a one-run config, whose rate is its
    median pass and whose spread is its passes')."""
    from harness.report.verdict import t_quantile

    array = np.log(np.asarray(values, dtype=float))
    centre = float(array.mean()) if centre_at is None else math.log(centre_at)
    if len(array) < 2:
        return float(np.exp(centre)), float(np.exp(centre))
    half = t_quantile(1 - (1 - level) / 2, len(array) - 1) * float(array.std(ddof=1)) / np.sqrt(len(array))
    return float(np.exp(centre - half)), float(np.exp(centre + half))


def representative(passes: Sequence[float]) -> float:
    """The low median (a run's rate from its passes): the median, with an even count the lower middle pass."""
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
