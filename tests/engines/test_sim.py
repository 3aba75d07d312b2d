"""The simulator engine: deterministic, vLLM's scheduling rules, exact token and cache counts, predicted rows."""

import json
import random

import pytest

from engines.base import KnobError, Request
from engines.sim import SimEngine
from engines.sim_scheduler import Scheduler, SchedulerConfig
from harness.run.runner import execute
from harness.run.spec import build_spec
from tests.conftest import compose

HARDWARE = {"name": "test-gpu", "kind": "gpu", "peak_flops_bf16": 1e14, "bandwidth_bytes_s": 1e12,
            "memory_bytes": 16 << 30}
TINY_LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "vocab_size": 2048,
              "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
KV_PER_TOKEN = 2 * 4 * 2 * 32 * 2  # 1 KiB


@pytest.fixture
def model(tmp_path) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return {"name": "tiny-test", "path": str(tmp_path), "local_dir": str(tmp_path)}


def engine(model: dict, **knobs) -> SimEngine:
    sim = SimEngine(model, {"hardware_spec": HARDWARE, "block_size": 16, "max_model_len": 1024, **knobs})
    sim.validate()
    sim.start()
    return sim


def unique(n: int, seed: int = 0, max_tokens: int = 32) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"r{i}", [rng.randrange(4, 2000) for _ in range(rng.randrange(32, 256))], max_tokens)
            for i in range(n)]


def prefix_heavy(groups: int, per_group: int, prefix_len: int) -> list[Request]:
    rng = random.Random(1)
    requests = []
    for g in range(groups):
        prefix = [rng.randrange(4, 2000) for _ in range(prefix_len)]
        requests += [Request(f"g{g}p{p}", prefix + [rng.randrange(4, 2000) for _ in range(20)], 8)
                     for p in range(per_group)]
    return requests


def test_same_input_same_prediction(model):
    runs = []
    for _ in range(2):
        sim = engine(model, kv_cache_memory_bytes=2048 * KV_PER_TOKEN, max_num_seqs=32)
        completions = sim.generate(unique(100))
        runs.append((sim.simulated_seconds(), sim.stats().preemptions, [c.finished_at for c in completions]))
    assert runs[0] == runs[1]


def test_token_counts_and_finish_times_on_the_simulated_clock(model):
    sim = engine(model)
    requests = [Request(r.id, r.prompt_token_ids, 5 + i % 13) for i, r in enumerate(unique(50))]
    completions = sim.generate(requests)
    assert [c.id for c in completions] == [r.id for r in requests]
    # The count is the scheduler's: each request decodes to its own max_tokens, one token per step after prefill.
    assert [len(c.output_token_ids) for c in completions] == [r.max_tokens for r in requests]
    assert all(c.prompt_tokens == len(r.prompt_token_ids) for c, r in zip(completions, requests))
    assert max(c.finished_at for c in completions) == sim.simulated_seconds() > 0
    assert sim.stats().extra["sim_steps"] >= 17


def test_every_scheduled_token_is_a_prompt_token_or_a_generated_one():
    """Without preemption or prefix hits, the steps compute each prompt once and feed back all but the last
    generated token: sum(tokens per step) = sum(prompt + max_tokens - 1)."""
    prompts, outs = [[7 + i] * n for i, n in enumerate(range(40, 240, 10))], [3 + i % 5 for i in range(20)]
    result = Scheduler(config(prefix_caching=False)).run(prompts, outs, lambda *_: 1.0, trace=True)
    assert sum(step.tokens for step in result.trace) == sum(len(p) + m - 1 for p, m in zip(prompts, outs))
    assert [r.generated for r in result.requests] == outs


def test_preemptions_rise_as_kv_blocks_shrink(model):
    counts = []
    for tokens in [65536, 4096, 2048, 1280]:
        sim = engine(model, kv_cache_memory_bytes=tokens * KV_PER_TOKEN, max_num_seqs=64)
        sim.generate(unique(128, max_tokens=64))
        counts.append(sim.stats().preemptions)
    # Not monotone in general (fewer blocks also admit fewer requests to preempt), but none when roomy.
    assert counts[0] == 0 and all(c > 0 for c in counts[1:]), counts


def test_prefix_hits_equal_the_ideal_when_the_cache_is_roomy(model):
    groups, per_group, prefix_len = 4, 8, 256  # a multiple of the block size: every prefix block can hit
    sim = engine(model)
    requests = prefix_heavy(groups, per_group, prefix_len)
    completions = sim.generate(requests)
    stats = sim.stats()
    assert stats.prefix_cache_hits == groups * (per_group - 1) * prefix_len
    assert stats.prefix_cache_queries == sum(len(r.prompt_token_ids) for r in requests)
    assert sum(c.cached_tokens for c in completions) == stats.prefix_cache_hits
    sim.reset_caches()
    before = sim.stats()
    sim.generate(requests)
    assert sim.stats().minus(before).prefix_cache_hits == stats.prefix_cache_hits, "reset: the same again"


