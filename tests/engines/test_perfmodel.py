"""The performance model: model and hardware specs, KV sizing, speed of light, step cost."""

import json
from dataclasses import asdict, replace

import pytest

from engines.perfmodel import (Efficiency, HardwareSpec, ModelSpec, Precision, StepCost, kv_budget_bytes,
                               max_resident_seqs, sol_columns, speed_of_light)
from tests.conftest import ROOT, compose

GPU_HARDWARE = ["h100", "h100_pcie", "h200", "a100_80gb", "l40s"]


@pytest.fixture
def llama() -> ModelSpec:
    return ModelSpec.load(None, "llama-3.1-8b")


@pytest.fixture
def h100() -> HardwareSpec:
    from omegaconf import OmegaConf

    return HardwareSpec.from_config(OmegaConf.to_container(compose("hardware=h100").hardware.spec, resolve=True))


def summary(requests: int, isl: int, osl: int, **extra) -> dict:
    return {"requests": requests, "input_tokens_requested": requests * isl, "output_tokens_requested": requests * osl,
            **extra}


def test_llama_3_1_8b_weights_and_kv_bytes(llama):
    assert llama.params == 8_030_261_248, "the published parameter count of Llama-3.1-8B"
    assert llama.weight_bytes() == pytest.approx(16.06e9, rel=1e-3)
    assert llama.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert llama.kv_bytes_per_token(1) == 65536, "fp8 KV cache"


def test_vlm_config_reads_its_text_config_and_float32_is_served_in_16_bits(tmp_path):
    text = {"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 256, "vocab_size": 2048, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3", "text_config": text}))
    spec = ModelSpec.load(tmp_path, "tiny_vlm")
    assert (spec.layers, spec.head_dim, spec.kv_heads, spec.dtype_bytes) == (4, 32, 2, 2)
    assert spec.kv_bytes_per_token() == 2 * 4 * 2 * 32 * 2


def test_unknown_model_names_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        ModelSpec.load(tmp_path, "no-such-model")


@pytest.mark.parametrize("option", GPU_HARDWARE)
def test_every_gpu_hardware_config_has_a_datasheet_spec(option):
    from omegaconf import OmegaConf

    spec = HardwareSpec.from_config(OmegaConf.to_container(compose(f"hardware={option}").hardware.spec, resolve=True))
    assert spec.peak_flops_bf16 > 1e14 and spec.bandwidth_bytes_s > 5e11 and spec.memory_bytes > 4e10
    assert spec.source == "datasheet"
    assert spec.peak_flops(1) >= spec.peak_flops(2)


