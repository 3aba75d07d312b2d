"""The step-model fit recovers step curves that are not of its own form, judged on held-out runs.

Runs are simulated with the simulator's scheduler and a "true" step time that the model cannot
express exactly (a CPU-like curve that grows quadratically with the batch; a GPU-like curve, flat
until a compute knee, then steep), with 5% noise per step. The model is fitted on runs below, at
and above the engine's fill, then judged on a held-out run of other sizes and knobs: its total
seconds, replayed through the scheduler with the fitted model, against the true ones.
"""

import numpy as np
import pandas as pd
import pytest

from engines.sim_scheduler import Scheduler, SchedulerConfig
from engines.stepmodel import StepModel, StepShape
from engines.steptrace import STEP_FIELDS, StepRecorder
from harness.steps.fit import fit_step_model


def cpu_curve(s: StepShape) -> float:
    return 2e-3 + 3e-5 * s.tokens + 4e-8 * s.tokens ** 2 + 4e-5 * s.seqs + 2e-8 * s.kv_tokens


def gpu_curve(s: StepShape) -> float:
    return 0.010 + 1e-5 * max(0.0, s.tokens - 1200) + 2e-9 * s.kv_tokens + 2e-6 * s.seqs


def requests(n: int, seed: int, prompt=(32, 400), output=(8, 120)):
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(1, 30000, size=int(rng.integers(*prompt)))] for _ in range(n)]
    return prompts, [int(m) for m in rng.integers(*output, size=n)]


def run(curve, n: int, max_seqs: int, seed: int, tokens: int = 2048, noise: float = 0.05, blocks: int = 20000,
        **lengths):
    """One simulated run: (trace frame, total seconds on the true curve)."""
    rng = np.random.default_rng(seed + 1000)
    config = SchedulerConfig(max_seqs=max_seqs, max_tokens_per_step=tokens, chunked_prefill=True,
                             prefix_caching=False, block_size=16, num_blocks=blocks, max_model_len=1024)
    recorder = StepRecorder(clock=lambda: 0.0)

    def on_step(step: StepShape, seconds: float, preempted: int) -> None:
        recorder.record(running=step.seqs, decode=step.decode, prefill=step.prefill, kv_tokens=step.kv_tokens,
                        encoder_tokens=step.encoder_tokens, preempted=preempted, dt=seconds, end=0.0)

    noisy = lambda step: curve(step) * float(rng.lognormal(0.0, noise))  # noqa: E731
    prompts, outputs = requests(n, seed, **lengths)
    result = Scheduler(config).run(prompts, outputs, noisy, on_step=on_step)
    trace = recorder.take()
    return pd.DataFrame({k: trace[k] for k in STEP_FIELDS}), result.seconds, (prompts, outputs, config)


def replayed(model: StepModel, setup) -> float:
    prompts, outputs, config = setup
    return Scheduler(config).run(prompts, outputs, model.seconds).seconds


@pytest.mark.parametrize("curve", [cpu_curve, gpu_curve], ids=["cpu-quadratic", "gpu-knee"])
def test_a_fit_below_at_and_above_fill_predicts_a_held_out_run(curve):
    fitted = {f"run{i}": run(curve, n, 64, seed=i)[0]
              for i, n in enumerate([24, 64, 400])}   # below, at and above the engine's 64 sequences
    model = fit_step_model(fitted, host_id="test")
    assert all(getattr(model, p) >= 0 for p in ("step_s", "seq_s", "token_s", "prefill_token_s", "kv_token_s"))
    for n, seqs, tokens, seed in [(300, 96, 1024, 7), (50, 32, 2048, 8)]:
        _, true_seconds, setup = run(curve, n, seqs, seed=seed, tokens=tokens, prompt=(64, 300), output=(20, 200))
        assert replayed(model, setup) / true_seconds == pytest.approx(1.0, abs=0.06)
    assert model.interval is not None and 0 < model.interval < 0.2


