"""In-job tuning (``batch.tune.trials``): the job's first shards are the trials, and their outputs count.

Phases, each run one engine start (a local pool, or one Ray Data pipeline whose actors start
with the run's knobs; a main phase whose config the last run's local engines run goes on with them):

1. **trials**: ``trials`` configs from ``harness.tune``'s tuner (the space ``troughput-tune`` takes
   for this engine and hardware, its seed trials and sizing heuristic, constraints, memory
   edge and sampler), each on the next shards of a seeded random order of the job's shards
   (``tune_runs.shards_per_run`` says how many). A trial's shards are committed as the job's
   output; its value is output tokens ÷ generation seconds (engines up to its last commit).
2. **confirmation**: the best feasible trial's config against the engine defaults, alternating,
   ``confirm_rounds`` runs a side on further sampled shards (each side's runs sized to hold
   ``confirm_fill``× what its engines run at once, as far as the budget holds, ``tune_runs.confirm_shards``;
   the sizes are kept in ``tune/confirm.json``), then more rounds while the rule is
   undecided, up to ``max_confirm_rounds`` and within the budget; the verdict rule
   (``harness.report.verdict``, docs/verdicts.md) must call the candidate a clear winner by
   ``min_effect``, else the defaults are kept.
3. **main**: every shard left, with the confirmed config; where the last run's engines run it already
   (the confirmation's last run was that config's), they go on with no restart (``harness.batch.launch``).

Quality guard: a config that changes an output-changing knob (``tune_config.OUTPUT_CHANGING``)
runs its shards into ``tune/provisional/`` beside a probe (``probe_requests`` sampled requests,
greedy), which the engine defaults' trial ran too; only if the probe's token agreement with
the defaults' is at least ``min_agreement`` are its shards moved into the job's output,
otherwise they are left for the final config (and counted as discarded).

Pruning (``batch.tune.prune``, ``harness.batch.tune.tune_prune``): each trial reports its fed-engine rate as
its shards commit; one clearly behind the finished trials at the same shard stops being handed shards, its
shards in flight commit (job output), the study is told ``PRUNED``, and the shards it did not run go to the
next run. The engine defaults' trial is never pruned.

``kill -9`` at any point: committed shards stay, the study (``tune/study.db``) marks the cut
trial failed (or pruned, where the pruner had stopped it), the run log (``tune/runs.jsonl``) keeps
every finished run, and the rerun goes on from there (a cut run's remaining shards go to the next run).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from engines.base import Request
from engines.worker import classify_failure
from harness.batch.job.job import ShardsRun, shard_records
from harness.batch.job.plan import Plan
from harness.batch.job.shards import Index
from harness.batch.job.state import JobState, write_whole
from harness.batch.tune.tune_config import output_changing, sampler_config
from harness.batch.tune.tune_predict import NO_PREDICTION, full_engine_rate, predict_rest, save_run
from harness.batch.tune.tune_prune import DEFAULTS_SEED, Reporter, accepts_hook, make_pruner, reporting_points
from harness.batch.tune.tune_runs import (RunLog, RunRecord, concurrency, confirm_shards, probe_requests, sample_order,
                                     sample_requests, sample_summary, shards_per_run)
from harness.core.errors import TroughputError
from harness.run.stepmodels import REPLAYABLE
from harness.steps.predict import prediction_columns
from harness.quality.agreement import columns as agreement_columns
from harness.report.sequential import SequentialPlan
from harness.report.verdict import INSUFFICIENT, Verdict
from harness.tune.best import leaders
from harness.tune.seeds import enqueue_seeds
from harness.tune.space import SearchSpace
from harness.tune.study import make_sampler

log = logging.getLogger("troughput.batch.tune")
STUDY = "in-job"
# run_phase(plan, target, shards, probe, on_commit=None): ``on_commit`` (``run_shards``) is passed only to a trial's
# run with the pruner on, and only where the run_phase takes it (``tune_prune.accepts_hook``)
PhaseRunner = Callable[..., ShardsRun]
PRUNED = optuna.trial.TrialState.PRUNED


@dataclass
class Outcome:
    """What the tuning phase and the main phase did: the runs this invocation made, and the row's columns."""

    runs: list[ShardsRun] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)


