"""A Ray engine actor (``EngineStage``) is fed as one node's worker is: by its unfinished requests, not a shard count;
its shards carry idle time, engine steps and occupancy from the step trace. The stage is built directly (Ray
imported, no cluster): its calls come from threads, as Ray Data's concurrent calls do."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engines.base import Request
from harness.batch.job.feeding import MAX_IN_FLIGHT_FACTOR, feed_below, most_held
from tests.conftest import FAKE_ENGINE

GAP_S = 3.0                    # the stage's gate and feeding loop poll at 0.05-0.5 s: above, never below
GAP_TOLERANCE_S = 0.5 * GAP_S  # a share of the gap, so that the gap, not a loaded host's speed, decides


def stage(knobs: dict[str, Any], in_flight: int = 1, shard_size: int = 4) -> Any:
    from harness.batch.scale.ray_stages import EngineStage

    return EngineStage({"engine": FAKE_ENGINE, "knobs": knobs, "model": {}},
                       {"in_flight": in_flight, "shard_size": shard_size})


def shard(n: int, lengths: list[int]) -> list[Request]:
    return [Request(f"{n}-{i}", [1, 2, 3], length) for i, length in enumerate(lengths)]


def calls(engine_stage: Any, shards: dict[int, list[Request]], stagger_s: float = 0.05) -> dict[int, dict]:
    """Every shard's call on its own thread, started ``stagger_s`` apart in order; their results by shard."""
    results: dict[int, dict] = {}
    threads = []
    for n, requests in shards.items():
        thread = threading.Thread(target=lambda n=n, r=requests: results.__setitem__(n, engine_stage.generate(n, r)))
        thread.start()
        threads.append(thread)
        time.sleep(stagger_s)
    for thread in threads:
        thread.join(120)
    return results


@pytest.mark.engine   # imports Ray (no cluster)
def test_an_engine_actor_is_topped_up_by_its_unfinished_requests_while_a_long_tail_runs() -> None:
    """``in_flight=1``: shard 0 holds one long request; the shards after it enter the engine while that tail runs
    (few unfinished requests), so they finish first, and the engine held more than one shard at once."""
    results = calls(stage({"token_s": 0.02, "max_num_seqs": 8}), {0: shard(0, [60, 2, 2, 2]),
                                                                   1: shard(1, [2] * 4), 2: shard(2, [2] * 4)})
    held = {n: r["measured"]["shards_in_engine"] for n, r in results.items()}
    assert held[1] >= 2 and held[2] >= 2, held
    finished = {n: max(c["finished_at"] or 0 for c in r["completions"]) for n, r in results.items()}
    assert finished[1] < finished[0] and finished[2] < finished[0], finished


@pytest.mark.engine   # imports Ray (no cluster)
def test_an_engine_actor_holds_at_most_the_one_node_bound_of_shards() -> None:
    """Seven calls at once on an actor with ``in_flight=1`` and an engine of one sequence: shards enter while fewer
    than ``feed_below`` (8) of its requests are unfinished, 4 of 2 requests, the rest wait at the gate; the stage
    before this fed every call at once (7)."""
    many = {n: shard(n, [25] * 2) for n in range(7)}
    results = calls(stage({"token_s": 0.005, "max_num_seqs": 1}), many, stagger_s=0.01)
    held = [r["measured"]["shards_in_engine"] for r in results.values()]
    assert feed_below(4, 1) == 8 and most_held(4, 1, 1) == 8
    assert len(results) == 7 and max(held) == 4, held


@pytest.mark.engine   # imports Ray (no cluster)
def test_small_shards_on_a_large_engine_are_all_held_not_starved_by_a_count_of_shards() -> None:
    """Seven 2-request calls on an engine of 64 sequences: all seven in the engine at once (14 requests, under the
    128 that twice its capacity keeps queued), where a count of ``MAX_IN_FLIGHT_FACTOR`` shards held 8 running."""
    many = {n: shard(n, [25] * 2) for n in range(7)}
    results = calls(stage({"token_s": 0.02, "max_num_seqs": 64}), many, stagger_s=0.01)
    held = [r["measured"]["shards_in_engine"] for r in results.values()]
    assert len(results) == 7 and max(held) == 7 > MAX_IN_FLIGHT_FACTOR, held


