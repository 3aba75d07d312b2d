"""Early stopping of in-job trials (``batch.tune.prune``): a trial clearly behind after a few shards stops.

As each of a trial's shards commits, the trial reports its **fed-engine rate** so far to the study
(``trial.report(value, step=shards committed)``): the output tokens its engines made per second of
engine step, over every step they have reported (``fed_rate``). Optuna's pruner (``median``:
``MedianPruner``; ``halving``: ``SuccessiveHalvingPruner``) then says whether the trial is behind the
others at that step; ``ClearlyBehind`` lets it stop only where the trial is also under
``1 - prune_margin`` of the median of the finished trials' values at the same step, never before
``prune_warmup`` of its shards are in, and never the engine defaults' trial (the fallback). A stopped
trial is handed no further shard: the shards its engines hold finish and commit (job output, as
every trial's), the study is told ``PRUNED``, and the shards it did not run go to the next run.

Why this value, and only while shards are left to hand over:

- the committed shards' own rate (their output tokens ÷ their engine seconds) is biased by the fill:
  when a run's first shard commits, an engine that holds many sequences at once has done most of
  the work of the shards it holds beside it, none of which has committed yet, so a config that runs
  many sequences reads low at its first shards; the steps count the work of the shards in flight too;
- the engine's steps are timed by the engine (a simulator's on its simulated clock), so the value is
  the same on ``engine=sim`` and on a real engine, and idle gaps between shards are not in it;
- once the last shard is handed over the engines drain what they hold, and a config that holds more
  drains over more of its last shards; the value is not reported then (pruning would save nothing:
  every shard is in flight), so the value at step ``k`` is the fed engine's for every config;
- a run whose shards all fit in its engines at once (one engine fill) hands its last shard over at
  once: it reports nothing and is never pruned.

Where the engines record no steps (a serial adapter), the committed shards' output tokens ÷ their
engine-busy seconds stands in (an engine that runs a shard at a time has no other shard's work in
flight). Both are multiplied by the run's engines: a value is the node's rate, as the trial's final
value (its full-engine rate) is.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from typing import Any

import optuna

from harness.batch.job.job import SoFar
from harness.core.errors import TroughputError

log = logging.getLogger("troughput.batch.tune")
PRUNERS = ("median", "halving", "none")
DEFAULTS_SEED = "engine defaults"   # the seed name of the job's own config (``tuning.DEFAULTS_SEED``)


def positive_int(tune: dict[str, Any], key: str, default: int | None, what: str) -> None:
    """Refuse ``batch.tune.<key>`` unless it is an integer >= 1 (``default`` where it is not set); ``what`` says
    what it counts."""
    value = tune.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TroughputError(f"batch.tune.{key}={value!r}: must be an integer >= 1 ({what})")


def check_settings(tune: dict[str, Any]) -> None:
    """``batch.tune.prune``, ``prune_margin`` and ``prune_warmup``, checked before any engine starts."""
    kind = tune.get("prune") or "none"
    if kind not in PRUNERS:
        raise TroughputError(f"batch.tune.prune={kind!r}: use one of {', '.join(PRUNERS)}")
    margin = tune.get("prune_margin", 0.25)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise TroughputError(f"batch.tune.prune_margin={margin!r}: must be a fraction in [0, 1) (a trial is pruned "
                             "only under (1 - it) × the median of the finished trials at the same shard)")
    positive_int(tune, "prune_warmup", 2, "shards a trial commits before the pruner may stop it")


def make_pruner(tune: dict[str, Any]) -> optuna.pruners.BasePruner:
    """The in-job study's pruner: ``NopPruner`` for ``prune: none``, else ``ClearlyBehind`` over Optuna's."""
    kind = tune.get("prune") or "none"
    if kind == "none":
        return optuna.pruners.NopPruner()
    warmup = int(tune.get("prune_warmup", 2))
    if kind == "median":   # the finished trials so far: from the first (the job's own config) on
        inner: optuna.pruners.BasePruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=warmup)
    else:                  # rungs at warmup, 2 × warmup, 4 × warmup shards: the top half of the trials there go on
        inner = optuna.pruners.SuccessiveHalvingPruner(min_resource=warmup, reduction_factor=2)
    return ClearlyBehind(inner, float(tune.get("prune_margin", 0.25)), warmup)


class ClearlyBehind(optuna.pruners.BasePruner):
    """``inner``'s verdict, where the trial is also clearly behind: under ``1 - margin`` of the median of the
    finished (``COMPLETE``) trials' values at its step, at ``warmup`` shards or more, and not the job's own config.

    Optuna's pruners prune any trial below their cut, however close: with the few trials of an in-job study,
    that is one below the job's own config at one shard by noise. The margin keeps such a trial."""

    def __init__(self, inner: optuna.pruners.BasePruner, margin: float, warmup: int):
        self.inner, self.margin, self.warmup = inner, margin, warmup

    def reference(self, study: optuna.Study, step: int) -> float | None:
        """The median of the finished trials' values at ``step`` (``None``: none reported there)."""
        values = [t.intermediate_values[step] for t in study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if step in t.intermediate_values]
        return statistics.median(values) if values else None

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        behind = bool(self.inner.prune(study, trial))   # asked every time: successive halving keeps each trial's value
        #                                                 at each rung it reaches (the defaults' too) as it asks
        if not behind or step < self.warmup or trial.user_attrs.get("seed") == DEFAULTS_SEED:
            return False
        reference = self.reference(study, step)
        return reference is not None and trial.intermediate_values[step] < (1 - self.margin) * reference


