"""The SGLang adapter up to the engine call: environment checks, knob and model names, kwargs, results, flush.

SGLang is not installed here (it needs an NVIDIA GPU). The stand-in ``sglang.Engine`` is
built from the recorded API (``engines/snapshots/sglang-0.5.23.json``, read from the
0.5.23 wheel): it rejects constructor arguments that are not ``ServerArgs`` fields,
``generate`` keywords and sampling keys the real ones lack, and fails the test when the
adapter reads a ``meta_info`` or ``startup_time`` key SGLang does not write.
"""

import importlib.util
import json
import os
import sys
import time
import types

import pytest

from engines import sglang as adapter
from engines import common
from engines.base import EngineUnavailable, KnobError, Request
from engines.knobs import to_native
from engines.sglang import SglangEngine, flush_radix_cache, to_completion
from engines.snapshots import load
from engines.sglang_steps import FPM_MODULE, fpm_step
from engines.statread import StatReader
from tests.engines.conftest import (RecordedDict, RecordedObject, UnrecordedName, check_fields, checked_method,
                                    collect_shards, fake_class, run_worker)

SNAPSHOT = load("sglang")
MODEL = {"path": "/models/llama", "name": "llama"}
needs_sglang_absent = pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                                         reason="sglang is installed here")


def output(ids, prompt_tokens, cached=0, retractions=0, latency=0.5, finish=None):
    meta = RecordedDict(SNAPSHOT, "meta_info", {
        "id": "x", "prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "cached_tokens": cached,
        "num_retractions": retractions, "e2e_latency": latency, "finish_reason": finish or {"type": "length"}})
    return RecordedDict(SNAPSHOT, "generate_output", {"text": "", "output_ids": ids, "meta_info": meta})


def flush_result(success, message=""):
    return RecordedObject(SNAPSHOT, "FlushCacheReqOutput", success=success, message=message)


def fpm(prefill=(0, 0, 0), decode=(0, 0), queued=(0, 0), wall=0.01):
    """A ``ForwardPassMetrics`` message's fields: ``prefill`` = (requests, new tokens, prefix KV tokens),
    ``decode`` = (requests, their KV tokens), ``queued`` = (prefill, decode) requests waiting; all zeros: idle."""
    return {"wall_time": wall, "counter_id": 0, "dp_rank": 0,
            "scheduled_requests": {"num_prefill_requests": prefill[0], "sum_prefill_tokens": prefill[1],
                                   "sum_prefill_kv_tokens": prefill[2], "num_decode_requests": decode[0],
                                   "sum_decode_kv_tokens": decode[1], "var_decode_kv_tokens": 0.0},
            "queued_requests": {"num_prefill_requests": queued[0], "num_decode_requests": queued[1]}}


def decode_fpm(payload: bytes):
    """The stand-in of ``forward_pass_metrics.decode`` (msgpack in SGLang, JSON here): the recorded structs, whose
    unrecorded attributes fail the test."""
    data = json.loads(payload)
    return RecordedObject(SNAPSHOT, "ForwardPassMetrics", **{
        **data, "scheduled_requests": RecordedObject(SNAPSHOT, "ScheduledRequestMetrics", **data["scheduled_requests"]),
        "queued_requests": RecordedObject(SNAPSHOT, "QueuedRequestMetrics", **data["queued_requests"])})


class Publisher:
    """The scheduler's FPM socket at ``<forward_pass_metrics_ipc_name>.0``: ``(b"", sequence, payload)`` per pass.

    An XPUB, so that it can wait for the adapter's subscription before the first pass (a PUB drops what is sent
    before a subscriber joins; a real run's warm-up passes precede the timed ones)."""

    def __init__(self, address):
        import zmq

        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.XPUB)
        self.socket.bind(address)
        self.seq, self.subscribed, self.wait_ms = 0, False, 5000

    def publish(self, messages, skip=0):
        if not self.subscribed:
            if not self.socket.poll(self.wait_ms):
                return   # nobody subscribed: dropped, as by a PUB
            self.socket.recv()
            self.subscribed = True
        self.seq += skip   # messages dropped past the high-water mark
        for message in messages:
            self.socket.send_multipart([b"", self.seq.to_bytes(8, "big"), json.dumps(message).encode()])
            self.seq += 1

    def close(self):
        self.socket.close(linger=0)
        self.context.term()