@pytest.mark.engine   # imports Ray (no cluster)
def test_an_engine_actor_s_shards_carry_idle_time_steps_and_occupancy() -> None:
    """A gap between two shards on the actor is idle time within GAP_TOLERANCE_S (never below the gap); the shard's
    engine steps and occupancy come from its step trace (2 of 16 seats: occupancy 2/16 on every step)."""
    actor = stage({"token_s": 0.02, "max_num_seqs": 16})
    first = actor.generate(0, shard(0, [5, 5]))
    time.sleep(GAP_S)
    second = actor.generate(1, shard(1, [5, 5]))
    assert first["measured"]["idle_before_s"] < 0.25 * GAP_S   # fed at once: far below the gap
    assert GAP_S <= second["measured"]["idle_before_s"] <= GAP_S + GAP_TOLERANCE_S, second["measured"]
    from engines.steptrace import occupancy

    figures = occupancy(second["steps"], second["measured"]["max_num_seqs"])
    assert second["measured"]["max_num_seqs"] == 16 and figures["engine_steps"] == 5
    assert figures["occupancy"] == pytest.approx(2 / 16)


def long_tailed(path: Path, shards: int, size: int = 4, long: int = 100) -> Path:
    """``shards`` shards of ``size`` requests: one of ``long`` output tokens, the rest of 2 (a long tail per shard)."""
    from tests.harness.batch.conftest import completion, write_jsonl

    return write_jsonl(path, [completion(f"r{i}", f"prompt {i}", max_tokens=long if i % size == 0 else 2)
                              for i in range(shards * size)])


@pytest.mark.engine   # joins the session's Ray head: one Ray Data pipeline, beside the same job on one node
@pytest.mark.xdist_group("ray")
def test_on_ray_a_long_tailed_job_takes_the_engine_steps_it_takes_on_one_node(tmp_path: Path, ray_head) -> None:
    """Same file, same config (in_flight=1, one 100-token request per 4-request shard, 8 seats, 50 ms a step): Ray's
    engine steps within 25% of one node's, where feeding by shard count (one shard in the engine at a time) took one
    long tail per shard, about 8 × 100 steps; the Ray row carries engine_steps, engine_idle_s and occupancy as the
    local row. Ray hands a converted shard over a task at a time (``batch.in_flight`` tasks): at 20 ms a step that
    latency cost it 179-199 steps against one node's 135-139 (2026-12-05), which holds every shard at once here."""
    from harness.run.results import read_rows
    from tests.harness.batch.conftest import read_jsonl, troughput_batch

    path = long_tailed(tmp_path / "batch.jsonl", 8)
    common = [f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", f"batch.input={path}", "batch.shard_size=4",
              "batch.in_flight=1", "+engine.knobs.token_s=0.05", "+engine.knobs.max_num_seqs=8"]
    local = troughput_batch(tmp_path, *common, f"batch.output_dir={tmp_path / 'local'}")
    ray = troughput_batch(tmp_path, *common, f"batch.output_dir={tmp_path / 'ray'}", "batch.scale=ray",
                          f"batch.ray.address={ray_head.address}", "batch.ray.actors=1", env=ray_head.driver_env,
                          timeout=600)
    assert local.returncode == 0 and ray.returncode == 0, local.stderr[-2000:] + ray.stderr[-3000:]
    answers = {scale: [(o["custom_id"], o["response"]["body"]["choices"][0]["text"])
                       for o in read_jsonl(tmp_path / scale / "output.jsonl")] for scale in ("local", "ray")}
    assert answers["ray"] == answers["local"] and len(answers["ray"]) == 32
    rows = {r["scale"]: r for r in read_rows(tmp_path / "results", "batch")}
    metas = [read_jsonl(p)[0] for p in sorted((tmp_path / "ray" / "shards").glob("*/meta.json"))]
    assert max(m["shards_in_engine"] for m in metas) >= 2, "shards entered the engine while a long tail ran"
    steps = {scale: rows[scale]["engine_steps"] for scale in ("local", "ray")}
    assert steps["local"] < 0.6 * 8 * 100, steps   # one node overlaps the tails (the bar the Ray path must meet)
    assert 0.75 * steps["local"] <= steps["ray"] <= 1.25 * steps["local"], steps
    for scale in ("local", "ray"):
        row = rows[scale]
        assert row["occupancy"] is not None and 0 < row["occupancy"] <= 1, row["occupancy"]
        assert row["engine_idle_s"] is not None and row["steps.file"], scale
    assert abs(rows["ray"]["occupancy"] - rows["local"]["occupancy"]) < 0.15, (rows["ray"]["occupancy"],
                                                                             rows["local"]["occupancy"])


