"""A quasi-random start for a model-based sampler: the first trials from a scrambled Sobol sequence.

Optuna's ``QMCSampler`` takes its search space from the study's first trial, which
in the tuner is the engine-defaults seed with no params, so it would never leave
random sampling; and its points must keep one fixed space, where the tuner's
constraints move a param's lower bound from trial to trial. ``SobolStart`` maps
each coordinate of a Sobol point onto whatever distribution the param has in that
trial, so constrained bounds and seed trials are fine.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from harness.core.errors import TroughputError

log = logging.getLogger(__name__)

MAX_DIMS = 32  # params one study may have; the first k coordinates of a Sobol sequence are k-dimensional Sobol


class SobolStart(optuna.samplers.BaseSampler):
    """The first ``n`` sampled (non-seed) trials from a scrambled Sobol sequence, then ``then``.

    Seed trials (a ``seed`` user attr, as the tuner enqueues them) are not counted and
    their free params come from ``then``. A trial's point is its rank among the
    study's non-seed trials, so a resumed study continues the same sequence.

    Args:
        then: the sampler after the start (TPE; its own startup should not exceed ``n``).
        n: Sobol trials.
        seed: the scrambling seed.
    """

    def __init__(self, then: optuna.samplers.BaseSampler, n: int, seed: int | None = None):
        from scipy.stats import qmc  # an optional dependency: only this sampler needs it

        self._then, self._n = then, n
        self._points = qmc.Sobol(d=MAX_DIMS, scramble=True, seed=seed).random(2 ** max(0, math.ceil(math.log2(n))))
        self._dims: dict[str, int] = {}

    def _rank(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> int | None:
        """This trial's index in the Sobol sequence, or None (a seed trial, or past the start)."""
        if "seed" in trial.user_attrs:
            return None
        rank = sum(1 for t in study.get_trials(deepcopy=False)
                   if t.number < trial.number and "seed" not in t.user_attrs)
        return rank if rank < self._n else None

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:  # noqa: D102
        return {} if self._rank(study, trial) is not None else self._then.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:  # noqa: D102
        return self._then.sample_relative(study, trial, search_space) if search_space else {}

    def sample_independent(self, study, trial, param_name, param_distribution):  # noqa: D102
        rank = self._rank(study, trial)
        if rank is None:
            return self._then.sample_independent(study, trial, param_name, param_distribution)
        dim = self._dims.setdefault(param_name, len(self._dims))
        if dim >= MAX_DIMS:
            raise ValueError(f"SobolStart takes at most {MAX_DIMS} params")
        return from_unit(float(self._points[rank, dim]), param_distribution)

    def before_trial(self, study, trial) -> None:  # noqa: D102
        self._then.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:  # noqa: D102
        self._then.after_trial(study, trial, state, values)


def from_unit(u: float, dist: BaseDistribution) -> Any:
    """The value at quantile ``u`` in [0, 1) of a distribution: uniform, or uniform in log space when ``log``."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[min(int(u * len(dist.choices)), len(dist.choices) - 1)]
    low, high, step = dist.low, dist.high, getattr(dist, "step", None)
    if isinstance(dist, IntDistribution):
        if dist.log:
            value = int(math.exp(math.log(low) + u * (math.log(high + 1) - math.log(low))))
        else:
            value = low + int(u * ((high - low) // step + 1)) * step
        return min(max(value, low), high)
    if dist.log:
        return min(max(math.exp(math.log(low) + u * (math.log(high) - math.log(low))), low), high)
    value = low + u * (high - low)
    if step is not None:
        value = low + round((value - low) / step) * step
    return min(max(value, low), high)


def with_start(sampler: optuna.samplers.BaseSampler, start: str, n: int,
               seed: int | None) -> optuna.samplers.BaseSampler:
    """``sampler`` whose first ``n`` trials come from ``start``: ``sobol`` (``SobolStart``) or ``random`` (its own).

    Without SciPy, ``sobol`` falls back to ``random`` with a warning.
    """
    if start not in ("sobol", "random"):
        raise TroughputError(f"tune.startup={start!r}: use sobol or random")
    if start == "random" or n <= 0:
        return sampler
    try:
        return SobolStart(sampler, n, seed=seed)
    except ImportError:
        log.warning("tune.startup=sobol needs SciPy (pip install scipy); the first %d trials are random instead", n)
        return sampler
