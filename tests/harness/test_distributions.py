import numpy as np
import pytest

from harness.core.errors import TroughputError
from harness.workloads.distributions import sample_lengths


@pytest.mark.parametrize("spec", [
    7,
    {"kind": "fixed", "value": 7},
    {"kind": "uniform", "low": 3, "high": 9},
    {"kind": "normal", "mean": 50, "std": 10, "min": 20, "max": 80},
    {"kind": "lognormal", "median": 100, "sigma": 0.5, "max": 400},
])
def test_lengths_are_positive_ints_within_bounds_and_seeded(spec):
    a = sample_lengths(spec, 500, np.random.default_rng(1))
    b = sample_lengths(spec, 500, np.random.default_rng(1))
    assert a.dtype == np.int64 and len(a) == 500 and (a >= 1).all()
    assert (a == b).all()
    if isinstance(spec, dict) and "max" in spec:
        assert a.max() <= spec["max"] and a.min() >= spec.get("min", 1)
    if isinstance(spec, dict) and spec["kind"] == "uniform":
        assert a.min() >= 3 and a.max() <= 9 and len(set(a)) == 7


def test_lognormal_median_is_near_its_parameter():
    a = sample_lengths({"kind": "lognormal", "median": 200, "sigma": 0.8}, 20000, np.random.default_rng(0))
    assert 180 < np.median(a) < 220


def test_bad_specs_name_the_problem():
    with pytest.raises(TroughputError, match="unknown length distribution 'zipf'"):
        sample_lengths({"kind": "zipf"}, 3, np.random.default_rng(0))
    with pytest.raises(TroughputError, match="needs parameter 'high'"):
        sample_lengths({"kind": "uniform", "low": 1}, 3, np.random.default_rng(0))