def fed_rate(so_far: SoFar) -> float | None:
    """A trial's value as a shard commits: output tokens a second of its engines' full steps so far (requests waiting
    behind them: no ramp or drain in it) × its engines, or of all its steps before it has any full one (see the
    module's notes); without steps, its committed shards' output tokens ÷ their engine-busy seconds × engines."""
    if so_far.full_s > 0 and so_far.full_tokens > 0:
        return so_far.full_tokens / so_far.full_s * so_far.engines
    return run_rate(so_far)


def run_rate(so_far: SoFar) -> float | None:
    """A run's output tok/s so far over all its engines' steps (its committed shards' engine-busy seconds where the
    engines report no steps), × its engines: what its engines made, fed or not (the confirmation's bound reads it,
    ``tune_confirm.Confirmation._at_the_bound``)."""
    if so_far.step_s > 0 and so_far.step_tokens > 0:
        return so_far.step_tokens / so_far.step_s * so_far.engines
    if so_far.engine_s > 0 and so_far.output_tokens > 0:
        return so_far.output_tokens / so_far.engine_s * so_far.engines
    return None


class Reporter:
    """The ``on_commit`` hook of one trial's run: reports ``fed_rate`` at each commit while shards are left to hand
    over, and stops the run when the pruner says so (kept in the trial's ``pruned`` user attribute at once, so a
    kill while its last shards finish leaves the decision in ``study.db``)."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial, label: str, values: dict[str, Any]):
        self.study, self.trial, self.label, self.values = study, trial, label, values
        self.pruned: dict[str, Any] | None = None
        self.reported = 0

    def __call__(self, so_far: SoFar) -> bool:
        if so_far.left <= 0:   # every shard is in flight: the engines drain, and stopping saves nothing
            return False
        value = fed_rate(so_far)
        if value is None:
            return False
        self.trial.report(value, so_far.shards)
        self.reported += 1
        if not self.trial.should_prune():
            return False
        pruner = self.study.pruner
        reference = pruner.reference(self.study, so_far.shards) if isinstance(pruner, ClearlyBehind) else None
        self.pruned = {"at": so_far.shards, "value": value, "reference": reference, "left": so_far.left,
                       "label": self.label, "config": self.values}   # what a resume needs to record the run
        self.trial.set_user_attr("pruned", self.pruned)
        log.info("%s: %s; the shards in flight finish, %d not handed over go to the next run", self.label,
                 self.reason(), so_far.left)
        return True

    def reason(self) -> str:
        p = self.pruned or {}
        return (f"pruned after {p.get('at')} shards: {p.get('value', 0):,.1f} tok/s of engine steps, under "
                f"{p.get('reference') or 0:,.1f} (the finished trials' median there) by more than the margin")


def accepts_hook(run_phase: Callable[..., Any]) -> bool:
    """Whether a run_phase takes ``on_commit`` (an injected one, e.g. a virtual-clock driver's, may not)."""
    import inspect

    try:
        params = inspect.signature(run_phase).parameters
    except (TypeError, ValueError):
        return False
    return "on_commit" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def reporting_points(shards: int, shard_size: int, in_flight: int, engines: int) -> int:
    """About how many of a ``shards``-shard run's commits come while shards are left to hand over (its points to
    report at): its shards less what ``engines`` engines hold at once (``feeding.held_at_once``)."""
    from harness.batch.job.feeding import held_at_once

    return max(0, shards - held_at_once(shard_size, in_flight) * max(engines, 1))
