"""Ordering against a real engine: on an interleaved prefix-heavy workload with a tiny KV cache, grouping wins hits.

The workload arrives interleaved (``workload.arrival`` default: one request of each group in turn, as
mixed real files do), so ``as_given`` is the honest baseline: were ``prefix_grouped`` a no-op, it would
send the same order as ``as_given`` and get the same hit count, and this test would fail.

The three runs are the worker's job (``engines.worker.run_job``) on what ``troughput-run`` builds, in this
pytest worker, which the ``vllm_adapter`` group's other tests have imported vLLM into already (a worker
process per run would import it again, about 10 s each). That ``troughput-run`` hands its worker the
requests in the ordering's order is the runner's, tested on the scripted engine
(``tests/harness/test_ordering.py``).
"""

import pytest

from harness.ordering.policies import apply_ordering
from harness.run.spec import build_spec
from tests.conftest import compose
from tests.engines.conftest import run_worker

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("vllm_adapter")]

# 6 groups x 4 prompts sharing 512 tokens (16 blocks of 32). The cache holds 40 blocks: one group's
# prefix and its 4 running requests fit (16 + 4 x 2 blocks), four unrelated requests (4 x 18) do not.
OVERRIDES = ["workload=prefix_heavy", "workload.num_groups=6", "workload.prompts_per_group=4",
             "workload.prefix_len={kind: fixed, value: 512}", "workload.suffix_len={kind: uniform, low: 16, high: 32}",
             "workload.output_len={kind: fixed, value: 2}", "model.canonical.context_length=1024",
             "hardware.canonical.kv_memory_bytes=1310720", "engine.knobs.max_num_seqs=4",
             "run.warmup_requests=0", "run.progress=false"]
POLICIES = ("as_given", "shuffled", "prefix_grouped")


def test_prefix_grouped_beats_the_interleaved_arrival_order_and_shuffled(tmp_path, monkeypatch):
    spec = build_spec(compose(*OVERRIDES, f"run.results_dir={tmp_path}"))
    groups = spec.workload.groups
    assert spec.workload.info["arrival"] == "interleaved"
    assert all(a != b for a, b in zip(groups, groups[1:])), "as given, no two neighbours share a prefix"
    orderings = {name: {**compose(f"ordering={name}").ordering} for name in POLICIES}
    sent = {name: [r.id for r in apply_ordering(spec.workload.requests, cfg)] for name, cfg in orderings.items()}
    assert sent["prefix_grouped"] != sent["as_given"], "prefix_grouped reorders the interleaved arrival"

    for name, value in spec.env.items():   # the worker's environment (in-process engine core, one thread)
        monkeypatch.setenv(name, str(value))
    rows = {}
    for name in POLICIES:
        (tmp_path / name).mkdir()
        ordered = apply_ordering(spec.workload.requests, orderings[name])
        result, rows[name] = run_worker(tmp_path / name, spec.engine, spec.model, ordered, spec.knobs)
        assert result["status"] == "ok", result.get("error")
    grouped = {**rows["prefix_grouped"], **{f"workload_info.{k}": v for k, v in spec.workload.summary().items()}}
    block = grouped["engine_info.block_size"]
    ideal_blocks = grouped[f"workload_info.ideal_prefix_hit_tokens_block{block}"]
    ideal_tokens = grouped["workload_info.ideal_prefix_hit_tokens_tree"]
    assert ideal_blocks == 6 * 3 * 512, "the prefix tree's ceiling: whole shared blocks, by all but the first prompt"
    assert ideal_blocks <= ideal_tokens < ideal_blocks + block * 24, "token level: within a block per request"
    assert grouped["preemptions"] == 0
    assert grouped["prefix_cache_hits"] == ideal_blocks, "grouped: every shared block served from the cache"
    ideal_rate = grouped[f"workload_info.ideal_prefix_hit_rate_block{block}"]
    assert grouped["prefix_cache_hit_rate"] == pytest.approx(ideal_rate)
    for baseline in ("as_given", "shuffled"):
        assert rows[baseline]["prefix_cache_hits"] < grouped["prefix_cache_hits"], baseline
        assert rows[baseline]["output_tokens"] == grouped["output_tokens"] == 24 * 2
