import json
import sys

import numpy as np
import pytest

from engines.base import Request
from harness.core.errors import TroughputError
from harness.ordering.policies import POLICIES, apply_ordering
from harness.run.runner import RunSpec, execute
from harness.workloads.base import Workload
from tests.conftest import FAKE_ENGINE, ROOT, compose

REQUESTS = [Request(f"r{i}", [i + 1], 1) for i in range(20)]


def grouped_requests(seed=0, groups=4, per_group=5, prefix=48):
    """Prefix groups interleaved (as a shuffled file would have them), with varied lengths; no labels."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 1000, prefix).tolist() for _ in range(groups)]
    requests = [Request(f"q{g}-{p}", prefixes[g] + rng.integers(0, 1000, int(rng.integers(1, 80))).tolist(),
                        int(rng.integers(1, 100)))
                for p in range(per_group) for g in range(groups)]
    return [requests[i] for i in rng.permutation(len(requests))]


def group_of(request: Request) -> str:
    return request.id.split("-")[0]


def runs(labels: list[str]) -> list[str]:
    """Consecutive distinct labels: a label appearing twice means its requests were not contiguous."""
    return [label for i, label in enumerate(labels) if i == 0 or labels[i - 1] != label]


def length_key(r: Request, cfg=None):
    cfg = cfg or {}
    return (r.max_tokens // cfg.get("output_bucket", 32), len(r.prompt_token_ids) // cfg.get("input_bucket", 64))


def test_as_given_keeps_order_and_shuffled_is_a_seeded_permutation():
    assert apply_ordering(REQUESTS, {"name": "as_given"}) == REQUESTS
    a = apply_ordering(REQUESTS, {"name": "shuffled", "seed": 1})
    assert a == apply_ordering(REQUESTS, {"name": "shuffled", "seed": 1})
    assert a != REQUESTS and sorted(r.id for r in a) == sorted(r.id for r in REQUESTS)
    assert a != apply_ordering(REQUESTS, {"name": "shuffled", "seed": 2})


def test_unknown_ordering_lists_known_ones():
    with pytest.raises(TroughputError, match="known: as_given, shuffled, prefix_grouped, length_bucketed, blended"):
        apply_ordering(REQUESTS, {"name": "alphabetical"})


def configs() -> dict[str, dict]:
    """Each ordering's config as troughput-run composes it."""
    from omegaconf import OmegaConf

    names = sorted(p.stem for p in (ROOT / "conf" / "ordering").glob("*.yaml"))
    return {n: OmegaConf.to_container(compose(f"ordering={n}").ordering, resolve=True) for n in names}


def test_every_policy_has_a_config_and_every_config_a_policy():
    assert set(configs()) == set(POLICIES)
    assert all(name == cfg["name"] for name, cfg in configs().items())


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_is_a_deterministic_permutation_of_the_same_requests(name):
    cfg = configs()[name]
    requests = grouped_requests()
    a, b = apply_ordering(requests, cfg), apply_ordering(list(requests), cfg)
    assert [r.id for r in a] == [r.id for r in b]
    assert sorted(map(id, a)) == sorted(map(id, requests)), "the very same request objects, none copied or changed"
    assert apply_ordering([], cfg) == []


def test_prefix_grouped_makes_groups_contiguous_from_token_ids_alone():
    requests = grouped_requests()
    ordered = apply_ordering(requests, {"name": "prefix_grouped", "block_size": 16})
    assert sorted(runs([group_of(r) for r in ordered])) == ["q0", "q1", "q2", "q3"]
    # Groups in order of first appearance, members in input order.
    assert runs([group_of(r) for r in ordered]) == runs(sorted({group_of(r): None for r in requests}, key=lambda g: [
        group_of(r) for r in requests].index(g)))
    for g in "q0", "q1":
        assert [r.id for r in ordered if group_of(r) == g] == [r.id for r in requests if group_of(r) == g]


def test_prefix_grouped_is_depth_first_over_nested_prefixes():
    system = list(range(1, 33))
    tasks = {t: [100 * t + k for k in range(32)] for t in (1, 2)}
    requests = [Request(f"{t}-{i}", system + tasks[t] + [900 + i] * 20, 4) for i in range(3) for t in (1, 2)]
    requests += [Request("solo", [7] * 40, 4), Request("sys-only", system + [5] * 20, 4)]
    ordered = [r.id for r in apply_ordering(requests, {"name": "prefix_grouped", "block_size": 16})]
    assert ordered == ["1-0", "1-1", "1-2", "2-0", "2-1", "2-2", "sys-only", "solo"]
    ordered = [r.id for r in apply_ordering(requests[::-1], {"name": "prefix_grouped", "block_size": 16})]
    assert ordered == ["sys-only", "2-2", "2-1", "2-0", "1-2", "1-1", "1-0", "solo"]


