"""``run.rounds=auto``: add interleaved rounds to a multirun until the rule decides, or a cap.

    troughput-run -m run.rounds=auto ordering=as_given,prefix_grouped workload=prefix_heavy

Hydra runs each config once (round 1, or the rounds given with ``run.round=...``); then
``RoundsCallback`` (a Hydra callback in ``conf/config.yaml``) reads this multirun's rows,
applies ``harness.report.verdict`` per cell through the report's own ``decide`` (min effect
``run.min_effect``), and, while a cell is undecided (``too close to call`` or
``insufficient data``) and ``run.max_rounds`` is not reached, runs one more round of
every config of that cell: each a fresh, independent run (its own engine process), in an
order that rotates each round so drift on a shared host lands on every side alike. It
ends by printing, per cell, whether the rule decided (and after how many rounds) or the
cap was reached, with the ratio and its interval.

Every look after the first is another chance to call a false winner, so the looks are planned
(``harness.report.sequential.SequentialPlan``: the first at the rounds Hydra ran, at least
``MIN_RUNS``, then one per added round up to ``run.max_rounds``) and each look's verdict is taken
at its group-sequential level (O'Brien–Fleming alpha spending), which keeps the whole loop's false-winner
rate at 5% or under for the plans docs/verdicts.md simulates (``sequential.SIMULATED``, the default of 3 to
10 runs a side among them); the loop's first line says whether its plan is one of them.

The configs are the jobs Hydra ran in this process (``on_job_end``), so this needs a
launcher that runs jobs in the driver process (the default, basic one); with another
launcher (submitit) it says so and adds nothing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.core.errors import TroughputError
from harness.report.sequential import SequentialPlan
from harness.report.verdict import DECIDED, MIN_RUNS
from harness.run.runner import execute
from harness.run.spec import AUTO, build_spec, wants_rounds

ROUND = "run.round="


class Job:
    """One config of the multirun: its composed config and the overrides that name it (without the round)."""

    def __init__(self, cfg: DictConfig, overrides: list[str]):
        self.cfg = cfg
        self.overrides = [o for o in overrides if not o.startswith(ROUND)]
        self.round = int(cfg.run.round) if cfg.run.get("round") is not None else 1

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(self.overrides)

    @property
    def command(self) -> str:
        """The command its rows carry, without the round."""
        return " ".join(["troughput-run", *self.overrides])

    def config_for(self, round_index: int, sweep_id: str, plan: SequentialPlan | None = None) -> DictConfig:
        """The config of an added round; its rows carry the loop's plan (``looks``: ``first-last``), so that a
        report on them judges at the level the loop's last look used (``harness.report.decisions``)."""
        cfg = copy.deepcopy(self.cfg)
        OmegaConf.update(cfg, "run.round", round_index, force_add=True)
        command = " ".join(["troughput-run", *self.overrides, f"{ROUND}{round_index}"])
        looks = {"looks": f"{plan.first}-{plan.last}"} if plan is not None else {}
        OmegaConf.update(cfg, "run.labels", {**cfg.run.labels, "command": command, "sweep_id": sweep_id, **looks},
                         force_add=True)
        return cfg


def until_decided(jobs: list[Job], results_dir: Path, sweep_id: str, max_rounds: int, min_effect: float,
                  run_one: Callable[[DictConfig], Any], say: Callable[[str], None] = print) -> dict[tuple, dict]:
    """Run more rounds of the undecided cells' configs; return the final decision per cell.

    ``run_one(cfg)`` runs one config (the runner's ``execute(build_spec(cfg))``). The loop itself is
    ``add_rounds``; this gives it the rounds (this multirun's configs, in a rotating order) and the looks (the
    report's decisions on this multirun's rows).
    """
    unique: dict[tuple, Job] = {}
    for job in jobs:
        unique.setdefault(job.key, job)
    cell_of_command: dict[str, tuple] = {}

    def look(plan: SequentialPlan) -> dict[tuple, dict]:
        decisions, cells = _decisions(results_dir, sweep_id, min_effect, plan)
        cell_of_command.clear()
        cell_of_command.update(cells)
        return decisions

    def run_round(round_index: int, open_cells: set[tuple], plan: SequentialPlan) -> None:
        todo = [job for job in unique.values() if cell_of_command.get(job.command) in open_cells | {None}]
        shift = (round_index - 1) % len(todo) if todo else 0  # round 1 ran in the given order
        say(f"rounds: round {round_index} of at most {max_rounds}: {len(todo)} config(s) of "
            f"{len(open_cells)} undecided cell(s)")
        for job in todo[shift:] + todo[:shift]:
            run_one(job.config_for(round_index, sweep_id, plan))

    done_round = max((job.round for job in jobs), default=0)
    decisions, decided_at = add_rounds(done_round, max_rounds, look, run_round, say=say,
                                       min_effect=min_effect)
    for cell, d in decisions.items():
        state = (f"decided after {decided_at[cell]} round(s)" if cell in decided_at
                 else "nothing to compare" if not _can_decide(d)
                 else f"cap of {max_rounds} rounds reached, undecided")
        say(f"rounds: {d['workload']} ({d['model']}, {d['hardware']}, host {d['host_id']}): {state}: "
            f"{d['verdict']}; {d.get('reason', '')}")
    return decisions


