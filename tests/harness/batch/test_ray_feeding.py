"""A Ray engine actor (``EngineStage``) is fed as one node's worker is: by its unfinished requests, not a shard count;
its shards carry idle time, engine steps and occupancy from the step trace. The stage is built directly (Ray
imported, no cluster): its calls come from threads, as Ray Data's concurrent calls do."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from engines.base import Request
from harness.batch.pool import MAX_IN_FLIGHT_FACTOR
from tests.conftest import FAKE_ENGINE

GAP_S, GAP_TOLERANCE_S = 1.5, 0.5   # the stage's gate and feeding loop poll at 0.05-0.5 s: above, never below


def stage(knobs: dict[str, Any], in_flight: int = 1, shard_size: int = 4) -> Any:
    from harness.batch.ray_stages import EngineStage

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
    """Seven calls at once on an actor with ``in_flight=1``: at most ``MAX_IN_FLIGHT_FACTOR`` shards in the engine
    at once (the rest wait at the gate); the stage before this fed every call at once (7)."""
    many = {n: shard(n, [25] * 2) for n in range(7)}
    results = calls(stage({"token_s": 0.02, "max_num_seqs": 64}), many, stagger_s=0.01)
    held = [r["measured"]["shards_in_engine"] for r in results.values()]
    assert len(results) == 7 and max(held) == MAX_IN_FLIGHT_FACTOR, held


@pytest.mark.engine   # imports Ray (no cluster)
def test_an_engine_actor_s_shards_carry_idle_time_steps_and_occupancy() -> None:
    """A gap between two shards on the actor is idle time within GAP_TOLERANCE_S (never below the gap); the shard's
    engine steps and occupancy come from its step trace (2 of 16 seats: occupancy 2/16 on every step)."""
    actor = stage({"token_s": 0.02, "max_num_seqs": 16})
    first = actor.generate(0, shard(0, [5, 5]))
    time.sleep(GAP_S)
    second = actor.generate(1, shard(1, [5, 5]))
    assert first["measured"]["idle_before_s"] < 0.5
    assert GAP_S <= second["measured"]["idle_before_s"] <= GAP_S + GAP_TOLERANCE_S, second["measured"]
    from engines.steptrace import occupancy

    figures = occupancy(second["steps"], second["measured"]["max_num_seqs"])
    assert second["measured"]["max_num_seqs"] == 16 and figures["engine_steps"] == 5
    assert figures["occupancy"] == pytest.approx(2 / 16)
