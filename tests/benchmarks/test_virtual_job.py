"""The virtual-clock driver (benchmarks/virtual_engine.py, virtual_job.py) can fail: every shard committed once, a
true step cost the tuner's step model can only approximate, jobs of 10^5 requests on bounded work, determinism,
and decisions that do not read a start's seconds. Small jobs of the short ``backlog`` workload; no engine runs."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from benchmarks.virtual_engine import Backlog, Truth, scheduler_config, simulate, steady_of
from benchmarks.virtual_job import MainCache, VirtualEngine, VirtualState, job_setup, run_virtual_job
from harness.steps.fit import fit_step_model, run_errors
from harness.steps.store import trace_frame

SMALL = ["batch.tune.trials=3", "batch.tune.max_share=0.2", "batch.tune.min_run_requests=32"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return job_setup(4000, 20, SMALL, work=tmp_path_factory.mktemp("setup"))


@pytest.fixture(scope="module")
def truth():
    return Truth.llama()


def _engine(size: int, truth: Truth, seed: int = 0, restart: float = 60.0, **kw) -> VirtualEngine:
    kw.setdefault("cap", 1000)
    return VirtualEngine(Backlog.draw(size, "backlog"), kw.pop("shard_size", 20), truth, restart, 0.02, 0.05, seed,
                         **kw)


def test_run_phase_commits_each_shard_once_and_reports_a_run(setup, truth, tmp_path) -> None:
    engine = _engine(4000, truth)
    state = VirtualState(tmp_path)
    plan = replace(setup.plan, phase={"phase": "trial", "run": "trial 0", "config": {}})
    run = engine.run_phase(plan, state, {0, 1, 2}, None, on_shard=lambda *_: None)   # an unknown keyword: ignored
    assert state.committed() == {0, 1, 2} and run.shards_run == 3 and run.requests_ok == 60
    assert run.output_tokens == int(engine.backlog.output[:60].sum())
    assert run.startup_s == 60.0 and run.generation_s > 0 and engine.clock == pytest.approx(60.0 + run.generation_s)
    assert len(run.steps) > 0 and run.engine_limits[0]["scheduler"] == "vllm-v1" and len(run.lengths) == 60
    trace = run.steps.snapshot()
    assert sum(trace["dt"]) == pytest.approx(run.generation_s), "the trace's steps are the run's generation"
    assert set(trace["context"]) == {-1.0}, "a vLLM engine core in a child process does not say its context"
    again = engine.run_phase(plan, state, {2, 3}, None)
    assert state.committed() == {0, 1, 2, 3} and again.shards_run == 1, "a committed shard is not committed twice"
    main = replace(setup.plan, phase={"phase": "main", "run": "main", "config": {}})
    kept = engine.run_phase(main, state, {4}, None)
    assert kept.engines_kept and kept.startup_s is None, "the main phase goes on with engines that run its config"


def test_every_shard_of_a_job_is_committed_once_and_its_clock_is_its_runs(setup, truth) -> None:
    engine = _engine(4000, truth, replayable=False)
    result = run_virtual_job(setup, engine, seed=3)
    shards = [r for r in result.runs if r.status == "ok"]
    assert sum(r.requests for r in shards) == 4000, "every request once, in one run"
    assert result.job_s == pytest.approx(sum(r.start_s + r.generation_s for r in result.runs))
    assert result.columns["tune.phase_s"] == pytest.approx(result.tuning_s), "the tuner reads the virtual clock"
    assert [r.kind for r in result.runs][-1] == "main" and result.runs[-1].requests > 1000, "the main phase aggregated"


def test_the_true_cost_is_not_the_step_model_s_form(truth) -> None:
    """Fitted on one run's steps (no noise at all), the step model misses them step by step, and misses a held-out
    run of another config by a nonzero, bounded share of its total (the tuner fits each config on its own runs)."""
    from engines.steptrace import StepRecorder
    from harness.steps.fit import coefficients, features

    backlog = Backlog.draw(2400, "backlog")

    def run(knobs: dict, lo: int, hi: int):
        config, caching = scheduler_config({"max_model_len": 8192, **knobs}, truth_model(), truth_spec())
        recorder = StepRecorder(clock=lambda: 0.0)
        simulate(config, backlog.prompt[lo:hi], backlog.output[lo:hi], [partial(truth.seconds, caching=caching)],
                 1.0, 0.0, 7, recorder)
        return trace_frame([{"steps": recorder.snapshot()}])

    fitted = run({"max_num_seqs": 128}, 0, 600)
    model = fit_step_model({"a": fitted})
    design = features(fitted, [k for k, _ in model.knees])
    relative = design.matrix @ coefficients(model, design.names) / fitted["dt"].to_numpy() - 1
    assert np.sqrt(np.mean(relative ** 2)) > 0.01, "a noiseless truth the fit could express would be fitted exactly"
    same = run_errors(model, {"b": run({"max_num_seqs": 128}, 600, 1200)})["b"]
    other = run_errors(model, {"c": run({"max_num_seqs": 512}, 1200, 2400)})["c"]
    assert abs(same) < 0.01, "a run of the fitted config: its total within 1%"
    assert 0.01 < abs(other) < 0.15, other


def test_a_long_run_is_its_steady_run_plus_the_rest_at_its_rate(truth) -> None:
    backlog = Backlog.draw(3000, "backlog")
    assert np.array_equal(Backlog.draw(1000, "backlog").output, backlog.output[:1000]), "sizes share their start"
    # 64 sequences at once: 1,000 requests are 15 engine fills (the driver's cap is 10,000 with about 250 at once)
    config, caching = scheduler_config({"max_model_len": 8192, "max_num_seqs": 64}, truth_model(), truth_spec())
    price = [partial(truth.seconds, caching=caching)]
    [first] = simulate(config, backlog.prompt[:1000], backlog.output[:1000], price, 1.0, 0.05, 1)
    [whole] = simulate(config, backlog.prompt, backlog.output, price, 1.0, 0.05, 1)
    estimate = steady_of(first, backlog.output[:1000]).seconds_for(int(backlog.output.sum()))
    assert abs(estimate / whole.seconds - 1) < 0.03


def test_a_job_of_100000_requests_simulates_a_bounded_number_of_them(truth, tmp_path) -> None:
    setup = job_setup(100_000, 50, ["batch.tune.trials=3", "batch.tune.max_share=0.04",
                                     "batch.tune.min_run_requests=128"], work=tmp_path)
    engine = _engine(100_000, truth, shard_size=50, cap=2000, mode="gpu", replayable=False)
    assert engine.backlog.prompt.nbytes + engine.backlog.output.nbytes == 8 * 100_000, "lengths, not token lists"
    result = run_virtual_job(setup, engine, seed=0)
    tuning = sum(r.requests for r in result.runs if r.kind != "main")
    mains = sum(r.kind == "main" for r in result.runs)
    assert sum(r.requests for r in result.runs) == 100_000
    assert engine.simulated <= tuning + mains * engine.prefix_shards(setup.plan) * 50 \
        and engine.cache.simulated <= 2 * 2000, "step by step: the tuning runs, each main run's start and one capped " \
                                                "run a config; the rest of the main phase at its steady rate"


def test_the_tuner_values_a_virtual_run_by_the_full_engine_rate_of_its_trace(setup, truth, tmp_path) -> None:
    """The tuner's own path (``tune_predict``): save the run's trace, fit it, replay its requests with the engine
    kept full. Against the true steady rate of that config: within 10%."""
    from harness.batch.tune.tune_predict import full_engine_rate, save_run
    from benchmarks.virtual_job import VirtualTuning

    engine = _engine(4000, truth)
    knobs = {**setup.plan.knobs, "max_num_seqs": 32}
    plan = replace(setup.plan, knobs=knobs, phase={"phase": "trial", "run": "trial 1", "config": {"x": 1}})
    run = engine.run_phase(plan, VirtualState(tmp_path / "state"), set(range(10)), None)   # 200 requests
    limits = run.engine_limits[0]
    assert save_run(tmp_path, "trial 1", run.steps.snapshot(), {**knobs, **{f"engine_{k}": v for k, v in
                                                                           limits.items() if v}}, 1, list(range(10)))
    tuning = VirtualTuning.__new__(VirtualTuning)
    tuning.backlog, tuning.plan = engine.backlog, setup.plan
    requests = tuning._requests(set(range(10)))
    assert [len(r.prompt_token_ids) for r in requests] == engine.backlog.prompt[:200].tolist()
    rate, _, note = full_engine_rate(tmp_path, "trial 1", requests, setup.plan.model,
                                     {"name": "gpu", "kind": "gpu", "peak_flops_bf16": 1e12, "bandwidth_bytes_s": 1e11,
                                      "memory_bytes": float(1 << 40)})
    config, caching = scheduler_config(knobs, truth_model(), truth_spec())
    true = engine.steady(knobs, config, caching).rate
    assert note is None and abs(rate / true - 1) < 0.10, (rate, true)


def test_a_job_is_determined_by_its_seed(setup, truth) -> None:
    def job(seed: int) -> list:
        result = run_virtual_job(setup, _engine(4000, truth, seed=seed, replayable=False), seed)
        return [(r.label, r.config, r.requests, r.generation_s) for r in result.runs]

    assert job(1) == job(1)
    assert job(1) != job(2)


def test_the_tuner_s_decisions_do_not_read_a_start_s_seconds(setup, truth) -> None:
    """So a job run at one restart cost is priced at the others (benchmarks/virtual_tuning.py); a tuner that reads
    them fails this, and the driver's --per-restart runs a job per restart cost instead."""
    def job(restart: float) -> list:
        result = run_virtual_job(setup, _engine(4000, truth, seed=5, restart=restart, replayable=False), 5)
        return [(r.label, r.config, r.requests, r.generation_s) for r in result.runs]

    assert job(30.0) == job(120.0)


