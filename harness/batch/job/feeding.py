"""How many shards an engine is handed: the feeding rule shared by one node's pool, Ray's engine actors and the
in-job pruner's estimate of a trial's reporting points."""

from __future__ import annotations


MAX_IN_FLIGHT_FACTOR = 4  # bounds the shards one engine holds (work redone after a crash)


def feed_below(shard_size: int) -> int:
    """Unfinished requests under which an engine is handed another shard: two shards' worth, at least 512
    (about twice a typical ``max_num_seqs``), so that freed sequence slots always find queued requests."""
    return max(2 * shard_size, 512)


def takes_another(shards: int, in_flight: int, shard_size: int, pending: int, sent: int, fed: int) -> bool:
    """Whether an engine holding ``shards`` unfinished shards is handed another: below ``in_flight`` always; beyond,
    up to ``MAX_IN_FLIGHT_FACTOR × in_flight`` while its unfinished requests (``pending`` as it last reported, plus
    those ``sent`` but not ``fed`` by then) are fewer than ``feed_below(shard_size)``. ``fed`` < 0: the engine
    never said (a serial feeder): ``in_flight`` only. The same rule on one node (``pool.LocalPool``) and in a Ray
    engine actor (``harness.batch.scale.ray_stages.EngineStage``)."""
    if shards < in_flight:
        return True
    if fed < 0:
        return False
    return shards < MAX_IN_FLIGHT_FACTOR * in_flight and pending + sent - fed < feed_below(shard_size)


def held_at_once(shard_size: int, in_flight: int) -> int:
    """About the most shards ``takes_another`` lets an engine that reports its unfinished requests hold: up to
    ``MAX_IN_FLIGHT_FACTOR × in_flight`` while they stay under ``feed_below``, never fewer than ``in_flight``."""
    return max(in_flight, min(MAX_IN_FLIGHT_FACTOR * in_flight, -(-feed_below(shard_size) // shard_size)))
