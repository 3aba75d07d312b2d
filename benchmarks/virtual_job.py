"""A job on a virtual clock: the real in-job tuner (``InJobTuning``) with runs from the virtual engine.

The tuner is the real one, built the way ``troughput-batch`` builds it (the composed config of
``engine=vllm hardware=<h100 or another> model=llama-3.1-8b tune=<space>``, ``build_plan``, ``phase_planner``,
``tune_settings``); three things are injected, all here:

- ``VirtualEngine.run_phase(plan, target, shards, on_commit=None)``: the one place an engine runs
  (``launch._tuned``'s ``run_phase``). It simulates the shards' requests (``benchmarks.virtual_engine``) with
  the plan's knobs on one engine fed shard by shard as the pool feeds it (``Feed``: ``pool.takes_another``),
  commits each shard into the job state at the step its last request finishes, and tells ``on_commit`` a
  ``SoFar`` then (the tuner's ``Blocks``: a trial's pruner, the main phase's confirmation); a true return stops
  the handover as ``run_shards`` does (the shards in flight finish, the rest stay uncommitted, the clock stops at
  the last of them). It returns a ``ShardsRun`` as a real run reports it: output tokens, ``generation_s`` and
  ``startup_s`` on the virtual clock, the engine's limits and a step trace. A run starts its engine
  (``restart_s``) unless it is the main phase and the last run ran its config already (``launch``:
  ``pool.runs_as``). Extra keyword arguments are accepted and ignored.
- ``VirtualState``: the job state in memory (a 10^6-request job has 10^4 shards and no output to keep); its
  ``tune/`` folder (run log, Optuna study, traces) is real, under ``root``.
- ``VirtualTuning``: ``InJobTuning`` with the sampled shards' requests made from lengths (there is no input
  file: a prompt is ``[index, 1, 2, ...]``, unique per request and below 2^24, so the tuner's replays, which
  shift each further pass by 2^24, never hit the prefix cache on another request).

The virtual clock: each run adds its start (unless kept) and its generation; the tuner reads it through its
``time.monotonic`` (``virtual_time``), so its own ``tune.*`` columns are on the virtual clock too. The tuner's
decisions use only what a run reports: rates from tokens and ``generation_s``, the step traces it fits.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time as _time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from benchmarks.virtual_engine import (CAP, HARDWARE, MODEL, ROOT, Backlog, Steady, Truth, config_seed, hardware_spec,
                                       limits, Feed, Simulated, scheduler_config, simulate_fed, steady_of)
from engines.sim_scheduler import SchedulerConfig
from engines.base import KnobError, Request
from engines.perfmodel import ModelSpec
from engines.steptrace import StepRecorder
from harness.batch.job.job import ShardsRun, SoFar
from harness.batch.job.plan import Plan
from harness.batch.job.shards import Index
from harness.batch.job.state import JobState
from harness.batch.tune.tune_confirm import BLOCK_STEPS
from harness.batch.tune.tune_runs import concurrency
from harness.batch.tune.tuning import InJobTuning
from harness.report.verdict import MIN_RUNS

log = logging.getLogger("troughput.virtual")

META_DIR = ROOT / ".cache" / "troughput" / "models" / "llama-3.1-8b-meta"
SPACE = "vllm_h100"
MODES = ("gpu", "aa", "slower")


class VirtualState(JobState):
    """A job state whose committed shards live in memory (``committed`` is a snapshot, rebuilt after commits)."""

    def __init__(self, root: str | Path):
        super().__init__(root)
        self.metas: dict[int, dict[str, Any]] = {}
        self._snapshot: frozenset[int] | None = frozenset()

    def adopt(self, plan: Plan) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def committed(self) -> frozenset[int]:  # type: ignore[override]
        if self._snapshot is None:
            self._snapshot = frozenset(self.metas)
        return self._snapshot

    def commit(self, index: int, outputs: list[dict], errors: list[dict], meta: dict[str, Any]) -> bool:
        if index in self.metas:
            return False
        self.metas[index] = meta
        self._snapshot = None
        return True

    def take(self, other: JobState, index: int) -> bool:
        if index in self.metas:
            return False
        return self.commit(index, [], [], other.meta(index))

    def meta(self, index: int) -> dict[str, Any]:
        return self.metas[index]


@dataclass
class VirtualRun:
    """One run on the virtual clock."""

    kind: str
    label: str
    config: dict[str, Any]
    requests: int
    output_tokens: int
    generation_s: float
    start_s: float           # 0 where the engines were kept
    status: str = "ok"


@dataclass
class MainCache:
    """Each config's ``Steady`` (its first ``CAP`` requests of the job, simulated once): shared by every job over
    one backlog, so a config's long run is simulated once and reused across seeds (their noise is their own)."""

    entries: dict[str, Steady] = field(default_factory=dict)
    host_s: float = 0.0
    simulated: int = 0   # requests simulated step by step for them


