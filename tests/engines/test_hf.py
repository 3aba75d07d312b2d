"""The Hugging Face baseline adapter: knob checks and counters without a model; real greedy runs on the tiny Llama."""

from __future__ import annotations

import json
import logging
import random

import pytest

from engines import get_engine_class
from engines.base import EngineStats, KnobError, Request
from engines.hf import HfEngine, HfStats, OffloadCounter, count_offloaded
from tests.conftest import ROOT, compose

pytestmark = pytest.mark.xdist_group("hf_tiny")   # one pytest worker: the real runs' module fixtures run once

CONTINUOUS = {"mode": "continuous", "num_blocks": 64, "page_size": 16, "max_batch_tokens": 128,
              "max_requests_per_batch": 8}


def engine(knobs: dict, model: dict | None = None) -> HfEngine:
    return HfEngine(model or {"path": "/nonexistent", "name": "tiny"}, knobs)


def test_registered_as_hf():
    assert get_engine_class("hf") is HfEngine


def test_unknown_knob_names_the_known_ones():
    with pytest.raises(KnobError) as error:
        engine({"batch_sz": 8}).validate()
    assert "batch_sz" in str(error.value) and "batch_size" in str(error.value) and "num_blocks" in str(error.value)


@pytest.mark.parametrize("knobs, words", [
    ({"mode": "paged"}, ["mode", "static", "continuous"]),
    ({"batch_size": 0}, ["batch_size", "positive"]),
    ({"batch_size": "8"}, ["batch_size"]),
    ({"early_stop": "yes"}, ["early_stop"]),
    ({"dtype": "int8"}, ["dtype", "float32"]),
    ({"mode": "continuous", "num_blocks": None}, ["num_blocks", "memory"]),
    ({**CONTINUOUS, "num_blocks": -1}, ["num_blocks", "positive"]),
])
def test_invalid_knob_values_fail_validation(knobs, words):
    with pytest.raises(KnobError) as error:
        engine(knobs).validate()
    assert all(word in str(error.value) for word in words), str(error.value)


def test_continuous_knobs_are_checked_by_transformers():
    pytest.importorskip("transformers")
    with pytest.raises(KnobError, match="scheduler_type"):
        engine({**CONTINUOUS, "scheduler_type": "lifo"}).validate()
    engine({**CONTINUOUS, "safety_margin": 0.1}).validate()  # any ContinuousBatchingConfig field passes through


def test_knobs_of_the_other_mode_are_accepted_and_ignored():
    engine({"mode": "static", "batch_size": 4, **{k: v for k, v in CONTINUOUS.items() if k != "mode"}}).validate()
    engine({**CONTINUOUS, "batch_size": 4, "early_stop": False}).validate()