def test_in_aa_every_config_runs_as_the_defaults_and_slower_ones_slower(setup, truth, tmp_path) -> None:
    cache = MainCache()
    plans = {"default": {}, "candidate": {"engine.canonical.max_seqs": 16}}
    seconds = {}
    for mode, slowdown in (("aa", 0.0), ("slower", 0.1)):
        for side, values in plans.items():
            engine = _engine(4000, truth, seed=9, mode=mode, slowdown=slowdown, cache=cache)
            plan = replace(setup.plan, phase={"phase": "trial", "run": side, "config": values})   # the defaults' knobs
            seconds[mode, side] = engine.run_phase(plan, VirtualState(tmp_path / f"{mode}{side}"), {0, 1}, None) \
                .generation_s
    assert seconds["aa", "candidate"] == pytest.approx(seconds["aa", "default"])
    assert seconds["slower", "candidate"] == pytest.approx(seconds["slower", "default"] / 0.9)


def test_run_phase_tells_on_commit_in_commit_order_and_a_stop_leaves_the_rest(setup, truth, tmp_path) -> None:
    """``on_commit`` after each shard, in the order they finish, ``left`` falling to 0 as the pool hands the last
    ones over (100 shards of 20: the pool keeps 512 requests queued, so 30 would all be handed over before one
    commits); a true return: the shards handed over finish, the rest stay uncommitted, the clock stops there."""
    seen = []
    engine = _engine(4000, truth, seed=2)
    plan = replace(setup.plan, phase={"phase": "trial", "run": "trial 0", "config": {}})
    state = VirtualState(tmp_path / "a")
    run = engine.run_phase(plan, state, set(range(100)), on_commit=lambda so_far: seen.append(so_far) or False)
    assert [s.shards for s in seen] == list(range(1, 101)) and state.committed() == set(range(100))
    done = [state.metas[i]["done_at_s"] for i in sorted(state.metas, key=lambda i: state.metas[i]["done_at_s"])]
    assert done == sorted(done) and run.generation_s == pytest.approx(max(done))
    assert seen[0].left > 0 and seen[-1].left == 0 and all(a.left >= b.left for a, b in zip(seen, seen[1:]))
    assert all(b.step_s >= a.step_s and b.step_tokens >= a.step_tokens for a, b in zip(seen, seen[1:]))  # one step: ties
    assert seen[-1].step_s == pytest.approx(run.generation_s), "one engine: its steps are its generation"

    stop_at = 3
    engine = _engine(4000, truth, seed=2)
    state = VirtualState(tmp_path / "b")
    told = []
    cut = engine.run_phase(plan, state, set(range(100)), on_commit=lambda so_far: told.append(so_far.left)
                           or so_far.shards == stop_at)
    assert len(told) == stop_at, "no hook call after the stop"
    handed = 100 - told[-1]
    assert stop_at < len(state.committed()) <= handed and cut.shards_run == len(state.committed())
    assert cut.generation_s < run.generation_s and engine.clock == pytest.approx(60.0 + cut.generation_s)
    assert max(state.metas[i]["done_at_s"] for i in state.metas) == pytest.approx(cut.generation_s)