def test_prefix_grouped_leaves_unrelated_prompts_in_input_order():
    rng = np.random.default_rng(1)
    requests = [Request(f"u{i}", rng.integers(0, 50, int(rng.integers(5, 200))).tolist(), 8) for i in range(40)]
    assert apply_ordering(requests, {"name": "prefix_grouped", "block_size": 16}) == requests


@pytest.mark.parametrize("descending", [True, False])
def test_length_bucketed_sorts_by_output_then_input_bucket_stably(descending):
    requests = grouped_requests(seed=2)
    cfg = {"name": "length_bucketed", "output_bucket": 32, "input_bucket": 64, "descending": descending}
    ordered = apply_ordering(requests, cfg)
    keys = [length_key(r) for r in ordered]
    assert keys == sorted(keys, reverse=descending)
    for key in set(keys):  # ties keep the input order
        assert [r for r in ordered if length_key(r) == key] == [r for r in requests if length_key(r) == key]


def test_length_bucketed_with_no_buckets_keeps_the_order():
    requests = grouped_requests()
    assert apply_ordering(requests, {"name": "length_bucketed", "output_bucket": 0, "input_bucket": None}) == requests


def test_blended_keeps_groups_together_in_length_order():
    requests = grouped_requests(seed=3)
    cfg = {**configs()["blended"], "min_shared_tokens": 32}
    ordered = apply_ordering(requests, cfg)
    labels = [group_of(r) for r in ordered]
    assert sorted(runs(labels)) == ["q0", "q1", "q2", "q3"], "each group contiguous"
    for g in set(labels):
        keys = [length_key(r) for r in ordered if group_of(r) == g]
        assert keys == sorted(keys, reverse=True), "length order inside a group"
    widest = max(length_key(r)[1] for r in requests) + 1  # the policy's scalar key: output bucket, then input
    means = [np.mean([-(out * widest + inp) for out, inp in map(length_key, (r for r in ordered if group_of(r) == g))])
             for g in runs(labels)]
    assert means == sorted(means), "groups in order of their mean length key, longest first"


def test_blended_between_its_two_ends():
    requests = grouped_requests(seed=4)
    blended = configs()["blended"]
    # Nothing shares 10k tokens: every request on its own, pure length order (ties in depth-first order).
    loose = apply_ordering(requests, {**blended, "min_shared_tokens": 10_000})
    by_length = apply_ordering(requests, configs()["length_bucketed"])
    assert loose != by_length and list(map(length_key, loose)) == list(map(length_key, by_length))
    # All lengths alike: pure prefix grouping.
    same = [Request(r.id, r.prompt_token_ids[:49], 8) for r in requests]
    grouped = apply_ordering(same, configs()["prefix_grouped"])
    assert apply_ordering(same, {**blended, "min_shared_tokens": 16}) == grouped


@pytest.mark.parametrize("cfg, message", [
    ({"name": "prefix_grouped", "block_size": 0}, "block_size"),
    ({"name": "length_bucketed", "input_bucket": -1}, "input_bucket"),
])
def test_bad_parameters_are_user_errors(cfg, message):
    with pytest.raises(TroughputError, match=message):
        apply_ordering(REQUESTS, cfg)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_outputs_come_back_in_the_original_order_with_the_original_ids(tmp_path, name):
    workload = Workload("w", grouped_requests(groups=3, per_group=3))
    spec = RunSpec(engine=FAKE_ENGINE, model={"name": "fake", "path": "none"}, workload=workload,
                   ordering=configs()[name], python=sys.executable, results_dir=tmp_path, save_outputs=True)
    row = execute(spec, progress=False)
    assert row["status"] == "ok", row["error"]
    assert row["ordering"] == name
    outputs = [json.loads(line) for line in open(tmp_path / "outputs" / f"{row['run_id']}.jsonl")]
    assert [o["id"] for o in outputs] == [r.id for r in workload.requests]
    # The fake engine echoes each prompt's last token: every output belongs to its own request.
    expected = [[r.prompt_token_ids[-1]] * r.max_tokens for r in workload.requests]
    assert [o["output_token_ids"] for o in outputs] == expected
