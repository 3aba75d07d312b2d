"""The SGLang adapter up to the engine call: environment checks, knob names, kwargs, result conversion.

SGLang is not installed here (it needs an NVIDIA GPU); a stand-in ``sglang`` module
records what the adapter would pass to ``sglang.Engine`` and feeds it SGLang-shaped results.
"""

import importlib.util
import sys
import types

import pytest

from engines import sglang as adapter
from engines.base import EngineUnavailable, KnobError, Request
from engines.knobs import to_native
from engines.sglang import SglangEngine, to_completion

MODEL = {"path": "/models/llama", "name": "llama"}
needs_sglang_absent = pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                                         reason="sglang is installed here")


def output(ids, prompt_tokens, cached=0, retractions=0, latency=0.5, finish=None):
    meta = {"id": "x", "prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "cached_tokens": cached,
            "num_retractions": retractions, "e2e_latency": latency, "finish_reason": finish or {"type": "length"}}
    return {"text": "", "output_ids": ids, "meta_info": meta}


class FakeSglangEngine:
    """Stands in for ``sglang.Engine``: records its kwargs and generate calls."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.flushed, self.shut = kwargs, [], 0, False

    def generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None):
        self.calls.append({"input_ids": input_ids, "sampling_params": sampling_params, "image_data": image_data})
        return [output([7] * p["max_new_tokens"], len(ids), cached=len(ids) // 2, retractions=i % 2)
                for i, (ids, p) in enumerate(zip(input_ids, sampling_params))]

    def get_server_info(self):
        return {"startup_time": {"load_weight": 3.0, "kv_cache_allocation": 0.5, "scheduler_e2e": 9.0,
                                 "cuda_graph": {"decode": 4.0, "prefill": 1.5}}}

    def flush_cache(self):
        self.flushed += 1

    def shutdown(self):
        self.shut = True


@pytest.fixture
def fake_sglang(monkeypatch):
    module = types.SimpleNamespace(Engine=FakeSglangEngine, __version__="0.5.23-fake")
    monkeypatch.setitem(sys.modules, "sglang", module)
    return module


@needs_sglang_absent
def test_without_sglang_validate_names_the_interpreter_and_the_fix():
    with pytest.raises(EngineUnavailable) as e:
        SglangEngine(MODEL, {}).validate()
    message = str(e.value)
    assert "sglang is not installed for" in message and sys.executable in message
    assert "troughput-env sglang" in message and "engine.python=" in message


def test_without_a_gpu_validate_says_so(monkeypatch):
    monkeypatch.setattr(adapter, "require_module", lambda *a: None)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    # the precise reasons of engines.requirements (here: a CPU torch, no driver), each with its fix
    with pytest.raises(EngineUnavailable, match=r"SGLang cannot run here: \(1\) .*; fix: .*driver >= 580"):
        SglangEngine(MODEL, {}).validate()


def test_knob_names_are_checked_against_the_recorded_server_args(past_env_checks):
    SglangEngine(MODEL, {"max_running_requests": 8, "chunked_prefill_size": -1, "speculative_num_steps": 3}).validate()
    with pytest.raises(KnobError, match=r"\['max_running_request'\].*sglang 0.5.23.*max_running_requests"):
        SglangEngine(MODEL, {"max_running_request": 8}).validate()
    with pytest.raises(KnobError, match="set by troughput itself"):
        SglangEngine(MODEL, {"model_path": "/elsewhere"}).validate()


def test_recorded_field_list_has_the_fields_the_adapter_and_the_knob_table_use():
    fields, source = adapter.server_args_fields()
    assert len(fields) == 546 and "0.5.23" in source
    used = {"model_path", "skip_tokenizer_init", "load_format", "max_running_requests", "chunked_prefill_size",
            "max_prefill_tokens", "mem_fraction_static", "disable_radix_cache", "tp_size", "kv_cache_dtype",
            "schedule_policy", "speculative_algorithm", "speculative_num_steps", "enable_mixed_chunk"}
    assert used <= fields


def test_engine_kwargs_from_canonical_and_native_knobs():
    knobs = to_native("sglang", {"max_seqs": 32, "prefix_caching": False, "page_size": 16})
    assert SglangEngine(MODEL, knobs)._engine_kwargs() == {
        "model_path": "/models/llama", "skip_tokenizer_init": True, "max_running_requests": 32,
        "disable_radix_cache": True, "page_size": 16}
    vlm = SglangEngine({"path": "/models/vlm", "image_token": "<image>", "dummy_weights": True}, {})
    assert vlm._engine_kwargs() == {"model_path": "/models/vlm", "skip_tokenizer_init": False,
                                    "load_format": "dummy"}


def test_to_completion_reads_meta_info():
    request = Request("r1", [1, 2, 3, 4], 3)
    completion = to_completion(request, output([5, 6, 7], 4, cached=2, latency=1.25), submitted_at=10.0)
    assert (completion.id, completion.prompt_tokens, completion.output_token_ids) == ("r1", 4, [5, 6, 7])
    assert completion.cached_tokens == 2 and completion.finished_at == pytest.approx(11.25)
    with pytest.raises(RuntimeError, match="aborted request r1: too long"):
        to_completion(request, output([], 4, finish={"type": "abort", "message": "too long"}))


def test_start_generate_stats_and_stop_through_a_stand_in_engine(fake_sglang, tmp_path):
    engine = SglangEngine(MODEL, {"max_running_requests": 4})
    info = engine.start()
    assert engine.llm.kwargs == {"model_path": "/models/llama", "skip_tokenizer_init": True,
                                 "max_running_requests": 4}
    assert info.engine_version == "0.5.23-fake" and info.compile_s == pytest.approx(5.5)
    assert info.extra == {"load_weight_s": 3.0, "kv_cache_allocation_s": 0.5}

    requests = [Request(f"r{i}", list(range(10 + i)), 2 + i) for i in range(3)]
    finished = []
    completions = engine.generate(requests, on_finish=finished.append)
    call = engine.llm.calls[0]
    assert call["input_ids"] == [r.prompt_token_ids for r in requests] and call["image_data"] is None
    assert call["sampling_params"][1] == {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0}
    assert [len(c.output_token_ids) for c in completions] == [2, 3, 4] and sum(finished) == 3

    stats = engine.stats()
    assert stats.preemptions == 1, "preemptions are the requests' retractions"
    assert stats.prefix_cache_queries == 10 + 11 + 12 and stats.prefix_cache_hits == 5 + 5 + 6

    engine.generate([Request("img", [1, 2], 1, images=[str(tmp_path / "a.png")]), Request("txt", [3], 1)])
    assert engine.llm.calls[1]["image_data"] == [[str(tmp_path / "a.png")], []]
    engine.reset_caches()
    assert engine.llm.flushed == 1
    llm = engine.llm
    engine.stop()
    assert llm.shut and not engine.started
