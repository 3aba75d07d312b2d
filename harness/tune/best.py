"""After a study: the best config as a ready-to-use ``engine=`` file, and its gain over the default measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import optuna
import yaml
from omegaconf import DictConfig, OmegaConf

from harness.report.verdict import ALPHA, CLEAR, MIN_EFFECT, Verdict, compare
from harness.run.runner import execute
from harness.tune.command import run_command
from harness.tune.objective import Objective
from harness.tune.ranking import ranked
from harness.tune.study import apply_values


def best_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The best feasible trial, or the feasible Pareto front of a multi-objective study ([] if none)."""
    order = ranked(study)
    return order if len(study.directions) > 1 else order[:1]


def rejected_faster(study: optuna.Study, best: optuna.trial.FrozenTrial) -> list[optuna.trial.FrozenTrial]:
    """Completed trials that beat ``best`` on the first objective but broke a constraint, best first."""
    sign = 1 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    faster = [t for t in done if t.user_attrs.get("infeasible") and sign * (t.values[0] - best.values[0]) > 0]
    return sorted(faster, key=lambda t: -sign * t.values[0])


def leaders(study: optuna.Study, count: int) -> list[optuna.trial.FrozenTrial]:
    """The ``count`` best feasible trials of a single-objective study, best first (the front's first otherwise)."""
    return ranked(study)[:1 if len(study.directions) > 1 else count]


def write_engine_file(cfg: DictConfig, trial: optuna.trial.FrozenTrial, out_dir: Path, name: str,
                      confirmed: str | None = None) -> Path:
    """``<out_dir>/engine/<name>.yaml``: the engine config with the trial's values, usable as ``engine=<name>``.

    ``confirmed``: the verdict over the default; None writes the header UNCONFIRMED (``tune.write_unconfirmed``).
    """
    values = dict(trial.params)  # {} for the engine-defaults seed
    tuned = apply_values(cfg, values)
    engine = OmegaConf.to_container(tuned.engine, resolve=True)
    others = {k: v for k, v in values.items() if not k.startswith("engine.")}
    path = out_dir / "engine" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [f"# Tuned by troughput-tune, study {name!r}, trial {trial.number}, run {trial.user_attrs.get('run_id')}",
              f"# objective values: {trial.values}"]
    header.append(f"# confirmed side by side: {confirmed}" if confirmed else
                  "# UNCONFIRMED: tune.confirm_rounds=0 and tune.write_unconfirmed=true, so no side-by-side runs "
                  "and no verdict that it beats the default config (docs/verdicts.md)")
    if others:
        header.append("# also set: " + " ".join(f"{k}={v}" for k, v in others.items()))
    header.append(f"# use: troughput-run hydra.searchpath=[file://{out_dir.resolve()}] engine={name}")
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(engine, sort_keys=False))
    return path


def judge_candidates(measured: dict[str, list[float]], maximise: bool = True, min_effect: float = MIN_EFFECT,
                     alpha: float = ALPHA) -> dict[str, Verdict | None]:
    """Each candidate of ``measured`` (every key but ``"default"``) against the default, by the rule at a level that
    keeps the whole confirmation's false-winner rate at ``alpha``. Only a candidate called ahead of the default
    changes what is written, and the rule's two-sided level α puts α/2 on that side of each comparison; so k
    candidates are judged at min(α, 2α/k) each (Bonferroni over the one harmful side): the default two at α as
    before, three at 0.033, four at 0.025. Measured by A/A simulation in
    ``tests/harness/tune/test_confirm_family.py``. None for a candidate or default with no measured run."""
    names = [n for n in measured if n != "default"]
    level = min(alpha, 2 * alpha / max(len(names), 1))
    verdicts: dict[str, Verdict | None] = {}
    for name in names:
        ours, default = measured[name], measured["default"]
        if not (ours and default):
            verdicts[name] = None
            continue
        a, b = (ours, default) if maximise else (default, ours)
        verdicts[name] = compare(a, b, min_effect, alpha=level)
    return verdicts


def confirm(cfg: DictConfig, candidates: list[optuna.trial.FrozenTrial], objective: Objective, rounds: int,
            make_spec: Callable[[DictConfig], Any], study_name: str,
            min_effect: float = MIN_EFFECT) -> dict[str, Any]:
    """Run the default config and each candidate side by side for ``rounds`` rounds (order rotating).

    Each candidate is judged against the default by ``harness.report.verdict.compare`` on the
    objective's per-run measured values (inverted when it is minimised, so a ratio > 1 is better): the
    verdict rests on measurements, not on the full-engine rate the trials were valued by.
    Returns the values per config (``"default"`` and ``"trial <n>"``), each candidate's
    ``verdicts``, and the ``winner``: among candidates the rule calls a clear winner over the
    default, the one with the best ratio; None when none is (the default is kept), with
    ``ratio``/``verdict`` of the best-estimated candidate either way.
    """
    names = ["default", *(f"trial {t.number}" for t in candidates)]
    values_of = {"default": {}, **{f"trial {t.number}": dict(t.params) for t in candidates}}
    measured: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for which in names[i % len(names):] + names[:i % len(names)]:
            run_cfg = apply_values(cfg, values_of[which])
            OmegaConf.update(run_cfg, "run.labels", {**cfg.run.labels, "study": study_name, "confirm": which,
                                                     "command": run_command(cfg, values_of[which])}, force_add=True)
            row = execute(make_spec(run_cfg), progress=False)
            broken = objective.broken(row) if row["status"] == "ok" and which != "default" else []
            if broken:
                outcome = f"{objective.name}={objective.values(row, measured=True)[0]:,.1f}, not counted: " \
                          f"{'; '.join(broken)}"
            elif row["status"] == "ok":
                measured[which].append(objective.values(row, measured=True)[0])
                outcome = f"{objective.name}={measured[which][-1]:,.1f}"
            else:
                outcome = (row["error"] or "").splitlines()[0][:200]
            print(f"  confirm round {i + 1} {which:>9}: {row['status']} {outcome}", flush=True)
    verdicts = judge_candidates(measured, objective.directions[0] == "maximize", min_effect)
    judged = sorted(((v.ratio, n) for n, v in verdicts.items() if v is not None and v.ratio is not None))
    best = judged[-1][1] if judged else None
    beating = [n for _, n in judged if verdicts[n].verdict == CLEAR and verdicts[n].winner == "a"]
    winner = beating[-1] if beating else None
    shown = winner or best
    return {"measured": measured, "verdicts": verdicts, "best": shown,
            "ratio": None if shown is None else verdicts[shown].ratio,
            "verdict": None if shown is None else verdicts[shown],
            "winner": None if winner is None else candidates[names.index(winner) - 1]}
