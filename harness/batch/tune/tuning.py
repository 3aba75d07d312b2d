"""In-job tuning (``batch.tune.trials``): the job's first shards are the trials, and their outputs count.

Phases, each run one engine start on this node (a main phase whose config the last run's engines run goes on
with them):

1. **trials**: ``trials`` configs from ``harness.tune``'s tuner (the space ``troughput-tune`` takes
   for this engine and hardware, its seed trials and sizing heuristic, constraints, memory
   edge and sampler), each on the next ``tune_runs.shards_per_run`` shards of a seeded random order of the
   job's shards. Trial 0 is the job's own config (the engine defaults), up to twice a run until it has given the
   confirmation its blocks; the other seeds run from the fewest sequences at once to the most (``run_order``: the
   likeliest winner last, so the main phase goes on with its engines). A trial's shards are committed as the
   job's output; its value is its full-engine rate (``tune_predict``), else its plain rate.
2. **main**: every shard left, starting on the best trial's config (the candidate), confirmed as it runs
   (``tune_confirm``): its blocks against trial 0's, at looks that may switch; only the last (or the one
   at ``tune_confirm.WITHIN`` of the main phase's shards) keeps a clear winner, one-sided at 0.04. A loser or a
   tie at any look, or no clear winner at the last, switches the rest to the engine defaults (one engine
   start), the candidate's committed shards kept. Where no
   trial beat the defaults, or trial 0 gave too few blocks to confirm against, the main phase runs the defaults.
   The rest of the job is predicted as the tuning ends and again at the main phase's first look, with its own
   steps so far (``tune_predict``). Where they cost at most ``batch.tune.alternate_share`` of the rest (a long
   job), the confirmation is by alternating runs instead (``tune_confirm.Alternation``): runs of the engine
   defaults and the candidate in turn, on sampled shards, a sample each, the same looks on them with no run
   allowance; then the rest on the config they chose.

Pruning (``batch.tune.prune``, ``harness.batch.tune.tune_prune``): each trial reports its fed-engine rate as
its shards commit; one clearly behind the finished trials at the same shard stops being handed shards, its
shards in flight commit (job output), the study is told ``PRUNED``, and the shards it did not run go to the
next run. The engine defaults' trial is never pruned.

No quality guard: a space with a knob that changes outputs by design is refused before any engine starts
(``tune_config``); ``troughput-tune`` guards such knobs with a probe against the defaults' outputs.

``kill -9`` at any point: committed shards stay, the study (``tune/study.db``) marks the cut
trial failed (or pruned, where the pruner had stopped it), the run log (``tune/runs.jsonl``) keeps
every finished run, and the rerun goes on from there (a cut run's remaining shards go to the next run).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from engines.base import Request
from engines.knobs import canonical_of, canonical_view
from engines.worker import classify_failure
from harness.batch.job.job import ShardsRun, shard_records
from harness.batch.job.plan import Plan
from harness.batch.job.shards import Index
from harness.batch.job.state import JobState, write_whole
from harness.batch.tune.tune_config import sampler_config
from harness.batch.tune.tune_confirm import (ALTERNATE, BLOCK_STEPS, KEEP, SWITCH, WITHIN, Alternation, Blocks,
                                             Confirmation, InMainRule, LookLog, alternate_estimate, run_sample)
from harness.batch.tune.tune_predict import NO_PREDICTION, RestInMain, full_engine_rate, predict_rest, save_run
from harness.batch.tune.tune_prune import DEFAULTS_SEED, Reporter, accepts_hook, make_pruner, reporting_points
from harness.batch.tune.tune_runs import (RunLog, RunRecord, concurrency, run_order, sample_order, sample_requests,
                                          sample_summary, shards_per_run)
from harness.core.errors import TroughputError
from harness.report.verdict import MIN_RUNS
from harness.run.stepmodels import REPLAYABLE
from harness.steps.predict import prediction_columns
from harness.tune.best import leaders
from harness.tune.seeds import enqueue_seeds
from harness.tune.space import SearchSpace
from harness.tune.study import make_sampler

log = logging.getLogger("troughput.batch.tune")
STUDY = "in-job"
# run_phase(plan, target, shards, on_commit=None): ``on_commit`` (``run_shards``) is called as each shard commits;
# the run_phase must take it (``tune_prune.accepts_hook``): the confirmation reads the blocks it gives
PhaseRunner = Callable[..., ShardsRun]
PRUNED = optuna.trial.TrialState.PRUNED
ASKED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING, PRUNED)


@dataclass
class Outcome:
    """What the tuning phase and the main phase did: the runs this invocation made, and the row's columns."""

    runs: list[ShardsRun] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)