def test_an_aggregated_run_counts_the_shards_past_its_simulated_start_as_left(setup, truth, tmp_path) -> None:
    """A run past ``cap`` simulates its start step by step; ``left`` there counts the shards past that start too (it
    counted the start's own only, so an engine defaults' trial, stopped on its blocks once ``left`` fell under a
    run's size, was cut to its simulated start: 35 of its 114 shards at 10^6 requests)."""
    seen: list[int] = []
    engine = _engine(4000, truth, seed=2, cap=1000)
    plan = replace(setup.plan, phase={"phase": "trial", "run": "trial 0", "config": {}})
    shards = 150   # 3,000 requests: aggregated
    start = engine.prefix_shards(plan)
    engine.run_phase(plan, VirtualState(tmp_path), set(range(shards)),
                     on_commit=lambda so_far: seen.append(so_far.left) or False)
    assert start < shards and len(seen) == shards and seen[-1] == 0
    assert all(a >= b for a, b in zip(seen, seen[1:])), "left never grows"
    assert seen[0] >= shards - start, "at the first commit the shards past the simulated start are all left"
    # a main run after it simulates as many shards step by step as this trial ran: its looks read no more blocks
    # than this trial gave (merged: tune_confirm.merge), each from simulated steps, not from steady draws
    assert engine.prefix_shards(plan) >= shards > start


