"""Calibration: re-simulating rows from their columns, fitting efficiency factors, the file engine=sim loads."""

import json

import numpy as np
import pytest
import yaml

from engines.perfmodel import Efficiency
from engines.sim import SimEngine
from harness.calibration.calibrate import fit, nelder_mead, simulate_row, unflatten, write_calibration
from harness.core.errors import TroughputError
from harness.run.results import prefixed

HARDWARE = {"name": "test-cpu", "kind": "cpu", "peak_flops_bf16": 5e10, "bandwidth_bytes_s": 1e10,
            "memory_bytes": 8 << 30}
TRUE = Efficiency(compute=0.3, bandwidth=0.6, step_overhead_s=4e-3, seq_overhead_s=5e-5)
WORKLOAD = {"name": "unique", "generator": "unique", "seed": 0, "num_requests": 60,
            "input_len": {"kind": "uniform", "low": 16, "high": 80}, "output_len": {"kind": "fixed", "value": 24}}


@pytest.fixture
def model(vocab_dir) -> dict:
    config = {"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 256, "vocab_size": 101, "max_position_embeddings": 2048}
    (vocab_dir / "config.json").write_text(json.dumps(config))
    return {"name": "tiny-test", "path": str(vocab_dir), "local_dir": str(vocab_dir)}


def row(model: dict, seqs: int, kv_tokens: int, wall_s: float = 1.0, workload: dict = WORKLOAD) -> dict:
    """A results row as the runner writes it (the columns calibration reads)."""
    from harness.workloads import build_workload

    fingerprint = build_workload(workload, model, image_dir=None).fingerprint
    knobs = {"max_num_seqs": seqs, "max_num_batched_tokens": 512, "kv_cache_memory_bytes": kv_tokens * 1024,
             "block_size": 16, "max_model_len": 256, "enforce_eager": True, "limit_mm_per_prompt": {"image": 1}}
    return {"run_id": f"s{seqs}-kv{kv_tokens}", "status": "ok", "workload": "unique", "wall_s": wall_s,
            "workload_fingerprint": fingerprint, "ordering": "as_given", "output_tokens": 60 * 24,
            "preemptions": None, **prefixed("workload_cfg", workload), **prefixed("ordering_cfg", {"name": "as_given"}),
            **prefixed("knob", knobs)}


def synthetic(model: dict, settings: list[tuple[int, int]], noise: float = 0.0, seed: int = 0) -> list:
    """Traces whose 'measured' times come from known efficiency factors, times log-normal noise."""
    rng = np.random.default_rng(seed)
    traces = []
    for seqs, kv in settings:
        trace = simulate_row(row(model, seqs, kv), model, HARDWARE)
        trace.measured_s = trace.predict(TRUE) * float(np.exp(rng.normal(0, noise)))
        traces.append(trace)
    return traces


def test_unflatten_reverses_the_rows_dotted_columns():
    nested = {"a": 1, "b": {"c": 2, "d": {"e": "x"}}}
    assert unflatten({**prefixed("p", nested), "other.z": 3, "p.nan": float("nan")}, "p") == nested


def test_a_row_is_resimulated_from_its_own_columns(model):
    trace = simulate_row(row(model, seqs=8, kv_tokens=512), model, HARDWARE)
    assert len(trace.steps) >= 24 and trace.preemptions >= 0
    assert simulate_row(row(model, 64, 400), model, HARDWARE).preemptions > 0, "a KV cache of 400 tokens preempts"
    broken = {**row(model, 8, 512), "workload_fingerprint": "0000"}
    with pytest.raises(TroughputError, match="fingerprint"):
        simulate_row(broken, model, HARDWARE)
    with pytest.raises(TroughputError, match="workload_cfg"):
        simulate_row({"wall_s": 1.0}, model, HARDWARE)


def test_fit_on_noisy_rows_predicts_held_out_settings_with_other_schedules(model):
    """Calibration and held-out 'measurements' both carry 8% noise (a quiet shared machine); no held-out
    schedule equals a fitted one; the a-priori factors miss these rows by far, so a broken fit shows."""
    noise = 0.08
    calibration = synthetic(model, [(4, 4096), (16, 4096), (64, 400), (32, 1024), (8, 320), (64, 4096)], noise)
    held_out = synthetic(model, [(12, 2048), (48, 600), (24, 4096), (2, 4096)], noise, seed=1)
    fitted = {t.steps.tobytes() for t in calibration}
    assert not any(t.steps.tobytes() in fitted for t in held_out), "held-out schedules differ from the fitted ones"
    result = fit(calibration)
    errors = [abs(t.predict(result.efficiency) / t.measured_s - 1) for t in held_out]
    a_priori = [abs(t.predict(Efficiency()) / t.measured_s - 1) for t in held_out]
    assert max(errors) < 3 * noise, errors
    assert min(a_priori) > 0.5, a_priori


def test_fixed_factors_stay_put(model):
    result = fit(synthetic(model, [(4, 4096), (64, 400), (16, 1024)]), fixed={"seq_overhead_s": 0.0})
    assert result.efficiency.seq_overhead_s == 0.0


def test_the_calibration_file_loads_as_the_simulators_knob(model, tmp_path):
    traces = synthetic(model, [(4, 4096), (64, 400), (16, 1024), (32, 2048)])
    result = fit(traces)
    path = write_calibration(tmp_path / "vllm" / "cpu-tiny.yaml", result, traces, "a test")
    text = path.read_text()
    assert "Median absolute error" in text and all(t.run_id in text for t in traces)
    loaded = yaml.safe_load(text)
    assert Efficiency.from_dict(loaded["efficiency"]).compute == pytest.approx(result.efficiency.compute, rel=1e-5)
    assert loaded["host"] == {"name": "test-cpu", "peak_flops_bf16": 5e10, "peak_flops_fp8": None,
                              "bandwidth_bytes_s": 1e10, "source": "datasheet"}, "the spec the fit is relative to"
    # engine=sim with this file predicts each row as the fit did, on a host of other rates too.
    other_host = {**HARDWARE, "peak_flops_bf16": 2e11, "bandwidth_bytes_s": 3e10}
    knobs = {k[len("knob."):]: v for k, v in row(model, 16, 1024).items() if k.startswith("knob.")}
    knobs.pop("limit_mm_per_prompt.image")
    sim = SimEngine(model, {**knobs, "hardware_spec": other_host, "calibration": loaded})
    sim.validate()
    sim.start()
    from harness.workloads import build_workload

    sim.generate(build_workload(WORKLOAD, model, image_dir=None).requests)
    assert sim.simulated_seconds() == pytest.approx(traces[2].predict(result.efficiency), rel=1e-4)


def test_nelder_mead_finds_a_quadratic_minimum():
    x, value = nelder_mead(lambda x: float(np.sum((x - np.array([1.0, -2.0, 0.5])) ** 2)), np.zeros(3))
    assert value < 1e-8 and np.allclose(x, [1.0, -2.0, 0.5], atol=1e-4)
