"""The TensorRT-LLM adapter up to the engine call: environment checks, knob names, kwargs, backends, results.

TensorRT-LLM cannot be installed here; a stand-in ``tensorrt_llm`` module records what
the adapter would pass to ``LLM`` and feeds it RequestOutput-shaped results.
"""

import importlib.util
import json
import sys
import types
from datetime import timedelta
from types import SimpleNamespace

import pytest

from engines import trtllm as adapter
from engines.base import EngineUnavailable, KnobError, Request
from engines.knobs import to_native
from engines.trtllm import TrtllmEngine, latest_reused_blocks, to_completion

MODEL = {"path": "/models/llama", "name": "llama"}
needs_trtllm_absent = pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                                         reason="tensorrt_llm is installed here")


def request_output(prompt_ids, token_ids, reused_blocks=None, last_token_s=None):
    metrics = None
    if reused_blocks is not None:
        metrics = SimpleNamespace(kv_cache_metrics=SimpleNamespace(num_reused_blocks=reused_blocks),
                                  timing_metrics=SimpleNamespace(last_token_time=timedelta(seconds=last_token_s)))
    return SimpleNamespace(prompt_token_ids=prompt_ids,
                           outputs=[SimpleNamespace(token_ids=token_ids, request_perf_metrics=metrics)])


class FakeLLM:
    """Stands in for ``tensorrt_llm.LLM``: records kwargs and requests, answers with perf metrics."""

    def __init__(self, **kwargs):
        self.kwargs, self.submitted, self.shut = kwargs, [], False
        self.args = SimpleNamespace(kv_cache_config=SimpleNamespace(tokens_per_block=16))
        self.llm_build_stats = SimpleNamespace(build_steps_info=[("build_engine", 40.0), ("load", 2.0)],
                                               cache_hitted=False)

    def generate_async(self, inputs, sampling_params=None, **extra):
        self.submitted.append((inputs, sampling_params, extra))
        ids = inputs["prompt_token_ids"]
        result = request_output(ids, [9] * sampling_params["max_tokens"], reused_blocks=len(ids) // 16,
                                 last_token_s=1.0)
        return SimpleNamespace(result=lambda: result)

    def get_stats(self, timeout=2):
        return [json.dumps({"iter": 1, "kvCacheStats": {"reusedBlocks": 3}}), {"iter": 2, "kvCacheStats": {}}]

    def shutdown(self):
        self.shut = True


class FakeTrtLLM(FakeLLM):
    pass


@pytest.fixture
def fake_trtllm(monkeypatch):
    module = types.ModuleType("tensorrt_llm")
    module.LLM, module.__version__ = FakeLLM, "1.2.1-fake"
    module.SamplingParams = lambda **kwargs: kwargs
    engine_module = types.ModuleType("tensorrt_llm._tensorrt_engine")
    engine_module.LLM = FakeTrtLLM
    monkeypatch.setitem(sys.modules, "tensorrt_llm", module)
    monkeypatch.setitem(sys.modules, "tensorrt_llm._tensorrt_engine", engine_module)
    return module


@needs_trtllm_absent
def test_without_tensorrt_llm_validate_names_the_interpreter_and_the_fix():
    with pytest.raises(EngineUnavailable) as e:
        TrtllmEngine(MODEL, {"backend": "pytorch"}).validate()
    message = str(e.value)
    assert "tensorrt_llm is not installed for" in message and sys.executable in message
    assert "troughput-env trtllm" in message


def test_without_a_gpu_validate_says_so(monkeypatch):
    monkeypatch.setattr(adapter, "require_module", lambda *a: None)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    # the precise reasons of engines.requirements (here: a CPU torch, no driver), each with its fix
    with pytest.raises(EngineUnavailable, match=r"TensorRT-LLM cannot run here: \(1\) .*; fix: .*driver >= 580"):
        TrtllmEngine(MODEL, {}).validate()


