import json

import pytest

from harness.report.data import group_configs, load_runs
from harness.report.decisions import CLEAR, CLOSE, INSUFFICIENT, chosen_knobs, decide, history, record


def decisions_for(directory, **kwargs):
    frame = load_runs(directory)
    return decide(frame, group_configs(frame, **kwargs), **kwargs)


def runs(row, knobs, *medians, engine="vllm"):
    """One row per independent run, each with three close passes around its median."""
    return [row(engine, knobs=knobs, passes=(m - 1, m, m + 1)) for m in medians]


def test_separated_independent_runs_are_a_clear_winner_with_its_margin(results, row):
    directory = results(*runs(row, {"max_num_seqs": 64}, 200, 205, 210), *runs(row, {"max_num_seqs": 8}, 100, 105, 110))
    [d] = decisions_for(directory)
    assert d["verdict"] == CLEAR and chosen_knobs(d) == {"max_num_seqs": 64}
    assert d["margin"] == pytest.approx(205 / 105 - 1), "the low median of the runs' median passes"
    assert 0 < d["margin_ci_low"] <= d["margin"] <= d["margin_ci_high"]
    assert d["runner_up.relation"].startswith("second-best config of the same engine")
    assert (d["chosen.n_runs"], d["chosen.sample_kind"]) == (3, "runs")
    assert "3 independent runs" in d["reason"]


def test_separated_passes_of_one_run_are_not_a_clear_winner_and_say_what_is_missing(results, row):
    directory = results(row(knobs={"max_num_seqs": 64}, passes=(200, 205, 210)),
                        row(knobs={"max_num_seqs": 8}, passes=(100, 105, 110)))
    [d] = decisions_for(directory)
    assert d["verdict"] == INSUFFICIENT and d["flags"] == ["too few runs"]
    assert "the winner has 1 and the runner-up has 1" in d["reason"] and "run.round=1,2,3" in d["reason"]
    assert d["chosen.sample_kind"] == "passes" and "not independent" in d["reason"]


def test_two_runs_per_side_are_still_too_few_for_a_clear_winner(results, row):
    directory = results(*runs(row, {"max_num_seqs": 64}, 200, 210), *runs(row, {"max_num_seqs": 8}, 100, 105, 110))
    [d] = decisions_for(directory)
    assert d["verdict"] == INSUFFICIENT and "the winner has 2" in d["reason"] and "runner-up has" not in d["reason"]


def test_runs_that_disagree_decide_even_when_each_runs_passes_are_tight(results, row):
    # each run's passes are within 1 tok/s, but runs drift by 40%: over runs the intervals overlap
    directory = results(*runs(row, {"max_num_seqs": 64}, 150, 200, 250), *runs(row, {"max_num_seqs": 8}, 140, 190, 240))
    [d] = decisions_for(directory)
    assert d["verdict"] == CLOSE
    assert d["chosen.runs_disagree"] is True and d["chosen.cv_runs"] == pytest.approx(0.25)


def test_overlapping_repeat_intervals_are_too_close_to_call_not_a_win(results, row):
    directory = results(row(knobs={"max_num_seqs": 64}, passes=(100, 130, 160)),
                        row(knobs={"max_num_seqs": 8}, passes=(110, 120, 150)))
    [d] = decisions_for(directory)
    assert d["verdict"] == CLOSE, "130 beats 120 on the median, but the intervals overlap"
    assert d["chosen.ci_low"] <= d["runner_up.ci_high"]
    assert d["margin_ci_low"] < 0 < d["margin_ci_high"]


def test_a_single_pass_is_flagged_and_not_called(results, row):
    directory = results(row(knobs={"max_num_seqs": 64}, passes=(300,)),
                        row(knobs={"max_num_seqs": 8}, passes=(100, 105, 110)))
    [d] = decisions_for(directory)
    assert d["verdict"] == INSUFFICIENT and d["flags"] == ["single run"]
    assert d["margin"] == pytest.approx(300 / 105 - 1) and d["margin_ci_low"] is None


def test_one_config_or_only_failures_is_insufficient_data(results, row):
    directory = results(row(workload="unique"), row(workload="prefix_heavy", status="oom", error="oom"))
    by_workload = {d["workload"]: d for d in decisions_for(directory)}
    assert by_workload["unique"]["verdict"] == INSUFFICIENT and by_workload["unique"]["flags"] == ["no runner-up"]
    assert by_workload["prefix_heavy"]["flags"] == ["no successful run"]
    assert by_workload["prefix_heavy"]["failed_runs"]


