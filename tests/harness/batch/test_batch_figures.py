"""Figures whose tests can fail: idle time from a scripted gap between shards, and occupancy from the step trace
(mean running sequences ÷ the engine's ``max_num_seqs``), in each shard's meta and in the row (one node)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness.batch import launch
from harness.batch.scale.pool import LocalPool
from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import batch_app, completion, write_jsonl

FAKE = f"engine.name={FAKE_ENGINE}"
GREEDY = "batch.sampling=benchmark"
GAP_S = 3.0          # the scripted gap before shard GAP_AT
GAP_AT = 2
GAP_TOLERANCE_S = 0.5 * GAP_S  # above the gap: the driver's commit of the last shard and conversion of the next (a
#                        loaded 2-core host), a share of the gap so that the gap, not the host's speed, decides; below
#                        it, never (the engine cannot be fed before the gap ends)


def same_length(path: Path, count: int, max_tokens: int) -> Path:
    return write_jsonl(path, [completion(f"req-{i}", f"prompt {i}", max_tokens=max_tokens) for i in range(count)])


def metas(out: Path) -> list[dict[str, Any]]:
    return [json.loads((d / "meta.json").read_text()) for d in sorted((out / "shards").iterdir())]


class GappedPool(LocalPool):
    """The real pool, except that shard ``GAP_AT`` is handed over only once the engine has finished every shard before
    it, ``GAP_S`` later: a scripted gap with nothing in the engine (as a slow driver or input would leave)."""

    submitted = 0

    def free(self) -> int:
        if self.submitted == GAP_AT and any(self.outstanding):
            return 0
        return super().free()

    def submit(self, shard_dir: Path, index: int, requests: int = 0) -> int:
        if index == GAP_AT:
            time.sleep(GAP_S)
        self.submitted += 1
        return super().submit(shard_dir, index, requests)


def test_a_scripted_gap_between_shards_is_idle_time_within_a_stated_tolerance(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(launch, "make_pool", lambda plan, state, run_id, slots=None: GappedPool(
        plan, state.work_dir / run_id, Path(plan.results_dir) / "logs", slots))
    path = same_length(tmp_path / "batch.jsonl", 20, max_tokens=5)
    out = tmp_path / "out"
    proc = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={out}", "batch.shard_size=4",
                     "batch.in_flight=2", "+engine.knobs.token_s=0.01", "+engine.knobs.max_num_seqs=4")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    idle = {m["index"]: m["idle_before_s"] for m in metas(out)}
    assert GAP_S <= idle[GAP_AT] <= GAP_S + GAP_TOLERANCE_S, idle
    others = sum(v for i, v in idle.items() if i != GAP_AT)
    assert others < 0.25 * GAP_S, f"shards fed while the engine was busy (or at its start) waited little: {idle}"
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["engine_idle_s"] == pytest.approx(idle[GAP_AT] + others)
    assert GAP_S <= row["engine_idle_s"] <= GAP_S + GAP_TOLERANCE_S + 0.25 * GAP_S


def test_an_engine_run_far_below_its_capacity_shows_low_occupancy_in_its_metas_and_the_row(tmp_path: Path) -> None:
    """Side by side: 64 seats for a job of 16 requests in 2-request shards (all of them in the engine at once: at
    most 16 running, occupancy at most 16/64) against 4 seats fed 8-request shards (always 4 running but the tail)."""
    path = same_length(tmp_path / "batch.jsonl", 16, max_tokens=20)
    common = [FAKE, GREEDY, f"batch.input={path}", "+engine.knobs.token_s=0.01"]
    starved = batch_app(tmp_path, *common, f"batch.output_dir={tmp_path / 'starved'}", "batch.shard_size=2",
                        "batch.in_flight=1", "+engine.knobs.max_num_seqs=64")
    full = batch_app(tmp_path, *common, f"batch.output_dir={tmp_path / 'full'}", "batch.shard_size=8",
                     "batch.in_flight=2", "+engine.knobs.max_num_seqs=4")
    assert starved.returncode == 0 and full.returncode == 0, starved.stderr + full.stderr
    bound = 16 / 64
    # a shard's steps are the engine's since the previous shard finished on it: a shard that finished in the same
    # step as the one before has none of its own (0 steps, no occupancy)
    traced = [m for m in metas(tmp_path / "starved") if m["engine_steps"]]
    # all 8 shards in the engine at once: small shards are held by the requests they bring, not by a count of
    # 4 × in_flight shards (8 running of 64 seats under that count)
    assert max(m["shards_in_engine"] for m in metas(tmp_path / "starved")) == 8
    assert len(traced) >= 2 and all(m["max_num_seqs"] == 64 for m in metas(tmp_path / "starved"))
    for meta in traced:
        assert meta["occupancy"] == pytest.approx(meta["mean_running"] / 64)
        assert meta["occupancy"] <= bound + 1e-9, meta
    full_metas = [m for m in metas(tmp_path / "full") if m["engine_steps"]]
    assert full_metas and all(m["max_num_seqs"] == 4 and m["occupancy"] >= 0.75 for m in full_metas), full_metas
    rows = {Path(r["output_dir"]).name: r for r in read_rows(tmp_path / "results", "batch")}
    assert rows["starved"]["occupancy"] <= bound + 1e-9 and rows["full"]["occupancy"] >= 0.75
    # the row's figure is the metas' steps-weighted mean, and its steps are the traces' (the scripted engine
    # keeps no step counter of its own)
    steps = [m["engine_steps"] for m in metas(tmp_path / "starved")]
    assert rows["starved"]["engine_steps"] == sum(steps)
    assert rows["starved"]["occupancy"] == pytest.approx(
        sum(m["occupancy"] * m["engine_steps"] for m in traced) / sum(steps))
    assert rows["starved"]["steps.mean_running"] == pytest.approx(rows["starved"]["occupancy"] * 64)


def test_an_engine_larger_than_512_sequences_is_fed_to_twice_its_capacity(tmp_path: Path) -> None:
    """1024 seats, 64-request shards: the driver keeps 2 × 1024 requests queued by the capacity the engine's start
    said, not the 512 it keeps for an engine that did not say (at most 9 shards of 64 would be in it at once)."""
    path = same_length(tmp_path / "batch.jsonl", 40 * 64, max_tokens=100)
    proc = batch_app(tmp_path, FAKE, GREEDY, f"batch.input={path}", f"batch.output_dir={tmp_path / 'out'}",
                     "batch.shard_size=64", "batch.in_flight=1", "+engine.knobs.token_s=0.01",
                     "+engine.knobs.max_num_seqs=1024")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    held = max(m["shards_in_engine"] for m in metas(tmp_path / "out"))
    assert held > 9, held