def test_vision_language_models_are_rejected(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3", "vision_config": {}}))
    with pytest.raises(KnobError, match="text-only"):
        engine({}, {"path": str(tmp_path), "local_dir": str(tmp_path), "name": "tiny_vlm"}).validate()


def test_requests_with_images_are_rejected():
    with pytest.raises(KnobError, match="text-only"):
        engine({}).generate([Request("a", [5, 6], 2, images=["x.png"])])


def test_offload_log_lines_are_parsed_and_summed():
    assert count_offloaded("Offloaded 3 requests (1 to CPU, 2 soft reset): 0 starved requests remain.") == 3
    assert count_offloaded("Paged cache initialized: self.max_batch_tokens = 256") == 0
    counter, cb_logger = OffloadCounter(), logging.getLogger("test_hf.offloads")
    cb_logger.addHandler(counter)
    cb_logger.setLevel(logging.INFO)
    try:
        cb_logger.info("Offloaded 1 requests (0 to CPU, 1 soft reset): 2 starved requests remain.")
        cb_logger.info("Offloaded 2 requests (0 to CPU, 2 soft reset): 0 starved requests remain.")
        cb_logger.info("Generation loop finished")
    finally:
        cb_logger.removeHandler(counter)
    assert counter.offloaded == 3


def test_padding_waste_of_a_pass_comes_from_its_slot_counts():
    before = HfStats(preemptions=0, extra={"useful_slots": 100.0, "padded_slots": 100.0, "padding_waste": 1.0})
    after = HfStats(preemptions=0, extra={"useful_slots": 300.0, "padded_slots": 150.0, "padding_waste": 0.5})
    diff = after.minus(before)
    assert diff.extra["padding_waste"] == pytest.approx(50 / 200)
    assert diff.minus(EngineStats()).extra["padding_waste"] == pytest.approx(0.25)


# --- real runs on the tiny Llama ---------------------------------------------------------------------------------

def _requests() -> list[Request]:
    """Six prompts of varied lengths and output lengths: two static batches of 4 and 2 rows."""
    rng = random.Random(7)
    return [Request(f"r{i}", [rng.randrange(10, 2000) for _ in range(rng.randint(3, 40))], rng.randint(1, 8))
            for i in range(6)]


@pytest.fixture(scope="module")
def tiny() -> dict:
    from engines.build_tiny import build

    path = build("tiny", ROOT / ".cache/troughput/models/tiny")
    return {"path": str(path), "local_dir": str(path), "name": "tiny"}


def generate(model: dict, knobs: dict, requests: list[Request]) -> tuple[list[list[int]], EngineStats, HfEngine]:
    """Start the adapter in-process, generate once, stop; (output ids, counters of that call, engine)."""
    hf = HfEngine(model, knobs)
    hf.validate()
    hf.start()
    try:
        before = hf.stats()
        completions = hf.generate(requests)
        stats = hf.stats().minus(before)
    finally:
        hf.stop()
    assert [c.id for c in completions] == [r.id for r in requests]
    return [c.output_token_ids for c in completions], stats, hf


@pytest.fixture(scope="module")
def static(tiny) -> dict[bool, tuple[list[list[int]], EngineStats, dict[str, list[float]]]]:
    """``_requests()`` in static batches of 4, with and without early stop: (output ids, counters, step trace) by
    early_stop.

    Four tests read these two runs (each a model load and a generation) instead of running them again."""
    requests = _requests()
    runs = {stop: generate(tiny, {"batch_size": 4, "early_stop": stop}, requests) for stop in (True, False)}
    return {stop: (outputs, stats, hf.step_trace.take()) for stop, (outputs, stats, hf) in runs.items()}


@pytest.mark.engine
def test_static_and_continuous_greedy_outputs_match_token_for_token(tiny, static):
    requests = _requests()
    (with_stop, _, _), (without_stop, _, _) = static[True], static[False]
    continuous, stats, hf = generate(tiny, CONTINUOUS, requests)
    assert [len(tokens) for tokens in with_stop] == [r.max_tokens for r in requests]
    assert with_stop == without_stop == continuous
    assert stats.preemptions == 0
    assert not hf.records_steps and len(hf.step_trace) == 0 and "no per-step callback" in hf.step_trace_gap


@pytest.mark.engine
def test_static_matches_plain_generate_for_one_request(tiny, static):
    import torch
    from transformers import AutoModelForCausalLM

    requests = _requests()
    outputs, _, _ = static[True]   # batch_size 4, early stop on (the knob's default)
    longest = max(range(len(requests)), key=lambda i: requests[i].max_tokens)
    request = requests[longest]
    model = AutoModelForCausalLM.from_pretrained(tiny["path"], dtype=torch.float32).eval()
    expected = model.generate(torch.tensor([request.prompt_token_ids]), max_new_tokens=request.max_tokens,
                              min_new_tokens=request.max_tokens, do_sample=False)[0, len(request.prompt_token_ids):]
    assert outputs[longest] == expected.tolist()


@pytest.mark.engine
def test_early_stop_does_fewer_padded_decode_slots(static):
    requests = _requests()
    batches = [requests[:4], requests[4:]]
    (_, idle, _), (_, stop, _) = static[False], static[True]
    longest = [max(r.max_tokens for r in batch) for batch in batches]
    # Without early stop every row rides along until its batch's longest row ends.
    assert idle.extra["padded_decode_slots"] == sum(n - r.max_tokens for n, b in zip(longest, batches) for r in b) > 0
    assert stop.extra["padded_decode_slots"] == 0 < idle.extra["padded_decode_slots"]
    assert idle.extra["decode_steps"] == stop.extra["decode_steps"] == sum(n - 1 for n in longest)
    assert idle.extra["padded_prefill_slots"] == stop.extra["padded_prefill_slots"] == sum(
        len(b) * max(len(r.prompt_token_ids) for r in b) - sum(len(r.prompt_token_ids) for r in b) for b in batches)
    assert stop.extra["useful_slots"] == sum(len(r.prompt_token_ids) + r.max_tokens - 1 for r in requests)
    assert stop.extra["padding_waste"] < idle.extra["padding_waste"]


@pytest.mark.engine
@pytest.mark.parametrize("early_stop", [True, False])
def test_every_forward_pass_of_the_static_loop_is_one_step(static, early_stop):
    """Per batch: a prefill step of its rows and prompt tokens, then one decode step per further token of its
    longest row, with the rows still generating (and, without early stop, every row of the batch riding along)."""
    requests = _requests()
    trace = static[early_stop][2]
    expected = {"running": [], "decode": [], "prefill": [], "prefill_seqs": [], "waiting": [], "kv_tokens": []}
    for start in (0, 4):
        batch = requests[start:start + 4]
        width, longest = max(len(r.prompt_token_ids) for r in batch), max(r.max_tokens for r in batch)
        waiting = len(requests) - start - len(batch)
        for name, value in (("running", len(batch)), ("decode", 0), ("prefill_seqs", len(batch)),
                            ("prefill", sum(len(r.prompt_token_ids) for r in batch)), ("waiting", waiting),
                            ("kv_tokens", len(batch) * width)):
            expected[name].append(value)
        for k in range(1, longest):
            generating = sum(r.max_tokens > k for r in batch)
            rows = generating if early_stop else len(batch)
            for name, value in (("running", rows), ("decode", generating), ("prefill", 0), ("prefill_seqs", 0),
                                ("waiting", waiting), ("kv_tokens", rows * (width + k))):
                expected[name].append(value)
    assert {name: trace[name] for name in expected} == expected
    assert trace["context"] == trace["kv_tokens"], "no prefix is shared: every row attends what it holds"
    assert trace["weight"] == [1.0] * len(trace["running"]) and all(dt > 0 for dt in trace["dt"])
    assert trace["t"] == sorted(trace["t"])


def test_only_the_static_loop_records_steps():
    assert HfEngine.records_steps and engine({}).records_steps
    gap = engine(CONTINUOUS).step_trace_gap
    assert not engine(CONTINUOUS).records_steps and "ContinuousBatchingManager" in gap and "register_result_handler" in gap


@pytest.mark.engine
def test_tiny_kv_cache_evictions_are_counted_as_preemptions(tiny):
    rng = random.Random(1)
    # Two 30-token prompts fill 4 blocks of 16; each needs a third block to decode, so one is evicted.
    requests = [Request(f"r{i}", [rng.randrange(10, 2000) for _ in range(30)], 8) for i in range(4)]
    roomy, roomy_stats, _ = generate(tiny, CONTINUOUS, requests)
    tight, tight_stats, _ = generate(tiny, {**CONTINUOUS, "num_blocks": 4}, requests)
    assert roomy_stats.preemptions == 0 and tight_stats.preemptions > 0
    assert tight == roomy


@pytest.mark.engine
def test_a_request_larger_than_the_kv_cache_fails_clearly(tiny):
    with pytest.raises(KnobError, match="num_blocks"):
        generate(tiny, {**CONTINUOUS, "num_blocks": 2}, [Request("long", list(range(10, 50)), 8)])


def _run(tmp_path, *overrides):
    from harness.run.spec import build_spec
    from harness.run.runner import execute

    cfg = compose(*overrides, f"run.results_dir={tmp_path}", "run.progress=false")
    return execute(build_spec(cfg), progress=False)


# Harness rows of engine=hf beside vLLM's (same workload, same columns, the dtype each ran) are checked against a
# vLLM run that serves other checks too: test_harness_rows_carry_engine_hf_and_the_columns_of_vllm_rows in
# tests/engines/test_vllm.py.


@pytest.mark.engine
def test_multimodal_workload_is_refused_before_the_engine_starts(tmp_path):
    row = _run(tmp_path, "engine=hf", "workload=multimodal", "workload.num_requests=2",
               f"run.image_dir={tmp_path / 'images'}")
    assert row["status"] == "invalid" and row["failed_phase"] == "validate"
    assert "text-only" in row["error"]
