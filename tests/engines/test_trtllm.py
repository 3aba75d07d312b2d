"""The TensorRT-LLM adapter up to the engine call: environment checks, knob names, kwargs, backends, results, stats.

TensorRT-LLM cannot be installed here. The stand-in ``tensorrt_llm`` is built from the
recorded API (``engines/snapshots/tensorrt_llm-1.2.1.json``): ``LLM(**kwargs)`` rejects what
``TorchLlmArgs``/``TrtLlmArgs`` (and the nested ``KvCacheConfig``, ``SchedulerConfig``,
``CudaGraphConfig``, which forbid extra fields) lack; ``generate_async``, ``get_stats`` and
``SamplingParams`` reject unknown keywords; results and iteration stats fail the test when
the adapter reads a name TensorRT-LLM does not have.
"""

import asyncio
import importlib.util
import json
import sys
import types
from datetime import timedelta

import pytest

from engines import trtllm as adapter
from engines import common
from engines.base import EngineUnavailable, KnobError, Request
from engines.knobs import to_native
from engines.snapshots import Snapshot, load
from engines.statread import StatReader
from engines.steptrace import StepRecorder
from engines.trtllm import IterationTally, TrtllmEngine, to_completion
from tests.engines.conftest import (RecordedDict, RecordedObject, UnrecordedName, check_fields, collect_shards,
                                    fake_class, run_worker)

SNAPSHOT = load("trtllm")
MODEL = {"path": "/models/llama", "name": "llama"}
needs_trtllm_absent = pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                                         reason="tensorrt_llm is installed here")


def request_output(prompt_ids, token_ids, reused_blocks=None, last_token_s=None):
    metrics = None
    if reused_blocks is not None:
        metrics = RecordedObject(
            SNAPSHOT, "RequestPerfMetrics",
            kv_cache_metrics=RecordedObject(SNAPSHOT, "KvCacheMetrics", num_reused_blocks=reused_blocks),
            timing_metrics=RecordedObject(SNAPSHOT, "TimingMetrics", last_token_time=timedelta(seconds=last_token_s)))
    sequence = RecordedObject(SNAPSHOT, "CompletionOutput", token_ids=token_ids, request_perf_metrics=metrics,
                              finish_reason="length", text="")
    in_loop = _running_loop()

    async def aresult(self):
        # the real result has an asyncio queue only when generate_async ran inside an event loop
        assert in_loop, "The asyncio event loop was not present during initialization"
        return self

    return RecordedObject(SNAPSHOT, "RequestOutput", methods={"result": lambda self, timeout=None: self,
                                                              "aresult": aresult},
                          prompt_token_ids=prompt_ids, outputs=[sequence])


def _running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def iteration(n, paused=None, reused=None, ctx=(0, 0), gen=1, latency_ms=10.0, queued=0, active=None, used=None):
    """One ``get_stats()`` entry with the recorded JSON keys: ``ctx`` = (context requests, their tokens), ``gen``
    generation requests, ``used`` KV blocks of 16 tokens."""
    batch = {"numScheduledRequests": ctx[0] + gen, "numContextRequests": ctx[0], "numCtxTokens": ctx[1],
             "numGenRequests": gen}
    if paused is not None:
        batch["numPausedRequests"] = paused
    entry = {"iter": n, "iterLatencyMS": latency_ms, "numQueuedRequests": queued,
             "numActiveRequests": ctx[0] + gen if active is None else active,
             "inflightBatchingStats": RecordedDict(SNAPSHOT, "InflightBatchingStats", batch)}
    kv = {} if reused is None else {"reusedBlocks": reused}
    if used is not None:
        kv.update(usedNumBlocks=used, tokensPerBlock=16)
    if kv:
        entry["kvCacheStats"] = RecordedDict(SNAPSHOT, "KvCacheStats", kv)
    return RecordedDict(SNAPSHOT, "IterationStats", entry)


