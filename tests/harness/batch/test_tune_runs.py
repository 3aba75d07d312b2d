"""The in-job tuning's run arithmetic: run sizes, fill, and the rest-of-job prediction replayed from step traces."""

from __future__ import annotations

import random

import json

import pytest

from harness.batch.tune.tune_runs import RunRecord, run_order

TINY_LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "vocab_size": 2048,
              "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


@pytest.fixture
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return path


def _lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [max(1, min(512, round(rng.lognormvariate(4.16, 1.0)))) for _ in range(n)]  # median 64, like backlog_cpu


def _curve(step) -> float:
    """A CPU-like step time that grows with the batch (not of the step model's form: quadratic)."""
    return 2e-3 + 2e-5 * step.tokens + 3e-8 * step.tokens ** 2 + 3e-5 * step.seqs


def _requests(lengths: list[int], seed: int, prefix: str = "r") -> list:
    from engines.base import Request

    rng = random.Random(seed)
    return [Request(f"{prefix}{i}", [rng.randrange(4, 2000) for _ in range(rng.randrange(16, 200))], n)
            for i, n in enumerate(lengths)]


def _context_curve(step) -> float:
    """``_curve`` and a cost quadratic in the KV cache in use (not of the model's form): steps at a context the short
    trials never reach cost more than a fit of theirs says."""
    return _curve(step) + 2e-12 * max(step.kv_tokens, 0.0) ** 2


def _slower_host(step) -> float:
    return 1.3 * _curve(step)


def _sim_run(requests: list, seats: int, cost=_curve) -> tuple[dict, float]:
    """A run on an engine whose steps cost ``cost``: its step trace and its seconds."""
    from engines.sim_scheduler import Scheduler, SchedulerConfig
    from engines.steptrace import StepRecorder

    recorder = StepRecorder(clock=lambda: 0.0)
    config = SchedulerConfig(max_seqs=seats, max_tokens_per_step=4096, chunked_prefill=True, prefix_caching=True,
                             block_size=16, num_blocks=200_000, max_model_len=1024)
    result = Scheduler(config).run([r.prompt_token_ids for r in requests], [r.max_tokens for r in requests], cost,
                                   on_step=lambda s, dt, p: recorder.record(running=s.seqs, decode=s.decode,
                                                                            prefill=s.prefill, kv_tokens=s.kv_tokens,
                                                                            dt=dt, end=0.0))
    return recorder.take(), result.seconds


def _draining_runs(root, label: str, knobs: dict, cost=_curve) -> list[list]:
    """Three 192-request runs on 512 seats (each one draining batch), saved as ``<label> 0..2`` with shards 0..2;
    their requests by shard."""
    from harness.batch.tune.tune_predict import save_run

    sample = []
    for seed in range(3):
        requests = _requests(_lengths(192, seed), seed, prefix=f"s{seed}-")
        trace, _ = _sim_run(requests, 512, cost)
        save_run(root, f"{label} {seed}", trace, knobs, 1, [seed])
        sample.append(requests)
    return sample


def test_the_rest_of_the_job_from_draining_runs_is_predicted_by_replaying_their_steps(tmp_path, model_dir) -> None:
    """192-request runs on an engine of 512 seats (every request starts at once and the run drains: the case whose
    old prediction from finish times read 2-11× long): the step model fitted to their steps, replayed over the
    20,000 requests left on one engine, predicts the rest within 10%."""
    from harness.batch.tune.tune_predict import predict_rest

    knobs = {"max_num_seqs": 512, "block_size": 16, "max_model_len": 1024, "kv_cache_memory_bytes": 1 << 34}
    sample = _draining_runs(tmp_path, "confirm", knobs)
    rest = _requests(_lengths(20_000, 99), 99)
    _, measured = _sim_run(rest, 512)
    hardware = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": 1e12, "bandwidth_bytes_s": 1e11}
    got = predict_rest(tmp_path, [f"confirm {s}" for s in range(3)],
                       lambda shards: [r for s in sorted(shards) for r in sample[s]], len(rest),
                       {"name": "t", "local_dir": str(model_dir)}, hardware, knobs, 1)
    assert got["prediction_method"] == "replay" and got["prediction_interval"] > 0
    assert abs(measured / got["predicted_rest_s"] - 1) < 0.10, (measured, got)
    none = predict_rest(tmp_path, ["no such run"], lambda shards: [], len(rest), {}, hardware, knobs, 1)
    assert none["predicted_rest_s"] is None