def add_rounds(done_round: int, max_rounds: int, look: Callable[[SequentialPlan], dict[tuple, dict]],
               run_round: Callable[[int, set[tuple], SequentialPlan], None],
               plan_for: Callable[[int, int], SequentialPlan] = SequentialPlan,
               say: Callable[[str], None] = print, min_effect: float | None = None
               ) -> tuple[dict[tuple, dict], dict[tuple, int]]:
    """The loop of ``run.rounds=auto``, whatever runs its rounds: plan the looks, look, and while a cell that can
    decide is undecided and ``max_rounds`` is not reached, run one more round and look again.

    ``done_round`` rounds have run (Hydra's); ``look(plan)`` gives each cell's decision (a dict with ``verdict`` and
    ``flags``) by the plan's rule; ``run_round(k, open_cells, plan)`` runs round k of the undecided cells' configs.
    ``plan_for(first, last)`` makes the plan: ``SequentialPlan``, or anything with its ``judge`` and ``describe``
    (the A/A tests in ``tests/harness/test_sequential.py`` also pass the old plain rule at every look, to show that
    it fails them); ``min_effect`` is the effect its first line says the simulated rate holds for. Returns the last look's decisions and, per decided cell, the
    round it decided at.
    """
    first = max(done_round, MIN_RUNS)
    plan = plan_for(first, max(first, max_rounds))
    say(f"rounds: verdicts by {plan.describe(min_effect)}")
    decisions = look(plan)
    decided_at: dict[tuple, int] = {}
    while True:
        decided_at |= {cell: done_round for cell, d in decisions.items() if d["verdict"] in DECIDED
                       and cell not in decided_at}
        open_cells = {cell for cell, d in decisions.items() if cell not in decided_at and _can_decide(d)}
        if not open_cells or done_round >= max_rounds:
            return decisions, decided_at
        done_round += 1
        run_round(done_round, open_cells, plan)
        decisions = look(plan)


def _can_decide(decision: dict) -> bool:
    """Whether more rounds could decide this cell (not with one config only)."""
    return "no runner-up" not in decision.get("flags", [])


def _decisions(results_dir: Path, sweep_id: str, min_effect: float, plan: SequentialPlan
               ) -> tuple[dict[tuple, dict], dict[str, tuple]]:
    """This multirun's decision per cell by the report's rule at the plan's level (nothing recorded), and each
    command's cell."""
    from harness.report.data import CELL, Filters, group_configs, load_runs
    from harness.report.decisions import cell_of, decide

    try:
        frame = load_runs(results_dir, Filters(sweep_id=sweep_id))
    except TroughputError:
        return {}, {}
    cells = {_without_round(str(row["command"])): tuple(row[c] for c in CELL) for row in frame.to_dict("records")}
    decisions = decide(frame, group_configs(frame, n_boot=200), min_effect=min_effect, plan=plan)
    return {cell_of(d): d for d in decisions}, cells


def _without_round(command: str) -> str:
    return " ".join(part for part in command.split() if not part.startswith(ROUND))


class RoundsCallback(Callback):
    """Collects the multirun's jobs; at its end adds rounds while ``run.rounds=auto`` (see the module doc)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.run.get("rounds") == AUTO:
            self.jobs.append(Job(copy.deepcopy(config), list(job_return.overrides or [])))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not wants_rounds(config):
            return
        if not self.jobs:
            print("rounds: run.rounds=auto needs a launcher that runs jobs in this process (the default one); "
                  "no rounds added", flush=True)
            return
        until_decided(self.jobs, Path(config.run.results_dir), str(config.hydra.sweep.dir),
                      int(config.run.max_rounds), float(config.run.min_effect),
                      lambda cfg: execute(build_spec(cfg), progress=bool(cfg.run.progress)))