class VirtualEngine:
    """The engine of one virtual job: ``run_phase`` simulates a run; ``clock`` is the job's virtual seconds so far.

    Modes: ``gpu``: each run with its plan's knobs; ``aa``: every config runs as the engine defaults (the same
    knobs, the same truth), so every candidate equals the defaults in speed; ``slower``: as ``aa``, with every
    config other than the defaults ``slowdown`` slower (its steps' seconds ÷ (1 − slowdown)). In ``aa`` and
    ``slower`` the job's ``plan_for`` gives every config the defaults' knobs (``defaults_plan_for``), so the
    tuner's replays replay what ran; a config is then known by its values (``plan.phase["config"]``).

    ``replayable=False``: the engine does not say it schedules like vLLM V1 (``engine_limits[0]["scheduler"]``
    is None) and keeps no trace, so the tuner values each trial by its plain rate and predicts nothing (its path
    for engines whose steps the simulator cannot replay): the cheap path of the A/A and slower-candidate counts.
    """

    def __init__(self, backlog: Backlog, shard_size: int, truth: Truth, restart_s: float, run_sigma: float,
                 step_sigma: float, seed: int, mode: str = "gpu", slowdown: float = 0.0, replayable: bool = True,
                 cache: MainCache | None = None, cap: int = CAP, model: ModelSpec | None = None,
                 spec: dict[str, Any] | None = None):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.backlog, self.size, self.truth, self.cap = backlog, shard_size, truth, cap
        self.restart_s, self.run_sigma, self.step_sigma, self.seed = restart_s, run_sigma, step_sigma, seed
        self.mode, self.slowdown, self.replayable = mode, slowdown, replayable
        self.cache = cache if cache is not None else MainCache()
        self.model, self.spec = model or ModelSpec.load(None, MODEL), spec or hardware_spec()
        self.rng = np.random.default_rng([seed, 40])
        self.clock = 0.0
        self.runs: list[VirtualRun] = []
        self.last: str | None = None   # the config the engines up now run
        self.simulated = 0             # requests simulated step by step (the rest aggregated)
        self.trial_shards = 0          # the largest finished trial run's shards (``prefix_shards``)
        self.in_flight = 2             # batch.in_flight of the steady runs (the plans' default)

    def now(self) -> float:
        return self.clock

    def identity(self, plan: Plan) -> str:
        """What tells two configs apart: the knobs (``gpu``), else the tuner's values (the knobs are the defaults')."""
        if self.mode == "gpu":
            return knobs_key(plan.knobs, plan.replicas)
        return json.dumps(plan.phase.get("config") or {}, sort_keys=True, default=str)

    def slower(self, plan: Plan) -> float:
        """A config's multiplier on its steps' seconds: 1 / (1 − slowdown) for a config other than the defaults
        in mode ``slower``, else 1."""
        return 1.0 / (1.0 - self.slowdown) if self.mode == "slower" and plan.phase.get("config") else 1.0

    def feed(self, plan: Plan | None = None) -> Feed:
        """The pool's handover to one engine at the plan's ``in_flight`` (the steady runs: ``self.in_flight``)."""
        if plan is None:
            return Feed.pool(self.in_flight, self.size)
        seats = plan.knobs.get("max_num_seqs")
        return Feed.pool(int(plan.in_flight), self.size, int(seats) if isinstance(seats, (int, float)) else None)

    def run_phase(self, plan: Plan, target: JobState, shards: set[int],
                  on_commit: Callable[[SoFar], bool] | None = None, **_: Any) -> ShardsRun:
        """One run of ``shards`` (those not committed yet) on one engine fed as the pool feeds it (``Feed``:
        ``pool.takes_another``, checked after every step; ``simulate_fed``), each shard committed at the step its
        last request finishes and ``on_commit`` told then (``SoFar.left``: shards not handed over yet;
        ``step_tokens``/``step_s``: the decode tokens and seconds of the steps so far). A true return stops the
        handover: the shards handed over finish and commit, the rest stay uncommitted, and the run's generation
        ends at the last of them.

        A run of up to ``cap`` requests is simulated whole. A longer one (aggregated) takes
        ``steady.seconds_for`` × its run factor unless stopped; its start, where the looks are made and which is no
        steady state, is simulated step by step (``prefix_shards`` shards handed over, its factor, up to the first
        commit after the last of them is handed over); past that each commit, in index order, is a block of its
        shard's output tokens at ``exp(block_log_mean + block_log_sd·z) ÷ factor`` (the config's own steady
        blocks, ``Steady``; ``z`` a standard normal draw a block, the run's factor shared by its blocks), hands one
        more shard over, and finishes pro rata of the tokens between the prefix's end and the run's."""
        kind = str(plan.phase.get("phase", "run"))
        key = self.identity(plan)
        kept = kind == "main" and self.last == key   # launch: the main phase goes on with engines that run it
        factor = float(np.exp(self.run_sigma * self.rng.standard_normal())) * self.slower(plan)
        run_seed = int(self.rng.integers(1 << 31))
        run = ShardsRun(engines_kept=kept, startup_s=None if kept else self.restart_s)
        start = 0.0 if kept else self.restart_s
        committed = target.committed()
        order = sorted(i for i in shards if i not in committed)
        if not order:
            return run
        sizes = [min(self.size, len(self.backlog) - i * self.size) for i in order]
        bounds = np.cumsum([0, *sizes])
        index = self.backlog.indices(order, self.size)
        prompt, output = self.backlog.prompt[index], self.backlog.output[index]
        try:
            config, caching = scheduler_config(plan.knobs, self.model, self.spec)
        except (MemoryError, KnobError) as e:   # vLLM refuses to start: the start's time is spent, no shard runs
            why = f"engine start failed: {type(e).__name__}: {e}"
            run.shards_failed = {i: why for i in order}
            self._log(kind, plan, run, start, "failed")
            self.last = None
            return run
        said = limits(config)
        run.engine_limits = [{**said, "scheduler": said["scheduler"] if self.replayable else None}]
        out = [int(output[lo:hi].sum()) for lo, hi in zip(bounds[:-1], bounds[1:])]
        price = partial(self.truth.seconds, caching=caching)
        engines = max(int(plan.replicas), 1)
        stopped = [False]

        def commit(position: int, at: float, step_tokens: float, step_s: float, left: int, engine_s: float,
                   full: tuple[float, float, int], tell: bool = True) -> bool:
            lo, hi = int(bounds[position]), int(bounds[position + 1])
            meta = {"index": order[position], "requests": hi - lo, "ok": hi - lo, "failed": 0,
                    "prompt_tokens": int(prompt[lo:hi].sum()), "output_tokens": out[position], "engine_s": engine_s,
                    "done_at_s": at, **plan.phase}
            if not target.commit(order[position], [], [], meta):
                return False
            run.add(meta)
            if tell and on_commit is not None and not stopped[0]:
                stopped[0] = bool(on_commit(SoFar(shards=run.shards_run, left=left, engines=engines,
                                                  output_tokens=run.output_tokens, engine_s=run.engine_s,
                                                  step_tokens=step_tokens, step_s=step_s,
                                                  # one engine simulated for each: the engines' full steps summed
                                                  full_tokens=full[0] * engines, full_s=full[1] * engines,
                                                  full_steps=int(full[2] * engines))))
            return stopped[0]

        last = [0.0]

        def in_sim(position: int, at: float, step_tokens: float, step_s: float, left: int,
                   full: tuple[float, float, int]) -> bool:
            busy, last[0] = at - last[0], at   # engine-busy seconds since the previous commit, on this shard
            # ``left``: of the ``p`` shards simulated; an aggregated run's shards past its start are left too
            return commit(position, at, step_tokens, step_s, left + len(order) - p, busy, full)

        recorder = StepRecorder(clock=lambda: 0.0) if self.replayable and kind != "main" else None
        aggregated = len(index) > self.cap
        # an aggregated run no hook reads (the defaults' after a switch) needs no start of its own: its time is
        # ``steady.seconds_for`` × its factor either way
        p = (min(self.prefix_shards(plan), len(order)) if on_commit is not None else 0) if aggregated else len(order)
        sim, _ = simulate_fed(config, prompt[:bounds[p]], output[:bounds[p]], sizes[:p], price, self.feed(plan), factor,
                              self.step_sigma, run_seed, recorder, in_sim, hand_over=p)
        self.simulated += int(bounds[p])
        seconds = sim.seconds
        if aggregated and not stopped[0]:
            seconds = self._steady_rest(plan, config, caching, order, out, target, sim, p, factor, run_seed, commit)
        if not aggregated:
            run.lengths = list(zip(prompt.tolist(), output.tolist()))
        if stopped[0] and run.lengths:   # the requests of the shards it ran
            mine = target.committed()
            run.lengths = [pair for n, i in enumerate(order) if i in mine
                           for pair in run.lengths[bounds[n]:bounds[n + 1]]]
        run.steps = recorder or StepRecorder()
        run.generation_s = seconds
        self._log(kind, plan, run, start, "ok")
        self.last = key
        return run

    def _steady_rest(self, plan: Plan, config: SchedulerConfig, caching: bool, order: list[int], out: list[int],
                     target: JobState, head: Simulated, handed: int, factor: float, run_seed: int,
                     commit: Callable[..., bool]) -> float:
        """An aggregated run past its simulated start (``run_phase``): returns its generation seconds."""
        steady = self.steady(plan.knobs, config, caching)
        whole = steady.seconds_for(int(sum(out))) * factor
        mine = target.committed()
        rest = [n for n in range(len(order)) if order[n] not in mine]
        if not rest:
            return head.seconds
        t0, end = head.seconds, max(whole, head.seconds)
        tokens = np.cumsum([out[n] for n in rest], dtype=float)
        at = t0 + (end - t0) * tokens / tokens[-1]
        # a rate drawn for each block of BLOCK_STEPS full steps (the config's steady blocks), every step full here
        mean = steady.block_log_mean if steady.block_log_mean is not None else math.log(steady.rate)
        steps = np.cumsum([out[n] for n in rest], dtype=float) / (steady.decode_per_step or 1.0)
        block = ((steps - 1e-9) // BLOCK_STEPS).astype(int)
        draws = np.exp(mean + (steady.block_log_sd or 0.0)
                       * np.random.default_rng([run_seed, 7]).standard_normal(int(block[-1]) + 1)) / factor
        rates = draws[block]
        step_tokens = float(head.step_decode[-1]) + tokens
        step_s = float(head.step_end[-1]) + np.cumsum([out[n] for n in rest] / rates)
        full_mask = head.step_full if head.step_full is not None else np.zeros(len(head.step_end), bool)
        head_full = (float(np.diff(head.step_decode, prepend=0)[full_mask].sum()),
                     float(np.diff(head.step_end, prepend=0.0)[full_mask].sum()), int(full_mask.sum()))
        fulls = [(head_full[0] + float(tokens[j]), head_full[1] + float(step_s[j]) - float(head.step_end[-1]),
                  head_full[2] + int(steps[j])) for j in range(len(rest))]
        # ``handed``: what the simulated start handed over; after it, one more shard at each commit
        share = (end - t0) / tokens[-1]
        for j, n in enumerate(rest):
            # ``rest`` is in index order; the first ``handed + j`` positions were handed over by now, and the one
            # committing too (a start that committed all it handed over hands this one over as it commits)
            now = max(handed + j, n + 1)
            if commit(n, float(at[j]), float(step_tokens[j]), float(step_s[j]), len(order) - now, out[n] * share,
                      fulls[j]):
                # stopped: the shards handed over finish (one more was handed at each commit before this one)
                in_flight = [k for k in range(j + 1, len(rest)) if rest[k] < now]
                for k in in_flight:
                    commit(rest[k], float(at[k]), float(step_tokens[k]), float(step_s[k]), 0, out[rest[k]] * share,
                           fulls[k], tell=False)
                return float(at[in_flight[-1]]) if in_flight else float(at[j])
        return end

    def prefix_shards(self, plan: Plan) -> int:
        """The shards an aggregated run's start hands over in its step-by-step simulation: what the engine holds
        at most (``Feed.most``), plus the blocks the looks read, plus four. A block closes at a commit, so the looks
        read no more blocks than trial 0 gave (merged where it gave more than ``MIN_RUNS`` − 1 + ``confirm_looks``:
        ``tune_confirm.merge``), nor than its shards: the largest finished trial run's shards, or that count where
        none has finished."""
        looks = int((plan.tune or {}).get("confirm_looks") or 6)
        return self.feed(plan).most * max(int(plan.replicas), 1) + max(MIN_RUNS - 1 + looks, self.trial_shards) + 4

    def steady(self, knobs: dict[str, Any], config: SchedulerConfig, caching: bool) -> Steady:
        """The config's first ``cap`` requests of the job, simulated once with no run noise (cached by knobs)."""
        key = knobs_key(knobs)
        if key not in self.cache.entries:
            t0 = _time.perf_counter()
            n = min(self.cap, len(self.backlog))
            prompt, output = self.backlog.prompt[:n], self.backlog.output[:n]
            sizes = [min(self.size, n - i) for i in range(0, n, self.size)]
            sim, _ = simulate_fed(config, prompt, output, sizes, partial(self.truth.seconds, caching=caching),
                                  self.feed(), 1.0, self.step_sigma, config_seed(key))
            self.cache.entries[key] = steady_of(sim, output)
            seats = concurrency([limits(config)], list(zip(prompt.tolist(), output.tolist())))
            if seats and n < 8 * seats:   # fewer engine fills than that: its middle half is no steady state
                log.warning("steady run of %d requests for %s holds only %.1f engine fills (%.0f at once): its rate "
                            "is not a steady state's; raise the cap", n, key, n / seats, seats)
            self.cache.simulated += n
            self.cache.host_s += _time.perf_counter() - t0
        return self.cache.entries[key]

    def fixed_job(self, knobs: dict[str, Any]) -> float:
        """Generation seconds of the whole job on one config, no noise (the default and grid-best jobs)."""
        config, caching = scheduler_config(knobs, self.model, self.spec)
        return self.steady(knobs, config, caching).seconds_for(int(self.backlog.output.sum()))

    def _log(self, kind: str, plan: Plan, run: ShardsRun, start: float, status: str) -> None:
        if kind == "trial":
            self.trial_shards = max(self.trial_shards, run.shards_run)
        self.clock += start + run.generation_s
        self.runs.append(VirtualRun(kind, str(plan.phase.get("run", kind)), dict(plan.phase.get("config") or {}),
                                    run.requests_ok, run.output_tokens, run.generation_s, start, status))


def knobs_key(knobs: dict[str, Any], replicas: int = 1) -> str:
    return json.dumps({"knobs": knobs, "replicas": replicas}, sort_keys=True, default=str)


class VirtualTuning(InJobTuning):
    """``InJobTuning`` reading a sampled shard's requests from the backlog's lengths (the job has no input file)."""

    def __init__(self, backlog: Backlog, *args: Any, **kwargs: Any):
        self.backlog = backlog
        super().__init__(*args, **kwargs)

    def _requests(self, shards: set[int]) -> list[Request]:
        index = self.backlog.indices(sorted(shards), self.plan.shard_size)
        return [Request(id=f"v{i}", prompt_token_ids=[int(i), *range(1, int(self.backlog.prompt[i]))],
                        max_tokens=int(self.backlog.output[i])) for i in index]

    def _sample_summary(self) -> dict[str, Any]:
        prompt, output = self.backlog.of(self.order[:self.k], self.plan.shard_size)
        return {"requests": max(len(prompt), 1), "input_tokens_requested": int(prompt.sum()),
                "output_tokens_requested": int(output.sum())}



@contextmanager
def virtual_time(module: Any, now: Callable[[], float]) -> Iterator[None]:
    """``module.time.monotonic`` reads ``now`` (the virtual clock) while inside; everything else is ``time``'s."""
    real = getattr(module, "time", None)
    if real is None:
        yield
        return

    class Clock:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def monotonic() -> float:
            return now()
    module.time = Clock()
    try:
        yield
    finally:
        module.time = real


def metadata_folder() -> Path:
    """A metadata-only Llama-3.1-8B folder (config, a vocabulary-free tokenizer), as search_efficiency.py's."""
    META_DIR.mkdir(parents=True, exist_ok=True)
    config = json.loads((ROOT / "conf" / "architectures" / f"{MODEL}.json").read_text())
    (META_DIR / "config.json").write_text(json.dumps({k: v for k, v in config.items() if not k.startswith("_")}))
    (META_DIR / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {}}, "added_tokens": []}))
    return META_DIR