def test_what_an_engine_runs_at_once_is_its_sequences_or_what_its_kv_cache_holds() -> None:
    from harness.batch.tune.tune_runs import concurrency

    # 128 prompt and 64 output tokens each: a request holds 160 tokens on average while it runs
    same = [(128, 64)] * 100
    assert concurrency([{"max_num_seqs": 256, "kv_cache_tokens": 16_000}], same) == 100.0
    assert concurrency([{"max_num_seqs": 32, "kv_cache_tokens": 16_000}] * 2, same) == 64.0
    assert concurrency([{"max_num_seqs": 32, "kv_cache_tokens": None}], same) == 32.0
    # skewed outputs: the long ones run longest, so what a running request holds is output-weighted
    skewed = [(128, 8)] * 90 + [(128, 512)] * 10   # unweighted 128 + 58.4 / 2 = 157 tokens; weighted 353
    assert round(concurrency([{"max_num_seqs": 256, "kv_cache_tokens": 35_293}], skewed)) == 100
    assert concurrency([{"max_num_seqs": None, "kv_cache_tokens": None}], same) is None, \
        "an engine that does not say: unknown, and no fill"
    assert concurrency([], same) is None and concurrency([{"max_num_seqs": 8}], []) is None
    # fed a shard at a time (an engine without feeder()), an engine runs at most a shard's requests at once
    assert concurrency([{"max_num_seqs": 256, "kv_cache_tokens": 16_000}] * 2, same, per_engine_cap=64) == 128.0
    assert concurrency([{"max_num_seqs": 32, "kv_cache_tokens": None}], same, per_engine_cap=64) == 32.0
    kept = RunRecord(kind="confirm", label="c", values={}, shards=[], requests=400, concurrency=100.0)
    assert kept.fill == 4.0 and RunRecord(**{**kept.__dict__, "concurrency": None}).fill is None


def test_the_run_log_reads_lines_with_derived_or_unknown_keys_and_old_lines_without_engines_kept(tmp_path) -> None:
    import json

    from harness.batch.tune.tune_runs import RunLog

    log = RunLog(tmp_path)
    log.append(RunRecord(kind="main", label="main", values={}, shards=[1], engines_kept=True))
    old = {k: v for k, v in RunRecord(kind="trial", label="trial 0", values={}, shards=[0]).to_dict().items()
           if k != "engines_kept"}
    newer = {**old, "label": "trial 1", "a_later_field": 1}
    with open(log.path, "a") as f:
        f.write(json.dumps(old) + "\n" + json.dumps(newer) + "\n")
    kept, before, after = log.read()
    assert kept.engines_kept and not before.engines_kept and after.label == "trial 1"


def test_a_draining_runs_full_engine_rate_is_what_the_engine_keeps_fed_without_end(tmp_path, model_dir) -> None:
    """A 320-request trial on 256 seats is about one draining batch: its own rate reads the config low. Its
    full-engine rate, from its steps, is within 10% of a 20,000-request run of the same config (ramp-up and drain
    a small part of it); the trial's plain rate is well below."""
    from harness.batch.tune.tune_predict import full_engine_rate, save_run

    knobs = {"max_num_seqs": 256, "block_size": 16, "max_model_len": 1024, "kv_cache_memory_bytes": 1 << 34}
    hardware = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": 1e12, "bandwidth_bytes_s": 1e11}
    trial = _requests(_lengths(320, 0), 0)
    trace, seconds = _sim_run(trial, 256)
    save_run(tmp_path, "trial 0", trace, knobs, 1, [0])
    full, beyond, why_not = full_engine_rate(tmp_path, "trial 0", trial, {"name": "t", "local_dir": str(model_dir)},
                                             hardware)
    assert why_not is None
    assert "seqs" not in beyond, "its steps reached the engine's 256 seats (its context did not: said so)"
    long = _requests(_lengths(20_000, 7), 7)
    _, long_seconds = _sim_run(long, 256)
    fed = sum(r.max_tokens for r in long) / long_seconds
    assert full / fed == pytest.approx(1.0, abs=0.10)
    assert sum(r.max_tokens for r in trial) / seconds < 0.8 * fed, "the trial's own rate is its drain"


def test_a_run_without_a_full_engine_rate_keeps_why(tmp_path, model_dir, monkeypatch) -> None:
    """Where the full-engine rate cannot be had (no trace, or the fit fails), the run's record says why, kept in
    ``tune/runs.jsonl``, and the study is told its plain rate."""
    from harness.batch.tune import tune_predict
    from harness.batch.tune.tune_predict import full_engine_rate, save_run
    from harness.batch.tune.tune_runs import RunLog, RunRecord

    knobs = {"max_num_seqs": 8, "block_size": 16, "max_model_len": 1024, "kv_cache_memory_bytes": 1 << 34}
    hardware = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": 1e12, "bandwidth_bytes_s": 1e11}
    model = {"name": "t", "local_dir": str(model_dir)}
    trial = _requests(_lengths(32, 0), 0)
    trace, _ = _sim_run(trial, 8)
    save_run(tmp_path, "trial 0", trace, knobs, 1, [0])
    assert full_engine_rate(tmp_path, "trial 9", trial, model, hardware) == \
        (None, [], "not computed: the run kept no step trace")

    def failing(traces, **kwargs):
        raise ValueError("scripted: no usable step")

    monkeypatch.setattr(tune_predict, "fit_step_model", failing)
    rate, beyond, why_not = full_engine_rate(tmp_path, "trial 0", trial, model, hardware)
    assert (rate, beyond, why_not) == (None, [], "not computed: ValueError: scripted: no usable step")
    log = RunLog(tmp_path / "tune")
    log.append(RunRecord(kind="trial", label="trial 0", values={}, shards=[0], output_tokens=100, generation_s=2.0,
                         full_engine_tok_s=rate, full_engine_beyond=beyond, full_engine_note=why_not))
    [kept] = log.read()
    assert kept.full_engine_note == why_not and kept.value == kept.rate == 50.0


