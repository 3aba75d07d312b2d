import pytest

from engines.base import Request
from harness.errors import TroughputError
from harness.ordering import apply_ordering

REQUESTS = [Request(f"r{i}", [i + 1], 1) for i in range(20)]


def test_as_given_keeps_order_and_shuffled_is_a_seeded_permutation():
    assert apply_ordering(REQUESTS, {"name": "as_given"}) == REQUESTS
    a = apply_ordering(REQUESTS, {"name": "shuffled", "seed": 1})
    assert a == apply_ordering(REQUESTS, {"name": "shuffled", "seed": 1})
    assert a != REQUESTS and sorted(r.id for r in a) == sorted(r.id for r in REQUESTS)
    assert a != apply_ordering(REQUESTS, {"name": "shuffled", "seed": 2})


def test_unknown_ordering_lists_known_ones():
    with pytest.raises(TroughputError, match="known: as_given, shuffled"):
        apply_ordering(REQUESTS, {"name": "alphabetical"})
