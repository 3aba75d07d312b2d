"""The prefix tree against brute force: ideal-cache counts, depth-first order, groups, summaries."""

import numpy as np
import pytest

import harness.workloads.prefix_tree as prefix_tree
from engines.base import Request
from harness.workloads import build_workload
from harness.workloads.base import Workload
from harness.workloads.prefix_tree import PrefixTree


def brute_ideal(prompts, block):
    """Prompt tokens minus distinct prefixes (whole blocks only when block > 1)."""
    seen, whole = set(), 0
    for p in prompts:
        m = len(p) // block
        whole += m * block
        seen.update(tuple(p[:k * block]) for k in range(1, m + 1))
    return whole - block * len(seen)


def block_lcp(a, b, block):
    k = 0
    while (k + 1) * block <= min(len(a), len(b)) and list(a[:(k + 1) * block]) == list(b[:(k + 1) * block]):
        k += 1
    return k


def nested_prompts(rng, n, vocab=3):
    """Prompts cut from a few bases at random points, plus random tails: deep, branching sharing."""
    bases = [rng.integers(0, vocab, int(rng.integers(0, 50))).tolist() for _ in range(4)]
    prompts = []
    for _ in range(n):
        base = bases[int(rng.integers(0, len(bases)))]
        tail = rng.integers(0, vocab, int(rng.integers(0, 12))).tolist()
        prompts.append(base[:int(rng.integers(0, len(base) + 1))] + tail)
    return prompts


@pytest.mark.parametrize("seed", range(40))
def test_ideal_counts_order_and_groups_match_brute_force(seed, monkeypatch):
    monkeypatch.setattr(prefix_tree, "_SLICE", 7)  # hashing in many slices
    rng = np.random.default_rng(seed)
    prompts = nested_prompts(rng, int(rng.integers(1, 30)))
    for tree_block in (1, 2, 4, 8):
        tree = PrefixTree(prompts, tree_block)
        for block in (1, tree_block, 2 * tree_block, 4 * tree_block):
            assert tree.ideal_hit_tokens(block) == brute_ideal(prompts, block)
        order = tree.order().tolist()
        assert sorted(order) == list(range(len(prompts)))
        for j in range(1, len(order)):  # depth first: the predecessor shares the most with any earlier request
            best = max(block_lcp(prompts[order[j]], prompts[order[i]], tree_block) for i in range(j))
            assert block_lcp(prompts[order[j]], prompts[order[j - 1]], tree_block) == best
        need = 2
        groups = tree.groups(need * tree_block)
        for i in range(len(prompts)):
            mates = [j for j in range(len(prompts)) if j != i and block_lcp(prompts[i], prompts[j], tree_block) >= need]
            assert (groups[i] == -1) == (not mates)
            assert all(groups[j] == groups[i] for j in mates)
        labels = groups[order][groups[order] >= 0].tolist()
        assert labels == sorted(labels), "groups contiguous and numbered in depth-first order"


def test_statistics_of_a_plain_example():
    system = list(range(100, 132))  # two 16-token blocks shared by everyone
    prompts = [system + [1] * 16 + [2, 3], system + [1] * 16 + [2, 4], system + [5] * 20, [9] * 10]
    tree = PrefixTree(prompts, 16)
    # Token level: the 2nd shares 49 tokens with the 1st, the 3rd 32 with either.
    assert tree.ideal_hit_tokens(1) == 49 + 32
    assert tree.ideal_hit_tokens(16) == 48 + 32 and tree.ideal_hit_tokens(32) == 32 + 32
    stats = tree.stats((1, 32))
    assert stats["ideal_prefix_hit_tokens_tree"] == 81
    assert stats["ideal_prefix_hit_rate"] == pytest.approx(81 / sum(map(len, prompts)))
    assert stats["ideal_prefix_hit_rate_block32"] == pytest.approx(64 / sum(map(len, prompts)))
    assert tree.order().tolist() == [0, 1, 2, 3]
    mixed = [prompts[0], prompts[3], prompts[2], prompts[1]]
    assert PrefixTree(mixed, 16).order().tolist() == [0, 3, 2, 1], "subtrees whole, by first appearance"
    with pytest.raises(ValueError, match="neither 1 nor a multiple"):
        tree.ideal_hit_tokens(24)


