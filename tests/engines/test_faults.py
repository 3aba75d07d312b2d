"""The test hook that makes a real engine fail after N steps (``engines.faults``): its counting, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.faults import AFTER_STEPS, FAULT_FILE, FAULT_TIMES, InjectedFault, failing_after, steps_before_fault


def test_unset_means_no_fault_and_nothing_counted(tmp_path: Path) -> None:
    assert steps_before_fault({}) is None
    assert steps_before_fault({AFTER_STEPS: "", FAULT_FILE: str(tmp_path / "n")}) is None
    assert not (tmp_path / "n").exists()


def test_only_the_first_engines_of_the_fault_file_fail(tmp_path: Path) -> None:
    env = {AFTER_STEPS: "7", FAULT_FILE: str(tmp_path / "n"), FAULT_TIMES: "2"}
    assert [steps_before_fault(env) for _ in range(4)] == [7, 7, None, None]
    assert (tmp_path / "n").read_text() == "2"
    assert [steps_before_fault({AFTER_STEPS: "3"}) for _ in range(3)] == [3, 3, 3], "no file: every engine fails"


def test_the_wrapped_step_runs_n_times_then_raises_every_time() -> None:
    calls = []
    step = failing_after(lambda x: calls.append(x) or x, 3, "engine")
    assert [step(i) for i in range(3)] == [0, 1, 2]
    for _ in range(2):
        with pytest.raises(InjectedFault, match="injected engine failure after 3 steps"):
            step(99)
    assert calls == [0, 1, 2], "the failing calls never reach the engine"


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match=AFTER_STEPS):
        steps_before_fault({AFTER_STEPS: "-1"})