@pytest.mark.parametrize("trial_cost, main_cost", [(_curve, _slower_host), (_context_curve, _context_curve)],
                         ids=["a slower host", "a context the trials never reached"])
def test_the_rest_predicted_inside_the_main_phase_sees_what_the_trials_did_not(tmp_path, model_dir, trial_cost,
                                                                                main_cost) -> None:
    """Where the main phase's steps cost what the trials' fit cannot say (the host 1.3× slower through it; or a step
    cost quadratic in the KV cache, at a steady context the 192-request trials on 512 seats never reach), the
    prediction made as the tuning ends misses the rest by over 20%; the one ``RestInMain`` makes once the main
    phase's engines have run ``at_steps`` full steps (a quarter of it), its own steps so far in the fit, lands
    within 10% of the rest then measured. Made once; not where the looks stop the run at that commit."""
    from harness.batch.job.job import SoFar
    from harness.batch.tune.tune_predict import RestInMain, predict_rest
    from engines.sim_scheduler import Scheduler, SchedulerConfig
    from engines.steptrace import StepRecorder

    knobs = {"max_num_seqs": 512, "block_size": 16, "max_model_len": 1024, "kv_cache_memory_bytes": 1 << 34}
    hardware = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": 1e12, "bandwidth_bytes_s": 1e11}
    model = {"name": "t", "local_dir": str(model_dir)}
    sample = _draining_runs(tmp_path, "trial", knobs, trial_cost)
    main = _requests(_lengths(20_000, 99), 99)
    steps = []
    config = SchedulerConfig(max_seqs=512, max_tokens_per_step=4096, chunked_prefill=True, prefix_caching=True,
                             block_size=16, num_blocks=200_000, max_model_len=1024)
    total = Scheduler(config).run([r.prompt_token_ids for r in main], [r.max_tokens for r in main],
                                  main_cost, on_step=lambda s, dt, p: steps.append((s, dt))).seconds
    at = len(steps) // 4
    recorder = StepRecorder(clock=lambda: 0.0)
    for s, dt in steps[:at]:
        recorder.record(running=s.seqs, decode=s.decode, prefill=s.prefill, kv_tokens=s.kv_tokens, dt=dt, end=0.0)
    elapsed = sum(dt for _, dt in steps[:at])

    def predict(extra=None):
        return predict_rest(tmp_path, [f"trial {s}" for s in range(3)],
                            lambda shards: [r for s in sorted(shards) for r in sample[s]], len(main), model, hardware,
                            knobs, 1, extra)

    def so_far(full_steps: int) -> SoFar:
        return SoFar(shards=1, left=1, engines=1, output_tokens=0, engine_s=0.0, step_tokens=0.0, step_s=0.0,
                     full_steps=full_steps, elapsed_s=elapsed, steps=recorder)

    before = predict()["predicted_rest_s"]
    assert total / before > 1.2, "the trials' steps cannot see what the main phase's steps cost"
    rest = RestInMain(predict, at)
    assert rest(so_far(at - 1)) is False and rest.made is None, "not before at_steps full steps an engine"
    assert rest(so_far(at)) is False and rest.made["at_s"] == elapsed and rest.made["cost_s"] > 0
    assert rest.made["run_s"] - elapsed == pytest.approx(rest.made["predicted_rest_s"])
    assert (total - elapsed) / rest.made["predicted_rest_s"] == pytest.approx(1.0, abs=0.10)
    assert "main phase so far among them" in rest.made["prediction_note"]
    made = rest.made
    rest(so_far(at + 5))
    assert rest.made is made, "made once"
    stopped = RestInMain(predict, at, then=lambda s: True)
    assert stopped(so_far(at)) is True and stopped.made is None and stopped.stopped, \
        "the looks switched the run at that commit: its rest is another config's"