def test_edges_are_slices_of_the_prompts():
    prompts = [[1] * 32 + [2] * 16, [1] * 32 + [3] * 16, [1] * 32]
    tree = PrefixTree(prompts, 16)
    edges = {tuple(prompts[tree.rep[x]][tree.depth[tree.parent[x]] * 16:tree.depth[x] * 16])
             for x in range(1, len(tree.parent))}
    assert edges == {(1,) * 32, (2,) * 16, (3,) * 16}
    assert len(tree.parent) == 4, "root, the shared 32 tokens (where the third ends) and two leaves"


@pytest.mark.parametrize("prompts", [[], [[]], [[1, 2], [1, 2], []], [[7] * 16, [7] * 16]])
def test_degenerate_inputs(prompts):
    tree = PrefixTree(prompts, 16)
    assert sorted(tree.order().tolist()) == list(range(len(prompts)))
    assert tree.ideal_hit_tokens(1) == brute_ideal(prompts, 1)
    assert tree.ideal_hit_tokens(16) == brute_ideal(prompts, 16)


def test_arrays_and_lists_give_the_same_tree():
    rng = np.random.default_rng(0)
    prompts = nested_prompts(rng, 25, vocab=2)
    a, b = PrefixTree(prompts, 4), PrefixTree([np.asarray(p, dtype=np.int64) for p in prompts], 4)
    assert a.order().tolist() == b.order().tolist() and a.stats((1, 4)) == b.stats((1, 4))


def test_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        PrefixTree([[1]], 0)


def test_prefix_heavy_summary_shows_the_ceiling(vocab_dir):
    cfg = {"name": "prefix_heavy", "generator": "prefix_heavy", "seed": 0, "num_groups": 3, "prompts_per_group": 4,
           "prefix_len": 70, "suffix_len": {"kind": "uniform", "low": 20, "high": 30}, "output_len": 4}
    workload = build_workload(cfg, {"name": "fake", "local_dir": str(vocab_dir)}, vocab_dir / "images")
    info = workload.summary()
    assert {"requests", "input_tokens_requested", "ideal_prefix_hit_tokens", "prefix_groups"} <= set(info)
    # Whole blocks of the 70-token prefix, by each of the other 3 prompts in each of 3 groups.
    assert info["ideal_prefix_hit_tokens_block32"] == 3 * 3 * 64
    assert info["ideal_prefix_hit_tokens_block16"] == 3 * 3 * 64
    # Token level: at least the generator's own ceiling (random suffixes may share a first token or so).
    generator_ceiling, tree = info["ideal_prefix_hit_tokens"], info["ideal_prefix_hit_tokens_tree"]
    assert generator_ceiling <= tree < generator_ceiling + 3 * 4 * 3
    assert info["ideal_prefix_hit_rate"] == pytest.approx(tree / info["input_tokens_requested"])


def test_summary_is_computed_once(monkeypatch):
    workload = Workload("w", [Request(f"r{i}", [1] * 40 + [i], 2) for i in range(5)])
    built = []
    real = prefix_tree.PrefixTree
    monkeypatch.setattr(prefix_tree, "PrefixTree", lambda *a, **k: built.append(1) or real(*a, **k))
    first = workload.summary()
    first["requests"] = -1  # callers may mutate what they get
    assert workload.summary()["requests"] == 5 and len(built) == 1
    assert workload.summary()["ideal_prefix_hit_tokens_tree"] == 4 * 40


def test_images_key_the_prompt_so_equal_placeholders_share_nothing():
    text = list(range(1, 40))
    requests = [Request("a", [7] + text, 2, ["/i/cat.png"]), Request("b", [7] + text, 2, ["/i/dog.png"]),
                Request("c", [7] + text, 2, ["/i/cat.png"]), Request("d", [7] + text, 2)]
    keys = prefix_tree.prompt_keys(requests)
    assert keys[3] is requests[3].prompt_token_ids, "no copy without images"
    assert keys[0] == keys[2] != keys[1] and keys[0][1:] == [7] + text and keys[0][0] < 0
    tree = PrefixTree(keys, 16)
    assert tree.ideal_hit_tokens(16) == 32, "only the repeated image's prompt hits"