def test_prefix_caching_off_queries_nothing(model):
    sim = engine(model, enable_prefix_caching=False)
    completions = sim.generate(prefix_heavy(2, 4, 128))
    assert (sim.stats().prefix_cache_queries, sim.stats().prefix_cache_hits) == (0, 0)
    assert all(c.cached_tokens == 0 for c in completions)


def config(**changes) -> SchedulerConfig:
    base = dict(max_seqs=8, max_tokens_per_step=64, chunked_prefill=True, prefix_caching=True, block_size=16,
                num_blocks=1000, max_model_len=1024)
    return SchedulerConfig(**{**base, **changes})


def test_token_budget_and_sequence_limit_hold_every_step():
    result = Scheduler(config()).run([[7] * n for n in range(40, 240, 10)], [16] * 20, lambda *_: 1.0, trace=True)
    assert all(step.tokens <= 64 and step.seqs <= 8 for step in result.trace)
    assert max(step.seqs for step in result.trace) == 8


def test_chunked_prefill_splits_a_long_prompt_and_without_it_the_prompt_waits_for_a_whole_step():
    prompt, out = [5] * 300, 4
    chunked = Scheduler(config()).run([prompt], [out], lambda *_: 1.0)
    assert chunked.steps == -(-300 // 64) + out - 1, "5 chunks of <=64 tokens, then 3 decode steps"
    whole = Scheduler(config(chunked_prefill=False, max_tokens_per_step=512)).run([prompt], [out], lambda *_: 1.0)
    assert whole.steps == 1 + out - 1
    # Without chunking, a prompt that does not fit the step's remaining budget waits for the next step.
    two = Scheduler(config(chunked_prefill=False, max_tokens_per_step=512)).run([prompt, [6] * 300], [out, out],
                                                                               lambda *_: 1.0, trace=True)
    assert two.trace[0][0] == 300 and two.trace[1][0] == 1 + 300


def test_knobs_are_checked_before_anything_runs(model):
    with pytest.raises(KnobError, match="max_num_seqz"):
        SimEngine(model, {"hardware_spec": HARDWARE, "max_num_seqz": 8}).validate()
    with pytest.raises(KnobError, match="hardware_spec"):
        SimEngine(model, {"max_num_seqs": 8}).validate()
    with pytest.raises(KnobError, match="must be >= max_num_seqs"):
        SimEngine(model, {"hardware_spec": HARDWARE, "max_num_seqs": 64, "max_num_batched_tokens": 16}).validate()
    with pytest.raises(KnobError, match="unknown efficiency"):
        SimEngine(model, {"hardware_spec": HARDWARE, "calibration": {"efficiency": {"speed": 1}}}).validate()


def test_a_kv_cache_smaller_than_one_sequence_fails_for_memory(model):
    sim = SimEngine(model, {"hardware_spec": HARDWARE, "kv_cache_memory_bytes": 100 * KV_PER_TOKEN,
                            "max_model_len": 1024})
    sim.validate()
    with pytest.raises(MemoryError, match="insufficient memory"):
        sim.start()


def test_ten_thousand_requests_finish_with_every_token(model):
    sim = engine(model, max_num_seqs=256, max_num_batched_tokens=8192)
    requests = unique(10_000, max_tokens=64)
    completions = sim.generate(requests)
    assert len(completions) == 10_000 and sum(len(c.output_token_ids) for c in completions) == 640_000
    assert all(c.finished_at is not None for c in completions)


def test_a_sim_run_through_the_runner_is_a_predicted_row(tmp_path):
    cfg = compose("engine=sim", "hardware=h100", "workload=unique", "workload.num_requests=40", "run.repeats=2",
                  f"run.results_dir={tmp_path}", "run.progress=false")
    row = execute(build_spec(cfg), progress=False)
    assert row["status"] == "ok", row["error"]
    assert row["engine"] == "sim" and row["predicted"] is True and row["startup_s"] == 0.0
    assert row["output_tokens"] == row["workload_info.output_tokens_requested"]
    assert row["completion_p99_s"] <= row["wall_s"] and row["stat.sim_steps"] > 0
    assert 0 < row["sol_fraction"] < 1, "the uncalibrated simulator stays under the speed of light"
    assert row["workload_cfg.num_requests"] == 40 and row["hw.name"] == "h100_sxm"
    assert row["output_tok_s_passes"][0] == row["output_tok_s_passes"][1], "predictions do not jitter"


STEP_MODEL = {"step_s": 2e-3, "seq_s": 1e-5, "token_s": 2e-6, "host_id": "fitted-here"}


def predicted(model: dict, calibration: dict | None) -> tuple[float, str | None]:
    sim = SimEngine(model, {"hardware_spec": HARDWARE, "block_size": 16, "max_model_len": 1024,
                            "calibration": calibration})
    sim.validate()
    info = sim.start()
    sim.generate(unique(60))
    return sim.simulated_seconds(), info.extra["sim_warning"]


def test_a_step_model_prices_every_step_and_uncalibrated_says_so(model):
    seconds, warning = predicted(model, {"step_model": STEP_MODEL})
    sim = engine(model, block_size=16, max_model_len=1024)
    steps = sim.schedule(unique(60)).steps
    assert warning is None
    assert seconds == pytest.approx(sum(2e-3 + 1e-5 * s.seqs + 2e-6 * s.tokens for s in steps))
    roofline, warning = predicted(model, None)
    assert roofline != seconds and "uncalibrated" in warning
    with pytest.raises(KnobError, match="negative"):
        predicted(model, {"step_model": {**STEP_MODEL, "seq_s": -1.0}})
    with pytest.raises(KnobError, match="older calibration"):
        predicted(model, {"host": {}})


def test_a_calibration_from_another_host_is_not_applied(tmp_path, monkeypatch):
    """Through the runner: a step model fitted on another host is dropped (no traces here to refit from), the
    row and the summary say uncalibrated; the same file marked as fitted on this host is applied."""
    from harness.run.summary import summary_table
    from harness.run.stepmodels import this_host_id

    def run(host_id: str) -> dict:
        overrides = [f"++engine.knobs.calibration.step_model.{k}={v}" for k, v in
                     {**STEP_MODEL, "host_id": host_id}.items()]
        return execute(build_spec(compose("engine=sim", "hardware=h100", "workload=unique", "workload.num_requests=40",
                                          "run.progress=false", f"run.results_dir={tmp_path}", *overrides)),
                       progress=False)

    elsewhere = run("another-host")
    assert elsewhere["status"] == "ok", elsewhere["error"]
    assert "uncalibrated" in elsewhere["engine_info.sim_warning"]
    assert "another-host" in elsewhere["engine_info.calibration"]
    assert "uncalibrated" in summary_table([elsewhere])
    here = run(this_host_id())
    assert here["engine_info.sim_warning"] is None and here["engine_info.calibrated"] is True
    assert here["output_tok_s"] != elsewhere["output_tok_s"]


def test_a_simulated_run_past_its_step_models_traces_says_so(tmp_path):
    """A step model whose traces held at most 8 sequences and never preempted: a run at more sequences counts
    the steps past them in the row (``stat.beyond.*``) and says so in the summary; one within them is silent."""
    from harness.run.summary import summary_table
    from harness.run.stepmodels import this_host_id

    def run(max_seqs: int) -> dict:
        overrides = [f"++engine.knobs.calibration.step_model.{k}={v}" for k, v in
                     {**STEP_MODEL, "host_id": this_host_id()}.items()]
        overrides += [f"++engine.knobs.calibration.step_model.seen.{k}={v}" for k, v in
                      {"seqs": 8, "tokens": 1e6, "context": 1e9, "preemptions": 0, "encoder_tokens": 0}.items()]
        row = execute(build_spec(compose("engine=sim", "hardware=h100", "workload=unique", "workload.num_requests=40",
                                         f"engine.knobs.max_num_seqs={max_seqs}", "run.progress=false",
                                         f"run.results_dir={tmp_path}", *overrides)), progress=False)
        assert row["status"] == "ok", row["error"]
        return row

    wide = run(32)
    assert wide["stat.beyond.seqs"] > 0 and wide["stat.beyond.tokens"] == 0 and wide["stat.beyond.preemptions"] == 0
    assert "extrapolates past the traces" in summary_table([wide]) and "seqs in" in summary_table([wide])
    narrow = run(8)
    assert narrow["stat.beyond.seqs"] == 0 and "extrapolates" not in summary_table([narrow])


def test_a_calibration_not_applied_says_whether_the_host_or_the_hardware_differs(tmp_path):
    from harness.run.stepmodels import step_model_for, this_host_id

    key = {"hardware": "h100"}
    same_host = step_model_for(tmp_path, "tiny", {**STEP_MODEL, "host_id": this_host_id(), "hardware": "cpu"}, key=key)
    assert same_host[0] is None and "fitted for hardware cpu, not h100 (same host)" in same_host[1]
    other_host = step_model_for(tmp_path, "tiny", {**STEP_MODEL, "host_id": "elsewhere", "hardware": "h100"}, key=key)
    assert other_host[0] is None and "fitted on host elsewhere, not this one" in other_host[1]
