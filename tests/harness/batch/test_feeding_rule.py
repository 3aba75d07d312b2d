"""The feeding rule (``harness.batch.job.feeding``): an engine is handed shards by the requests it has unfinished,
sized to its capacity, so small shards on a large engine do not starve it."""

from __future__ import annotations

from harness.batch.job.feeding import MAX_IN_FLIGHT_FACTOR, feed_below, held_at_once, most_held, takes_another


def test_large_shards_keep_the_count_of_shards_bound() -> None:
    assert feed_below(1000) == 2000 and most_held(1000, 3) == MAX_IN_FLIGHT_FACTOR * 3 == 12
    assert held_at_once(1000, 3) == 3


def test_the_queue_kept_follows_the_engine_s_capacity() -> None:
    """Twice the sequences the engine runs at once, 512 where it did not say: an engine of 1024 sequences (a GPU's)
    keeps 2048 queued, not 512, which would leave half its seats empty."""
    assert feed_below(16) == 512 and feed_below(16, 1024) == 2048 and feed_below(16, 64) == 128


def test_small_shards_on_a_large_engine_fill_it() -> None:
    """16-request shards, in_flight 2, an engine of 256 sequences: it takes shards until 512 requests are unfinished,
    where the count of 4 × in_flight = 8 shards let 128 run; and while shards wait on long tails, up to 4 × 32."""
    shards, pending = 0, 0
    while takes_another(shards, 2, 16, pending, 0, 0, capacity=256):
        shards, pending = shards + 1, pending + 16
    assert pending == 512 and shards == 32 and most_held(16, 2, 256) == 128
    # 100 open shards whose requests are all finished but one each (long tails): 100 unfinished, more taken
    assert takes_another(100, 2, 16, 100, 0, 0, capacity=256) and not takes_another(128, 2, 16, 100, 0, 0, 256)
    assert held_at_once(16, 2, 256) == 32
    # a serial feeder (never says what it has fed): in_flight only
    assert takes_another(1, 2, 16, 0, 0, -1, capacity=256) and not takes_another(2, 2, 16, 0, 0, -1, capacity=256)
