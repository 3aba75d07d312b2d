"""``run.rounds=auto``: a real multirun (scripted engine, real worker processes) that adds rounds until decided."""

import pytest

from harness.core.errors import TroughputError
from harness.report.rounds import wants_rounds
from harness.report.sequential import SequentialPlan
from harness.report.verdict import CLEAR
from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE, compose
from tests.harness.test_cli import troughput_run_here

COMMON = [f"engine.name={FAKE_ENGINE}", "workload=unique", "workload.num_requests=4", "run.warmup_requests=0",
          "run.rounds=auto"]


def rounds_of(rows, knob):
    return sorted((r[f"knob.{knob}"], r["round"]) for r in rows)


def test_a_clear_difference_stops_as_soon_as_the_rule_decides(tmp_path):
    # 5x apart: on a quiet host the rule decides at round 3 (the fewest it takes); scheduling noise on a
    # loaded host can take a round or two more, so the test checks that it stopped at the first deciding round
    proc = troughput_run_here(tmp_path, "-m", *COMMON, "run.max_rounds=8", "+engine.knobs.sleep_s=0.1,0.5")
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(tmp_path / "results")
    last = max(r["round"] for r in rows)
    assert 3 <= last < 8 and f"decided after {last} round(s): clear winner" in proc.stdout
    assert rounds_of(rows, "sleep_s") == [(s, k) for s in (0.1, 0.5) for k in range(1, last + 1)]
    rates = {s: [r["output_tok_s"] for r in sorted(rows, key=lambda r: r["round"]) if r["knob.sleep_s"] == s]
             for s in (0.1, 0.5)}
    plan = SequentialPlan(3, 8)   # the loop's looks: 3 to run.max_rounds=8 runs a side
    assert "rounds: verdicts by group-sequential" in proc.stdout
    assert f"rounds: verdicts by {plan.describe(0.02)}" in proc.stdout, "the loop's plan at run.min_effect"
    assert plan.judge(rates[0.1], rates[0.5]).verdict == CLEAR
    if last > 3:
        assert not plan.judge(rates[0.1][:-1], rates[0.5][:-1]).decided, "one round fewer had not decided"
    assert len({r["sweep_id"] for r in rows}) == 1 and {r["status"] for r in rows} == {"ok"}
    assert f"{len(rows)} row(s)" in proc.stdout, "the summary comes after the added rounds"
    added = [r for r in rows if r["round"] == last]
    assert all(r["command"].endswith(f"run.round={last}") for r in added), "each added row says how to rerun it"
    assert {r.get("looks") for r in rows if r["round"] > 1} == {"3-8"}, "added rows carry the loop's plan"


def test_an_undecidable_comparison_runs_to_the_cap_and_says_so(tmp_path):
    # the same config twice (A/A) with a scripted spread: generate calls alternate 0.02 s and 0.3 s across runs,
    # and the rotating order gives both sides the same slow and fast runs: never decided
    cycle = tmp_path / "cycle"
    proc = troughput_run_here(tmp_path, "-m", *COMMON, "engine.knobs.max_num_seqs=8,9", "run.max_rounds=4",
                              "+engine.knobs.sleep_cycle_s=[0.02,0.3]", f"+engine.knobs.cycle_file={cycle}")
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(tmp_path / "results")
    assert rounds_of(rows, "max_num_seqs") == [(8, 1), (8, 2), (8, 3), (8, 4), (9, 1), (9, 2), (9, 3), (9, 4)]
    assert "cap of 4 rounds reached, undecided: too close to call" in proc.stdout
    assert "runs a side would" in proc.stdout
    assert int(cycle.read_text()) == 8


def test_rounds_takes_auto_or_null_only():
    assert not wants_rounds(compose("engine=sim"))
    assert wants_rounds(compose("engine=sim", "run.rounds=auto"))
    with pytest.raises(TroughputError, match="run.rounds=3"):
        wants_rounds(compose("engine=sim", "run.rounds=3"))


def test_the_loop_s_first_line_says_whether_its_plan_was_simulated_at_its_minimum_effect():
    """3 to 10 runs a side is a simulated plan, at a minimum effect of 2% or more: a loop at 1% must not claim it."""
    from harness.report import rounds

    for min_effect, claim in ((0.02, "(simulated for this plan"), (0.01, "(not simulated for this plan")):
        said = []
        rounds.add_rounds(3, 10, lambda plan: {}, lambda *a: None, say=said.append, min_effect=min_effect)
        assert said[0].startswith("rounds: verdicts by group-sequential") and claim in said[0], said[0]
