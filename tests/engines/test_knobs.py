"""The canonical knob table: mapping per engine, transforms, conflicts, value checks, round trip, docs/knobs.md."""

import subprocess
import sys

import pytest

from engines import knobs as knob_table
from engines.base import KnobError
from engines.knobs import canonical_view, knob_table_markdown, to_native
from harness.docs import KNOBS_PAGE, TABLE_END, TABLE_START, embed_knob_table
from tests.conftest import ROOT

EVERYTHING = {  # one valid value per canonical knob, per engine where values are engine names
    "vllm": {"kv_cache_dtype": "fp8", "schedule_policy": "priority",
             "speculative": {"method": "ngram", "num_speculative_tokens": 3}},
    "sglang": {"kv_cache_dtype": "fp8_e4m3", "schedule_policy": "lpm",
               "speculative": {"algorithm": "EAGLE", "num_steps": 3}},
    "trtllm": {"kv_cache_dtype": "fp8", "schedule_policy": "fcfs",
               "speculative": {"decoding_type": "NGram", "max_draft_len": 3}},
}
COMMON = {"max_seqs": 64, "max_tokens_per_step": 4096, "kv_memory_fraction": 0.85, "prefix_caching": False,
          "chunked_prefill": True, "tensor_parallel": 2}


@pytest.mark.parametrize("engine, expected", [
    ("vllm", {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.85,
              "enable_prefix_caching": False, "enable_chunked_prefill": True, "tensor_parallel_size": 2}),
    ("sglang", {"max_running_requests": 64, "chunked_prefill_size": 4096, "max_prefill_tokens": 4096,
                "mem_fraction_static": 0.85, "disable_radix_cache": True, "tp_size": 2}),
    ("trtllm", {"max_batch_size": 64, "max_num_tokens": 4096, "enable_chunked_prefill": True,
                "tensor_parallel_size": 2,
                "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": False}}),
])
def test_canonical_knobs_map_to_each_engines_native_names(engine, expected):
    assert to_native(engine, COMMON) == expected


def test_sglang_chunked_prefill_off_overrides_the_chunk_size_but_keeps_the_prefill_budget():
    native = to_native("sglang", {"max_tokens_per_step": 2048, "chunked_prefill": False})
    assert native == {"chunked_prefill_size": -1, "max_prefill_tokens": 2048}
    assert to_native("sglang", {"chunked_prefill": True}) == {}, "on = SGLang's default chunk size"


def test_sglang_speculative_keys_get_their_prefix_once():
    native = to_native("sglang", {"speculative": {"algorithm": "EAGLE", "speculative_num_steps": 3}})
    assert native == {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3}