class InJobTuning:
    """One invocation of a tuned job: what is left of the trials, the confirmation and the main phase."""

    def __init__(self, plan: Plan, state: JobState, index: Index, plan_for: Callable[..., Plan],
                 run_phase: PhaseRunner, base: dict[str, Any], start_ahead: Callable[[Plan], None] | None = None):
        # start_ahead(plan): start the first run's workers now, so that they start while the study is set up
        self.plan, self.state, self.index = plan, state, index
        self.tune = plan.tune
        self.plan_for, self.run_phase, self.base, self.start_ahead = plan_for, run_phase, base, start_ahead
        self.root = state.root / "tune"
        self._adopt_folder()
        self.log = RunLog(self.root)
        self.order = sample_order(index.shards(plan.shard_size), int(self.tune.get("seed") or 0))
        self.k = shards_per_run(self.tune, index, plan.shard_size)
        self.space = SearchSpace(self.tune["space"])
        self.outcome = Outcome()
        self.study: optuna.Study | None = None
        self.in_main: list[tuple[RestInMain, RunRecord]] = []   # each main run's prediction from its own steps
        self._limits: list[dict[str, Any]] = []   # what the last run's engines said at their start
        self.ahead_t0: float | None = None   # when the first run's workers were started ahead (``start_ahead``)
        self.alternate: dict[str, Any] | None = None   # whether the main phase alternates runs, and why
        if not accepts_hook(run_phase):
            raise TroughputError("in-job tuning needs a run_phase that takes on_commit: the confirmation reads the "
                                 "blocks of each run as its shards commit")
        self.points = reporting_points(self.k, self.plan.shard_size, self.plan.in_flight, self.plan.replicas)
        self.rule = InMainRule(int(self.tune.get("confirm_looks") or 3), float(self.tune["min_effect"]),
                               float(self.tune.get("run_spread", 0.03)))
        self.block_steps = int(self.tune.get("block_steps") or BLOCK_STEPS)
        self.pruning = self._pruning()

    def _pruning(self) -> bool:
        """Whether trials report to the pruner (``batch.tune.prune``); too few points, in the log."""
        kind = self.tune.get("prune") or "none"
        if kind == "none":
            return False
        points, warmup = self.points, int(self.tune.get("prune_warmup", 2))
        if points < warmup:
            log.warning("batch.tune.prune=%s: a trial of %d shards hands its last shard over after about %d commits "
                        "(its engines hold several at once), under batch.tune.prune_warmup=%d: the pruner cannot "
                        "stop one. Smaller shards (batch.shard_size) or a larger batch.tune.max_share give it room",
                        kind, self.k, points, warmup)
        return True

    def _adopt_folder(self) -> None:
        """``tune/`` for this job's tuning settings; one left by other settings (nothing committed) starts over."""
        path = self.root / "settings.json"
        settings = json.dumps(self.plan.identity().get("tune"), sort_keys=True)
        if path.exists() and path.read_text() != settings:
            if self.state.committed():  # adopt() refuses this first; kept as a guard
                raise TroughputError(f"{self.root} belongs to other batch.tune settings; use another batch.output_dir")
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        path.write_text(settings)

    # ---- the phases -------------------------------------------------------------------------------

    def run(self) -> Outcome:
        t0 = time.monotonic()
        if self.start_ahead is not None and not (self.root / "study.db").exists():   # a new study: trial 0 is first
            self.start_ahead(self.plan_for({}, {"phase": "trial", "run": f"trial 0 ({DEFAULTS_SEED})", "config": {}}))
            self.ahead_t0 = t0
        study = self.study = self._study()
        self._trials(study)
        candidate, why = self._candidate(study)
        left = self._left()
        requests_left = sum(shard_records(self.index, self.plan.shard_size, i) for i in left)
        confirmation = self._confirmation(len(left)) if candidate and why is None else None
        start = candidate
        if confirmation is not None and len(confirmation.defaults) < MIN_RUNS:
            why = (f"the engine defaults' trial gave {len(confirmation.defaults)} block(s) of full steps, under the "
                   f"{MIN_RUNS} the confirmation needs: nothing to confirm the candidate against, so the main phase "
                   "runs the defaults")
            log.warning("%s", why)
            start, confirmation = {}, None
        prediction = self._predict_rest(start, requests_left)   # for the config the main phase starts on
        tuning_s = time.monotonic() - t0   # the study's start to the main phase's
        if prediction.get("predicted_rest_s"):
            log.info("the rest of the job (%d requests) predicted at %.0f s of generation (%s)", requests_left,
                     prediction["predicted_rest_s"], prediction["prediction_note"])
        alternation = self._alternation(start, left) if confirmation is not None else None
        chosen = self._alternate(start, alternation) if alternation else self._main(start, confirmation, left)
        confirmation = alternation or confirmation
        if confirmation is not None:
            why = confirmation.columns()["tune.confirm.reason"]
        self.outcome.columns = self._columns(chosen, candidate, why, prediction, tuning_s)
        if confirmation is not None:
            self.outcome.columns |= confirmation.columns()
        main = self.plan_for(chosen, {})
        self.outcome.columns |= {"tune.chosen_knobs": main.knobs, "tune.chosen_replicas": main.replicas,
                                 "tune.chosen_ordering": main.ordering.get("name")}
        return self.outcome

    def _study(self) -> optuna.Study:
        cfg = sampler_config(self.tune, f"sqlite:///{self.root / 'study.db'}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(study_name=STUDY, storage=cfg.tune.storage, direction="maximize",
                                    sampler=make_sampler(cfg), pruner=make_pruner(self.tune), load_if_exists=True)
        seeds = [dict(s) for s in self.tune.get("seeds") or []]
        if not any(s.get("name") == DEFAULTS_SEED for s in seeds):
            seeds.insert(0, {"name": DEFAULTS_SEED})  # the fallback config is always measured
        trials = int(self.tune["trials"])
        enqueue_seeds(study, {**self.tune, "seeds": seeds}, self.space, self.base, self._sample_summary(),
                      self.plan.model["local_dir"], order=lambda named: run_order(named, trials, self._at_once,
                                                                                  DEFAULTS_SEED))
        finished = {r.trial: r for r in self.log.read() if r.kind == "trial"}
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            record = finished.get(trial.number)  # killed after its run was logged, before it was told: tell it now
            if record is None and "pruned" in trial.user_attrs:   # the pruner stopped it, a kill cut its last shards
                record = self._pruned_and_cut(trial)
            if record is not None and record.pruned_at:
                study.tell(trial.number, state=PRUNED)
                continue
            if record is not None and record.status == "ok":
                study.tell(trial.number, record.value or 0.0)
                continue
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            if record is not None:  # it ran and failed or was rejected: it used its budget, and is never rerun
                study.set_user_attr(f"ran_{trial.number}", record.reason or record.status)
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            key = f"requeued_{trial.number}"  # a seed trial cut by a kill runs again, once
            if "seed" in trial.user_attrs and self._cut(study, trial) and key not in study.user_attrs:
                study.enqueue_trial(trial.params, user_attrs={"seed": trial.user_attrs["seed"]}, skip_if_exists=False)
                study.set_user_attr(key, True)
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            if trial.user_attrs.get("status") == "oom":
                self.space.learn_memory_edge(trial.params)
        return study

    def _at_once(self, values: dict[str, Any]) -> int:
        """Sequences a config runs at once, for the seeds' order: replicas × ``max_seqs`` (an adapter given as
        ``module:Class`` has no mapping: the knob that is ``max_seqs`` in some engine). Unset (the engine's default)
        or a config that cannot be planned (its trial fails, as before): 0, so it runs among the first."""
        try:
            plan = self.plan_for(values, {})
        except Exception:   # noqa: BLE001 - the trial itself says why
            return 0
        seqs = canonical_view(plan.engine, plan.knobs).get("max_seqs") or next(
            (v for k, v in plan.knobs.items() if canonical_of(k) == "max_seqs"), 0)
        return plan.replicas * int(seqs or 0)

    def _pruned_and_cut(self, trial: optuna.trial.FrozenTrial) -> RunRecord:
        """The run record of a trial the pruner stopped and a kill then cut while its shards in flight finished: its
        config, and the shards it committed (their metas name its run); no timings (the run's end was not seen)."""
        pruned = trial.user_attrs["pruned"]
        mine = [(i, meta) for i in sorted(self.state.committed())
                if (meta := self.state.meta(i)).get("run") == pruned["label"] and meta.get("phase") == "trial"]
        record = RunRecord(kind="trial", label=pruned["label"], values=pruned["config"], shards=[i for i, _ in mine],
                           requests=sum(int(m["ok"]) for _, m in mine),
                           output_tokens=sum(int(m["output_tokens"]) for _, m in mine), trial=trial.number,
                           pruned_at=int(pruned["at"]),
                           reason=f"pruned after {pruned['at']} shards; cut by a kill while its shards in flight "
                                  "finished (no timings)")
        self.log.append(record)
        log.info("%s: %s", record.label, record.reason)
        return record

    def _trials(self, study: optuna.Study) -> None:
        cut = sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
                  if self._cut(study, t))  # killed while running: those do not use up the budget
        budget = int(self.tune["trials"]) + cut
        while len(study.get_trials(deepcopy=False, states=ASKED)) < budget:
            if not self._room_for_a_trial():
                log.warning("the tuning budget (batch.tune.max_share) has no room for another trial (runs cut by "
                            "kills took shards): no more trials")
                break
            trial = study.ask()
            trial.set_user_attr("pid", os.getpid())   # the order troughput-tune names its trials in
            trial.set_user_attr("host", socket.gethostname())
            seed = trial.user_attrs.get("seed")
            values = {} if seed == DEFAULTS_SEED else self.space.suggest(trial, self.base)
            broken = self.space.check(values, self.base)
            if broken:
                self._fail(study, trial, f"constraint broken, not launched: {broken}")
                continue
            ran = [r for r in self.log.read() if r.kind == "trial" and r.values == values and r.status == "ok"]
            if ran:   # one engine start per distinct config: a config the sampler proposes again is not rerun
                trial.set_user_attr("same_as", ran[0].label)
                if ran[0].pruned_at:
                    study.tell(trial, state=PRUNED)
                else:
                    study.tell(trial, ran[0].value or 0.0)
                log.info("trial %d: %s again, as %s: its value, not another run", trial.number, values or
                         "engine defaults", ran[0].label)
                continue
            label = f"trial {trial.number}" + (f" ({seed})" if seed else "")
            # every trial reports, the defaults' too (the others are compared with them; the pruner never stops them)
            reporter = Reporter(study, trial, label, values) if self.pruning else None
            shards = self._next_shards(None if values else self._room_for_the_defaults(study, budget))
            enough = self.rule.last_samples   # a block for each of the candidate's at the last look
            blocks = Blocks(reporter, self.block_steps, *((enough, len(shards) - self.k) if not values else ()))
            record = self._run("trial", label, values, shards, trial=trial.number, blocks=blocks)
            trial.set_user_attr("status", record.status)
            if record.status == "failed":
                if classify_failure(record.reason) == "oom":
                    trial.set_user_attr("status", "oom")
                    self.space.learn_memory_edge(values)
                self._fail(study, trial, record.reason)
                continue
            if record.pruned_at:
                study.tell(trial, state=PRUNED)
                continue
            study.tell(trial, record.value or 0.0)

    def _candidate(self, study: optuna.Study) -> tuple[dict[str, Any], str | None]:
        """The best trial's config other than the defaults ({} where none beat them), and why it goes on
        unconfirmed (``None``: it is confirmed in the main phase)."""
        candidates = [t for t in leaders(study, 1) if t.params and t.user_attrs.get("seed") != DEFAULTS_SEED]
        if not candidates:
            log.info("no trial config beat the engine defaults in the trials: the job goes on with the defaults")
            return {}, "no trial config beat the job's own in the trials"
        candidate = candidates[0]
        self.candidate_trial = candidate.number
        own = [r for r in self.log.read() if r.kind == "trial" and not r.values]
        if own and not any(r.status == "ok" for r in own):  # the job's config cannot run: nothing to confirm against
            why = own[-1].reason.splitlines()[0][:300] if own[-1].reason else own[-1].status
            log.warning("the job's own config failed (%s): trial %d's config goes on unconfirmed", why,
                        candidate.number)
            return dict(candidate.params), f"the job's own config failed ({why}): the best trial, unconfirmed"
        return dict(candidate.params), None

    def _confirmation(self, left: int) -> Confirmation:
        """The main phase's looks against the engine defaults' trial blocks (its last ok run of them), deciding
        within ``tune_confirm.WITHIN`` of its shards: those ``left`` and those it committed before a kill."""
        own = [r for r in self.log.read() if r.kind == "trial" and not r.values and r.status == "ok"]
        before = sum(1 for i in self.state.committed() if self.state.meta(i).get("phase") == "main")
        confirmation = Confirmation(self.rule, own[-1].blocks if own else [], LookLog(self.root), self.block_steps,
                                    within=max(1, math.ceil(WITHIN * (left + before))), before=before)
        log.info("confirmation in the main phase: %s; the defaults' blocks (%d merged a sample): %s",
                 self.rule.describe(), confirmation.merged, ", ".join(f"{b:,.0f}" for b in confirmation.defaults)
                 or "none")
        return confirmation

    def _main(self, candidate: dict[str, Any], confirmation: Confirmation | None, left: list[int]) -> dict[str, Any]:
        """The main phase: on the candidate (looking as its blocks commit) and, where the looks say so, the rest on
        the defaults; returns the config the job finished on."""
        if confirmation is not None and confirmation.action == SWITCH:   # decided before a kill
            candidate, confirmation = {}, None   # the rest on the defaults, with no looks to stop them
        if left:
            self._run("main", "main", candidate, set(left), blocks=confirmation.blocks if confirmation else None,
                      rest=self._rest_in_main(candidate, set(left)))
        if confirmation is None or confirmation.action != SWITCH or not candidate:
            return candidate
        rest = self._left()
        log.info("confirmation: %s: the %d shard(s) left run on the engine defaults", confirmation.made[-1].reason,
                 len(rest))
        if rest:
            self._run("main", "main (engine defaults)", {}, set(rest), rest=self._rest_in_main({}, set(rest)))
        return {}

    def _alternation(self, candidate: dict[str, Any], left: list[int]) -> Alternation | None:
        """The confirmation by alternating runs (``tune_confirm.Alternation``) where they cost at most
        ``batch.tune.alternate_share`` of the rest of the job (``tune_confirm.alternate_estimate``), else None (the
        blocks of the main phase's first run). The decision is kept in ``tune/alternate.json`` (written whole)
        before any run, so a resumed job goes on as it began; it is the row's ``tune.confirm.alternate``."""
        path = self.root / "alternate.json"
        try:
            self.alternate = json.loads(path.read_text())
        except (OSError, ValueError):   # not made yet (or cut by a kill as it was written: made again)
            self.alternate = alternate_estimate(self.log.read(), candidate, self.k, len(left),
                                                float(self.tune.get("alternate_share") or 0.0),
                                                self.rule.last_samples)
            write_whole(path, json.dumps(self.alternate))
        log.info("alternating runs: %s", self.alternate["why"])
        return Alternation(self.rule, LookLog(self.root)) if self.alternate["alternate"] else None

    def _alternate(self, candidate: dict[str, Any], alternation: Alternation) -> dict[str, Any]:
        """The main phase confirmed by alternating runs of ``k`` sampled shards (``tune_confirm.Alternation``), then
        the rest on the config the looks chose (on the last run's engines where it ran last); returns that config.
        A run that fails is run again once; a config's second failure ends them: the rest runs on the other config,
        unconfirmed where that is the candidate. A run that gives no block ends them too (the rest on the defaults)."""
        while True:   # each pass: the samples so far (a resumed job's too), a look where due, the next run
            runs = [r for r in self.log.read() if r.label.startswith(ALTERNATE)]
            ok = [r for r in runs if r.status == "ok"]
            side = alternation.next([x for r in ok if r.values and (x := run_sample(r))],
                                    [x for r in ok if not r.values and (x := run_sample(r))])
            if side is None:
                break
            failed = [r for r in runs if r.status != "ok"]
            twice = next((r for r in failed if sum(f.values == r.values for f in failed) > 1), None)
            blockless = next((r for r in ok if run_sample(r) is None), None)
            shards = self._next_shards()
            if twice is not None:
                alternation.stop(f"{twice.label} failed, its config's second failure ({twice.reason[:300]}): the "
                                 "rest on the other config" + ("" if twice.values else ", unconfirmed"),
                                 SWITCH if twice.values else KEEP)
            elif blockless is not None or not shards:
                alternation.stop(f"{blockless.label} gave no block of full steps to compare" if blockless else
                                 "the job's shards ran out before the looks decided")
            else:
                values = candidate if side else {}
                n = sum(r.values == values for r in runs) + 1
                self._run("main", f"{ALTERNATE}: {'candidate' if side else 'engine defaults'} {n}", values, shards)
        chosen = candidate if alternation.action == KEEP else {}
        log.info("confirmation: %s: the rest runs on %s", alternation.made[-1].reason, chosen or "the engine defaults")
        rest = self._left()
        if rest:
            self._run("main", "main" if chosen else "main (engine defaults)", chosen, set(rest),
                      rest=self._rest_in_main(chosen, set(rest)))
        return chosen

    def _rest_in_main(self, values: dict[str, Any], shards: set[int]) -> RestInMain:
        """The main run's rest predicted once it has run ``MIN_RUNS`` blocks' full steps (the confirmation's first
        look where no blocks are merged), its own steps so far in the fit."""
        requests = sum(shard_records(self.index, self.plan.shard_size, i) for i in shards)
        return RestInMain(lambda extra: self._predict_rest(values, requests, extra), MIN_RUNS * self.block_steps)

    def _left(self) -> list[int]:
        return [i for i in range(self.index.shards(self.plan.shard_size)) if i not in self.state.committed()]

    # ---- one run ----------------------------------------------------------------------------------

    def _run(self, kind: str, label: str, values: dict[str, Any], shards: set[int], trial: int | None = None,
             blocks: Blocks | None = None, rest: RestInMain | None = None) -> RunRecord:
        """Run ``shards`` with ``values``' config, one engine start; record it with its blocks; fold it into the
        invocation. ``blocks``: the run's hook as its shards commit, which may stop it (a trial's, reporting to the
        pruner; the main phase's confirmation); ``rest``: a main run's prediction of its rest from its own steps
        (after the blocks and looks, at the same commits)."""
        phase = {"phase": kind, "run": label, "config": values}
        plan = self.plan_for(values, phase)
        blocks = blocks or Blocks(None, self.block_steps)
        reporter = blocks.then if isinstance(blocks.then, Reporter) else None
        log.info("%s: %s on %d shards", label, values or "engine defaults", len(shards))
        t0 = time.monotonic()
        before = self.state.committed()
        if rest is not None:   # it asks the blocks (and the looks) first, at the same commits
            rest.then = blocks
        run = self.run_phase(plan, self.state, shards, on_commit=rest or blocks)
        if run.engines_kept and not run.engine_limits:   # no start, so nothing said: the last run's engines' limits
            run.engine_limits = list(self._limits)
        self._limits = list(run.engine_limits)
        wall = time.monotonic() - t0
        ahead_s = t0 - self.ahead_t0 if run.started_ahead and self.ahead_t0 is not None else 0.0
        committed = sorted(self.state.committed() - before)
        record = RunRecord(kind=kind, label=label, values=values, shards=committed, requests=run.requests_ok,
                           output_tokens=run.output_tokens, generation_s=run.generation_s, startup_s=run.startup_s,
                           wall_s=wall, trial=trial, engines_kept=run.engines_kept, blocks=list(blocks.values),
                           ahead_s=ahead_s,
                           concurrency=concurrency(run.engine_limits, run.lengths,
                                                   self.plan.shard_size if run.serial else None))
        if reporter is not None and reporter.pruned:
            record.pruned_at, record.reason = reporter.pruned["at"], reporter.reason()
        limits = run.engine_limits[0] if run.engine_limits else {}
        saved = save_run(self.root, label, run.steps.snapshot(),
                         {**plan.knobs, **{f"engine_{k}": v for k, v in limits.items() if v}},
                         max(len(run.engine_limits), 1), committed)
        if saved and kind == "trial" and committed and limits.get("scheduler") == REPLAYABLE \
                and not record.pruned_at:   # a pruned trial's value is told to no one
            record.full_engine_tok_s, record.full_engine_beyond, record.full_engine_note = full_engine_rate(
                self.root, label, self._requests(set(committed)), self.plan.model, self._hardware())
        run.engine_limits, run.lengths = [], []  # measured; not carried into the job's totals
        failed = [f"shard {i}: {why}" for i, why in sorted(run.shards_failed.items())] + run.errors
        if failed:
            record.status, record.reason = "failed", "; ".join(failed)[:1000]
        self.log.append(record)
        self.outcome.runs.append(run)
        if rest is not None:
            self.in_main.append((rest, record))
        log.info("%s: %s", label, _describe(record))
        return record

    # ---- helpers ----------------------------------------------------------------------------------

    def _next_shards(self, k: int | None = None) -> set[int]:
        """The next ``k`` (default: the run size ``self.k``) shards of the sample order that are not committed yet."""
        committed = self.state.committed()
        return set([i for i in self.order if i not in committed][:k or self.k])

    def _room_for_the_defaults(self, study: optuna.Study, budget: int) -> int:
        """The engine defaults' trial's shards: twice a run (it is the confirmation's side too), within the budget's
        room less a run for each trial after it, at least a run. It stops being handed shards once it has given the
        confirmation its blocks and taken a run's shards (a run's engines keep up to twice what they hold queued, so
        a stop comes that much later)."""
        asked = len(study.get_trials(deepcopy=False, states=ASKED))   # this one among them (not the seeds waiting)
        return max(self.k, min(2 * self.k, self._budget_left() - max(0, budget - asked) * self.k))

    def _room_for_a_trial(self) -> bool:
        """Whether one more trial fits in ``max_share`` of the job's shards."""
        return self.k <= self._budget_left()

    def _budget_left(self) -> int:
        """``max_share`` of the job's shards less every shard the tuning runs so far took (runs cut by a kill took
        theirs too; there is no main phase yet)."""
        budget = int(float(self.tune["max_share"]) * self.index.shards(self.plan.shard_size))
        return budget - len(self.state.committed())

    @staticmethod
    def _cut(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether a failed trial was cut by a kill while it ran (not failed by its config)."""
        return "reason" not in trial.user_attrs and f"ran_{trial.number}" not in study.user_attrs

    def _sample_summary(self) -> dict[str, Any]:
        """The first run's requests and requested tokens: what the sizing heuristic sizes for."""
        return sample_summary(self.plan, self.index, set(self.order[:self.k]))

    @staticmethod
    def _fail(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _requests(self, shards: set[int]) -> list[Request]:
        """The real requests of sampled shards, as the engines got them."""
        return sample_requests(self.plan, self.index, shards)

    def _hardware(self) -> dict[str, Any]:
        """A spec for the simulator that replays runs: priced by a step model and sized by what the engines
        reported (``engine_*`` knobs), so only the kind of device is read from it (an engine that does not say
        its KV cache is replayed with one that never runs out)."""
        return {"name": self.plan.device_kind, "kind": self.plan.device_kind, "peak_flops_bf16": 1e12,
                "bandwidth_bytes_s": 1e11, "memory_bytes": float(1 << 40)}

    def _predict_rest(self, chosen: dict[str, Any], requests_left: int,
                      extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The rest of the job, replayed with the step model of the chosen config's runs (``tune_predict``), and
        ``extra`` traces of it (the main phase's so far)."""
        labels = [r.label for r in self.log.read() if r.kind == "trial" and r.values == chosen
                  and r.status == "ok" and r.full_engine_tok_s]   # runs whose steps the simulator replays
        main = self.plan_for(chosen, {})
        try:
            return predict_rest(self.root, labels, self._requests, requests_left, self.plan.model, self._hardware(),
                                main.knobs, max(main.replicas, 1), extra)
        except Exception as e:   # an advisory figure: no failure of it may stop the job
            log.warning("no prediction of the rest of the job: %s: %s", type(e).__name__, e)
            return dict(NO_PREDICTION)

    def _columns(self, chosen: dict[str, Any], candidate: dict[str, Any], why: str | None,
                 prediction: dict[str, Any], tuning_s: float) -> dict[str, Any]:
        """The row's ``tune.*`` columns: every run, the candidate and what became of it, the engine starts, the
        overhead, the prediction."""
        records = self.log.read()
        tuning = [r for r in records if r.kind != "main"]
        main = [r for r in records if r.kind == "main"]
        # each run's time outside generation (worker start with the engine's import, engine start, stop); the
        # job's first start is one any job pays, every later one (the main phase's included) is the tuning's
        restarts_s = sum(max(0.0, r.wall_s - r.generation_s) for r in records[1:])
        # speed lost on the other configs: a run's time beyond what the chosen config's runs take per token
        mine = [r for r in records if r.status == "ok" and r.values == chosen and r.rate]
        rate = sum(r.output_tokens for r in mine) / sum(r.generation_s for r in mine) if mine else None
        shortfall_s = sum(max(0.0, r.generation_s - r.output_tokens / rate)
                          for r in records if r.status == "ok" and r.values != chosen) if rate else 0.0
        # the tuning phase on its own clock where this invocation ran all of it (the step-model replays between
        # runs included), else its runs' wall times; the job: its runs' wall times and those replays
        phase_s = sum(r.wall_s for r in tuning)
        if len(self.outcome.runs) == len(records):
            phase_s = max(phase_s, tuning_s)
        job_s = sum(r.wall_s for r in records) + phase_s - sum(r.wall_s for r in tuning)
        # the job's first start: from its first workers' spawn (started ahead: the study set up meanwhile) to the
        # first run's engines up
        first_s = max(0.0, records[0].wall_s - records[0].generation_s) + records[0].ahead_s if records else 0.0
        states = [t.state for t in self.study.get_trials(deepcopy=False)] if self.study is not None else []
        pruned, ran = states.count(PRUNED), states.count(PRUNED) + states.count(optuna.trial.TrialState.COMPLETE)
        switched = bool(candidate) and not chosen and any(r.kind == "main" and r.values for r in main)
        rest = [r for r in main if not r.label.startswith(ALTERNATE)]   # the main phase past its alternating runs
        alternated = len(rest) < len(main)
        measured_rest = sum(r.generation_s for r in main) if main else None
        note = prediction.get("prediction_note")
        if switched or alternated:
            note = (f"{note}; " if note else "") + "measured over both configs: the main phase " + (
                "alternated runs of them" if alternated else "switched to the engine defaults after the candidate's "
                "shards")
        return {
            "tune.space": self.tune.get("space_name"), "tune.shards_per_run": self.k,
            "tune.runs": [r.to_dict() for r in records],
            "tune.trials": sum(r.kind == "trial" for r in records),
            "tune.chosen": chosen or "engine defaults", "tune.candidate": candidate or None,
            "tune.candidate_trial": getattr(self, "candidate_trial", None) if candidate else None,
            "tune.verdict": why, "tune.switched": switched,
            "tune.engine_starts": sum(not r.engines_kept for r in records),
            "tune.distinct_configs": len({json.dumps(r.values, sort_keys=True, default=str) for r in records}),
            "tune.restarts": sum(not r.engines_kept for r in records[1:]), "tune.restart_s": restarts_s,
            "tune.engine_start_s": sum(r.startup_s or 0.0 for r in tuning),
            "tune.prune": (self.tune.get("prune") or "none") if self.pruning else "none",
            "tune.pruned_trials": pruned, "tune.pruned_share": pruned / ran if ran else None,
            # shards the pruned trials did not run (their runs' size less what they committed): later runs ran them
            "tune.pruned_shards_left": sum(max(0, self.k - len(r.shards)) for r in tuning if r.pruned_at),
            "tune.shortfall_s": shortfall_s,
            "tune.overhead_s": restarts_s + shortfall_s,
            "tune.overhead_share": (restarts_s + shortfall_s) / job_s if job_s else None,
            "tune.phase_s": phase_s, "tune.phase_share": phase_s / job_s if job_s else None,
            # the first start (a worker's spawn with the engine's import, then its engine) is paid by any job
            "tune.first_start_s": first_s,
            "tune.phase_share_after_start": (phase_s - first_s) / (job_s - first_s) if job_s > first_s else None,
            "tune.phase_requests": sum(r.requests for r in tuning),
            "tune.this_invocation_tuning_s": tuning_s,
            **{f"tune.{k}": v for k, v in prediction.items()},
            "tune.measured_rest_s": measured_rest,
            "tune.measured_rest_tok_s": sum(r.output_tokens for r in main) / measured_rest if measured_rest else None,
            **prediction_columns("rest_of_job", prediction.get("predicted_rest_s"), measured_rest, "seconds",
                                 prediction.get("prediction_interval"), note),
            **_full_engine_record([r for r in tuning if r in mine], rest[0] if rest and rest[0].values == chosen
                                  else None),
            **self._in_main_record(),
            "tune.trial_statistics": _statistics(tuning),
            "tune.confirm.alternate": self.alternate,
        }

    def _in_main_record(self) -> dict[str, Any]:
        """``prediction.rest_in_main.*``: the last main run's rest, predicted at its first look from its own steps so
        far, beside its generation seconds from then on; where that run was stopped (the looks switched to the
        defaults later), the measured side is left out (its rest ran on another config)."""
        made = [(rest, record) for rest, record in self.in_main
                if rest.made and rest.made.get("predicted_rest_s") is not None]
        if not made:
            return {}
        rest, record = made[-1]
        stopped = rest.stopped
        measured = None if stopped else max(0.0, record.generation_s - rest.made["at_s"])
        note = (f"{rest.made['prediction_note']}; made {rest.made['at_s']:.0f} s into {record.label}, the whole run "
                "replayed less those seconds" + ("; not measured: the looks then switched the rest to the defaults"
                                                 if stopped else ""))
        return {"tune.in_main_prediction_at_s": rest.made["at_s"],
                "tune.in_main_prediction_cost_s": rest.made["cost_s"],
                "tune.in_main_predicted_run_s": rest.made["run_s"],
                "tune.in_main_measured_run_s": None if stopped else record.generation_s,
                **prediction_columns("rest_in_main", rest.made["predicted_rest_s"], measured, "seconds",
                                     rest.made.get("prediction_interval"), note)}


def _full_engine_record(chosen_runs: list[RunRecord], main: RunRecord | None) -> dict[str, Any]:
    """``prediction.full_engine.*``: the chosen config's full-engine rate from its tuning runs' steps (their mean)
    beside the rate its main phase then measured (a long run, fed without end: its drain is a small part), so the
    report's track record shows how far the trial values that ranked configs can be trusted."""
    rates = [r.full_engine_tok_s for r in chosen_runs if r.full_engine_tok_s]
    if not rates:
        return {}
    return prediction_columns("full_engine", sum(rates) / len(rates), main.rate if main else None, "output tok/s",
                              None, f"mean of {len(rates)} tuning run(s) of the chosen config; measured: the main "
                                    f"phase's output tok/s over its generation time, its drain included")


def _statistics(tuning: list[RunRecord]) -> str | None:
    """What the trials were valued by: ``full engine`` for all, ``run rate`` for all, or which ones had no
    full-engine rate (then valued by their run's plain rate, which includes its drain: a lower bound, so such a
    config is ranked no higher than it should be, and the confirmation on measured rates still decides)."""
    valued = [r for r in tuning if r.kind == "trial" and r.status == "ok" and not r.pruned_at]   # pruned: no value
    plain = [r.label for r in valued if not r.full_engine_tok_s]
    if not valued:
        return None
    if not plain:
        return "full engine"
    if len(plain) == len(valued):
        return "run rate"
    return f"full engine, but run rate (a lower bound) for: {', '.join(plain)}"


def _describe(record: RunRecord) -> str:
    rate = f"{record.rate:,.1f} output tok/s" if record.rate else "no rate"
    if record.full_engine_tok_s:
        rate += (f" (full engine {record.full_engine_tok_s:,.1f}"
                 + (f", extrapolated in {', '.join(record.full_engine_beyond)}" if record.full_engine_beyond else "")
                 + ")")
    elif record.full_engine_note:
        rate += f" (no full-engine rate: {record.full_engine_note})"
    text = f"{record.status}, {rate}, {record.requests} requests, {len(record.shards)} shards committed"
    if record.fill is not None:   # under 2: one draining batch
        text += f", {record.fill:.2f}× the {record.concurrency:.0f} requests its engines run at once"
    if record.blocks:
        text += f", {len(record.blocks)} blocks"
    if record.engines_kept:
        text += ", on the last run's engines (no restart)"
    return text + (f" ({record.reason[:200]})" if record.reason else "")