@dataclass
class Setup:
    """The composed job config and its plan, made once per tuner settings (Hydra's compose takes a second)."""

    cfg: Any
    plan: Plan
    base: dict[str, Any]


def job_setup(records: int, shard_size: int, overrides: list[str], space: str = SPACE,
              work: Path | None = None, hardware: str = HARDWARE) -> Setup:
    """``troughput-batch``'s config and plan for a virtual job of ``records`` requests (the engine is vLLM on
    ``hardware``, ``conf/hardware/<name>.yaml``, serving Llama-3.1-8B; the input file is a one-line stand-in: the
    backlog is the virtual engine's)."""
    from omegaconf import OmegaConf

    from harness.batch.cli import build_plan
    from harness.batch.job.source import apply_source
    from tests.conftest import compose

    work = Path(work or tempfile.mkdtemp(prefix="virtual-job-"))
    work.mkdir(parents=True, exist_ok=True)
    stand_in = work / "stand-in.jsonl"
    stand_in.write_text(json.dumps({"custom_id": "v0", "method": "POST", "url": "/v1/completions",
                                    "body": {"model": MODEL, "prompt": [1, 2], "max_tokens": 2}}) + "\n")
    cfg = compose(f"batch.input={stand_in}", f"batch.output_dir={work / 'out'}", "engine=vllm", f"hardware={hardware}",
                  f"model={MODEL}", f"model.path={metadata_folder()}", f"tune={space}", "batch.sampling=benchmark",
                  f"batch.shard_size={shard_size}", f"run.results_dir={work / 'results'}", *overrides,
                  config_name="batch")
    cfg, origin = apply_source(cfg)
    plan = build_plan(cfg, origin)
    plan = replace(plan, input_digest=f"virtual:{records}")
    return Setup(cfg, plan, OmegaConf.to_container(cfg, resolve=True))


