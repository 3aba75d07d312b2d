"""How many shards an engine is handed: the feeding rule shared by one node's pool, Ray's engine actors and the
in-job pruner's estimate of a trial's reporting points."""

from __future__ import annotations


MAX_IN_FLIGHT_FACTOR = 4  # with large shards, bounds the shards one engine holds (work redone after a crash)
UNKNOWN_CAPACITY_QUEUE = 512  # unfinished requests kept where the engine's capacity is unknown (twice a typical 256)


def feed_below(shard_size: int, capacity: int | None = None) -> int:
    """Unfinished requests under which an engine is handed another shard: two shards' worth, and at least twice
    the sequences the engine runs at once (``capacity``, its ``max_num_seqs``; 512 where unknown), so that freed
    sequence slots always find queued requests."""
    return max(2 * shard_size, 2 * capacity if capacity else UNKNOWN_CAPACITY_QUEUE)


def most_held(shard_size: int, in_flight: int, capacity: int | None = None) -> int:
    """The most shards one engine holds: ``MAX_IN_FLIGHT_FACTOR ×`` the larger of ``in_flight`` and the shards that
    hold ``feed_below`` requests. Where shards are small beside the engine (16-request shards on an engine of 256
    sequences), a count of ``in_flight`` alone would starve it (at most 4 × 2 × 16 = 128 running), and so would
    room for ``feed_below`` requests alone on long-tailed outputs: each open shard then waits on its one or two
    longest requests (35 shards of 16 held 124 running of 256 in a real vLLM-CPU main phase)."""
    return MAX_IN_FLIGHT_FACTOR * max(in_flight, -(-feed_below(shard_size, capacity) // shard_size))


def takes_another(shards: int, in_flight: int, shard_size: int, pending: int, sent: int, fed: int,
                  capacity: int | None = None) -> bool:
    """Whether an engine holding ``shards`` unfinished shards is handed another: below ``in_flight`` always; beyond,
    up to ``most_held`` shards while its unfinished requests (``pending`` as it last reported, plus those ``sent``
    but not ``fed`` by then) are fewer than ``feed_below(shard_size, capacity)``. ``fed`` < 0: the engine never
    said (a serial feeder): ``in_flight`` only. ``capacity``: the engine's ``max_num_seqs`` as its start said
    (``None``: unknown). The same rule on one node (``pool.LocalPool``) and in a Ray engine actor
    (``harness.batch.scale.ray_stages.EngineStage``)."""
    if shards < in_flight:
        return True
    if fed < 0:
        return False
    return (shards < most_held(shard_size, in_flight, capacity)
            and pending + sent - fed < feed_below(shard_size, capacity))


def held_at_once(shard_size: int, in_flight: int, capacity: int | None = None) -> int:
    """About the most shards ``takes_another`` lets an engine that reports its unfinished requests hold: enough
    for ``feed_below`` requests, within ``most_held``, never fewer than ``in_flight``."""
    return max(in_flight, min(most_held(shard_size, in_flight, capacity),
                              -(-feed_below(shard_size, capacity) // shard_size)))
