from pathlib import Path

import pytest

from harness.core.errors import TroughputError
from harness.workloads import build_workload

MODEL = {"name": "fake", "image_token": "<image>"}


def build(cfg, vocab_dir: Path, image_dir: Path | None = None):
    return build_workload(cfg, {**MODEL, "local_dir": str(vocab_dir)}, image_dir or vocab_dir / "images")


UNIQUE = {"name": "unique", "generator": "unique", "seed": 3, "num_requests": 50,
          "input_len": {"kind": "uniform", "low": 5, "high": 40}, "output_len": 8}
PREFIX = {"name": "prefix_heavy", "generator": "prefix_heavy", "seed": 0, "num_groups": 3,
          "prompts_per_group": 4, "prefix_len": 30, "suffix_len": {"kind": "uniform", "low": 2, "high": 5},
          "output_len": 4}
MULTIMODAL = {"name": "multimodal", "generator": "multimodal", "seed": 0, "num_requests": 40,
              "images_per_request": 2, "image_width": 32, "image_height": 24, "duplicate_rate": 0.5,
              "input_len": 6, "output_len": 4}


def test_unique_is_deterministic_and_uses_ordinary_tokens_only(vocab_dir):
    a, b = build(UNIQUE, vocab_dir), build(UNIQUE, vocab_dir)
    assert a.fingerprint == b.fingerprint
    assert [r.prompt_token_ids for r in a.requests] == [r.prompt_token_ids for r in b.requests]
    tokens = {t for r in a.requests for t in r.prompt_token_ids}
    assert tokens <= set(range(4, 100)), "special and added tokens never appear in synthetic prompts"
    assert all(5 <= len(r.prompt_token_ids) <= 40 and r.max_tokens == 8 for r in a.requests)
    assert len({r.id for r in a.requests}) == 50


def test_seed_changes_the_fingerprint(vocab_dir):
    assert build(UNIQUE, vocab_dir).fingerprint != build({**UNIQUE, "seed": 4}, vocab_dir).fingerprint


def test_prefix_heavy_groups_share_exactly_their_prefix(vocab_dir):
    w = build(PREFIX, vocab_dir)
    assert len(w.requests) == 12 and w.groups.count("g0000") == 4
    prefixes = {}
    for g in range(3):
        prompts = [r.prompt_token_ids for r, label in zip(w.requests, w.groups) if label == f"g{g:04d}"]
        assert len({tuple(p[:30]) for p in prompts}) == 1
        prefixes[g] = tuple(prompts[0][:30])
    assert len(set(prefixes.values())) == 3, "each group has its own prefix"
    assert w.info["ideal_prefix_hit_tokens"] == 3 * 30 * (4 - 1)
    assert w.summary()["requests"] == 12


def test_prefix_heavy_arrives_interleaved_by_default(vocab_dir):
    w = build(PREFIX, vocab_dir)
    assert w.info["arrival"] == "interleaved"
    assert w.groups == ["g0000", "g0001", "g0002"] * 4, "round-robin over the groups"
    assert [r.id for r in w.requests[:4]] == ["g0000-p0000", "g0001-p0000", "g0002-p0000", "g0000-p0001"]
    assert all(a != b for a, b in zip(w.groups, w.groups[1:])), "no two neighbours share a prefix"


@pytest.mark.parametrize("arrival", ["grouped", "shuffled"])
def test_arrival_reorders_the_same_prompts_and_changes_the_fingerprint(vocab_dir, arrival):
    interleaved, other = build(PREFIX, vocab_dir), build({**PREFIX, "arrival": arrival}, vocab_dir)
    assert other.info["arrival"] == arrival

    def as_set(w):
        return {(r.id, tuple(r.prompt_token_ids), r.max_tokens) for r in w.requests}

    assert as_set(other) == as_set(interleaved), "the same requests, only their order differs"
    assert [r.id for r in other.requests] != [r.id for r in interleaved.requests]
    assert other.fingerprint != interleaved.fingerprint, "the order is part of the content"
    assert other.summary()["ideal_prefix_hit_rate"] == interleaved.summary()["ideal_prefix_hit_rate"]
    assert other.fingerprint == build({**PREFIX, "arrival": arrival}, vocab_dir).fingerprint, "deterministic"
    assert dict(zip((r.id for r in other.requests), other.groups)) == \
        dict(zip((r.id for r in interleaved.requests), interleaved.groups)), "labels follow their requests"


def test_grouped_arrival_emits_each_group_back_to_back(vocab_dir):
    w = build({**PREFIX, "arrival": "grouped"}, vocab_dir)
    assert w.groups == ["g0000"] * 4 + ["g0001"] * 4 + ["g0002"] * 4


def test_shuffled_arrival_follows_the_seed(vocab_dir):
    def order(seed):
        return [r.id for r in build({**PREFIX, "arrival": "shuffled", "seed": seed}, vocab_dir).requests]

    assert order(0) != order(1)
    assert sorted(order(0)) == sorted(order(1))


def test_unknown_arrival_lists_the_known_ones(vocab_dir):
    with pytest.raises(TroughputError, match="interleaved, grouped, shuffled"):
        build({**PREFIX, "arrival": "random"}, vocab_dir)


def test_multimodal_repeats_images_and_leads_with_placeholders(vocab_dir, tmp_path):
    w = build(MULTIMODAL, vocab_dir, tmp_path / "img")
    summary = w.summary()
    assert summary["images"] == 80
    assert 10 < summary["unique_images"] < 70, "about half the draws repeat an earlier image"
    assert all(r.prompt_token_ids[:2] == [100, 100] and len(r.prompt_token_ids) == 8 for r in w.requests)
    assert all(Path(p).exists() for r in w.requests for p in r.images)
    again = build(MULTIMODAL, vocab_dir, tmp_path / "img2")
    assert again.fingerprint == w.fingerprint, "image content, not its path, enters the fingerprint"


def test_multimodal_needs_a_vision_model(vocab_dir):
    with pytest.raises(TroughputError, match="takes no images"):
        build_workload(MULTIMODAL, {"name": "tiny", "image_token": None, "local_dir": str(vocab_dir)}, vocab_dir)


def test_unknown_generator_lists_known_ones(vocab_dir):
    with pytest.raises(TroughputError, match="known: unique, prefix_heavy, multimodal, file"):
        build({**UNIQUE, "generator": "nope"}, vocab_dir)