def defaults_plan_for(job: Plan) -> Callable[..., Plan]:
    """A ``plan_for`` whose plans all carry the job's own knobs (``aa``/``slower``: every config runs as the
    defaults; the values stay the tuner's, in ``phase["config"]``)."""
    from harness.batch.job.job import job_id

    def same(values: dict[str, Any], phase: dict[str, Any]) -> Plan:
        return replace(job, knobs=dict(job.knobs), phase=phase, job=job_id(job))
    return same


@dataclass
class JobResult:
    """A virtual job: its runs, the tuner's row columns, and its totals on the virtual clock."""

    runs: list[VirtualRun]
    columns: dict[str, Any]
    job_s: float
    host_s: float

    @property
    def tuning_s(self) -> float:
        return sum(r.start_s + r.generation_s for r in self.runs if r.kind != "main")

    @property
    def starts(self) -> int:
        return sum(r.start_s > 0 for r in self.runs)

    @property
    def chosen(self) -> dict[str, Any]:
        chosen = self.columns.get("tune.chosen")
        return chosen if isinstance(chosen, dict) else {}


def run_virtual_job(setup: Setup, engine: VirtualEngine, seed: int, root: Path | None = None,
                    keep: bool = False) -> JobResult:
    """One job through the real tuner: trials, the main phase confirmed as it runs (and switched back to the
    defaults where the looks say so), all on ``engine``'s virtual clock."""
    from harness.batch.tune import tuning as tuning_module
    from harness.batch.tune.tune_config import phase_planner

    root = Path(root or tempfile.mkdtemp(prefix="virtual-job-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        plan = replace(setup.plan, output_dir=str(root), tune={**setup.plan.tune, "seed": seed})
        plan_for = phase_planner(setup.cfg, plan) if engine.mode == "gpu" else defaults_plan_for(plan)
        state = VirtualState(root)
        index = Index(records=len(engine.backlog), duplicates={}, digest=plan.input_digest)
        t0 = _time.perf_counter()
        with virtual_time(tuning_module, engine.now):
            outcome = VirtualTuning(engine.backlog, plan, state, index, plan_for, engine.run_phase, setup.base).run()
        host = _time.perf_counter() - t0
        shards = index.shards(plan.shard_size)
        if len(state.committed()) != shards:
            raise RuntimeError(f"the virtual job committed {len(state.committed())} of {shards} shards")
        return JobResult(engine.runs, outcome.columns, engine.clock, host)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