def test_knob_names_are_checked_per_backend_and_inside_nested_configs(past_env_checks):
    TrtllmEngine(MODEL, {"backend": "pytorch", "max_batch_size": 64, "cuda_graph_config": {"max_batch_size": 64},
                         "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "dtype": "fp8"},
                         "scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}}).validate()
    TrtllmEngine(MODEL, {"backend": "tensorrt", "build_config": {"max_batch_size": 64}, "fast_build": True}).validate()
    with pytest.raises(KnobError, match=r"\['build_config'\].*TorchLlmArgs"):
        TrtllmEngine(MODEL, {"backend": "pytorch", "build_config": {}}).validate()
    with pytest.raises(KnobError, match=r"kv_cache_config.free_gpu_mem_fraction.*free_gpu_memory_fraction"):
        TrtllmEngine(MODEL, {"kv_cache_config": {"free_gpu_mem_fraction": 0.8}}).validate()
    with pytest.raises(KnobError, match="backend 'onnx' is unknown"):
        TrtllmEngine(MODEL, {"backend": "onnx"}).validate()
    with pytest.raises(KnobError, match="PyTorch-backend only"):
        TrtllmEngine(MODEL, {"backend": "tensorrt", "kv_cache_config": {"dtype": "fp8"}}).validate()


def test_recorded_field_lists_have_the_names_the_adapter_and_the_knob_table_use():
    fields, source = adapter.native_fields("pytorch")
    assert {"model", "max_batch_size", "max_num_tokens", "enable_chunked_prefill", "tensor_parallel_size",
            "speculative_config", "return_perf_metrics", "enable_iter_perf_stats", "load_format",
            "backend"} <= fields[""]
    assert {"free_gpu_memory_fraction", "enable_block_reuse", "dtype", "tokens_per_block"} <= fields["kv_cache_config"]
    assert {"capacity_scheduler_policy", "waiting_queue_policy"} <= fields["scheduler_config"]
    assert "1.2-line" in source
    trt_fields, _ = adapter.native_fields("tensorrt")
    assert {"build_config", "enable_build_cache"} <= trt_fields[""] and "enable_iter_perf_stats" not in trt_fields[""]


def test_engine_kwargs_per_backend():
    knobs = to_native("trtllm", {"backend": "pytorch", "max_seqs": 128, "kv_memory_fraction": 0.85,
                                 "prefix_caching": True})
    assert TrtllmEngine(MODEL, knobs)._engine_kwargs() == {
        "model": "/models/llama", "return_perf_metrics": True, "enable_iter_perf_stats": True,
        "max_batch_size": 128, "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True}}
    trt = TrtllmEngine({**MODEL, "dummy_weights": True}, {"backend": "tensorrt"})._engine_kwargs()
    assert trt == {"model": "/models/llama", "return_perf_metrics": True, "load_format": "dummy"}


def test_to_completion_counts_reused_blocks_and_maps_the_finish_time():
    request = Request("r1", list(range(80)), 2)
    out = request_output(list(range(80)), [4, 5], reused_blocks=6, last_token_s=12.5)
    completion = to_completion(request, out, tokens_per_block=32, submitted_at=100.0,
                               clock_at_submit=timedelta(seconds=10))
    assert completion.prompt_tokens == 80 and completion.output_token_ids == [4, 5]
    assert completion.cached_tokens == 80, "reused blocks x block size, capped at the prompt"
    assert completion.finished_at == pytest.approx(102.5)
    bare = to_completion(request, request_output(list(range(80)), [4, 5]), tokens_per_block=32)
    assert bare.cached_tokens is None and bare.finished_at is None


def test_iteration_stats_as_dicts_or_json_strings():
    assert latest_reused_blocks([json.dumps({"kvCacheStats": {"reusedBlocks": 2}}),
                                 {"kvCacheStats": {"reusedBlocks": 5}}, {"iter": 3}]) == 5.0
    assert latest_reused_blocks([]) is None


@pytest.mark.parametrize("backend, llm_class", [("pytorch", FakeLLM), ("tensorrt", FakeTrtLLM)])
def test_start_picks_the_backends_llm_class_and_records_build_time(fake_trtllm, backend, llm_class):
    engine = TrtllmEngine(MODEL, {"backend": backend, "max_batch_size": 8})
    info = engine.start()
    assert type(engine.llm) is llm_class and "backend" not in engine.llm.kwargs
    assert info.compile_s == pytest.approx(42.0) and info.engine_version == "1.2.1-fake"
    assert info.extra["backend"] == backend and info.extra["tokens_per_block"] == 16


def test_generate_stats_reset_and_stop_through_a_stand_in_llm(fake_trtllm):
    engine = TrtllmEngine(MODEL, {})
    engine.start()
    requests = [Request(f"r{i}", list(range(32 * (i + 1))), 3) for i in range(3)]
    finished = []
    completions = engine.generate(requests, on_finish=finished.append)
    inputs, params, extra = engine.llm.submitted[0]
    assert inputs == {"prompt_token_ids": requests[0].prompt_token_ids} and extra == {}
    assert params == {"max_tokens": 3, "ignore_eos": True, "top_k": 1, "detokenize": False,
                      "return_perf_metrics": True}
    assert [c.id for c in completions] == ["r0", "r1", "r2"] and finished == [1, 1, 1]
    stats = engine.stats()
    assert stats.prefix_cache_queries == 32 + 64 + 96 and stats.prefix_cache_hits == 32 + 64 + 96
    assert stats.preemptions is None and stats.extra == {"kv_reused_blocks": 3.0}

    engine.reset_caches()
    engine.generate(requests[:1])
    assert engine.llm.submitted[-1][2]["cache_salt"].startswith("troughput-"), "a new salt after each reset"
    llm = engine.llm
    engine.stop()
    assert llm.shut and not engine.started