def test_resident_sequences_and_kv_budget(llama, h100):
    budget = kv_budget_bytes(llama, h100)
    assert budget == pytest.approx(h100.memory_bytes * 0.9 - llama.weight_bytes())
    assert max_resident_seqs(llama, budget, 2000) == int(budget // (131072 * 2000))
    assert kv_budget_bytes(llama, h100, {"kv_cache_memory_bytes": 1 << 30}) == 1 << 30
    assert kv_budget_bytes(llama, h100, {"gpu_memory_utilization": 0.5}) < budget


def test_prefill_heavy_workloads_are_compute_bound_and_decode_heavy_ones_bandwidth_bound(llama, h100):
    prefill = speed_of_light(llama, h100, summary(1000, 2048, 16))
    decode = speed_of_light(llama, h100, summary(1000, 128, 2048))
    assert prefill.bound == "compute" and prefill.compute_s > prefill.memory_s
    assert decode.bound == "bandwidth" and decode.memory_s > decode.compute_s
    assert prefill.seconds == max(prefill.compute_s, prefill.memory_s)


def test_fp8_raises_the_bound_and_prefix_hits_lower_prefill_flops(llama, h100):
    work = summary(3000, 1000, 1000)
    assert (speed_of_light(llama, h100, work, {"quantization": "fp8", "kv_cache_dtype": "fp8"}).tok_s
            > 1.5 * speed_of_light(llama, h100, work).tok_s)
    prefill = summary(1000, 2048, 16)
    cached = speed_of_light(llama, h100, {**prefill, "ideal_prefix_hit_tokens": 1000 * 1024})
    assert cached.compute_s < speed_of_light(llama, h100, prefill).compute_s


@pytest.mark.parametrize("engine, knobs", [
    ("vllm", {"tensor_parallel_size": 2, "kv_cache_dtype": "fp8", "quantization": "fp8"}),
    ("sglang", {"tp_size": 2, "kv_cache_dtype": "fp8_e4m3", "quantization": "fp8"}),
    ("trtllm", {"tensor_parallel_size": 2, "kv_cache_config": {"dtype": "fp8"}, "quant_config": {"quant_algo": "FP8"}}),
])
def test_precision_and_parallelism_are_read_in_every_engines_names(llama, h100, engine, knobs):
    assert Precision.from_knobs(llama, knobs, engine) == Precision(weight_bytes=1, kv_bytes=1, devices=2,
                                                                    tensor_parallel=2)
    work, rate = summary(1000, 1000, 1000), 5000.0
    columns = sol_columns(None, "llama-3.1-8b", asdict(h100), work, knobs, rate, engine=engine)
    vllm = sol_columns(None, "llama-3.1-8b", asdict(h100), work,
                       {"tensor_parallel_size": 2, "kv_cache_dtype": "fp8", "quantization": "fp8"}, rate)
    default = sol_columns(None, "llama-3.1-8b", asdict(h100), work, {}, rate, engine=engine)
    assert columns["sol_fraction"] == pytest.approx(vllm["sol_fraction"])
    assert columns["sol_fraction"] < default["sol_fraction"] / 2, "two fp8 GPUs: more than twice the bound"


def test_pipeline_parallel_counts_devices_and_kv_dtype_names_are_sized():
    llama = ModelSpec.load(None, "llama-3.1-8b")
    assert Precision.from_knobs(llama, {"tp_size": 2, "pp_size": 2}, "sglang").devices == 4
    assert Precision.from_knobs(llama, {"tp_size": 2, "pp_size": 2}, "sglang").tensor_parallel == 2
    assert Precision.from_knobs(llama, {"pipeline_parallel_size": 3}, "trtllm").devices == 3
    assert Precision.from_knobs(llama, {"kv_cache_dtype": "bf16"}, "sglang").kv_bytes == 2
    assert Precision.from_knobs(llama, {"tp_size": 2}, "vllm").devices == 1, "not a vLLM name"


def test_replicas_each_get_their_devices_and_a_share_of_the_work(llama, h100):
    work = summary(2000, 128, 2048)  # decode-heavy: the weights are read once per step per replica
    one = sol_columns(None, "llama-3.1-8b", asdict(h100), work, {}, 1000.0)
    two = sol_columns(None, "llama-3.1-8b", asdict(h100), work, {}, 1000.0, replicas=2)
    assert 1.5 * one["sol_tok_s"] < two["sol_tok_s"] <= 2 * one["sol_tok_s"] * 1.0001


def test_step_cost_is_a_roofline_for_linear_layers_plus_one_for_attention_plus_overheads(llama, h100):
    import numpy as np

    cost = StepCost(llama, h100, Precision.from_knobs(llama))
    eff = Efficiency(compute=0.9, bandwidth=0.8, step_overhead_s=1e-3, seq_overhead_s=1e-6)
    # 256 decoding sequences with 1,000 tokens of context each: both parts bandwidth-bound on an H100.
    decode = cost.step_seconds(256, 256, 256 * 1000, 256 * 1000, eff)
    memory = (llama.weight_bytes() + 131072 * 256 * 1000) / (h100.bandwidth_bytes_s * 0.8)
    assert decode == pytest.approx(memory + 1e-3 + 256e-6)
    # One 8,192-token prefill chunk: the linear layers are compute-bound.
    prefill = cost.step_seconds(8192, 1, 8192 * 4096, 8192, eff)
    assert prefill > 2 * 8192 * llama.matmul_params / (h100.peak_flops_bf16 * 0.9)
    steps = cost.step_seconds(np.array([256, 8192]), np.array([256, 1]), np.array([256e3, 8192 * 4096]),
                              np.array([256e3, 8192]), eff)
    assert steps == pytest.approx([decode, prefill]), "the same numbers elementwise on arrays"
    with pytest.raises(ValueError, match="unknown efficiency"):
        Efficiency.from_dict({"compute": 0.5, "speed": 2})


def test_allreduce_is_zero_on_one_device_and_a_ring_over_nvlink_under_tensor_parallelism(llama, h100):
    eff = Efficiency()
    assert h100.interconnect_bandwidth_bytes_s == 450e9, "NVLink 4: 900 GB/s both ways, 450 GB/s each"
    assert h100.interconnect_latency_s == pytest.approx(6e-6)
    one = StepCost(llama, h100, Precision.from_knobs(llama))
    assert one.allreduce_seconds(4096, eff) == 0.0
    assert one.step_seconds(256, 256, 256e3, 256e3, eff) == StepCost(llama, h100, Precision(2, 2)).step_seconds(
        256, 256, 256e3, 256e3, eff)
    costs = {p: StepCost(llama, h100, Precision.from_knobs(llama, {"tensor_parallel_size": p})) for p in (2, 4, 8)}
    # units: TP2, one token: 2 all-reduces x 32 layers of 4,096 bf16 values (8,192 B); a ring sends 2(p-1)/p of
    # them, at 450e9 B/s x the interconnect efficiency, plus 6 us a call
    expected = 64 * (1.0 * 4096 * 2 / (450e9 * eff.interconnect) + 6e-6)
    assert costs[2].allreduce_seconds(1, eff) == pytest.approx(expected)
    assert costs[2].allreduce_seconds(1, eff) == pytest.approx(64 * 6e-6, rel=0.01), "one token: the latency"
    assert costs[2].allreduce_seconds(8192, eff) - costs[2].allreduce_seconds(0, eff) == pytest.approx(
        64 * 8192 * 8192 / (450e9 * eff.interconnect)), "8,192 tokens: 64 MiB over the link, in seconds"
    # grows with tokens and with the group (2(p-1)/p: 1, 1.5, 1.75)
    assert costs[2].allreduce_seconds(1024, eff) < costs[2].allreduce_seconds(4096, eff)
    assert costs[2].allreduce_seconds(4096, eff) < costs[4].allreduce_seconds(4096, eff) < costs[8].allreduce_seconds(
        4096, eff)
    bandwidth_part = {p: c.allreduce_seconds(4096, eff) - c.allreduce_seconds(0, eff) for p, c in costs.items()}
    assert bandwidth_part[8] / bandwidth_part[2] == pytest.approx(1.75)
    assert costs[2].allreduce_seconds(4096, Efficiency(interconnect=0.41)) > costs[2].allreduce_seconds(4096, eff)
    # it adds to the step, after the layers (a TP2 decode step of 256: per-device FLOP/s and bytes halve)
    step = costs[2].step_seconds(256, 256, 256e3, 256e3, eff)
    free = one.step_seconds(256, 256, 256e3, 256e3, replace(eff, compute=eff.compute * 2, bandwidth=eff.bandwidth * 2))
    assert step == pytest.approx(free + costs[2].allreduce_seconds(256, eff))
    # pipeline stages alone all-reduce nothing; a spec without an interconnect leaves it unpriced
    assert StepCost(llama, h100, Precision(2, 2, devices=2, tensor_parallel=1)).allreduce_seconds(4096, eff) == 0
    bare = replace(h100, interconnect_bandwidth_bytes_s=None)
    assert StepCost(llama, bare, Precision(2, 2, devices=2, tensor_parallel=2)).allreduce_seconds(4096, eff) == 0
    import numpy as np

    tokens = np.array([1, 4096])
    assert costs[2].allreduce_seconds(tokens, eff) == pytest.approx(
        [costs[2].allreduce_seconds(1, eff), costs[2].allreduce_seconds(4096, eff)]), "elementwise on arrays"


def test_attention_runs_at_the_fp8_peak_only_with_an_fp8_kv_cache(llama, h100):
    eff = Efficiency()
    fp8_weights = StepCost(llama, h100, Precision.from_knobs(llama, {"quantization": "fp8"}))
    fp8_both = StepCost(llama, h100, Precision.from_knobs(llama, {"quantization": "fp8", "kv_cache_dtype": "fp8"}))
    assert fp8_weights.peak == fp8_both.peak == h100.peak_flops_fp8
    assert fp8_weights.attention_peak == h100.peak_flops_bf16 and fp8_both.attention_peak == h100.peak_flops_fp8
    # a prefill chunk of 8,192 tokens at 32k context: attention is compute-bound, twice as long in 16 bits
    pairs = 8192 * 32768
    attention_bf16 = llama.attention_flops_per_pair * pairs / (h100.peak_flops_bf16 * eff.compute)
    assert fp8_weights.step_seconds(8192, 1, pairs, 0, eff) == pytest.approx(
        fp8_both.step_seconds(8192, 1, pairs, 0, eff) + attention_bf16 / 2)


def test_sol_columns_for_a_row_and_none_when_unknown(h100):
    spec = asdict(h100)
    columns = sol_columns(None, "llama-3.1-8b", spec, summary(100, 1000, 1000), {}, output_tok_s=1000.0)
    assert columns["sol_tok_s"] > 1000 and columns["sol_fraction"] == pytest.approx(1000 / columns["sol_tok_s"])
    assert columns["hw.bandwidth_bytes_s"] == h100.bandwidth_bytes_s
    assert columns["sol_exceeded"] is False
    assert sol_columns(None, "llama-3.1-8b", None, summary(1, 1, 1), {}, 1.0) == {
        "sol_tok_s": None, "sol_fraction": None, "sol_exceeded": None}
    assert sol_columns(None, "unknown-model", spec, summary(1, 1, 1), {}, 1.0)["sol_tok_s"] is None
    faster = sol_columns(None, "llama-3.1-8b", spec, summary(100, 1000, 1000), {},
                         output_tok_s=2 * columns["sol_tok_s"])
    assert faster["sol_exceeded"] is True and faster["sol_fraction"] == pytest.approx(2.0)


def test_a_rate_above_the_speed_of_light_is_flagged_in_reports_not_shown_as_a_fraction():
    from harness.report.document import SOL_EXCEEDED, fmt
    from harness.run.summary import summary_table

    assert fmt(0.42, "sol") == "42.0%" and fmt(3.7, "sol") == SOL_EXCEEDED
    rows = [{"run_id": "a", "status": "ok", "sol_fraction": 3.7}, {"run_id": "b", "status": "ok", "sol_fraction": 0.5}]
    table = summary_table(rows)
    assert "above SoL!" in table and "3.7" not in table and "0.5" in table


def test_weights_that_fit_in_the_cache_stream_at_its_rate(h100):
    host = HardwareSpec("host", peak_flops_bf16=4e10, bandwidth_bytes_s=8e9, memory_bytes=2e10,
                        cache_bytes=32 << 20, cache_bandwidth_bytes_s=5e10)
    assert host.weight_bandwidth(10 << 20) == 5e10 and host.weight_bandwidth(64 << 20) == 8e9
    assert h100.weight_bandwidth(1 << 20) == h100.bandwidth_bytes_s, "no cache figures: memory bandwidth"


def test_an_incomplete_spec_is_an_unknown_speed_of_light_not_a_measurement(monkeypatch):
    import subprocess

    def no_benchmark(*args, **kwargs):
        raise AssertionError("writing a row must not start a host benchmark")

    monkeypatch.setattr(subprocess, "run", no_benchmark)
    monkeypatch.setattr(subprocess, "Popen", no_benchmark)
    spec = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": None, "bandwidth_bytes_s": None, "memory_bytes": None}
    columns = sol_columns(None, "llama-3.1-8b", spec, summary(10, 100, 100), {}, 10.0)
    assert columns == {"sol_tok_s": None, "sol_fraction": None, "sol_exceeded": None}
    with pytest.raises(ValueError, match="lacks peak_flops_bf16, bandwidth_bytes_s"):
        HardwareSpec.from_config(spec)


def test_shipped_architectures_are_valid():
    for path in (ROOT / "conf" / "architectures").glob("*.json"):
        assert ModelSpec.load(None, path.stem).params > 1e9
