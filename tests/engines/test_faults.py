"""The test hook that makes a real engine fail after N steps (``engines.faults``): its counting, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.faults import (AFTER_STEPS, FAULT_FILE, FAULT_TIMES, InjectedFault, after_steps, announce, failing_after,
                            hook_note, steps_before_fault)


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


@pytest.mark.parametrize("value", ["twenty", "1.5", "-1", " "])
def test_a_value_that_is_no_count_is_an_error_naming_the_variable(value: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{AFTER_STEPS}={value!r}: must be an integer >= 0"):
        steps_before_fault({AFTER_STEPS: value, FAULT_FILE: str(tmp_path / "n")})
    with pytest.raises(ValueError, match=AFTER_STEPS):
        after_steps({AFTER_STEPS: value})
    assert not (tmp_path / "n").exists(), "refused before any engine was counted"


def test_a_hook_left_set_warns_and_says_so_in_the_start_info(capsys) -> None:
    extra: dict = {}
    assert announce(extra, "fake", {}) is None and extra == {} and capsys.readouterr().err == ""
    note = announce(extra, "fake", {AFTER_STEPS: "20"})
    assert extra == {"fault_hook": note} and note == (f"{AFTER_STEPS}=20 is set, but engine 'fake' has no such hook: "
                                                      f"it has no effect")
    assert f"troughput: warning: {note}; unset {AFTER_STEPS} in a real job" in capsys.readouterr().err
    own = {"fault_hook": hook_note(20, True, {AFTER_STEPS: "20"})}   # an adapter with the hook (vLLM) says its own
    assert announce(own, "vllm", {AFTER_STEPS: "20"}) == own["fault_hook"]
    assert own["fault_hook"] == f"{AFTER_STEPS}=20: this engine fails at its step 21 (a test hook, engines/faults.py)"
    past = hook_note(20, False, {AFTER_STEPS: "20", FAULT_FILE: "/tmp/n", FAULT_TIMES: "1"})
    assert "past TROUGHPUT_FAULT_TIMES=1 of TROUGHPUT_FAULT_FILE=/tmp/n, so it does not fail" in past