@pytest.mark.engine   # joins the session's Ray head: one Ray Data pipeline, beside the same job on one node
@pytest.mark.xdist_group("ray")
def test_engine_steps_and_a_fault_hook_note_come_from_the_engines_on_ray_as_on_one_node(tmp_path: Path,
                                                                                      ray_head) -> None:
    """The scripted engine counts its own steps from 1,000 (knob ``step_counter``), a count no step trace holds; two
    engines, on one node and on Ray: each row's ``engine_steps`` is each engine's latest count summed over its
    engines, from its shards' metas (``engine_steps_since_start``), not the traces' steps. Before, a Ray row
    summed the step traces (under 1,000) while a local row took the engines' counts. A test hook left set in the
    engines' environment (``engines.faults``) is in both rows (``engine_info.fault_hook``)."""
    from harness.run.results import read_rows
    from tests.harness.batch.conftest import numbered, read_jsonl, troughput_batch

    path = numbered(tmp_path / "batch.jsonl", 24, max_tokens=8)
    common = [f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", f"batch.input={path}", "batch.shard_size=4",
              "+engine.knobs.token_s=0.02", "+engine.knobs.step_counter=1000",
              "+engine.env.TROUGHPUT_FAULT_AFTER_STEPS=1000"]   # no effect on the scripted engine, but said
    local = troughput_batch(tmp_path, *common, f"batch.output_dir={tmp_path / 'local'}", "engine.replicas=2")
    ray = troughput_batch(tmp_path, *common, f"batch.output_dir={tmp_path / 'ray'}", "batch.scale=ray",
                          f"batch.ray.address={ray_head.address}", "batch.ray.actors=2", env=ray_head.driver_env,
                          timeout=600)
    assert local.returncode == 0 and ray.returncode == 0, local.stderr[-2000:] + ray.stderr[-3000:]
    rows = {r["scale"]: r for r in read_rows(tmp_path / "results", "batch")}
    for scale, engine in (("local", lambda m: m["worker"]), ("ray", lambda m: (m["engine_node"], m["engine_pid"]))):
        metas = [read_jsonl(p)[0] for p in sorted((tmp_path / scale / "shards").glob("*/meta.json"))]
        latest: dict = {}
        for m in metas:
            latest[engine(m)] = max(latest.get(engine(m), 0), m["engine_steps_since_start"])
        traced = sum(m["engine_steps"] for m in metas)
        assert rows[scale]["engine_steps"] == sum(latest.values()), (scale, rows[scale]["engine_steps"], latest)
        assert rows[scale]["engine_steps"] >= 1000 * len(latest) + traced * 0.9 and traced < 1000, (scale, traced)
        assert rows[scale]["engine_info.fault_hook"] == ("TROUGHPUT_FAULT_AFTER_STEPS=1000 is set, but engine 'fake' "
                                                         "has no such hook: it has no effect"), scale