def test_a_gpu_curve_is_flat_below_its_knee_and_steep_above_it():
    model = fit_step_model({f"r{i}": run(gpu_curve, n, 64, seed=i)[0] for i, n in enumerate([24, 64, 400])})
    decode = [model.seconds(StepShape(tokens=n, seqs=n, kv_tokens=0)) for n in (8, 64, 512)]
    assert max(decode) / min(decode) < 1.15, "decode steps cost nearly the same at any batch below the knee"
    prefill = model.seconds(StepShape(tokens=2048, seqs=8, prefill=2040)) / model.seconds(StepShape(tokens=512, seqs=8))
    assert prefill == pytest.approx(gpu_curve(StepShape(2048, 8)) / gpu_curve(StepShape(512, 8)), rel=0.15)


def test_a_linear_model_of_run_totals_cannot_tell_the_parts_apart_but_steps_can():
    """Two runs' totals fix at most two numbers; the steps of the same two runs fix every part."""
    traces = {f"r{i}": run(cpu_curve, n, 64, seed=i)[0] for i, n in enumerate([64, 400])}
    model = fit_step_model(traces)
    big = StepShape(tokens=1500, seqs=40, prefill=1460, kv_tokens=20000)
    assert model.seconds(big) == pytest.approx(cpu_curve(big), rel=0.1)


def preempting_curve(s: StepShape) -> float:
    """The CPU curve plus a cost per request preempted (vLLM frees its blocks and drops its state)."""
    return cpu_curve(s) + 1e-2 * s.preempted


def test_a_cost_per_preemption_is_recovered_and_prices_a_kv_limited_run():
    """Fit runs preempt a little (a roomy cache); the held-out run preempts at most steps (a small one)."""
    fitted = {f"r{i}": run(preempting_curve, n, 64, seed=i, blocks=blocks)[0]
              for i, (n, blocks) in enumerate([(64, 20000), (400, 20000), (200, 700)])}
    assert sum(t["preempted"].sum() for t in fitted.values()) > 0
    model = fit_step_model(fitted)
    assert model.preempt_s == pytest.approx(1e-2, rel=0.35)
    trace, true_seconds, setup = run(preempting_curve, 300, 96, seed=9, blocks=300)
    assert trace["preempted"].sum() > 50, "the held-out run is KV-limited"
    assert replayed(model, setup) / true_seconds == pytest.approx(1.0, abs=0.06)
    without = StepModel(**{**model.to_dict(), "preempt_s": 0.0, "knees": model.knees, "at_bound": ()})
    assert replayed(without, setup) / true_seconds < 0.94, "without the part, the KV-limited run is priced too fast"


def test_a_prediction_past_the_traces_says_so():
    model = fit_step_model({"r": run(cpu_curve, 64, 32, seed=3)[0]})
    assert model.beyond(StepShape(tokens=16, seqs=16)) == []
    assert "seqs" in model.beyond(StepShape(tokens=16, seqs=200))
    assert model.beyond(StepShape(tokens=16, seqs=16, preempted=1)) == ["preemptions"], \
        "the traces never preempted: the preemption part was never fitted"
    assert model.beyond(StepShape(tokens=16, seqs=16, encoder_tokens=64)) == ["encoder_tokens"]


def test_an_aggregated_trace_fits_like_the_raw_one():
    """Past its limit the recorder keeps means by bucket, weighted by count: the fit barely moves."""
    frame, _, _ = run(cpu_curve, 400, 64, seed=4)
    recorder = StepRecorder(limit=50, clock=lambda: 0.0)
    for row in frame.to_dict("records"):
        recorder.record(running=int(row["running"]), decode=int(row["decode"]), prefill=int(row["prefill"]),
                        kv_tokens=row["kv_tokens"], dt=row["dt"], end=0.0)
    compact = recorder.take()
    assert len(compact["weight"]) < len(frame) and sum(compact["weight"]) == len(frame)
    aggregated = fit_step_model({"r": pd.DataFrame({k: compact[k] for k in STEP_FIELDS})})
    raw = fit_step_model({"r": frame})
    shape = StepShape(tokens=300, seqs=60, prefill=240, kv_tokens=9000)
    assert aggregated.seconds(shape) == pytest.approx(raw.seconds(shape), rel=0.05)


def test_no_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="run the real engine first"):
        fit_step_model({})