def passes(requests):
    """What the stand-in scheduler runs for a batch: one prefill pass of every request, then one decode pass per
    further token of the longest, then the idle heartbeat."""
    lengths, outputs = [len(ids) for ids, _ in requests], [p["max_new_tokens"] for _, p in requests]
    out = [fpm(prefill=(len(requests), sum(lengths), 0), wall=0.02)]
    for k in range(1, max(outputs)):
        going = [n for n, m in zip(lengths, outputs) if m > k]
        out.append(fpm(decode=(len(going), sum(going) + k * len(going)), wall=0.005))
    return [*out, fpm(wall=0.0)]


def _init(self, **kwargs):
    check_fields(SNAPSHOT, "ServerArgs", kwargs)   # sglang.Engine(**kwargs) builds ServerArgs(**kwargs)
    self.kwargs, self.calls, self.flushes, self.busy_flushes, self.shut = kwargs, [], 0, 0, False
    self.skip = 0
    if kwargs.get("enable_forward_pass_metrics"):
        self.publisher = Publisher(f"{kwargs['forward_pass_metrics_ipc_name']}.0")


def _generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None, **rest):
    for params in sampling_params:
        check_fields(SNAPSHOT, "SamplingParams", params)
    self.calls.append({"input_ids": input_ids, "sampling_params": sampling_params, "image_data": image_data})
    if hasattr(self, "publisher"):
        self.publisher.publish(passes(list(zip(input_ids, sampling_params))), skip=self.skip)
    return [output([7] * p["max_new_tokens"], len(ids), cached=len(ids) // 2, retractions=i % 2)
            for i, (ids, p) in enumerate(zip(input_ids, sampling_params))]


def server_info(startup=None, types_as_recorded=True, **rest):
    """A recorded-shape ``get_server_info()`` result (``keys.server_info`` and ``types.startup_time``)."""
    startup = {"load_weight": 3.0, "kv_cache_allocation": 0.5, "scheduler_e2e": 9.0,
               "cuda_graph": {"decode": 4.0, "prefill": 1.5}} if startup is None else startup
    return RecordedDict(SNAPSHOT, "server_info", {
        "startup_time": RecordedDict(SNAPSHOT, "startup_time", startup, types_as_recorded=types_as_recorded),
        "version": "0.5.23", **rest})


def _get_server_info(self):
    return self.server_info if hasattr(self, "server_info") else server_info()


def _flush_cache(self):
    """Busy for the first ``busy_flushes`` calls (the scheduler still draining), then flushes."""
    self.flushes += 1
    if self.flushes <= self.busy_flushes:
        return flush_result(False, "Cache not flushed because there are pending requests.")
    return flush_result(True)


def _shutdown(self):
    self.shut = True
    if hasattr(self, "publisher"):
        self.publisher.close()


FakeSglangEngine = fake_class(SNAPSHOT, "Engine", {
    "generate": _generate, "get_server_info": _get_server_info, "flush_cache": _flush_cache,
    "shutdown": _shutdown}, init=_init)


def install(monkeypatch, engine_class):
    """The stand-in ``sglang`` with ``engine_class`` as its ``Engine``, and its FPM module's ``decode``."""
    module = types.SimpleNamespace(Engine=engine_class, __version__="0.5.23-fake")
    monkeypatch.setitem(sys.modules, "sglang", module)
    monkeypatch.setitem(sys.modules, FPM_MODULE, types.SimpleNamespace(decode=decode_fpm))
    return module


@pytest.fixture
def fake_sglang(monkeypatch):
    return install(monkeypatch, FakeSglangEngine)


def steps_in(engine, count, timeout_s=10.0):
    """The engine's step trace once ``count`` steps were recorded (the messages cross a socket)."""
    deadline = time.monotonic() + timeout_s
    while len(engine.step_trace) < count and time.monotonic() < deadline:
        engine.fpm.drain()
        time.sleep(0.01)
    return engine.step_trace.take()


def test_the_stand_in_rejects_what_sglang_rejects():
    with pytest.raises(TypeError, match=r"ServerArgs\(\) got unexpected keyword argument\(s\) \['max_running_request'\]"):
        FakeSglangEngine(model_path="/m", max_running_request=4)
    engine = FakeSglangEngine(model_path="/m")
    with pytest.raises(TypeError, match=r"Engine.generate\(\) got unexpected keyword argument\(s\) \['input_id'\]"):
        engine.generate(input_id=[[1]], sampling_params=[{"max_new_tokens": 1}])
    with pytest.raises(TypeError, match=r"SamplingParams\(\) got unexpected keyword argument\(s\) \['max_tokens'\]"):
        engine.generate(input_ids=[[1]], sampling_params=[{"max_tokens": 1}])
    with pytest.raises(UnrecordedName, match="'num_preemptions', which is not one of the meta_info keys"):
        output([1], 1)["meta_info"].get("num_preemptions")
    with pytest.raises(UnrecordedName, match="FlushCacheReqOutput.succeeded"):
        flush_result(True).succeeded   # noqa: B018
    with pytest.raises(UnrecordedName, match=r"no method\(s\) \['flush'\]"):
        fake_class(SNAPSHOT, "Engine", {"flush": _flush_cache})


@needs_sglang_absent
def test_without_sglang_validate_names_the_interpreter_and_the_fix():
    with pytest.raises(EngineUnavailable) as e:
        SglangEngine(MODEL, {}).validate()
    message = str(e.value)
    assert "sglang is not installed for" in message and sys.executable in message
    assert "troughput-env sglang" in message and "engine.python=" in message


def test_without_a_gpu_validate_says_so(monkeypatch):
    monkeypatch.setattr(common, "require_module", lambda *a: None)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    # the precise reasons of engines.requirements (here: a CPU torch, no driver), each with its fix
    with pytest.raises(EngineUnavailable, match=r"SGLang cannot run here \(the checks of `troughput-env \w+ "
                                                r"--check`\): \(1\) .*driver >= 580.*; fix: "):
        SglangEngine(MODEL, {}).validate()


def test_knob_names_are_checked_against_the_recorded_server_args(past_env_checks):
    SglangEngine(MODEL, {"max_running_requests": 8, "chunked_prefill_size": -1, "speculative_num_steps": 3}).validate()
    with pytest.raises(KnobError, match=r"\['max_running_request'\].*sglang 0.5.23.*max_running_requests"):
        SglangEngine(MODEL, {"max_running_request": 8}).validate()
    with pytest.raises(KnobError, match="set by troughput itself"):
        SglangEngine(MODEL, {"model_path": "/elsewhere"}).validate()


def test_every_native_name_the_knob_table_maps_to_is_a_recorded_server_args_field():
    fields, source = adapter.server_args_fields()
    assert len(fields) == 546 and "sglang 0.5.23" in source and SNAPSHOT.data["source"]["kind"] == "wheel"
    mapped = {name for m in adapter.UNIT.knobs.values() if not m.prefix for name in m.targets}
    assert mapped and mapped <= fields, sorted(mapped - fields)
    prefixes = {m.prefix for m in adapter.UNIT.knobs.values() if m.prefix}
    assert all(any(f.startswith(p) for f in fields) for p in prefixes)
    assert adapter.UNIT.reserved <= fields


def test_a_model_sglang_does_not_implement_is_refused_with_what_it_implements(past_env_checks, tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Idefics3ForConditionalGeneration"]}')
    with pytest.raises(KnobError, match=r"'smolvlm' \(Idefics3ForConditionalGeneration\) is not implemented by "
                                        r"SGLang 0.5.23; it implements: .*LlamaForCausalLM"):
        SglangEngine({"path": str(tmp_path), "name": "smolvlm"}, {}).validate()
    SglangEngine({"path": "/hub/id", "name": "llama-3.1-8b"}, {}).validate()   # conf/architectures: Llama
    SglangEngine({"path": "Qwen/Qwen2.5-VL-7B-Instruct", "name": "qwen2.5-vl-7b"}, {}).validate()   # the shared VLM
    SglangEngine({"path": "/hub/id", "name": "unknown"}, {}).validate()        # not known before start: passes


def test_engine_kwargs_from_canonical_and_native_knobs():
    knobs = to_native("sglang", {"max_seqs": 32, "prefix_caching": False, "page_size": 16})
    assert SglangEngine(MODEL, knobs)._engine_kwargs() == {
        "model_path": "/models/llama", "skip_tokenizer_init": True, "max_running_requests": 32,
        "disable_radix_cache": True, "page_size": 16}
    vlm = SglangEngine({"path": "/models/vlm", "image_token": "<image>", "dummy_weights": True}, {})
    assert vlm._engine_kwargs() == {"model_path": "/models/vlm", "skip_tokenizer_init": False,
                                    "load_format": "dummy"}


def test_own_sampling_and_constraints_become_recorded_sampling_keys(fake_sglang):
    from engines.worker import workload_limits

    requests = [Request("j", [1], 8, constraint={"kind": "json", "value": {"type": "object"}}),
                Request("c", [1], 8, sampling={"top_p": 0.9, "seed": 3}, constraint={"kind": "choice", "value": ["a.b", "c"]}),
                Request("r", [1], 8, constraint={"kind": "regex", "value": "[0-9]+"}),
                Request("o", [1], 8, constraint={"kind": "json_object", "value": None})]
    engine = SglangEngine({**MODEL, **workload_limits(requests)}, {})
    engine.start()
    assert engine.llm.kwargs["skip_tokenizer_init"] is False, "a grammar needs the tokenizer"
    engine.generate(requests)   # the stand-in checks every key against the recorded SamplingParams
    params = engine.llm.calls[0]["sampling_params"]
    assert params[0]["json_schema"] == '{"type": "object"}' and params[0]["ignore_eos"] is False
    assert params[1]["regex"] == r"(a\.b|c)" and (params[1]["top_p"], params[1]["sampling_seed"]) == (0.9, 3)
    assert params[2]["regex"] == "[0-9]+" and params[3]["json_schema"] == '{"type": "object"}'
    engine.stop()


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
                                 "max_running_requests": 4, "enable_forward_pass_metrics": True,
                                 "forward_pass_metrics_ipc_name": f"ipc://{engine.fpm_dir}/fpm"}
    assert info.engine_version == "0.5.23-fake" and info.compile_s == pytest.approx(5.5)
    assert info.extra == {"load_weight_s": 3.0, "kv_cache_allocation_s": 0.5}

    requests = [Request(f"r{i}", list(range(10 + i)), 2 + i) for i in range(3)]
    finished = []
    completions = engine.generate(requests, on_finish=finished.append)
    call = engine.llm.calls[0]
    assert call["input_ids"] == [r.prompt_token_ids for r in requests] and call["image_data"] is None
    assert call["sampling_params"][1] == {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0}
    assert [len(c.output_token_ids) for c in completions] == [2, 3, 4] and sum(finished) == 3
    # one prefill pass of the three prompts (10, 11, 12 tokens), decode passes while outputs of 2, 3, 4 tokens
    # go on, and the idle heartbeat, which is no step
    trace = steps_in(engine, 4)
    assert trace["running"] == [3, 3, 2, 1] and trace["decode"] == [0, 3, 2, 1]
    assert trace["prefill"] == [33, 0, 0, 0] and trace["prefill_seqs"] == [3, 0, 0, 0]
    assert trace["context"] == [33, 33 + 3, 11 + 12 + 2 * 2, 12 + 3] and trace["waiting"] == [0] * 4
    assert trace["kv_tokens"] == [-1] * 4, "the KV pool's use is not in the messages"
    assert trace["dt"] == pytest.approx([0.02, 0.005, 0.005, 0.005]) and trace["t"] == sorted(trace["t"])
    assert SglangEngine.records_steps and engine.stat_reader.warnings == []

    stats = engine.stats()
    assert stats.preemptions == 1, "preemptions are the requests' retractions"
    assert stats.prefix_cache_queries == 10 + 11 + 12 and stats.prefix_cache_hits == 5 + 5 + 6

    engine.generate([Request("img", [1, 2], 1, images=[str(tmp_path / "a.png")]), Request("txt", [3], 1)])
    assert engine.llm.calls[1]["image_data"] == [[str(tmp_path / "a.png")], []]
    engine.reset_caches()
    assert engine.llm.flushes == 1
    llm, folder = engine.llm, engine.fpm_dir
    engine.stop()
    assert llm.shut and not engine.started and not os.path.exists(folder)


def test_steps_missing_from_the_sequence_are_counted_and_said(fake_sglang):
    engine = SglangEngine(MODEL, {})
    engine.start()
    engine.generate([Request("a", [1, 2], 2)])
    steps_in(engine, 2)
    engine.llm.skip = 3
    engine.generate([Request("b", [1, 2], 2)])
    steps_in(engine, 2)
    stats = engine.stats()
    assert stats.extra["forward_pass_metrics_lost"] == 3.0
    assert any("3 forward pass metrics messages were lost" in w for w in engine.stat_reader.warnings)
    engine.stop()


def test_a_pass_reads_as_a_step_by_its_recorded_names():
    reader = StatReader("SGLang")
    step = fpm_step(decode_fpm(json.dumps(fpm(prefill=(2, 90, 30), decode=(5, 700), queued=(4, 1), wall=0.03))),
                    reader)
    assert step == {"dt": 0.03, "running": 7, "decode": 5, "prefill": 90, "prefill_seqs": 2, "waiting": 5,
                    "context": 700 + 30 + 90, "decode_context": 700}
    assert fpm_step(decode_fpm(json.dumps(fpm())), reader) is None, "the idle heartbeat is no step"
    partial = RecordedObject(SNAPSHOT, "ForwardPassMetrics", wall_time=0.01, queued_requests=None,
                             scheduled_requests=RecordedObject(SNAPSHOT, "ScheduledRequestMetrics",
                                                               num_decode_requests=3))
    assert fpm_step(partial, reader) is None
    assert any("scheduled_requests.num_prefill_requests is missing" in w for w in reader.warnings)
    with pytest.raises(UnrecordedName, match="ScheduledRequestMetrics.num_running"):
        decode_fpm(json.dumps(fpm())).scheduled_requests.num_running   # noqa: B018


def test_knobs_that_turn_the_metrics_off_leave_no_trace_and_say_why(fake_sglang):
    engine = SglangEngine(MODEL, {"enable_forward_pass_metrics": False})
    engine.start()
    assert engine.llm.kwargs["enable_forward_pass_metrics"] is False and engine.fpm is None
    assert not engine.records_steps and "enable_forward_pass_metrics is off" in engine.step_trace_gap
    engine.generate([Request("a", [1, 2], 2)])
    assert len(engine.step_trace) == 0
    engine.stop()


def test_an_sglang_without_the_metrics_module_runs_without_steps_and_says_so(fake_sglang, monkeypatch):
    monkeypatch.setitem(sys.modules, FPM_MODULE, types.SimpleNamespace())   # no decode
    engine = SglangEngine(MODEL, {})
    engine.start()
    engine.llm.publisher.wait_ms = 0   # the scheduler publishes; nobody listens
    assert engine.fpm is None and not engine.records_steps
    assert engine.stat_reader.warnings == [engine.step_trace_gap] and "cannot be read here" in engine.step_trace_gap
    assert len(engine.generate([Request("a", [1, 2], 2)])) == 1
    engine.stop()


def test_the_stand_in_holds_names_and_value_kinds_to_the_recording():
    info = server_info()
    with pytest.raises(UnrecordedName):
        "startup" in info   # noqa: B015 - `in` with an unrecorded name fails like [] and .get
    assert "grammar_backend" in SNAPSHOT.keys("server_info"), "ServerArgs fields are server_info keys"
    with pytest.raises(UnrecordedName, match="cuda_graph: number, recorded mapping"):
        server_info({"cuda_graph": 2.5})


@pytest.mark.parametrize("startup, warning", [
    ({"load_weight": 3.0, "kv_cache_allocation": 0.5, "cuda_graph": 2.5}, "['cuda_graph'] is number (2.5), expected mapping"),
    ({"load_weight": "3 s", "cuda_graph": {"decode": 4.0}}, "['load_weight'] is text ('3 s'), expected number"),
    ({"cuda_graph": {"decode": None}}, "['cuda_graph']['decode'] is NoneType"),
])
def test_a_startup_stat_of_another_shape_is_a_null_column_and_a_warning_in_an_ok_row(
        fake_sglang, past_env_checks, tmp_path, startup, warning):
    FakeSglangEngine.server_info = server_info(startup, types_as_recorded=False)
    try:
        result, columns = run_worker(tmp_path, "sglang", MODEL, [Request("r", [1, 2, 3], 2)])
    finally:
        del FakeSglangEngine.server_info
    assert result["status"] == "ok", result.get("error")
    assert any(warning in w for w in columns["engine_info.stat_warnings"]), columns["engine_info.stat_warnings"]
    assert columns["output_tokens"] == 2


def test_a_missing_meta_info_stat_is_a_warning_not_a_crash(fake_sglang, past_env_checks, tmp_path, monkeypatch):
    def without_cached(self, *args, **kwargs):
        outputs = _generate(self, *args, **kwargs)
        for o in outputs:
            del o["meta_info"]["cached_tokens"]
            o["meta_info"]["num_retractions"] = "0"
        return outputs

    monkeypatch.setattr(FakeSglangEngine, "generate", checked_method(SNAPSHOT, "Engine", "generate", without_cached))
    result, columns = run_worker(tmp_path, "sglang", MODEL, [Request("r", [1, 2, 3], 2)])
    assert result["status"] == "ok", result.get("error")
    warnings = " | ".join(columns["engine_info.stat_warnings"])
    assert "meta_info['cached_tokens'] is missing" in warnings and "['num_retractions'] is text" in warnings
    assert columns["cached_tokens"] is None and columns["prefix_cache_hit_rate"] is None, "unknown, not 0"
    assert columns["preemptions"] is None, "an unreadable retraction count leaves the total unknown, not 0"


def test_the_flush_is_retried_while_the_scheduler_is_busy(fake_sglang):
    engine = SglangEngine(MODEL, {})
    engine.start()
    engine.llm.busy_flushes = 3
    engine.reset_caches()
    assert engine.llm.flushes == 4 and engine.unflushed is None
    engine.generate([Request("r", [1, 2], 1)])
    engine.stop()


def test_a_cache_that_never_flushes_is_never_timed(fake_sglang, monkeypatch):
    monkeypatch.setattr(adapter, "FLUSH_TIMEOUT_S", 0.2)
    engine = SglangEngine(MODEL, {})
    engine.start()
    engine.llm.busy_flushes = 10**6
    engine.reset_caches()
    assert engine.llm.flushes >= 2, "retried before giving up"
    with pytest.raises(adapter.CacheNotFlushed, match=r"did not flush its radix cache .*pending requests.*not timed"):
        engine.generate([Request("r", [1, 2], 1)])
    assert len(engine.llm.calls) == 0, "nothing ran on the warm cache"
    engine.stop()


def test_flush_backs_off_within_its_bound():
    class Busy:
        calls = 0

        def flush_cache(self):
            Busy.calls += 1
            return flush_result(False, "busy")

    now, sleeps = [0.0], []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    reason = flush_radix_cache(Busy(), 5.0, sleep=sleep, clock=lambda: now[0])
    assert reason and "'busy'" in reason
    assert sum(sleeps) <= 5.0 and sleeps[:3] == [0.05, 0.1, 0.2] and max(sleeps) == 1.0
    assert Busy.calls == len(sleeps) + 1


async def _async_generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None, **rest):
    check_fields(SNAPSHOT, "SamplingParams", sampling_params)
    self.calls.append({"input_ids": input_ids, "sampling_params": sampling_params, "image_data": image_data})
    if input_ids == [666]:
        raise ValueError("prompt too long")
    return output([7] * sampling_params["max_new_tokens"], len(input_ids), cached=1, retractions=1)


FakeAsyncSglangEngine = fake_class(SNAPSHOT, "Engine", {"async_generate": _async_generate, "shutdown": _shutdown,
                                                        "get_server_info": _get_server_info}, init=_init)


def test_the_feeder_runs_one_async_generate_per_request_and_returns_whole_shards(monkeypatch, tmp_path):
    install(monkeypatch, FakeAsyncSglangEngine)
    engine = SglangEngine(MODEL, {})
    engine.start()
    feeder = engine.feeder()
    feeder.feed("a", [Request("a0", [1, 2, 3], 2), Request("a1", [666], 2)])
    feeder.feed("b", [Request("b0", [4], 3, images=[str(tmp_path / "x.png")])])
    got = collect_shards(feeder, 2)
    assert feeder.idle()
    assert [c.id for c in got["a"].completions] == ["a0"] and "prompt too long" in got["a"].errors["a1"]
    assert [len(c.output_token_ids) for c in got["b"].completions] == [3]
    image_call = next(c for c in engine.llm.calls if c["input_ids"] == [4])
    assert image_call["image_data"] == [str(tmp_path / "x.png")]
    assert engine.stats().prefix_cache_queries == 3 + 1
    engine.stop()
