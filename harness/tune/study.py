"""One Optuna study per (engine, model, workload, hardware) cell, driven with ask/tell.

Every trial is one runner run (an isolated worker, one results row labelled with
the study name and trial number); the trial carries the run id. Failed runs are
told as ``FAIL`` with their reason and, when memory ran out, teach the search
space its memory edge. The study lives in any Optuna RDB storage, so re-running
the same command resumes it and several processes can share it.

Multi-fidelity (``tune.fidelity``, a fraction): a trial first runs on that seeded
sample of the workload, reports it as step 0, and stops there (``PRUNED``) when
Optuna's percentile pruner ranks it outside the top ``tune.prune_keep_percent`` of
the trials before it; the others go on to the full workload, which is their value.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import warnings
from dataclasses import replace
from datetime import datetime
from typing import Any, Callable

import optuna
from omegaconf import DictConfig, OmegaConf

from harness.core.errors import TroughputError
from harness.run.runner import execute
from harness.tune.command import run_command
from harness.tune.objective import Objective
from harness.tune.samplers import with_start
from harness.tune.space import SearchSpace

log = logging.getLogger(__name__)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
MEMORY_STATUSES = {"oom"}
PRUNE_AFTER = 4  # trials that must have reported before the pruner stops any
TPE_STARTUP = 4  # Optuna's default is 10; 4 reached 2% of the grid's best sooner (benchmarks/search_efficiency.py)


def study_name(cfg: DictConfig) -> str:
    """``tune.study_name``, else one name per cell: engine-model-workload-hardware."""
    return cfg.tune.study_name or f"{cfg.engine.name}-{cfg.model.name}-{cfg.workload.name}-{cfg.hardware.name}"


def open_study(cfg: DictConfig, objective: Objective) -> optuna.Study:
    """Create or resume the study in ``tune.storage``."""
    storage = cfg.tune.storage
    if storage.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(storage.removeprefix("sqlite:///"))), exist_ok=True)
    return optuna.create_study(
        study_name=study_name(cfg), storage=optuna.storages.RDBStorage(storage, engine_kwargs=_engine_kwargs(storage)),
        directions=objective.directions, sampler=make_sampler(cfg), pruner=make_pruner(cfg, objective),
        load_if_exists=True)


def make_pruner(cfg: DictConfig, objective: Objective) -> optuna.pruners.BasePruner:
    """With ``tune.fidelity``: keep the top ``tune.prune_keep_percent`` at the low fidelity; else never prune."""
    fidelity = cfg.tune.get("fidelity")
    if fidelity is None:
        return optuna.pruners.NopPruner()
    if not 0 < float(fidelity) < 1:
        raise TroughputError(f"tune.fidelity={fidelity}: must be a fraction of the workload in (0, 1)")
    if objective.multi:
        raise TroughputError("tune.fidelity needs a single objective: Optuna prunes single-objective studies only")
    keep = float(cfg.tune.prune_keep_percent)
    if not 0 < keep <= 100:
        raise TroughputError(f"tune.prune_keep_percent={keep:g}: must be in (0, 100]")
    return optuna.pruners.PercentilePruner(keep, n_startup_trials=PRUNE_AFTER, n_warmup_steps=0)


def make_sampler(cfg: DictConfig) -> optuna.samplers.BaseSampler:
    """TPE (default), random, or grid over the space.

    TPE's first ``tune.n_startup_trials`` trials come from ``tune.startup``: ``random``
    (default, Optuna's own; seed trials count among them, as every completed trial does) or
    ``sobol`` (a scrambled Sobol sequence, ``harness.tune.samplers.SobolStart``, which needs SciPy;
    seed trials apart). ``tune.multivariate`` (default) models the params jointly.
    ``benchmarks/search_efficiency.py`` measures the choices (docs/benchmarks.md, "Does the search pay?").
    """
    name, seed = cfg.tune.sampler, cfg.tune.seed
    if name == "tpe":
        startup = cfg.tune.get("n_startup_trials")
        startup = TPE_STARTUP if startup is None else int(startup)
        multivariate = cfg.tune.get("multivariate")
        with warnings.catch_warnings():  # Optuna marks multivariate TPE experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup,
                                             multivariate=True if multivariate is None else bool(multivariate))
        return with_start(tpe, cfg.tune.get("startup") or "random", startup, seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return StudyGridSampler(grid_values(cfg), seed=seed)
    raise TroughputError(f"tune.sampler={name!r}: use tpe, random or grid")


def grid_values(cfg: DictConfig) -> dict[str, list[Any]]:
    """The grid of ``tune.sampler=grid``: each param's ``tune.grid_points`` values (all choices if categorical)."""
    space = SearchSpace(OmegaConf.to_container(cfg.tune.space, resolve=True))
    return {p.path: p.grid(int(cfg.tune.grid_points)) for p in space.params}


class StudyGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler fitted to the tuner's ask/tell loop and its seed trials.

    - Optuna's ``after_trial`` calls ``Study.stop()`` once the grid is covered, which only
      works inside ``Study.optimize`` and raises under ask/tell; here the loop's budget
      (the grid's size plus the seed trials, ``trial_budget``) ends the study instead.
    - An enqueued seed trial that fixes only some params (the sizing heuristic) gets the
      others drawn at random from their ranges, where Optuna's grid sampler refuses.
    """

    def __init__(self, search_space: dict[str, list[Any]], seed: int | None = None):
        super().__init__(search_space, seed=seed)
        self.size = math.prod(len(values) for values in search_space.values())
        self._seed_sampler = optuna.samplers.RandomSampler(seed=seed)

    def after_trial(self, study, trial, state, values) -> None:  # noqa: D102 - see the class docstring
        return None

    def sample_independent(self, study, trial, param_name, param_distribution):  # noqa: D102
        if "seed" in trial.user_attrs:
            return self._seed_sampler.sample_independent(study, trial, param_name, param_distribution)
        return super().sample_independent(study, trial, param_name, param_distribution)


def trial_budget(cfg: DictConfig, study: optuna.Study) -> int:
    """Trials the study should hold: ``tune.n_trials``; with the grid sampler, the seed trials plus
    at most ``tune.n_trials`` grid cells (all of them when ``n_trials`` >= the grid's size)."""
    n_trials = int(cfg.tune.n_trials)
    if not isinstance(study.sampler, StudyGridSampler):
        return n_trials
    seeds = sum("seed" in t.user_attrs for t in study.get_trials(deepcopy=False))
    return seeds + min(n_trials, study.sampler.size)


def check_one_host(study: optuna.Study, host_id: str | None, mixed_hosts: bool = False) -> None:
    """Refuse to add this host's trials to a study whose trials ran on another kind of machine.

    Optuna ranks every trial of a study against every other, so trials from hosts with other
    ``env.host_id`` (another CPU, ISA or GPU) would be compared as if alike. ``tune.mixed_hosts=true``
    allows it (the rows still name their host); a study on identical cluster nodes shares one id.
    """
    others = sorted({t.user_attrs["host_id"] for t in study.get_trials(deepcopy=False)
                     if t.user_attrs.get("host_id") not in (None, host_id)})
    if others and not mixed_hosts:
        raise TroughputError(f"study {study.study_name!r} holds trials from host(s) {', '.join(others)}, and this host "
                             f"is {host_id}: their rates are not comparable. Use another tune.study_name, or "
                             "tune.mixed_hosts=true to mix them knowingly")


UNNAMED_AFTER_S = 30.0
"""A tuner names itself on a trial right after asking for it (the sampler has run by then; two
storage writes follow, each waiting at most SQLite's 5 s for a lock); a trial still unnamed after
this long was asked for by a tuner that was killed. Ages count from the trial's start as the asking
node's clock wrote it, so nodes sharing a study need clocks within a few seconds (NTP)."""


def fail_stale_trials(study: optuna.Study, stale_after_s: float) -> int:
    """Mark trials left RUNNING by a killed tuner as failed; returns how many.

    Stale: its tuner's pid is gone (same host), or it never got its owner recorded
    within ``UNNAMED_AFTER_S`` of being asked, or it has run longer than ``stale_after_s``.
    """
    failed = 0
    now = datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        attrs = trial.user_attrs
        age = (now - trial.datetime_start).total_seconds() if trial.datetime_start else 0.0
        dead_here = attrs.get("host") == socket.gethostname() and not _alive(attrs.get("pid"))
        orphaned = "host" not in attrs and age > UNNAMED_AFTER_S
        if dead_here or orphaned or age > stale_after_s:
            # skip_if_finished: another tuner on the study may fail the same trial first
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            study.set_user_attr(f"stale_trial_{trial.number}", "tuner died while the trial ran")
            failed += 1
    return failed


def await_unnamed_trials(study: optuna.Study, deadline: float | None = None) -> bool:
    """Wait out trials asked for but not yet named by their tuner; True when there were any.

    Such a trial is another worker's, named within moments, or a killed tuner's (killed between
    asking and naming): that one is marked failed once ``UNNAMED_AFTER_S`` has passed, like any
    trial of a killed tuner, instead of being left RUNNING with nobody running it.
    """
    def unnamed() -> list[int]:
        return [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                if "host" not in t.user_attrs]

    waiting = unnamed()
    if waiting:
        log.info("trial(s) %s asked for but not yet named by a tuner: waiting up to %.0f s for a name, then "
                 "counting them failed (a tuner killed between asking and starting)", waiting, UNNAMED_AFTER_S)
    while unnamed() and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.5)
        fail_stale_trials(study, stale_after_s=float("inf"))
    return bool(waiting)


def finished_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def started_trials(study: optuna.Study) -> int:
    """Finished plus running trials (other workers' included); waiting (enqueued) ones are not counted."""
    return len(study.get_trials(deepcopy=False, states=(*FINISHED, optuna.trial.TrialState.RUNNING)))


def run_trials(cfg: DictConfig, study: optuna.Study, space: SearchSpace, objective: Objective,
               make_spec: Callable[[DictConfig], Any]) -> int:
    """Ask, run and tell until the study holds its budget (``trial_budget``) or ``tune.timeout`` passes.

    Trial numbers are handed out by the storage, so several workers never exceed
    the budget: a worker that is handed a number past it stops without running.

    Returns:
        How many trials this call ran.
    """
    base = OmegaConf.to_container(cfg, resolve=True)
    deadline = time.monotonic() + float(cfg.tune.timeout) if cfg.tune.timeout else None
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
        if trial.user_attrs.get("status") in MEMORY_STATUSES:
            space.learn_memory_edge(trial.params)
    budget = trial_budget(cfg, study)
    ran = 0
    while deadline is None or time.monotonic() < deadline:
        if started_trials(study) >= budget:
            await_unnamed_trials(study, deadline)  # a killed tuner's unnamed trial ends failed, not RUNNING
            break
        if isinstance(study.sampler, StudyGridSampler) and study.sampler.is_exhausted(study) and \
                not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            break  # every cell ran (several workers, or an earlier, larger budget) and no seed waits
        trial = study.ask()
        if trial.number >= budget:  # another worker took the last slot between our count and our ask
            trial.set_user_attr("reason", "over budget: not run")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            break
        trial.set_user_attr("pid", os.getpid())   # pid first: a trial with a host but no pid reads as dead
        trial.set_user_attr("host", socket.gethostname())
        _run_one(cfg, study, trial, space, objective, base, make_spec)
        ran += 1
    return ran


def _run_one(cfg, study, trial, space, objective, base, make_spec) -> None:
    seed_name = trial.user_attrs.get("seed")
    try:
        values = {} if seed_name == "engine defaults" else space.suggest(trial, base)
    except TroughputError as e:
        return _fail(study, trial, f"no valid proposal: {e}")
    broken = space.check(values, base)
    if broken:
        return _fail(study, trial, f"constraint broken, not launched: {broken}")
    trial_cfg = apply_values(cfg, values)
    OmegaConf.update(trial_cfg, "run.labels", {**cfg.run.labels, "study": study.study_name, "trial": trial.number,
                                               "command": run_command(cfg, values)}, force_add=True)
    label = f"trial {trial.number}" + (f" ({seed_name})" if seed_name else "")
    log.info("%s: %s", label, values or "engine defaults")
    spec = make_spec(trial_cfg)
    fidelity = cfg.tune.get("fidelity")
    if fidelity is not None:
        share = {"workload.sample.fraction": float(fidelity), "workload.sample.seed": int(cfg.tune.seed)}
        sample = spec.workload.sample(float(fidelity), seed=int(cfg.tune.seed))
        row = execute(replace(spec, workload=sample, labels={**spec.labels, "fidelity": float(fidelity),
                                                             "command": run_command(cfg, {**values, **share})}),
                      progress=bool(cfg.run.progress))
        trial.set_user_attr("low_fidelity_run_id", row["run_id"])
        if row["status"] == "ok":
            value = objective.values(row)[0]
            trial.report(value, step=0)
            if trial.should_prune():
                trial.set_user_attr("reason", f"pruned: {objective.name}={value:,.1f} on {float(fidelity):g} "
                                              f"of the workload, outside the top {cfg.tune.prune_keep_percent}%")
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                log.info("%s: %s", label, trial.user_attrs["reason"])
                return None
            row = execute(spec, progress=bool(cfg.run.progress))
    else:
        row = execute(spec, progress=bool(cfg.run.progress))
    trial.set_user_attr("run_id", row["run_id"])
    trial.set_user_attr("status", row["status"])
    trial.set_user_attr("host_id", row.get("env.host_id"))
    if row["status"] != "ok":
        if row["status"] in MEMORY_STATUSES:
            space.learn_memory_edge(values)
        return _fail(study, trial, f"{row['status']}: {(row['error'] or '').splitlines()[0][:300]}")
    for name, value in objective.constraint_values(row).items():
        trial.set_constraint(name, value)
    broken = objective.broken(row)
    if broken:
        trial.set_user_attr("infeasible", "; ".join(broken))
    trial.set_user_attr("value_from", objective.value_source(row))   # a resumed study can tell its values apart
    study.tell(trial, objective.values(row))
    log.info("%s: %s%s", label, objective.describe(row), f" -- infeasible: {'; '.join(broken)}" if broken else "")


def _fail(study, trial, reason: str) -> None:
    trial.set_user_attr("reason", reason)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    log.warning("trial %d failed: %s", trial.number, reason)


def apply_values(cfg: DictConfig, values: dict[str, Any]) -> DictConfig:
    """A copy of ``cfg`` with each dotted path set; ``ordering`` swaps in that ordering's config file."""
    from engines.common import PROJECT_ROOT

    trial_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for path, value in values.items():
        if path == "ordering":
            trial_cfg.ordering = OmegaConf.load(PROJECT_ROOT / "conf" / "ordering" / f"{value}.yaml")
        else:
            OmegaConf.update(trial_cfg, path, value, force_add=True)
    return trial_cfg


def _engine_kwargs(storage: str) -> dict[str, Any]:
    # SQLite: wait for the lock instead of failing when several tuners share one file.
    return {"connect_args": {"timeout": 60}} if storage.startswith("sqlite") else {}


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