class InJobTuning:
    """One invocation of a tuned job: what is left of the trials, the confirmation and the main phase."""

    def __init__(self, plan: Plan, state: JobState, index: Index, plan_for: Callable[..., Plan],
                 run_phase: PhaseRunner, base: dict[str, Any]):
        self.plan, self.state, self.index = plan, state, index
        self.tune = plan.tune
        self.plan_for, self.run_phase, self.base = plan_for, run_phase, base
        self.root = state.root / "tune"
        self._adopt_folder()
        self.log = RunLog(self.root)
        self.order = sample_order(index.shards(plan.shard_size), int(self.tune.get("seed") or 0))
        self.k = shards_per_run(self.tune, index, plan.shard_size)
        self.space = SearchSpace(self.tune["space"])
        self.outcome = Outcome()
        self.reference: dict[str, list[int]] | None = None
        self.sizes: dict[str, int] = {}   # shards per confirmation run, a side (``_confirm_sizes``); {}: no confirmation
        self.study: optuna.Study | None = None
        self.pruning = self._pruning()

    def _pruning(self) -> bool:
        """Whether trials report to the pruner (``batch.tune.prune``); why not, and too few points, in the log."""
        kind = self.tune.get("prune") or "none"
        if kind == "none":
            return False
        if self.plan.scale == "ray":
            log.info("batch.tune.prune=%s: not on Ray (a run is one pipeline that runs its shards to the end): every "
                     "trial runs to its end", kind)
            return False
        if not accepts_hook(self.run_phase):
            log.warning("batch.tune.prune=%s: this run_phase takes no on_commit hook: every trial runs to its end",
                        kind)
            return False
        points = reporting_points(self.k, self.plan.shard_size, self.plan.in_flight, self.plan.replicas)
        warmup = int(self.tune.get("prune_warmup", 2))
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
        study = self.study = self._study()
        self._trials(study)
        chosen, verdict = self._confirm(study)
        tuning_s = time.monotonic() - t0
        left = [i for i in range(self.index.shards(self.plan.shard_size)) if i not in self.state.committed()]
        requests_left = sum(shard_records(self.index, self.plan.shard_size, i) for i in left)
        prediction = self._predict_rest(chosen, requests_left)
        if prediction.get("predicted_rest_s"):
            log.info("the rest of the job (%d requests) predicted at %.0f s of generation (%s)", requests_left,
                     prediction["predicted_rest_s"], prediction["prediction_note"])
        if left:
            self._run("main", "main", chosen, set(left))
        self.outcome.columns = self._columns(chosen, verdict, prediction, tuning_s)
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
        enqueue_seeds(study, {**self.tune, "seeds": seeds}, self.space, self.base, self._sample_summary(),
                      self.plan.model["local_dir"])
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
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING,
                  PRUNED)
        while len(study.get_trials(deepcopy=False, states=states)) < budget:
            if not self._room_for_a_trial():
                log.warning("the tuning budget (batch.tune.max_share) has no room for another trial and the "
                            "confirmation (runs cut by kills, or a reference run, took shards): no more trials")
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
            if self.tune.get("min_agreement") is not None and self._changes_output(values) \
                    and self._reference() is None:  # the defaults' probe is cut or failed: measure it first, once
                if any(r.kind in ("trial", "reference") and not r.values and r.status != "ok" for r in self.log.read()):
                    self._fail(study, trial, "quality guard: no reference outputs (the job's own config failed), so "
                                             "an output-changing config cannot be checked: not run")
                    continue
                self._run("reference", "reference (the job's own config)", {}, self._next_shards())
            label = f"trial {trial.number}" + (f" ({seed})" if seed else "")
            # every trial reports, the defaults' too (the others are compared with them; the pruner never stops them)
            reporter = Reporter(study, trial, label, values) if self.pruning else None
            record = self._run("trial", label, values, self._next_shards(), trial=trial.number, reporter=reporter)
            trial.set_user_attr("status", record.status)
            if record.status == "failed":
                if classify_failure(record.reason) == "oom":
                    trial.set_user_attr("status", "oom")
                    self.space.learn_memory_edge(values)
                self._fail(study, trial, record.reason)
                continue
            if record.status == "rejected":
                trial.set_user_attr("infeasible", record.reason)
            floor = self.tune.get("min_agreement")
            if floor is not None:
                agreement = record.agreement if record.agreement is not None else \
                    0.0 if self._changes_output(values) else 1.0  # only output-changing configs are probed
                trial.set_constraint("agreement", float(floor) - agreement)
            if record.pruned_at:
                study.tell(trial, state=PRUNED)
                continue
            study.tell(trial, record.value or 0.0)

    def _confirm(self, study: optuna.Study) -> tuple[dict[str, Any], Any]:
        """The candidate against the defaults, alternating; returns the config the job continues with."""
        candidates = [t for t in leaders(study, 1) if t.params and t.user_attrs.get("seed") != DEFAULTS_SEED]
        if not candidates:
            log.info("no trial config beat the engine defaults in the trials: the job goes on with the defaults")
            return {}, None
        candidate = candidates[0]
        values = dict(candidate.params)
        own = [r for r in self.log.read() if r.kind in ("trial", "reference") and not r.values]
        if own and not any(r.status == "ok" for r in own):  # the job's config cannot run: nothing to confirm against
            why = own[-1].reason.splitlines()[0][:300] if own[-1].reason else own[-1].status
            log.warning("the job's own config failed (%s): trial %d's config goes on unconfirmed", why, candidate.number)
            return values, (candidate.number, None, f"the job's own config failed ({why}): the best trial, unconfirmed")
        rounds, cap = int(self.tune["confirm_rounds"]), int(self.tune.get("max_confirm_rounds") or 0)
        self.sizes = self._confirm_sizes(candidate.number, values)
        r = 0
        while True:
            started = len(self._confirm_records(candidate.number)) > 2 * r   # round r begun (a kill cut it)
            if r >= rounds and not started:   # the rounds asked for are in: more only while undecided, to the cap
                verdict = self._verdict(candidate.number)
                more = self._more_rounds(verdict, r, cap)
                if not more:
                    break
                log.info("confirmation: %s after %d rounds (%s): one more round", verdict.verdict, r, more)
            sides = ("default", "candidate") if r % 2 == 0 else ("candidate", "default")
            for side in sides:
                done = [x for x in self._confirm_records(candidate.number) if x.side == side]
                if len(done) > r:
                    continue
                self._run("confirm", f"confirm {side} {r + 1}", {} if side == "default" else values,
                          self._next_shards(self.sizes[side]), trial=candidate.number, side=side)
            r += 1
        log.info("confirmation: trial %d ÷ engine defaults: %s, %s (%d rounds)", candidate.number,
                 verdict.interval_text(), verdict.verdict, r)
        return (values if verdict.winner == "a" else {}), (candidate.number, verdict, verdict.verdict)

    def _verdict(self, trial: int) -> Verdict:
        mine = self._confirm_records(trial)
        rates = {side: [x.rate for x in mine if x.side == side and x.rate] for side in ("candidate", "default")}
        return self.confirm_plan().judge(rates["candidate"], rates["default"], min_effect=float(self.tune["min_effect"]))

    def confirm_plan(self) -> SequentialPlan:
        """The confirmation's looks: the first after ``confirm_rounds`` runs a side, then one per added round up
        to ``max_confirm_rounds``; each look's verdict at its group-sequential level (docs/verdicts.md), so the
        added rounds keep the whole confirmation's false-winner rate at 5% or under (simulated for the default plan,
        3 to 6 runs a side, and the others of ``sequential.SIMULATED``)."""
        rounds = int(self.tune["confirm_rounds"])
        return SequentialPlan(rounds, max(rounds, int(self.tune.get("max_confirm_rounds") or rounds)))

    def _more_rounds(self, verdict: Verdict, done: int, cap: int) -> str | None:
        """Why one more confirmation round, after ``done``; ``None`` (and why not, in the log) if none.

        One more while the rule has not decided: too close to call (and the rounds it likely needs at this
        spread fit under the cap ``max_confirm_rounds``), or insufficient data because a run failed (at most
        one a side so far); and the cap is not reached and the budget (``max_share``) holds two more runs."""
        if verdict.decided:
            return None
        if done >= cap:
            log.info("confirmation: %s after %d rounds, the cap (batch.tune.max_confirm_rounds=%d): no more rounds",
                     verdict.verdict, done, cap)
            return None
        if verdict.verdict == INSUFFICIENT:   # a failed run: another round, unless a side keeps failing
            if min(verdict.n_a, verdict.n_b) < done - 1:
                log.info("confirmation: %s: more than one failed run on a side, no more rounds", verdict.reason)
                return None
            why = "a run failed: " + verdict.reason
        elif (needed := self.confirm_plan().runs_to_decide(verdict)) is None:   # at the plan's levels, to the cap
            log.info("confirmation: %s; no look up to batch.tune.max_confirm_rounds=%d would decide it at this "
                     "estimate and spread: no more rounds", verdict.reason, cap)
            return None
        else:
            why = f"about {needed} rounds a side would likely decide it"
        if not self._room_for(sum(self.sizes.values())):   # _confirm set the sizes before the first round
            log.info("confirmation: %s, but the tuning budget (batch.tune.max_share) holds no further round",
                     verdict.verdict)
            return None
        return why

    # ---- one run ----------------------------------------------------------------------------------

    def _run(self, kind: str, label: str, values: dict[str, Any], shards: set[int], trial: int | None = None,
             side: str | None = None, reporter: Reporter | None = None) -> RunRecord:
        """Run ``shards`` with ``values``' config, one engine start; record it; fold it into the invocation.
        ``reporter``: a trial's, which reports to the pruner as its shards commit and may stop the run."""
        phase = {"phase": kind, "run": label, "config": values}
        plan = self.plan_for(values, phase)
        guarded = self.tune.get("min_agreement") is not None and kind == "trial" and self._changes_output(values)
        probe = self._probe() if self.tune.get("min_agreement") is not None and kind in ("trial", "reference") and \
            (guarded or not values) else None
        target = JobState(self.root / "provisional" / label.replace(" ", "_")) if guarded else self.state
        if guarded:
            target.adopt(plan)
        log.info("%s: %s on %d shards", label, values or "engine defaults", len(shards))
        t0 = time.monotonic()
        before = target.committed()
        run = self.run_phase(plan, target, shards, probe, on_commit=reporter) if reporter is not None else \
            self.run_phase(plan, target, shards, probe)
        wall = time.monotonic() - t0
        committed = sorted(target.committed() - before)
        record = RunRecord(kind=kind, label=label, values=values, shards=committed, requests=run.requests_ok,
                           output_tokens=run.output_tokens, probe_output_tokens=run.probe_output_tokens,
                           generation_s=run.generation_s, startup_s=run.startup_s, wall_s=wall, trial=trial,
                           side=side, engines_kept=run.engines_kept,
                           concurrency=concurrency(run.engine_limits, run.lengths,
                                                   self.plan.shard_size if run.serial else None))
        if reporter is not None and reporter.pruned:
            record.pruned_at, record.reason = reporter.pruned["at"], reporter.reason()
        limits = run.engine_limits[0] if run.engine_limits else {}
        saved = save_run(self.root, label, run.steps.snapshot(),
                         {**plan.knobs, **{f"engine_{k}": v for k, v in limits.items() if v}},
                         max(len(run.engine_limits), 1), committed)
        if saved and kind in ("trial", "confirm") and committed and limits.get("scheduler") == REPLAYABLE \
                and not record.pruned_at:   # a pruned trial's value is told to no one
            record.full_engine_tok_s, record.full_engine_beyond, record.full_engine_note = full_engine_rate(
                self.root, label, self._requests(set(committed)), self.plan.model, self._hardware())
        run.finishes, run.engine_limits, run.lengths = [], [], []  # measured; not carried into the job's totals
        failed = [f"shard {i}: {why}" for i, why in sorted(run.shards_failed.items())] + run.errors
        if failed:
            record.status, record.reason = "failed", "; ".join(failed)[:1000]
        if probe is not None:
            self._judge(record, run, values, guarded)
        if guarded:
            self._settle(record, target)
            run = self._counted(run, record)
        self.log.append(record)
        self.outcome.runs.append(run)
        log.info("%s: %s", label, _describe(record))
        return record

    def _judge(self, record: RunRecord, run: ShardsRun, values: dict[str, Any], guarded: bool) -> None:
        """The probe's agreement with the defaults' (the defaults' own probe is the reference)."""
        path = self.root / "probe-reference.json"
        if not values:
            if run.probe and not path.exists():
                path.write_text(json.dumps(run.probe))
            return
        if not guarded:
            return
        reference = self._reference()
        if reference is None or run.probe is None:
            record.agreement = None
            if record.status == "ok":
                record.status, record.reason = "rejected", "quality guard: no probe outputs to compare (the " \
                    "engine defaults' or this config's probe did not run)"
            return
        record.agreement = agreement_columns(run.probe, reference).get("quality.token_agreement")
        floor = float(self.tune["min_agreement"])
        if record.status == "ok" and (record.agreement is None or record.agreement < floor):
            record.status = "rejected"
            record.reason = f"quality guard: token agreement {record.agreement:.4f} < min {floor}"

    def _settle(self, record: RunRecord, provisional: JobState) -> None:
        """A guarded trial's shards join the job's output if it passed; else they are left for the final config."""
        shards = record.shards
        if record.status == "ok":
            record.shards = [i for i in shards if self.state.take(provisional, i)]
            record.discarded = sorted(set(shards) - set(record.shards))
        else:
            record.shards, record.discarded = [], shards

    def _counted(self, run: ShardsRun, record: RunRecord) -> ShardsRun:
        """A guarded run as the job's row counts it: only the shards that joined the job's output."""
        counted = ShardsRun(generation_s=run.generation_s, startup_s=run.startup_s,
                            peak_worker_rss_bytes=run.peak_worker_rss_bytes, probe_output_tokens=run.probe_output_tokens)
        for i in record.shards:
            counted.add(self.state.meta(i))
        return counted

    def _reference(self) -> dict[str, list[int]] | None:
        if self.reference is None:
            path = self.root / "probe-reference.json"
            if path.exists():
                self.reference = json.loads(path.read_text())
        return self.reference

    # ---- helpers ----------------------------------------------------------------------------------

    def _next_shards(self, k: int | None = None) -> set[int]:
        """The next ``k`` (default: the run size ``self.k``) shards of the sample order that are not committed yet."""
        committed = self.state.committed()
        return set([i for i in self.order if i not in committed][:k or self.k])

    def _room_for_a_trial(self) -> bool:
        """Whether one more trial and the whole confirmation (at the trials' run size) fit in ``max_share``."""
        return self._room_for(self.k * (1 + 2 * int(self.tune["confirm_rounds"])))

    def _room_for(self, shards: int) -> bool:
        """Whether ``shards`` more shards of runs fit in ``max_share`` of the job's shards (``_room_left``)."""
        return shards <= self._room_left()

    def _room_left(self) -> int:
        """Shards of the tuning budget (``max_share`` of the job's) not taken yet, counting every shard the tuning
        runs so far took (runs cut by a kill took theirs too)."""
        budget = int(float(self.tune["max_share"]) * self.index.shards(self.plan.shard_size))
        taken = self.state.committed() | {i for r in self.log.read() for i in r.discarded}  # no main phase yet
        return budget - len(taken)

    def _confirm_sizes(self, trial: int, values: dict[str, Any]) -> dict[str, int]:
        """Shards per confirmation run for each side (``tune_runs.confirm_shards``), from what each side's config
        ran at once in the trials and the budget left; fixed in ``tune/confirm.json`` at the first round, so a
        resumed job confirms with the sizes it began with."""
        path = self.root / "confirm.json"
        if path.exists():
            saved = json.loads(path.read_text())
            if saved.get("trial") == trial:
                return saved["shards"]
        records = [r for r in self.log.read() if r.kind in ("trial", "reference") and r.status == "ok"]
        seats = {side: max((r.concurrency for r in records if r.values == config and r.concurrency), default=None)
                 for side, config in (("default", {}), ("candidate", values))}
        target, rounds, room = float(self.tune.get("confirm_fill") or 0), int(self.tune["confirm_rounds"]), \
            self._room_left()
        shards = confirm_shards(self.k, self.plan.shard_size, room, rounds, seats, target)
        per_round = sum(shards.values())
        names = {"default": "the job's config", "candidate": f"trial {trial}"}
        fills = [f"{names[side]} {shards[side] * self.plan.shard_size / c:.1f}×" for side, c in seats.items() if c]
        log.info("confirmation: runs of %d shards (the job's config) and %d (trial %d)%s; room for %d added rounds",
                 shards["default"], shards["candidate"], trial,
                 f": {', '.join(fills)} what its engines ran at once in the trials (batch.tune.confirm_fill={target:g})"
                 if len(fills) == 2 and target > 0 else " (batch.tune.confirm_fill: no fill known for both sides, or 0)",
                 max(0, room - rounds * per_round) // per_round)
        if rounds * per_round > room:
            log.warning("confirmation: %d rounds of %d shards go %d shards over the budget left (%d; a reference run "
                        "or runs cut by a kill took shards beyond the trials' own)", rounds, per_round,
                        rounds * per_round - room, room)
        write_whole(path, json.dumps({"trial": trial, "shards": shards, "concurrency": seats, "fill_target": target}))
        return shards

    @staticmethod
    def _cut(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether a failed trial was cut by a kill while it ran (not failed by its config)."""
        return "reason" not in trial.user_attrs and f"ran_{trial.number}" not in study.user_attrs

    def _confirm_records(self, trial: int) -> list[RunRecord]:
        return [r for r in self.log.read() if r.kind == "confirm" and r.trial == trial]

    def _changes_output(self, values: dict[str, Any]) -> bool:
        return bool(output_changing(values))

    def _probe(self) -> list[Request]:
        """The quality probe: requests of the last shard in the sample order (``tune_runs.probe_requests``)."""
        return probe_requests(self.plan, self.index, self.order[-1], int(self.tune["probe_requests"]),
                              int(self.tune["probe_max_tokens"]))

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

    def _predict_rest(self, chosen: dict[str, Any], requests_left: int) -> dict[str, Any]:
        """The rest of the job, replayed with the step model of the chosen config's runs (``tune_predict``)."""
        labels = [r.label for r in self.log.read() if r.kind in ("trial", "confirm") and r.values == chosen
                  and r.status == "ok" and r.full_engine_tok_s]   # runs whose steps the simulator replays
        main = self.plan_for(chosen, {})
        try:
            return predict_rest(self.root, labels, self._requests, requests_left, self.plan.model, self._hardware(),
                                main.knobs, max(main.replicas, 1))
        except (OSError, ValueError, MemoryError, RuntimeError) as e:
            log.warning("no prediction of the rest of the job: %s", e)
            return dict(NO_PREDICTION)

    def _columns(self, chosen: dict[str, Any], verdict: Any, prediction: dict[str, Any],
                 tuning_s: float) -> dict[str, Any]:
        """The row's ``tune.*`` columns: every run, the winner and its margin, the overhead, the prediction."""
        records = self.log.read()
        tuning = [r for r in records if r.kind != "main"]
        main = [r for r in records if r.kind == "main"]
        # each run's time outside generation (worker start with the engine's import, engine start, stop); the
        # job's first start is one any job pays, every later one (the main phase's included) is the tuning's
        restarts_s = sum(max(0.0, r.wall_s - r.generation_s) for r in records[1:])
        discarded = sorted({i for r in tuning for i in r.discarded})
        discarded_s = sum(r.generation_s * len(r.discarded) / max(len(r.discarded) + len(r.shards), 1)
                          for r in tuning)
        # speed lost on the other configs: a run's time beyond what the chosen config's runs take per token
        mine = [r for r in tuning if r.status == "ok" and r.values == chosen and r.rate]
        rate = sum(r.output_tokens + r.probe_output_tokens for r in mine) / sum(r.generation_s for r in mine) \
            if mine else None
        shortfall_s = sum(max(0.0, r.generation_s - (r.output_tokens + r.probe_output_tokens) / rate)
                          for r in tuning if r.status == "ok" and r.values != chosen) if rate else 0.0
        job_s = sum(r.wall_s for r in records)
        trial_no, v, said = verdict if verdict else (None, None, "no trial config beat the job's own in the trials")
        states = [t.state for t in self.study.get_trials(deepcopy=False)] if self.study is not None else []
        pruned, ran = states.count(PRUNED), states.count(PRUNED) + states.count(optuna.trial.TrialState.COMPLETE)
        return {
            "tune.space": self.tune.get("space_name"), "tune.shards_per_run": self.k, "tune.confirm_shards": self.sizes or None,
            "tune.runs": [r.to_dict() for r in records],
            "tune.trials": sum(r.kind == "trial" for r in records),
            "tune.confirm_runs": sum(r.kind == "confirm" for r in records),
            "tune.chosen": chosen or "engine defaults", "tune.candidate_trial": trial_no,
            "tune.verdict": said,
            "tune.margin": v.ratio if v else None, "tune.margin_interval": v.interval_text() if v else None,
            "tune.restarts": sum(not r.engines_kept for r in records[1:]), "tune.restart_s": restarts_s,
            "tune.engine_start_s": sum(r.startup_s or 0.0 for r in tuning),
            "tune.discarded_shards": len(discarded), "tune.discarded_s": discarded_s,
            "tune.prune": (self.tune.get("prune") or "none") if self.pruning else "none",
            "tune.pruned_trials": pruned, "tune.pruned_share": pruned / ran if ran else None,
            # shards the pruned trials did not run (their runs' size less what they committed): later runs ran them
            "tune.pruned_shards_left": sum(max(0, self.k - len(r.shards)) for r in tuning if r.pruned_at),
            "tune.shortfall_s": shortfall_s,
            "tune.overhead_s": restarts_s + discarded_s + shortfall_s,
            "tune.overhead_share": (restarts_s + discarded_s + shortfall_s) / job_s if job_s else None,
            "tune.phase_s": sum(r.wall_s for r in tuning), "tune.phase_share": sum(r.wall_s for r in tuning) / job_s
            if job_s else None,
            "tune.phase_requests": sum(r.requests for r in tuning),
            "tune.this_invocation_tuning_s": tuning_s,
            **{f"tune.{k}": v for k, v in prediction.items()},
            "tune.measured_rest_s": main[-1].generation_s if main else None,
            "tune.measured_rest_tok_s": main[-1].rate if main else None,
            **prediction_columns("rest_of_job", prediction.get("predicted_rest_s"),
                                 main[-1].generation_s if main else None, "seconds",
                                 prediction.get("prediction_interval"), prediction.get("prediction_note")),
            **_full_engine_record(mine, main[-1] if main else None),
            "tune.trial_statistics": _statistics(tuning),
        }


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
    valued = [r for r in tuning if r.kind == "trial" and r.status == "ok"]
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
    if record.agreement is not None:
        text += f", agreement {record.agreement:.4f}"
    if record.engines_kept:
        text += ", on the last run's engines (no restart)"
    return text + (f" ({record.reason[:200]})" if record.reason else "")