class _SlowInMain(VirtualEngine):
    """Every config but the defaults 30% faster in its trial and 30% slower in the main phase."""

    def slower(self, plan) -> float:
        if not plan.phase.get("config"):
            return 1.0
        return 1 / 0.7 if plan.phase.get("phase") == "main" else 0.7


def test_a_candidate_slower_in_the_main_phase_is_switched_back_to_the_defaults(truth, tmp_path) -> None:
    """Engines of 32 sequences (every config runs the job's knobs here): the pool keeps 64 requests queued for one,
    so a stop leaves most of a 4,000-request job to the defaults, and a trial of 260 requests gives the defaults'
    side blocks of 128 full steps (an engine of 1,024 holds a trial whole and gives none: then there is nothing to
    confirm against and the main phase runs the defaults from its start)."""
    setup = job_setup(4000, 20, [*SMALL, "engine.canonical.max_seqs=32"], work=tmp_path)
    engine = _SlowInMain(Backlog.draw(4000, "backlog"), 20, truth, 60.0, 0.02, 0.05, 4, mode="slower", cap=1000,
                         replayable=False)
    result = run_virtual_job(setup, engine, seed=4)   # raises unless every shard is committed
    cols = result.columns
    assert cols["tune.candidate"] and cols["tune.switched"] and cols["tune.chosen"] == "engine defaults"
    assert cols["tune.confirm.action"] == "switch to the engine defaults" and cols["tune.confirm.looks"] >= 1
    assert cols["tune.confirm.reason"].endswith("a clear loser"), cols["tune.confirm.reason"]
    mains = [r for r in result.runs if r.kind == "main"]
    assert [bool(r.config) for r in mains] == [True, False], "the candidate, stopped, then the rest on the defaults"
    assert mains[1].start_s > 0, "the switch is an engine start"
    shards = sum(r.requests for r in result.runs) // 20
    assert shards == 200 and mains[0].requests < mains[1].requests, "every shard once; the candidate ran few"
    assert engine.runs[-1].label == "main (engine defaults)"


def truth_model():
    from engines.perfmodel import ModelSpec

    return ModelSpec.load(None, "llama-3.1-8b")


def truth_spec():
    from benchmarks.virtual_engine import hardware_spec

    return hardware_spec()


def test_another_gpu_prices_its_true_steps_with_its_own_figures_and_gets_its_vllm_defaults(tmp_path) -> None:
    from benchmarks.virtual_engine import hardware_spec
    from benchmarks.virtual_tuning import DRIVER, parse, settings
    from engines.stepmodel import StepShape

    h100, a100 = Truth.llama(truth_model()), Truth.llama(truth_model(), hardware_spec("a100_80gb"))
    assert (a100.flops, a100.bandwidth) == (312e12, 2.039e12)
    assert h100 == Truth.llama(truth_model(), hardware_spec("h100")), "the H100's when no spec is given"
    assert replace(a100, flops=h100.flops, bandwidth=h100.bandwidth) == h100, "the same form: only the figures differ"
    for shape in (StepShape(seqs=256, decode=256, tokens=256, kv_tokens=256 * 2000),
                  StepShape(seqs=8, decode=0, prefill=8192, tokens=8192, pairs=8192 * 1024)):
        assert a100.seconds(shape) > h100.seconds(shape)
    config, _ = scheduler_config({"max_model_len": 8192}, truth_model(), hardware_spec("a100_80gb"))
    assert (config.max_seqs, config.max_tokens_per_step) == (256, 8192), "vLLM's defaults on an A100"
    setup = job_setup(4000, 20, SMALL, work=tmp_path, hardware="a100_80gb")
    assert setup.base["hardware"]["spec"]["name"] == "a100_80gb"
    assert "hardware" not in settings(parse(["--out", str(tmp_path)])), "the H100 is the default: not named"
    assert settings(parse(["--out", str(tmp_path)]))["driver"] == DRIVER, "an older driver's stored jobs are rerun"
    assert settings(parse(["--out", str(tmp_path), "--hardware", "l40s"]))["hardware"] == "l40s"
