"""Workload samples for low-fidelity trials: seeded, in order, their own statistics."""

import pytest

from engines.base import Request
from harness.core.errors import TroughputError
from harness.workloads.base import Workload

WORKLOAD = Workload("w", [Request(f"r{i}", [1, 2, 3 + i], 4) for i in range(20)],
                    groups=[f"g{i % 3}" for i in range(20)], info={"built": 1})


def test_a_sample_is_a_seeded_fraction_in_original_order():
    sample = WORKLOAD.sample(0.25, seed=7)
    ids = [r.id for r in sample.requests]
    assert len(ids) == 5 and ids == sorted(ids, key=lambda i: int(i[1:]))
    assert ids == [r.id for r in WORKLOAD.sample(0.25, seed=7).requests], "same seed, same sample"
    assert ids != [r.id for r in WORKLOAD.sample(0.25, seed=8).requests]
    assert sample.groups == [f"g{int(i[1:]) % 3}" for i in ids]
    assert sample.summary()["requests"] == 5 and "built" not in sample.summary()
    assert sample.fingerprint != WORKLOAD.fingerprint


def test_a_sample_keeps_at_least_one_request_and_checks_the_fraction():
    assert len(WORKLOAD.sample(0.001).requests) == 1
    for bad in (0, 1.5):
        with pytest.raises(TroughputError, match="fraction in"):
            WORKLOAD.sample(bad)