def make_llm(args_class):
    def init(self, **kwargs):
        check_fields(SNAPSHOT, args_class, kwargs)
        for section, cls in adapter.NESTED.items():
            if isinstance(kwargs.get(section), dict):
                check_fields(SNAPSHOT, cls, kwargs[section])   # StrictBaseModel: extra fields forbidden
        self.kwargs, self.submitted, self.shut = kwargs, [], False
        self.stats_batches = [[json.dumps(iteration(1, paused=0, reused=1)), iteration(2, paused=2)],
                              [iteration(3, paused=1, reused=3)]]
        self.args = RecordedObject(SNAPSHOT, args_class,
                                   kv_cache_config=RecordedObject(SNAPSHOT, "KvCacheConfig", tokens_per_block=16))
        self.llm_build_stats = RecordedObject(SNAPSHOT, "LlmBuildStats", cache_hitted=False,
                                              build_steps_info=[("build_engine", 40.0), ("load", 2.0)])

    def generate_async(self, inputs, sampling_params=None, **extra):
        self.submitted.append((inputs, sampling_params, extra))
        ids = inputs["prompt_token_ids"]
        return request_output(ids, [9] * sampling_params.max_tokens, reused_blocks=len(ids) // 16, last_token_s=1.0)

    def get_stats(self, timeout=2):
        return self.stats_batches.pop(0) if self.stats_batches else []

    def shutdown(self):
        self.shut = True

    return fake_class(SNAPSHOT, "LLM", {"generate_async": generate_async, "get_stats": get_stats,
                                        "shutdown": shutdown}, init=init)


FakeLLM, FakeTrtLLM = make_llm("TorchLlmArgs"), make_llm("TrtLlmArgs")


class FakeSamplingParams:
    """``SamplingParams(**kwargs)``: a dataclass; unknown fields raise ``TypeError``."""

    def __init__(self, **kwargs):
        check_fields(SNAPSHOT, "SamplingParams", kwargs)
        self.__dict__.update(kwargs)


class FakeGuidedDecodingParams(FakeSamplingParams):
    """``GuidedDecodingParams(**kwargs)``: a dataclass; unknown fields raise ``TypeError``."""

    def __init__(self, **kwargs):
        check_fields(SNAPSHOT, "GuidedDecodingParams", kwargs)
        self.__dict__.update(kwargs)


@pytest.fixture
def fake_trtllm(monkeypatch):
    module = types.ModuleType("tensorrt_llm")
    module.LLM, module.__version__ = FakeLLM, "1.2.1-fake"
    module.SamplingParams = FakeSamplingParams
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.GuidedDecodingParams = FakeGuidedDecodingParams
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    engine_module = types.ModuleType("tensorrt_llm._tensorrt_engine")
    engine_module.LLM = FakeTrtLLM
    monkeypatch.setitem(sys.modules, "tensorrt_llm", module)
    monkeypatch.setitem(sys.modules, "tensorrt_llm._tensorrt_engine", engine_module)
    monkeypatch.setattr(adapter, "DRAIN_EVERY_S", 0.001)   # drain all the time
    return module


def test_the_stand_in_rejects_what_tensorrt_llm_rejects():
    with pytest.raises(TypeError, match=r"TorchLlmArgs\(\) got unexpected keyword argument\(s\) \['build_config'\]"):
        FakeLLM(model="/m", build_config={})
    with pytest.raises(TypeError, match=r"CudaGraphConfig\(\) got unexpected keyword argument\(s\) \['max_bs'\]"):
        FakeLLM(model="/m", cuda_graph_config={"max_bs": 8})
    llm = FakeLLM(model="/m")
    with pytest.raises(TypeError, match=r"LLM.generate_async\(\) got unexpected keyword argument\(s\) \['salt'\]"):
        llm.generate_async({"prompt_token_ids": [1]}, sampling_params=FakeSamplingParams(max_tokens=1), salt="x")
    with pytest.raises(TypeError, match=r"SamplingParams\(\) got unexpected keyword argument\(s\) \['max_new_tokens'\]"):
        FakeSamplingParams(max_new_tokens=1)
    with pytest.raises(UnrecordedName, match="CompletionOutput.output_ids"):
        request_output([1], [2]).outputs[0].output_ids   # noqa: B018
    with pytest.raises(UnrecordedName, match="'numPreemptions', which is not one of the InflightBatchingStats keys"):
        iteration(1, paused=0)["inflightBatchingStats"].get("numPreemptions")


@needs_trtllm_absent
def test_without_tensorrt_llm_validate_names_the_interpreter_and_the_fix():
    with pytest.raises(EngineUnavailable) as e:
        TrtllmEngine(MODEL, {"backend": "pytorch"}).validate()
    message = str(e.value)
    assert "tensorrt_llm is not installed for" in message and sys.executable in message
    assert "troughput-env trtllm" in message


def test_without_a_gpu_validate_says_so(monkeypatch):
    monkeypatch.setattr(common, "require_module", lambda *a: None)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    # the precise reasons of engines.requirements (here: a CPU torch, no driver), each with its fix
    with pytest.raises(EngineUnavailable, match=r"TensorRT-LLM cannot run here \(the checks of `troughput-env \w+ "
                                                r"--check`\): \(1\) .*driver >= 580.*; fix: "):
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


def test_every_native_name_the_knob_table_maps_to_is_a_recorded_field():
    for backend in ("pytorch", "tensorrt"):
        fields, source = adapter.native_fields(backend)
        assert "tensorrt_llm 1.2.1" in source
        for mapping in adapter.UNIT.knobs.values():
            for target in mapping.targets:
                section, _, name = target.rpartition(".")
                if backend == "tensorrt" and target == "kv_cache_config.dtype":
                    continue   # PyTorch backend only, refused by check_knobs
                assert name in fields[section], f"{target} ({backend})"
    assert adapter.UNIT.reserved <= fields[""]
    assert SNAPSHOT.data["source"]["commit"] == "376f7e1bd8ed543f75014309e3fd4b237e9b0e73"
    trt_fields, _ = adapter.native_fields("tensorrt")
    assert {"build_config", "enable_build_cache"} <= trt_fields[""] and "enable_iter_perf_stats" not in trt_fields[""]


def _with_registry(architectures):
    """The committed TensorRT-LLM snapshot with ``architectures`` as its recorded model registry."""
    data = {**SNAPSHOT.data, "models": {**SNAPSHOT.data["models"], "architectures": architectures}}
    return Snapshot(data, SNAPSHOT.path)


def test_a_model_tensorrt_llm_does_not_implement_is_refused_with_what_it_implements(past_env_checks, monkeypatch,
                                                                                     tmp_path):
    """SGLang's check (``Snapshot.check_architectures``) on TensorRT-LLM's ``@register_auto_model`` registry."""
    registry = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration"]
    monkeypatch.setattr(adapter, "load_snapshot", lambda engine: _with_registry(registry))
    (tmp_path / "config.json").write_text('{"architectures": ["Idefics3ForConditionalGeneration"]}')
    with pytest.raises(KnobError, match=r"'smolvlm' \(Idefics3ForConditionalGeneration\) is not implemented by "
                                        r"TensorRT-LLM 1.2.1; it implements: LlamaForCausalLM, Qwen2ForCausalLM, "
                                        r"Qwen2_5_VLForConditionalGeneration"):
        TrtllmEngine({"path": str(tmp_path), "name": "smolvlm"}, {}).validate()
    TrtllmEngine({"path": "/hub/id", "name": "llama-3.1-8b"}, {}).validate()              # conf/architectures: Llama
    TrtllmEngine({"path": "Qwen/Qwen2.5-VL-7B-Instruct", "name": "qwen2.5-vl-7b"}, {}).validate()   # the shared VLM
    TrtllmEngine({"path": "/hub/id", "name": "unknown"}, {}).validate()   # not known before start: the engine judges


def test_the_committed_registry_is_not_recorded_so_no_model_is_refused(past_env_checks, tmp_path):
    """Until the registry is recorded from source at a named commit, TensorRT-LLM itself is the judge."""
    assert SNAPSHOT.architectures is None
    (tmp_path / "config.json").write_text('{"architectures": ["Idefics3ForConditionalGeneration"]}')
    TrtllmEngine({"path": str(tmp_path), "name": "smolvlm"}, {}).validate()


def test_without_chunked_prefill_the_token_budget_must_cover_the_longest_prompt(past_env_checks):
    model = {**MODEL, "workload_max_prompt_tokens": 9000, "workload_max_seq_tokens": 9100}
    with pytest.raises(KnobError, match=r"max_num_tokens=8192 .* below the longest prompt \(9000 tokens\)"):
        TrtllmEngine(model, {}).validate()
    with pytest.raises(KnobError, match=r"max_num_tokens=4096"):
        TrtllmEngine(model, {"max_num_tokens": 4096}).validate()
    TrtllmEngine(model, {"max_num_tokens": 9000}).validate()
    TrtllmEngine(model, {"enable_chunked_prefill": True}).validate()


def test_engine_kwargs_per_backend():
    knobs = to_native("trtllm", {"backend": "pytorch", "max_seqs": 128, "kv_memory_fraction": 0.85,
                                 "prefix_caching": True})
    assert TrtllmEngine(MODEL, knobs)._engine_kwargs() == {
        "model": "/models/llama", "return_perf_metrics": True, "enable_iter_perf_stats": True,
        "max_batch_size": 128, "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True},
        "cuda_graph_config": {"max_batch_size": 128, "enable_padding": True}}
    trt = TrtllmEngine({**MODEL, "dummy_weights": True}, {"backend": "tensorrt"})._engine_kwargs()
    assert trt == {"model": "/models/llama", "return_perf_metrics": True, "load_format": "dummy"}


def test_cuda_graphs_follow_max_batch_size_unless_configured():
    assert "cuda_graph_config" not in TrtllmEngine(MODEL, {})._engine_kwargs(), "engine defaults stay defaults"
    assert TrtllmEngine(MODEL, {"max_batch_size": 1024})._engine_kwargs()["cuda_graph_config"] == {
        "max_batch_size": 1024, "enable_padding": True}
    assert TrtllmEngine(MODEL, {"max_batch_size": 1024, "cuda_graph_config": None})._engine_kwargs()[
        "cuda_graph_config"] is None, "null turns graphs off"
    explicit = {"batch_sizes": [1, 8, 64]}
    assert TrtllmEngine(MODEL, {"max_batch_size": 1024, "cuda_graph_config": explicit})._engine_kwargs()[
        "cuda_graph_config"] == explicit
    trt = TrtllmEngine(MODEL, {"backend": "tensorrt", "max_batch_size": 64})._engine_kwargs()
    assert "cuda_graph_config" not in trt, "the TensorRT backend has no cuda_graph_config"


def test_the_tensorrt_build_is_sized_for_the_workload():
    model = {**MODEL, "workload_max_prompt_tokens": 3000, "workload_max_seq_tokens": 3064}
    kwargs = TrtllmEngine(model, {"backend": "tensorrt"})._engine_kwargs()
    assert (kwargs["max_input_len"], kwargs["max_seq_len"]) == (3000, 3064)
    assert TrtllmEngine(model, {"backend": "tensorrt", "max_input_len": 4096})._engine_kwargs()["max_input_len"] == 4096
    built = TrtllmEngine(model, {"backend": "tensorrt", "build_config": {"max_input_len": 5000}})._engine_kwargs()
    assert "max_input_len" not in built and built["max_seq_len"] == 3064
    assert "max_input_len" not in TrtllmEngine(model, {})._engine_kwargs(), "the PyTorch backend needs no build limits"


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


class Clock:
    """A ``StepRecorder`` clock that reads ``now``."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_each_iteration_is_one_step_with_the_engines_own_latency_and_counts():
    clock = Clock()
    steps = StepRecorder(clock=clock)
    tally = IterationTally(StatReader("TensorRT-LLM"), steps)
    clock.now = 101.0
    tally.add([json.dumps(iteration(1, ctx=(2, 300), gen=0, latency_ms=40.0, queued=3, active=5, used=20)),
               iteration(2, ctx=(1, 100), gen=2, latency_ms=15.0, paused=1, used=27),
               iteration(3, gen=3, latency_ms=10.0, used=28)])
    clock.now = 101.02   # the next batch's laid-back ends would reach before 101.0: held at the last step's end
    tally.add([iteration(4, gen=3, latency_ms=30.0), iteration(5, gen=2, latency_ms=20.0, queued=1)])
    trace = steps.take()
    assert trace["running"] == [2, 3, 3, 3, 2] and trace["decode"] == [0, 2, 3, 3, 2]
    assert trace["prefill"] == [300, 100, 0, 0, 0] and trace["prefill_seqs"] == [2, 1, 0, 0, 0]
    assert trace["waiting"] == [3 + 3, 0, 0, 0, 1], "queued plus active but not scheduled"
    assert trace["kv_tokens"] == [320, 432, 448, -1, -1] and trace["preempted"] == [0, 1, 0, 0, 0]
    assert trace["context"] == [-1] * 5, "1.2.1's iteration stats sum no context"
    assert trace["dt"] == pytest.approx([0.04, 0.015, 0.01, 0.03, 0.02])
    assert trace["t"] == pytest.approx([0.975, 0.99, 1.0, 1.0, 1.02]), "ends laid back from each drain"
    assert tally.paused == 1 and tally.reader.warnings == []


def test_an_iteration_without_its_latency_or_batch_counts_is_no_step_and_a_warning():
    steps = StepRecorder()
    tally = IterationTally(StatReader("TensorRT-LLM"), steps)
    no_latency = RecordedDict(SNAPSHOT, "IterationStats", {k: v for k, v in iteration(1).items()
                                                           if k != "iterLatencyMS"})
    no_batch = RecordedDict(SNAPSHOT, "IterationStats", {"iter": 2, "iterLatencyMS": 5.0})
    no_counts = RecordedDict(SNAPSHOT, "IterationStats", {"iter": 3, "iterLatencyMS": 5.0, "inflightBatchingStats":
                                                          RecordedDict(SNAPSHOT, "InflightBatchingStats",
                                                                       {"numPausedRequests": 2})})
    tally.add([no_latency, no_batch, no_counts, iteration(4)])
    assert len(steps) == 1 and tally.paused == 2
    warnings = " | ".join(tally.reader.warnings)
    assert "['iterLatencyMS'] is missing" in warnings and "['inflightBatchingStats'] is missing" in warnings
    assert "['numScheduledRequests'] is missing" in warnings


def test_iteration_stats_as_dicts_or_json_strings():
    tally = IterationTally()
    tally.add([json.dumps(iteration(1, paused=2, reused=2)), iteration(2, paused=0, reused=5), iteration(3)])
    tally.add([iteration(5, paused=1)])
    assert tally.paused == 3, "preemptions are the paused requests summed over iterations"
    assert tally.reused_blocks == 5.0 and tally.lost == 1, "iteration 4 was not seen"
    empty = IterationTally()
    empty.add([])
    assert empty.paused is None and empty.extra() == {"iterations": 0.0, "iteration_stats_lost": 0.0}


@pytest.mark.parametrize("backend, llm_class", [("pytorch", FakeLLM), ("tensorrt", FakeTrtLLM)])
def test_start_picks_the_backends_llm_class_and_records_build_time(fake_trtllm, backend, llm_class):
    engine = TrtllmEngine(MODEL, {"backend": backend, "max_batch_size": 8})
    info = engine.start()
    assert type(engine.llm) is llm_class and "backend" not in engine.llm.kwargs
    assert info.compile_s == pytest.approx(42.0) and info.engine_version == "1.2.1-fake"
    assert info.extra["backend"] == backend and info.extra["tokens_per_block"] == 16
    assert engine.stat_reader.warnings == [], "the recorded shapes read without a warning"


def test_generate_stats_reset_and_stop_through_a_stand_in_llm(fake_trtllm):
    engine = TrtllmEngine(MODEL, {})
    engine.start()
    requests = [Request(f"r{i}", list(range(32 * (i + 1))), 3) for i in range(3)]
    finished = []
    completions = engine.generate(requests, on_finish=finished.append)
    inputs, params, extra = engine.llm.submitted[0]
    assert inputs == {"prompt_token_ids": requests[0].prompt_token_ids} and extra == {}
    assert vars(params) == {"max_tokens": 3, "ignore_eos": True, "top_k": 1, "detokenize": False,
                            "return_perf_metrics": True}
    assert [c.id for c in completions] == ["r0", "r1", "r2"] and finished == [1, 1, 1]
    stats = engine.stats()
    assert stats.prefix_cache_queries == 32 + 64 + 96 and stats.prefix_cache_hits == 32 + 64 + 96
    assert stats.preemptions == 3, "numPausedRequests summed: 0 + 2 + 1"
    assert stats.extra == {"kv_reused_blocks": 3.0, "iterations": 3.0, "iteration_stats_lost": 0.0}
    assert engine.stat_reader.warnings == [], "recorded shapes (dicts and JSON strings) read without a warning"
    assert TrtllmEngine.records_steps and engine.step_trace.take()["preempted"] == [0, 2, 1], "one step an iteration"

    engine.reset_caches()
    engine.generate(requests[:1])
    assert engine.llm.submitted[-1][2]["cache_salt"].startswith("troughput-"), "a new salt after each reset"
    llm = engine.llm
    engine.stop()
    assert llm.shut and not engine.started


def test_own_sampling_and_constraints_reach_the_recorded_sampling_params(fake_trtllm):
    requests = [Request("j", [1, 2], 8, constraint={"kind": "json", "value": {"type": "object"}}),
                Request("c", [1, 2], 8, sampling={"temperature": 0.5, "seed": 7, "stop": ["\n"]},
                        constraint={"kind": "choice", "value": ["yes", "no"]}),
                Request("o", [1, 2], 8, constraint={"kind": "json_object", "value": None})]
    from engines.worker import workload_limits

    engine = TrtllmEngine({**MODEL, **workload_limits(requests)}, {})
    engine.start()
    assert engine.llm.kwargs["guided_decoding_backend"] == "xgrammar", "a constrained workload needs a grammar backend"
    completions = engine.generate(requests)
    params = [p for _, p, _ in engine.llm.submitted]
    assert vars(params[0].guided_decoding) == {"json": {"type": "object"}}
    assert vars(params[1].guided_decoding) == {"regex": "(yes|no)"}
    assert (params[1].temperature, params[1].seed, params[1].stop, params[1].ignore_eos) == (0.5, 7, ["\n"], False)
    assert vars(params[2].guided_decoding) == {"json_object": True}
    assert [p.detokenize for p in params] == [False, True, False], "only stop strings need the engine's text"
    assert completions[0].finish_reason == "length"


def test_the_h100_space_never_proposes_a_budget_below_the_prompts_without_chunked_prefill():
    yaml = pytest.importorskip("yaml")
    from harness.tune.space import SearchSpace
    from tests.conftest import ROOT

    space = SearchSpace(yaml.safe_load((ROOT / "conf" / "tune" / "trtllm_h100.yaml").read_text())["space"])
    base = {"model": {"canonical": {"context_length": 8192}}}
    values = {"engine.canonical.chunked_prefill": False, "engine.canonical.max_seqs": 16,
              "engine.canonical.max_tokens_per_step": 4096}
    assert "max_tokens_per_step=4096 < model.canonical.context_length=8192" in space.check(values, base)
    assert space.check({**values, "engine.canonical.chunked_prefill": True}, base) is None
    assert space.clip(values, base)["engine.canonical.max_tokens_per_step"] == 8192


def test_the_worker_passes_the_longest_prompt_and_sequence_in_the_model_dict():
    from engines.worker import workload_limits

    requests = [Request("a", [1] * 300, 20), Request("b", [1] * 100, 500)]
    assert workload_limits(requests) == {"workload_max_prompt_tokens": 300, "workload_max_seq_tokens": 600,
                                         "workload_needs_tokenizer": False, "workload_constrained": False}
    assert workload_limits([]) == {}


def llama_folder(tmp_path, **config):
    """A model folder whose config names its EOS (and maybe pad) id, and whose tokenizer.json no loader reads."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    return {"path": str(tmp_path), "local_dir": str(tmp_path), "name": "llama"}


def test_token_id_prompts_start_without_a_tokenizer_and_take_end_and_pad_ids_from_the_config(fake_trtllm, tmp_path):
    engine = TrtllmEngine(llama_folder(tmp_path, eos_token_id=[128001, 128009], pad_token_id=7), {})
    engine.start()   # the stand-in checks skip_tokenizer_init against the recorded TorchLlmArgs
    assert engine.llm.kwargs["skip_tokenizer_init"] is True
    engine.generate([Request("r", [1, 2, 3], 2)])
    params = engine.llm.submitted[0][1]   # end_id and pad_id checked against the recorded SamplingParams
    assert (params.end_id, params.pad_id) == (128001, 7)
    no_pad = TrtllmEngine(llama_folder(tmp_path, eos_token_id=2), {})
    assert no_pad.token_ids() == (2, 2), "pad_id defaults to the EOS id, as SamplingParams does"


def test_the_tokenizer_stays_where_it_is_needed_or_the_eos_is_unknown(fake_trtllm, tmp_path):
    assert "skip_tokenizer_init" not in TrtllmEngine(MODEL, {})._engine_kwargs(), "no local config: no EOS id"
    grammar = TrtllmEngine({**llama_folder(tmp_path, eos_token_id=2), "workload_needs_tokenizer": True}, {})
    assert "skip_tokenizer_init" not in grammar._engine_kwargs() and grammar.token_ids() is None


def odd_stats_llm(batches):
    """A stand-in LLM whose get_stats hands back ``batches`` (shapes TensorRT-LLM might send) in turn."""
    class Odd(FakeLLM):
        pass

    def get_stats(self, timeout=2):
        return batches.pop(0) if batches else []

    Odd.get_stats = adapter_checked("get_stats", get_stats)
    return Odd


def adapter_checked(method, impl):
    from tests.engines.conftest import checked_method

    return checked_method(SNAPSHOT, "LLM", method, impl)


@pytest.mark.parametrize("batches, warning", [
    ([[RecordedDict(SNAPSHOT, "IterationStats", {"iter": 1, "inflightBatchingStats": RecordedDict(
        SNAPSHOT, "InflightBatchingStats", {"numPausedRequests": "2"})})]], "['numPausedRequests'] is text ('2')"),
    ([[RecordedDict(SNAPSHOT, "IterationStats", {"iter": 1, "kvCacheStats": 4.0})]], "['kvCacheStats'] is number"),
    ([["{not json"]], "get_stats() entry is not valid JSON"),
    ([[3]], "get_stats() entry is number (3), expected mapping"),
    ([{"iter": 1}], "get_stats() returned dict, not a list"),
])
def test_iteration_stats_of_another_shape_leave_an_ok_row_with_a_warning(fake_trtllm, past_env_checks, tmp_path,
                                                                          batches, warning):
    fake_trtllm.LLM = odd_stats_llm(list(batches))
    result, columns = run_worker(tmp_path, "trtllm", MODEL, [Request("r", [1, 2, 3], 2)])
    assert result["status"] == "ok", result.get("error")
    assert any(warning in w for w in columns["engine_info.stat_warnings"]), columns["engine_info.stat_warnings"]
    assert columns["output_tokens"] == 2


def test_a_pass_carries_the_iterations_drained_during_it_as_its_steps(fake_trtllm, past_env_checks, tmp_path):
    fake_trtllm.LLM = odd_stats_llm([[iteration(1, ctx=(1, 3), gen=0)],   # drained before the pass: not its steps
                                     [iteration(2, gen=1, latency_ms=7.0), iteration(3, gen=1, latency_ms=8.0)]])
    result, _ = run_worker(tmp_path, "trtllm", MODEL, [Request("r", [1, 2, 3], 2)])
    steps = result["passes"][0]["steps"]
    assert result["status"] == "ok" and result["passes"][0]["step_trace_gap"] is None
    assert steps["decode"] == [1, 1] and steps["dt"] == pytest.approx([0.007, 0.008])


def test_iterations_lost_past_the_queue_are_a_warning_with_the_count(fake_trtllm, past_env_checks, tmp_path):
    fake_trtllm.LLM = odd_stats_llm([[iteration(1, paused=0)], [iteration(5, paused=1)]])
    result, columns = run_worker(tmp_path, "trtllm", MODEL, [Request("r", [1, 2, 3], 2)])
    assert result["status"] == "ok", result.get("error")
    assert columns["stat.iteration_stats_lost"] == 3.0
    assert any("3 iteration stats were lost" in w for w in columns["engine_info.stat_warnings"])


def test_iteration_stats_are_drained_on_a_timer_while_results_are_awaited(fake_trtllm, monkeypatch):
    """A long pass: the first result arrives late, yet the stats queue is drained meanwhile."""
    import threading

    release, drains = threading.Event(), []

    class Slow(FakeLLM):
        pass

    def generate_async(self, inputs, sampling_params=None, **extra):
        out = request_output(inputs["prompt_token_ids"], [9] * sampling_params.max_tokens)
        return RecordedObject(SNAPSHOT, "RequestOutput", methods={"result": lambda s, timeout=None: (
            release.wait(5), out)[1]}, prompt_token_ids=out.prompt_token_ids, outputs=out.outputs)

    def get_stats(self, timeout=2):
        drains.append(1)
        if len(drains) >= 3:
            release.set()   # the result comes only after the timer has drained twice during the wait
        return [iteration(len(drains), paused=1)]

    Slow.generate_async = adapter_checked("generate_async", generate_async)
    Slow.get_stats = adapter_checked("get_stats", get_stats)
    fake_trtllm.LLM = Slow
    monkeypatch.setattr(adapter, "DRAIN_EVERY_S", 0.02)
    engine = TrtllmEngine(MODEL, {})
    engine.start()
    engine.generate([Request("r", [1, 2], 1)])
    assert len(drains) >= 3 and engine.iterations.paused == len(drains)


def test_start_stats_of_another_shape_leave_an_ok_row_with_null_columns_and_warnings(fake_trtllm, past_env_checks,
                                                                                      tmp_path):
    """Build steps that are not (step, seconds) numbers, and no tokens_per_block: the row is ok, the start's
    columns and the prefix-cache hits (which need the block size) are null, not 0, each with a warning."""
    class Odd(FakeLLM):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.args = RecordedObject(SNAPSHOT, "TorchLlmArgs",
                                       kv_cache_config=RecordedObject(SNAPSHOT, "KvCacheConfig", tokens_per_block=None))
            self.llm_build_stats = RecordedObject(SNAPSHOT, "LlmBuildStats", cache_hitted=False,
                                                  build_steps_info=[("build_engine", "40 s"), ("load", 2.0)])

    fake_trtllm.LLM = Odd
    result, columns = run_worker(tmp_path, "trtllm", MODEL, [Request("r", list(range(32)), 2)])
    assert result["status"] == "ok", result.get("error")
    warnings = " | ".join(columns["engine_info.stat_warnings"])
    assert "['build_engine'] is text ('40 s')" in warnings and "tokens_per_block is missing" in warnings
    assert columns["compile_s"] == pytest.approx(2.0) and columns["output_tokens"] == 2
    assert columns["cached_tokens"] is None and columns["prefix_cache_hit_rate"] is None


def test_the_feeder_awaits_each_request_generated_inside_its_event_loop(fake_trtllm):
    engine = TrtllmEngine(MODEL, {"backend": "pytorch"})
    engine.start()
    feeder = engine.feeder()
    feeder.feed("a", [Request("a0", list(range(40)), 2), Request("a1", [1], 3)])
    feeder.feed("b", [Request("b0", [2, 3], 1)])
    got = collect_shards(feeder, 2)
    assert [[len(c.output_token_ids) for c in got[s].completions] for s in "ab"] == [[2, 3], [1]]
    assert not got["a"].errors and feeder.idle()
    assert engine.stats().prefix_cache_hits == 32   # two reused 16-token blocks of a0's prompt