def test_native_knobs_pass_through_and_dotted_names_nest():
    native = to_native("trtllm", {"backend": "tensorrt", "kv_cache_config.tokens_per_block": 64,
                                  "scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}})
    assert native == {"backend": "tensorrt", "kv_cache_config": {"tokens_per_block": 64},
                      "scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}}
    assert to_native("vllm", {"max_num_seqs": 8, "limit_mm_per_prompt": {"image": 4}}) == {
        "max_num_seqs": 8, "limit_mm_per_prompt": {"image": 4}}


def test_canonical_knob_and_its_native_twin_together_are_an_error():
    with pytest.raises(KnobError, match=r"max_seqs=8 and its vLLM twin \(max_num_seqs=16\)"):
        to_native("vllm", {"max_seqs": 8, "max_num_seqs": 16})
    with pytest.raises(KnobError, match="kv_cache_config.free_gpu_memory_fraction"):
        to_native("trtllm", {"kv_memory_fraction": 0.5, "kv_cache_config": {"free_gpu_memory_fraction": 0.9}})
    with pytest.raises(KnobError, match="speculative_num_steps"):
        to_native("sglang", {"speculative": {"algorithm": "EAGLE"}, "speculative_num_steps": 2})


def test_canonical_knob_replaces_a_native_twin_from_a_general_layer():
    base = {"gpu_memory_utilization": 0.5, "block_size": 32}
    assert to_native("vllm", {"kv_memory_fraction": 0.4}, base=base) == {"gpu_memory_utilization": 0.4,
                                                                         "block_size": 32}
    merged = to_native("trtllm", {"kv_cache_config": {"enable_block_reuse": False}},
                       base={"kv_cache_config": {"free_gpu_memory_fraction": 0.7}})
    assert merged == {"kv_cache_config": {"free_gpu_memory_fraction": 0.7, "enable_block_reuse": False}}


def test_a_canonical_knob_an_engine_lacks_names_the_engines_that_have_it(monkeypatch):
    from engines import unit, units

    # Every unit loaded before the patch: Ray Data LLM's unit copies vLLM's mappings when it is first loaded,
    # and would otherwise keep the patched knob after this test (and name it here, depending on test order).
    units()
    only_vllm = knob_table.Canonical("cpu_kv_bytes", "KV bytes on CPU", "int > 0", knob_table._positive_int)
    monkeypatch.setitem(knob_table.TABLE, "cpu_kv_bytes", only_vllm)
    monkeypatch.setitem(unit("vllm").knobs, "cpu_kv_bytes", knob_table.NativeMapping(("kv_cache_memory_bytes",)))
    assert to_native("vllm", {"cpu_kv_bytes": 1024}) == {"kv_cache_memory_bytes": 1024}
    with pytest.raises(KnobError, match=r"'cpu_kv_bytes' has no SGLang equivalent \(it exists for vLLM\)"):
        to_native("sglang", {"cpu_kv_bytes": 1024})


@pytest.mark.parametrize("engine, knob, value, message", [
    ("vllm", "max_seqs", 0, "integer > 0"),
    ("sglang", "max_seqs", True, "integer > 0"),
    ("trtllm", "max_tokens_per_step", "4096", "integer > 0"),
    ("vllm", "kv_memory_fraction", 0, r"fraction in \(0, 1\]"),
    ("sglang", "kv_memory_fraction", 1.2, r"fraction in \(0, 1\]"),
    ("trtllm", "prefix_caching", "yes", "true or false"),
    ("vllm", "kv_cache_dtype", "fp8_e4m3fn", "vLLM accepts auto"),
    ("trtllm", "schedule_policy", "priority", "TensorRT-LLM accepts fcfs"),
    ("sglang", "schedule_policy", "sjf", "SGLang accepts lpm"),
    ("vllm", "speculative", {}, "non-empty mapping"),
])
def test_values_out_of_range_fail_with_the_knob_the_engine_and_the_rule(engine, knob, value, message):
    with pytest.raises(KnobError, match=f"{knob}=.*out of range.*{message}"):
        to_native(engine, {knob: value})


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_canonical_view_reads_back_what_to_native_wrote(engine):
    canonical = {**COMMON, **EVERYTHING[engine]}
    assert canonical_view(engine, to_native(engine, canonical)) == canonical


def test_canonical_view_of_plain_native_knobs_and_of_an_unknown_engine():
    assert canonical_view("sglang", {"chunked_prefill_size": -1, "disable_radix_cache": False}) == {
        "chunked_prefill": False, "prefix_caching": True}
    assert canonical_view("tests.fake_engine:FakeEngine", {"max_num_seqs": 4}) == {}


def test_the_knobs_page_embeds_the_table_the_code_renders():
    page = KNOBS_PAGE.read_text()
    assert embed_knob_table(page) == page, "docs/knobs.md's knob table is stale; regenerate: python -m harness.docs"


def test_embedding_replaces_a_stale_table_and_needs_the_markers():
    stale = f"intro\n{TABLE_START}| old |{TABLE_END}\nafter\n"
    assert embed_knob_table(stale) == f"intro\n{TABLE_START}{knob_table_markdown()}{TABLE_END}\nafter\n"
    with pytest.raises(ValueError, match="docs/knobs.md: the markers"):
        embed_knob_table("no markers here")


def test_the_driver_imports_no_engine_module():
    code = ("import sys, harness.cli, harness.run.runner, harness.core.engine_env, harness.report.cli, "
            "harness.tune.cli, engines, engines.knobs; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'sglang', 'tensorrt_llm') "
            "or m in ('engines.vllm', 'engines.sglang', 'engines.trtllm')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
