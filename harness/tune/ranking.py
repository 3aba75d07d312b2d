"""The one ranking of a study's trials: finished, feasible, best first.

Feasibility is read through Optuna's public constraint API: ``FrozenTrial.constraints``
(a name -> value mapping filled by ``Trial.set_constraint``); a trial is feasible when
every value is <= 0, as Optuna's own samplers and ``Study.best_trial(s)`` count it.
The tuner's best trial, its leaders for confirmation, the written engine file and the
seeds taken from another study all come from here.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState


def feasible(trial: FrozenTrial) -> bool:
    """Every constraint set on the trial is met (a trial with no constraints is feasible)."""
    return all(value <= 0 for value in trial.constraints.values())


def ranked(study: optuna.Study) -> list[FrozenTrial]:
    """Completed feasible trials, best first.

    Single objective: every such trial, sorted by its value in the study's direction.
    Several objectives: Optuna's feasible Pareto front (``Study.best_trials``), sorted by
    the first objective, since a front has no single order.
    """
    if len(study.directions) > 1:
        front = study.best_trials
        return sorted(front, key=lambda t: _sort_key(study.directions[0], t.values[0]))
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted((t for t in done if feasible(t)), key=lambda t: _sort_key(study.direction, t.values[0]))


def _sort_key(direction: optuna.study.StudyDirection, value: float) -> float:
    return -value if direction == optuna.study.StudyDirection.MAXIMIZE else value
