"""Run a job's shards: convert, order, dispatch to a pool, turn results into output lines, commit.

``run_shards`` is the same on one node and in each SLURM array task (a subset of the shards):
the driver converts the next shard while the engines generate the previous ones, and a shard
counts only once it is committed (``commit_shard``, which ``batch.scale=ray``'s commit stage
calls too).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engines.steptrace import StepRecorder, occupancy
from harness.batch.job.convert import MODEL_NOT_FOUND, Item, convert_shard
from harness.batch.job.images import image_resolver
from harness.batch.job.output import ENGINE_FAULT, failure, success
from harness.batch.job.plan import Plan
from harness.batch.job.progress import Progress
from harness.batch.job.shards import Index, iter_shards
from harness.batch.job.state import JobState
from harness.core.tokens import TextTokenizer
from harness.ordering.policies import apply_ordering
from harness.workloads.records import Options

log = logging.getLogger(__name__)
TIMED_PHASES = ("trial",)  # in-job tuning runs whose requests' lengths are kept (``tune_runs.concurrency``)


@dataclass
class ShardsRun:
    """What one invocation did (shards committed before it are not counted)."""

    shards_run: int = 0
    shards_failed: dict[int, str] = field(default_factory=dict)
    requests_ok: int = 0
    requests_failed: int = 0
    requests_other_model: int = 0  # of the failed: requests naming a model the job does not serve (error lines)
    prompt_tokens: int = 0
    output_tokens: int = 0
    engine_s: float = 0.0          # engine-busy seconds, summed over shards (their measured wall_s)
    engine_idle_s: float = 0.0     # seconds an engine waited with nothing fed, summed (shard boundaries, driver)
    engine_steps: int | None = None  # engine steps since start, summed over engines, where the engine counts them
    #                                  (``engine_counted``; else the row takes the steps the shards' traces hold)
    steps_by_engine: dict[str, int] = field(default_factory=dict)  # each engine's own count, its latest
    traced_steps: int = 0            # steps in the shards' step traces
    occupancy_steps: int = 0         # of those, the steps whose engine's capacity is known ...
    running_share: float = 0.0       # ... and the sum over them of running ÷ capacity (``occupancy``)
    generation_s: float = 0.0      # engines up (the last one) to the last commit
    startup_s: float | None = None  # the slowest engine's start
    peak_worker_rss_bytes: int = 0
    errors: list[str] = field(default_factory=list)  # failures that are no shard's (an array task that died)
    engine_limits: list[dict[str, Any]] = field(default_factory=list)  # per engine started: its max_num_seqs and
    #                                  kv_cache_tokens where it says (``tune_runs.concurrency``)
    lengths: list[tuple[int, int]] = field(default_factory=list)  # (prompt, output tokens) per request, kept for an
    #                                  in-job tuning's runs (``tune_runs.concurrency``)
    steps: StepRecorder = field(default_factory=StepRecorder)  # the engines' steps (bounded; harness.steps.store)
    fault_hooks: list[str] = field(default_factory=list)  # what engines started with a test hook set said of it
    #                                  (``engines.faults.announce``): the row's ``engine_info.fault_hook``
    serial: bool = False           # an engine ran a shard at a time (no ``feeder()``): at most a shard at once
    engines_kept: bool = False     # it went on with the previous run's engines (no start: no ``startup_s``)
    started_ahead: bool = False    # its workers were started before it was asked for (an in-job tuning's first run)

    def add(self, meta: dict[str, Any]) -> None:
        """Count one shard this invocation committed (its ``meta.json``)."""
        self.shards_run += 1
        self.requests_ok += meta["ok"]
        self.requests_failed += meta["failed"]
        self.requests_other_model += int(meta.get("other_model") or 0)
        self.prompt_tokens += meta["prompt_tokens"]
        self.output_tokens += meta["output_tokens"]
        self.engine_s += float(meta["engine_s"])
        self.engine_idle_s += float(meta.get("idle_before_s") or 0.0)
        self.traced_steps += int(meta.get("engine_steps") or 0)
        self.hooked([meta.get("fault_hook")])   # on Ray, from the actor
        if meta.get("occupancy") is not None:
            self.occupancy_steps += int(meta["engine_steps"])
            self.running_share += float(meta["occupancy"]) * int(meta["engine_steps"])

    def hooked(self, notes: Any) -> None:
        """Keep what engines said of a test hook set (``engines.faults.announce``), each note once, in order."""
        self.fault_hooks += [n for n in dict.fromkeys(notes) if n and n not in self.fault_hooks]

    def engine_counted(self, engine: str, steps: Any) -> None:
        """An engine's own count of its steps since it started (``measured.engine_steps``, where the engine counts
        them: vLLM), as of a shard it finished. ``engine_steps`` is each engine's latest (largest) count, summed
        over engines: one rule on one node (an engine per worker) and on Ray (an engine per actor process,
        ``harness.batch.scale.ray_job.tally``), so both rows' ``engine_steps`` come from the engines' own counters."""
        if steps is None:
            return
        self.steps_by_engine[engine] = max(self.steps_by_engine.get(engine, 0), int(steps))
        self.engine_steps = sum(self.steps_by_engine.values())

    @property
    def occupancy(self) -> float | None:
        """Mean running sequences ÷ the engine's ``max_num_seqs``, over every traced step of every shard (steps
        weighted alike; each shard's own in its meta); ``None`` where no step trace knows its capacity."""
        return self.running_share / self.occupancy_steps if self.occupancy_steps else None

    def to_dict(self) -> dict[str, Any]:
        """As JSON data (an array task's part), its step trace as columns (bounded, ``StepRecorder``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "steps"}
        return {**json.loads(json.dumps(data)), "shards_failed": {str(k): v for k, v in self.shards_failed.items()},
                "steps": self.steps.snapshot()}

    @classmethod
    def sequential(cls, parts: list[ShardsRun], committed: set[int]) -> ShardsRun:
        """Runs one after another (an in-job tuning's phases): counts and seconds add up; a failure counts
        only while its shard is still uncommitted (a later run may have done it)."""
        total = cls()
        for part in parts:
            for key in ("shards_run", "requests_ok", "requests_failed", "requests_other_model", "prompt_tokens",
                        "output_tokens", "engine_s", "engine_idle_s", "generation_s", "traced_steps", "occupancy_steps", "running_share"):
                setattr(total, key, getattr(total, key) + getattr(part, key))
            total.startup_s = (total.startup_s or 0.0) + part.startup_s if part.startup_s is not None \
                else total.startup_s
            total.peak_worker_rss_bytes = max(total.peak_worker_rss_bytes, part.peak_worker_rss_bytes)
            total.shards_failed.update({i: why for i, why in part.shards_failed.items() if i not in committed})
            total.steps.extend(part.steps.snapshot())
            total.hooked(part.fault_hooks)
        if parts and (total.shards_failed or not parts[-1].shards_run):
            total.errors = [e for part in parts for e in part.errors]
        return total

    @classmethod
    def merged(cls, parts: list[dict[str, Any]]) -> ShardsRun:
        """Array tasks side by side: counts add up, seconds are the longest task's."""
        total = cls()
        for part in parts:
            for key in ("shards_run", "requests_ok", "requests_failed", "requests_other_model", "prompt_tokens",
                        "output_tokens", "engine_s", "engine_idle_s", "traced_steps", "occupancy_steps", "running_share"):
                setattr(total, key, getattr(total, key) + part.get(key, 0))
            total.shards_failed.update({int(k): v for k, v in part["shards_failed"].items()})
            total.generation_s = max(total.generation_s, part["generation_s"])
            total.startup_s = max(filter(None, [total.startup_s, part["startup_s"]]), default=None)
            total.peak_worker_rss_bytes = max(total.peak_worker_rss_bytes, part["peak_worker_rss_bytes"])
            total.errors += part.get("errors", [])
            total.steps.extend(part.get("steps"))
            if part.get("engine_steps") is not None:   # each task's engines are its own: their counts add up
                total.engine_steps = (total.engine_steps or 0) + int(part["engine_steps"])
            total.hooked(part.get("fault_hooks", []))
        return total


@dataclass(frozen=True)
class SoFar:
    """A run as one of its shards commits: what it has done so far, for an ``on_commit`` hook (``run_shards``)."""

    shards: int            # shards this run has committed, this one included
    left: int              # shards of the run not handed to an engine yet (0: the engines drain what they hold)
    engines: int           # engines the run feeds
    output_tokens: int     # of the shards committed
    engine_s: float        # their engine-busy seconds (``meta.engine_s``), summed over the engines
    step_tokens: float     # tokens of the decode steps the engines have reported so far (shards still in flight
    #                        included: each shard's result brings the steps since the previous one finished)
    step_s: float          # those steps' seconds, summed over the engines (0: the engines record no steps)
    full_tokens: float = 0.0  # of those, the steps of an engine running all it holds (requests waiting behind the
    full_s: float = 0.0       # step; an engine that does not say: while shards were left to hand over): their decode
    full_steps: int = 0       # tokens, seconds and count (``fed_rate``, ``tune_confirm.Blocks``)
    elapsed_s: float = 0.0    # the run's generation seconds so far (engines up to this commit)
    steps: Any = None         # the run's step recorder (``snapshot()``: every engine step it has reported so far)


def job_id(plan: Plan) -> str:
    """The job's id (in every output line's ``id``): a digest of its identity; a phase's plan carries the job's."""
    if plan.job:
        return plan.job
    return hashlib.sha256(json.dumps(plan.identity(), sort_keys=True).encode()).hexdigest()[:12]


def shard_records(index: Index, size: int, shard: int) -> int:
    return max(0, min(size, index.records - shard * size))


def run_shards(plan: Plan, state: JobState, index: Index, wanted: Callable[[int], bool], pool: Any,
               progress: bool = True, keep_open: bool = False,
               engines_kept: bool = False, on_commit: Callable[[SoFar], bool] | None = None) -> ShardsRun:
    """Run every wanted, uncommitted shard through ``pool`` (a ``LocalPool``; started here unless it is).

    ``keep_open``: leave the pool's workers up afterwards (unless a shard failed), for the next run.
    ``engines_kept``: the pool's engines are up already (``LocalPool.keep``): no ``started`` comes, generation
    starts when the first shard is handed over, and each engine's idle time before its first shard counts
    from then (not from the previous run's end).
    ``on_commit``: called with the run ``SoFar`` after each shard this run commits; when it returns true, no
    further shard is handed over: the shards in flight finish and commit, the rest stay uncommitted (an in-job
    tuning's pruner, ``harness.batch.tune.tune_prune``, and its confirmation, ``tune_confirm``).
    """
    size = plan.shard_size
    committed = state.committed()
    todo = {i for i in range(index.shards(size)) if wanted(i) and i not in committed}
    run = ShardsRun(engines_kept=engines_kept)
    if not todo:
        return run
    total = sum(shard_records(index, size, i) for i in range(index.shards(size)) if wanted(i))
    bar = Progress(total, total - sum(shard_records(index, size, i) for i in todo), progress)
    if not pool.started:
        pool.start()   # first: the workers import their engine while the runner loads its tokenizer
    try:
        runner = _Runner(plan, state, index, run, bar)
        runner.on_commit, runner.todo = on_commit, len(todo)
        runner.drive(pool, iter_shards(Path(plan.input), plan.format, size, todo.__contains__))
    finally:
        if not keep_open or run.shards_failed or not pool.any_alive():
            pool.close(kill=bool(run.shards_failed))
        bar.close()
    return run


class _Runner:
    """The loop of one invocation: keeps the pool full, commits what comes back."""

    def __init__(self, plan: Plan, state: JobState, index: Index, run: ShardsRun, bar: Progress):
        self.plan, self.state, self.index, self.run, self.bar = plan, state, index, run, bar
        self.tok = TextTokenizer(Path(plan.model["local_dir"]))
        source = Path(plan.input)
        self.options = Options(plan.default_max_tokens, plan.sampling, image_resolver(
            plan.model.get("image_token"), state.root / "images", source.parent, plan.allow_remote_images))
        self.job = job_id(plan)
        self.in_flight: dict[str, tuple[int, list[Item], int]] = {}  # shard dir -> (index, items, worker)
        self.retried: set[int] = set()
        self.started: dict[int, float] = {}
        self.failures: dict[int, str] = {}  # worker -> why it failed
        self.t_ready: float | None = None
        self.t_last: float | None = None
        self.inside_startup: dict[int, float] = {}  # worker -> replica start-up inside its shards (engine=ray)
        self.sign_of_life: dict[int, float] = {}  # worker -> when it last said anything (while its engine starts)
        self.first_fed: dict[int, tuple[str, float]] = {}  # on engines kept from the last run: worker -> its first
        #                                                   shard and when it was handed over
        self.on_commit: Callable[[SoFar], bool] | None = None  # see ``run_shards``
        self.todo = 0           # shards this run is to run
        self.dispatched = 0     # of those, handed to an engine (or committed at once: no request for an engine)
        self.stopped = False    # ``on_commit`` said stop: no further shard is handed over
        self.step_tokens = 0.0  # decode tokens and seconds of the engines' steps reported so far (``SoFar``)
        self.step_s = 0.0
        self.full = [0.0, 0.0, 0]  # of those, the full steps' decode tokens, seconds and count (``SoFar``)

    def drive(self, pool: Any, shards: Any) -> None:
        exhausted = False
        while True:
            while not exhausted and not self.stopped and pool.any_alive() and pool.free() > 0:
                shard = next(shards, None)
                if shard is None:
                    exhausted = True
                    break
                self._dispatch(pool, shard.index, convert_shard(
                    shard, self.plan.format, self.tok, self.options, self.index, Path(self.plan.input),
                    self.plan.max_model_len, self.plan.served_models()))
            if not self.in_flight and (exhausted or self.stopped or not pool.any_alive()):
                break
            got = pool.next_event(timeout=1.0)
            if got is not None:
                self.sign_of_life[got[0]] = time.monotonic()   # any event is a sign of life (an engine starting)
                self._handle(pool, *got)
            self._kill_stalled(pool)
        inside = max(self.inside_startup.values(), default=0.0)  # start-up, not generation, on the slowest worker
        if self.t_last is not None:
            self.run.generation_s = self._elapsed(self.t_last)
        if inside:
            self.run.startup_s = (self.run.startup_s or 0.0) + inside

    def _elapsed(self, until: float | None = None) -> float:
        """Generation seconds from the engines up to ``until`` (default: now), the slowest worker's start-up inside
        its shards taken off: ``SoFar.elapsed_s`` as shards commit, ``generation_s`` at the run's last commit."""
        if self.t_ready is None:
            return 0.0
        end = time.monotonic() if until is None else until
        return max(0.0, end - self.t_ready - max(self.inside_startup.values(), default=0.0))

    def _hand_over(self, shard_dir: str, index: int, items: list[Item], worker: int) -> None:
        """A shard is now in flight on ``worker``; an idle worker's stall clock starts now. On engines kept from
        the previous run (no ``started``), the first hand-over starts generation."""
        now = time.monotonic()
        if self.run.engines_kept and self.t_ready is None:
            self.t_ready = now
            self.bar.engines_up()
        if self.run.engines_kept:
            self.first_fed.setdefault(worker, (shard_dir, now))
        if all(owner != worker for _, _, owner in self.in_flight.values()):
            self.sign_of_life[worker] = now
        self.in_flight[shard_dir] = (index, items, worker)

    def _kill_stalled(self, pool: Any) -> None:
        """Kill a worker with shards in flight whose engine has been starting for ``plan.stall_timeout_s`` without
        a word (a hung start, or an in-job tuning's restart): its shards go to another worker once, else fail with
        the reason. A running engine is not watched: a request may rightly take longer than any fixed limit, and
        not every engine reports tokens as they come. A parked worker (``LocalPool``'s slots) holds no shard, so it
        is never watched."""
        limit = self.plan.stall_timeout_s
        if not limit:
            return
        now = time.monotonic()
        for worker in {owner for _, _, owner in self.in_flight.values()}:
            if not pool.alive[worker] or pool.up[worker] or worker in self.failures:
                continue
            since = self.sign_of_life.setdefault(worker, now)
            if now - since > limit:
                self.failures[worker] = (f"its engine was still starting after {now - since:.0f} s: it looks hung, so "
                                         f"troughput killed the worker (batch.stall_timeout_s={limit:g})")
                log.error("worker %d: %s", worker + 1, self.failures[worker])
                pool.kill(worker)

    def _dispatch(self, pool: Any, index: int, items: list[Item]) -> None:
        self.dispatched += 1
        requests = [item.request for item in items if item.request is not None]
        if not requests:  # nothing for the engine: commit the errors at once
            self._commit(index, items, {"completions": [], "errors": {}, "measured": {"wall_s": 0.0}})
            return
        shard_dir = self.state.scratch(index)
        with open(shard_dir / "requests.jsonl", "w") as f:
            for request in apply_ordering(requests, self.plan.ordering):
                f.write(json.dumps(request.to_dict()) + "\n")
        self._hand_over(str(shard_dir), index, items, pool.submit(shard_dir, index, len(requests)))

    def _handle(self, pool: Any, worker: int, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "started":
            self.started[worker] = time.monotonic()
            self.run.startup_s = max(self.run.startup_s or 0.0, event["start"].get("startup_s") or 0.0)
            extra = event["start"].get("extra") or {}
            self.run.hooked([extra.get("fault_hook")])
            self.run.engine_limits.append({k: extra.get(k) for k in ("max_num_seqs", "kv_cache_tokens", "block_size",
                                                                         "max_num_batched_tokens", "scheduler")})
            if len(self.started) == pool.engines:  # every worker not parked
                self.t_ready = time.monotonic()
                self.bar.engines_up()
        elif kind == "progress":
            self.bar.worker_progress(worker, int(event.get("done", 0)))
        elif kind == "phase" and event.get("phase") == "preloaded":
            if event.get("error"):  # not fatal: the slot's first start imports again and fails with its reason
                log.warning("parked worker %d could not import its engine ahead: %s", worker + 1, event["error"])
            else:
                log.info("parked worker %d imported %s in %.1f s", worker + 1, ", ".join(event.get("modules") or [])
                         or "nothing", float(event.get("seconds") or 0.0))
        elif kind == "shard_done":
            index, items, _ = self.in_flight.pop(event["shard"])
            result = json.loads((Path(event["shard"]) / "result.json").read_text())
            self.run.peak_worker_rss_bytes = max(self.run.peak_worker_rss_bytes, result.get("peak_rss_bytes") or 0)
            measured = result["measured"]
            first, fed_at = self.first_fed.get(worker, (None, 0.0))
            if event["shard"] == first and self.t_ready is not None:  # a kept engine's idle before this run's first
                #                                  shard began at the last run's end: count it from this run's start
                measured["idle_before_s"] = min(float(measured.get("idle_before_s") or 0.0), fed_at - self.t_ready)
            if self.plan.phase.get("phase") in TIMED_PHASES:
                self.run.lengths += [(int(c.get("prompt_tokens") or 0), len(c["output_token_ids"]))
                                     for c in result["completions"]]
                self.run.serial = self.run.serial or not measured.get("streams")
            meta = self._commit(index, items, result, worker)
            self.run.steps.extend(result.get("steps"))
            self._stepped(result.get("steps"), left=self.todo - self.dispatched)
            self.run.engine_counted(f"worker {worker + 1}", result["measured"].get("engine_steps"))
            startup = float(result["measured"].get("startup_s") or 0.0)
            self.inside_startup[worker] = self.inside_startup.get(worker, 0.0) + startup
            if self.t_ready is None:  # a pool without start events: the first result marks the engines up
                self.t_ready = time.monotonic() - float(result["measured"]["wall_s"])
            if meta is not None and self.on_commit is not None and not self.stopped:
                self.stopped = bool(self.on_commit(SoFar(
                    shards=self.run.shards_run, left=self.todo - self.dispatched, engines=max(int(pool.engines), 1),
                    output_tokens=self.run.output_tokens, engine_s=self.run.engine_s, step_tokens=self.step_tokens,
                    step_s=self.step_s, full_tokens=self.full[0], full_s=self.full[1], full_steps=self.full[2],
                    elapsed_s=self._elapsed(), steps=self.run.steps)))
        elif kind == "shard_failed":
            log.error("worker %d failed: %s", worker + 1, event.get("error"))
            self.failures[worker] = str(event.get("error"))
        elif kind == "exit":
            why = event.get("error") or self.failures.get(worker) or f"worker exited with code {event['code']}"
            if pool.parked[worker]:  # it held no shard; the next run gets new workers
                log.warning("parked worker %d ended: %s", worker + 1, why)
            self._orphaned(pool, worker, why)

    def _orphaned(self, pool: Any, worker: int, why: str) -> None:
        """Shards queued on a worker that ended: once more on a live worker, else failed (a rerun retries them)."""
        for shard_dir, (index, items, owner) in list(self.in_flight.items()):
            if owner != worker:
                continue
            del self.in_flight[shard_dir]
            if index not in self.retried and pool.any_alive():
                self.retried.add(index)
                count = sum(item.request is not None for item in items)
                self._hand_over(shard_dir, index, items, pool.submit(Path(shard_dir), index, count))
            else:
                self.run.shards_failed[index] = f"worker {worker + 1}: {why}"

    def _commit(self, index: int, items: list[Item], result: dict[str, Any],
                worker: int | None = None) -> dict[str, Any] | None:
        meta = commit_shard(self.plan, self.state, self.tok, self.job, index, items, result,
                            None if worker is None else {"worker": worker + 1})
        if meta is None:
            return None  # another worker or an earlier run committed it first
        self.t_last = time.monotonic()
        self.run.add(meta)
        self.bar.shard_done(-1 if worker is None else worker, len(items), meta["output_tokens"])
        return meta

    def _stepped(self, trace: dict[str, list[float]] | None, left: int) -> None:
        """Add a shard's steps to the decode tokens and step seconds so far, and its full steps (requests waiting
        behind the step; where the engine does not say, -1, while ``left`` shards were still to hand over) to
        theirs (``SoFar``)."""
        if not trace or not trace.get("weight"):
            return
        waiting = trace.get("waiting") or [-1.0] * len(trace["weight"])
        for w, d, dt, queued in zip(trace["weight"], trace["decode"], trace["dt"], waiting):
            self.step_tokens += w * d
            self.step_s += w * dt
            if queued > 0 or (queued < 0 and left > 0):
                self.full[0] += w * d
                self.full[1] += w * dt
                self.full[2] += int(w)


def commit_shard(plan: Plan, state: JobState, tok: Any, job: str, index: int, items: list[Item],
                 result: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Shard ``index``'s output and error lines from its items and the engine's ``result``, committed.

    Returns the shard's ``meta.json`` (``extra`` added to it), or ``None`` when the shard was
    already committed (by another worker or an earlier run) and this copy was dropped.
    """
    by_id = {c["id"]: c for c in result["completions"]}
    engine_errors: dict[str, str] = result["errors"]
    outputs, errors = [], []
    created = int(time.time())
    for item in items:
        if item.error is not None:
            errors.append(failure(job, item, item.error))
        elif item.request.id in engine_errors:  # type: ignore[union-attr]
            errors.append(failure(job, item, f"{plan.input}, line {item.line}: "
                                             f"{engine_errors[item.request.id]}", ENGINE_FAULT))
        else:
            completion = by_id[item.request.id]  # type: ignore[union-attr]
            text = completion.get("text")
            text = tok.decode(completion["output_token_ids"]) if text is None else text
            outputs.append(success(job, item, completion, text, plan.model_name, created))
    meta = {"index": index, "requests": len(items), "ok": len(outputs), "failed": len(errors),
            "other_model": sum(item.code == MODEL_NOT_FOUND for item in items),
            "prompt_tokens": sum(c["prompt_tokens"] for c in result["completions"]),
            "output_tokens": sum(len(c["output_token_ids"]) for c in result["completions"]),
            "engine_s": result["measured"]["wall_s"], "span_s": result["measured"].get("span_s"),
            "idle_before_s": result["measured"].get("idle_before_s"),
            # the engine's steps since the previous shard finished on it (overlapping shards: the stretch this one
            # ended), how many sequences they ran and that over what the engine holds
            "max_num_seqs": result["measured"].get("max_num_seqs"),
            "shards_in_engine": result["measured"].get("shards_in_engine"),  # once it was fed, itself included
            # the engine's own count of its steps since it started, as this shard finished (where it counts them):
            # on Ray the row's engine_steps is each engine's latest, summed (``ShardsRun.engine_counted``)
            "engine_steps_since_start": result["measured"].get("engine_steps"),
            **occupancy(result.get("steps"), result["measured"].get("max_num_seqs")),
            "first_line": items[0].line, "last_line": items[-1].line,
            **plan.phase, **(extra or {}), "committed_at": time.time()}
    return meta if state.commit(index, outputs, errors, meta) else None
