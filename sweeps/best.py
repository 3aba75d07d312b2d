"""After a study: the best config as a ready-to-use ``engine=`` file, and its gain over the default measured."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

import optuna
import yaml
from omegaconf import DictConfig, OmegaConf

from harness.runner import execute
from sweeps.objective import Objective
from sweeps.study import apply_values


def best_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The best trial, or the Pareto front of a multi-objective study (feasible ones only)."""
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        return []
    return study.best_trials if len(study.directions) > 1 else [study.best_trial]


def write_engine_file(cfg: DictConfig, trial: optuna.trial.FrozenTrial, out_dir: Path, name: str) -> Path:
    """``<out_dir>/engine/<name>.yaml``: the engine config with the trial's values, usable as ``engine=<name>``."""
    values = dict(trial.params)  # {} for the engine-defaults seed
    tuned = apply_values(cfg, values)
    engine = OmegaConf.to_container(tuned.engine, resolve=True)
    others = {k: v for k, v in values.items() if not k.startswith("engine.")}
    path = out_dir / "engine" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [f"# Tuned by troughput-tune, study {name!r}, trial {trial.number}, run {trial.user_attrs.get('run_id')}",
              f"# objective values: {trial.values}"]
    if others:
        header.append("# also set: " + " ".join(f"{k}={v}" for k, v in others.items()))
    header.append(f"# use: troughput-run hydra.searchpath=[file://{out_dir.resolve()}] engine={name}")
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(engine, sort_keys=False))
    return path


def confirm(cfg: DictConfig, values: dict[str, Any], objective: Objective, rounds: int,
            make_spec: Callable[[DictConfig], Any], study_name: str) -> dict[str, Any]:
    """Run the default config and ``values`` alternately for ``rounds`` rounds; median ratio best/default."""
    measured: dict[str, list[float]] = {"default": [], "best": []}
    for i in range(rounds):
        order = ["default", "best"] if i % 2 == 0 else ["best", "default"]
        for which in order:
            run_cfg = apply_values(cfg, values if which == "best" else {})
            OmegaConf.update(run_cfg, "run.labels", {**cfg.run.labels, "study": study_name, "confirm": which},
                             force_add=True)
            row = execute(make_spec(run_cfg), progress=False)
            if row["status"] == "ok":
                measured[which].append(float(row["output_tok_s"]))
            print(f"  confirm round {i + 1} {which:>7}: {row['status']} "
                  f"{row.get('output_tok_s') or 0:,.1f} output tok/s", flush=True)
    if not measured["default"] or not measured["best"]:
        return {"ratio": None, **measured}
    ratio = statistics.median(measured["best"]) / statistics.median(measured["default"])
    return {"ratio": ratio, **measured}
