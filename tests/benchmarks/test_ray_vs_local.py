"""benchmarks/ray_vs_local.py's bar: Ray's engine steps within 5% of one node's and occupancy within 5 points."""

from __future__ import annotations

import pytest

from benchmarks.ray_vs_local import compare


def side(steps: float, occupancy: float, rate: float = 1000.0) -> dict[str, float]:
    return {"engine_steps": steps, "occupancy": occupancy, "output_tok_s": rate}


@pytest.mark.parametrize(("ray", "holds"), [
    (side(1040, 0.27), True),     # 4% more steps, 2 points more occupancy
    (side(1060, 0.25), False),    # 6% more steps
    (side(940, 0.25), False),     # 6% fewer: a difference either way
    (side(1000, 0.31), False),    # 6 points of occupancy
    (side(1000, 0.19), False),
])
def test_the_bar_is_steps_within_5_percent_and_occupancy_within_5_points(ray, holds) -> None:
    got = compare(side(1000, 0.25, 2000.0), ray)
    assert got["bar_holds"] is holds
    assert got["steps_ratio"] == pytest.approx(ray["engine_steps"] / 1000)
    assert got["occupancy_points"] == pytest.approx((ray["occupancy"] - 0.25) * 100)
    assert got["tok_s_ratio"] == pytest.approx(0.5), "the rate is reported beside the bar, not part of it"


def test_a_side_without_figures_does_not_hold() -> None:
    missing = {"engine_steps": None, "occupancy": None, "output_tok_s": 1.0}
    assert compare(side(1000, 0.25), missing)["bar_holds"] is False