def test_the_row_leaves_out_the_measured_rest_of_a_main_run_the_looks_later_switched() -> None:
    """A prediction made inside the candidate's main run, after which the looks switched the rest to the defaults:
    the row keeps it with no measurement (its rest ran on another config); one the defaults' run made is measured."""
    from harness.batch.tune.tune_predict import RestInMain
    from harness.batch.tune.tuning import InJobTuning

    def made(stopped: bool) -> RestInMain:
        rest = RestInMain(lambda extra: {}, 1)
        rest.made = {"predicted_rest_s": 50.0, "at_s": 10.0, "run_s": 60.0, "cost_s": 0.5, "prediction_note": "n",
                     "prediction_interval": None}
        rest.stopped = stopped
        return rest

    class Tuning(InJobTuning):
        def __init__(self, in_main):   # only what _in_main_record reads
            self.in_main = in_main

    candidate = RunRecord(kind="main", label="main", values={"x": 1}, shards=[1], generation_s=30.0)
    defaults = RunRecord(kind="main", label="main (engine defaults)", values={}, shards=[2], generation_s=70.0)
    cols = Tuning([(made(True), candidate)])._in_main_record()
    assert cols["prediction.rest_in_main.predicted"] == 50.0 and cols["prediction.rest_in_main.measured"] is None
    assert "not measured: the looks then switched" in cols["prediction.rest_in_main.note"]
    cols = Tuning([(made(True), candidate), (made(False), defaults)])._in_main_record()
    assert cols["prediction.rest_in_main.measured"] == 60.0 and "main (engine defaults)" in \
        cols["prediction.rest_in_main.note"]
    assert Tuning([(RestInMain(lambda extra: {}, 1), candidate)])._in_main_record() == {}, "none made: no columns"


def test_a_rest_predicted_at_or_under_nothing_stays_in_the_record_as_its_worst() -> None:
    """The whole run replayed shorter than it has already run: the rest is kept at a millisecond (its error huge,
    counted), not dropped; and a predictor that raises leaves no prediction and does not stop the run."""
    from harness.batch.job.job import SoFar
    from harness.batch.tune.tune_predict import FLOOR_S, RestInMain
    from engines.steptrace import StepRecorder

    recorder = StepRecorder(clock=lambda: 0.0)
    recorder.record(running=4, decode=4, prefill=0, kv_tokens=100, dt=0.01, end=0.0)
    so_far = SoFar(shards=1, left=1, engines=1, output_tokens=0, engine_s=0.0, step_tokens=0.0, step_s=0.0,
                   full_steps=1, elapsed_s=30.0, steps=recorder)
    short = RestInMain(lambda extra: {"predicted_rest_s": 20.0, "prediction_note": "n"}, 1)
    assert short(so_far) is False and short.made["predicted_rest_s"] == FLOOR_S and short.made["run_s"] == 20.0

    def broken(extra):
        raise KeyError("scripted")

    failing = RestInMain(broken, 1)
    assert failing(so_far) is False and failing.made["predicted_rest_s"] is None


def test_the_trials_run_the_defaults_first_then_their_seeds_from_fewest_sequences_at_once_to_most() -> None:
    """The likeliest winner of a throughput job runs last (the main phase goes on with its engines); which seeds run is
    still the listed order's (a seed past the trials is not pulled in by its size), the engine defaults always among
    them, and a seed with params listed before it takes no trial's place."""
    def seed(name: str, replicas: int = 0, seqs: int = 0) -> tuple[str, dict]:
        return name, ({"replicas": replicas, "seqs": seqs} if replicas else {})

    def names(seeds: list, trials: int) -> list[str]:
        return [name for name, _ in run_order(seeds, trials, lambda p: p["replicas"] * p["seqs"], "engine defaults")]

    seeds = [seed("batch recipe", 1, 256), seed("every core", 2, 256), seed("engine defaults"), seed("heuristic", 1, 54)]
    assert names(seeds, 4) == ["engine defaults", "heuristic", "batch recipe", "every core"]
    assert names(seeds, 3) == ["engine defaults", "batch recipe", "every core", "heuristic"]
    assert names(seeds, 2)[:2] == ["engine defaults", "batch recipe"]
    # listed last, past the trials: the defaults still run, first
    assert names(seeds[:2] + [seed("heuristic", 1, 54), seed("engine defaults")], 3) == [
        "engine defaults", "batch recipe", "every core", "heuristic"]
    # the same params twice: the second is left out, and the widest still runs last
    twice = [seed("engine defaults"), seed("every core", 2, 256), seed("again", 2, 256), seed("batch recipe", 1, 256)]
    assert names(twice, 3) == ["engine defaults", "batch recipe", "every core"]
    # a seed whose params clip to nothing is the defaults again, not trial 0
    assert names([seed("clipped away"), seed("engine defaults"), seed("one", 1, 8)], 2) == ["engine defaults", "one"]