def test_the_runner_up_is_another_engine_when_there_is_one(results, row):
    directory = results(*runs(row, {"max_num_seqs": 64}, 300, 300, 300), *runs(row, {"max_num_seqs": 8}, 250, 250, 250),
                        *runs(row, {"max_running_requests": 8}, 200, 200, 200, engine="sglang"))
    [d] = decisions_for(directory)
    assert d["chosen.engine"] == "vllm" and d["runner_up.engine"] == "sglang"
    assert d["runner_up.relation"] == "best config of another engine"
    assert d["verdict"] == CLEAR and d["margin"] == pytest.approx(0.5)


def test_the_bootstrap_is_seeded(results, row):
    directory = results(row(knobs={"max_num_seqs": 64}, passes=(200, 230, 210, 250)),
                        row(knobs={"max_num_seqs": 8}, passes=(100, 150, 110, 120)))
    first, second = decisions_for(directory), decisions_for(directory)
    assert first[0]["margin_ci_low"] == second[0]["margin_ci_low"]
    assert first[0]["basis"] == second[0]["basis"]


def test_decisions_are_appended_only_when_their_rows_change_and_old_ones_are_kept(results, row):
    directory = results(row(knobs={"max_num_seqs": 64}, passes=(200, 205, 210)),
                        row(knobs={"max_num_seqs": 8}, passes=(100, 105, 110)))
    [first] = record(directory, decisions_for(directory))
    [again] = record(directory, decisions_for(directory))
    assert first["recorded"] == "new" and again["recorded"] == "unchanged"
    assert again["decision_id"] == first["decision_id"]
    assert len(list((directory / "decisions").glob("*.json"))) == 1

    results(*[row(knobs={"max_num_seqs": 8}, passes=(400, 405, 410)) for _ in range(2)])  # new evidence flips it
    [latest] = record(directory, decisions_for(directory))
    assert latest["recorded"] == "new" and latest["supersedes"] == first["decision_id"]
    assert chosen_knobs(latest) == {"max_num_seqs": 8}
    [cell] = history(directory).values()
    assert [d["decision_id"] for d in cell] == [first["decision_id"], latest["decision_id"]]
    stored = json.loads((directory / "decisions" / f"{first['decision_id']}.json").read_text())
    assert stored["chosen.knob.max_num_seqs"] == 64, "the older decision is kept as it was"
    assert set(stored["rests_on"]) <= {p.stem for p in (directory / "runs").glob("*.json")}


def test_a_faster_config_below_the_agreement_floor_is_passed_over_and_named(results, row, tmp_path):
    from harness.report import ReportOptions, build_report
    from harness.report.quality import QualityGuard

    fast = [row(knobs={"dtype": "float32"}, passes=(m - 1, m, m + 1), **{"quality.token_agreement": 0.82})
            for m in (300, 305, 310)]
    kept = [row(knobs={"dtype": "bfloat16"}, passes=(m - 1, m, m + 1), **{"quality.token_agreement": 1.0})
            for m in (100, 105, 110)]
    unchecked = [row(knobs={"max_num_seqs": 4}, passes=(m - 1, m, m + 1)) for m in (50, 55, 60)]
    directory = results(*fast, *kept, *unchecked)
    [d] = decisions_for(directory)
    assert chosen_knobs(d) == {"dtype": "bfloat16"}, "the fastest config fails the 0.99 guard"
    assert chosen_knobs(d, "runner_up") == {"max_num_seqs": 4}, "a config without agreement is not checked"
    [rejected] = d["rejected_for_quality"]
    assert rejected["gain"] == pytest.approx(305 / 105 - 1) and "0.820 < 0.99" in rejected["why"]
    assert "faster but rejected for output quality" in d["quality_note"] and "+190.5%" in d["quality_note"]
    [loose] = decide(load_runs(directory), group_configs(load_runs(directory)), guard=QualityGuard(min_agreement=0.8))
    assert chosen_knobs(loose) == {"dtype": "float32"} and "rejected_for_quality" not in loose
    report = build_report(directory, "q", options=ReportOptions(record=False))
    text = str([getattr(block, "rows", None) for section in report.sections for block in section.blocks])
    assert "rejected: token agreement with the default config 0.820 < 0.99" in text
