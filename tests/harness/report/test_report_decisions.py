import json

import pytest

from harness.report.data import group_configs, load_runs
from harness.report.decisions import CLEAR, CLOSE, EQUIVALENT, INSUFFICIENT, chosen_knobs, decide, history, record
from harness.report.verdict import compare


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
    rule = compare([200, 205, 210], [100, 105, 110])
    assert d["margin"] == pytest.approx(rule.ratio - 1), "the ratio of geometric means of the runs' median passes"
    assert 0 < d["margin_ci_low"] <= d["margin"] <= d["margin_ci_high"]
    assert d["margin_ci_low"] == pytest.approx(rule.low - 1) and d["chosen.run_values"] == [200, 205, 210]
    assert d["runner_up.relation"].startswith("second-ranked config of the same engine")
    assert (d["chosen.n_runs"], d["chosen.sample_kind"]) == (3, "runs")
    assert "3 independent runs" in d["reason"]


def test_separated_passes_of_one_run_are_not_a_clear_winner_and_say_what_is_missing(results, row):
    directory = results(row(knobs={"max_num_seqs": 64}, passes=(200, 205, 210)),
                        row(knobs={"max_num_seqs": 8}, passes=(100, 105, 110)))
    [d] = decisions_for(directory)
    assert d["verdict"] == INSUFFICIENT and d["flags"] == ["single run"]
    assert "the first-ranked config has 1 and the runner-up has 1" in d["reason"] and "run.round=1,2,3" in d["reason"]
    assert "run.rounds=auto" in d["reason"]
    assert d["chosen.sample_kind"] == "passes" and "not independent" in d["reason"]


def test_two_runs_per_side_are_still_too_few_for_a_clear_winner(results, row):
    directory = results(*runs(row, {"max_num_seqs": 64}, 200, 210), *runs(row, {"max_num_seqs": 8}, 100, 105, 110))
    [d] = decisions_for(directory)
    assert d["verdict"] == INSUFFICIENT and "the first-ranked config has 2" in d["reason"] and "runner-up has" not in d["reason"]
    assert d["flags"] == ["too few runs"]


def test_runs_that_disagree_decide_even_when_each_runs_passes_are_tight(results, row):
    # each run's passes are within 1 tok/s, but runs drift by 40%: over runs the intervals overlap
    directory = results(*runs(row, {"max_num_seqs": 64}, 150, 200, 250), *runs(row, {"max_num_seqs": 8}, 140, 190, 240))
    [d] = decisions_for(directory)
    assert d["verdict"] == CLOSE
    assert d["chosen.runs_disagree"] is True and d["chosen.cv_runs"] == pytest.approx(0.25)


def test_overlapping_runs_are_too_close_to_call_with_the_rounds_that_would_decide(results, row):
    directory = results(*runs(row, {"max_num_seqs": 64}, 100, 130, 160), *runs(row, {"max_num_seqs": 8}, 110, 120, 150))
    [d] = decisions_for(directory)
    assert d["verdict"] == CLOSE, "130 beats 120 on the median, but the ratio's interval includes 1"
    assert d["margin_ci_low"] < 0 < d["margin_ci_high"]
    assert d["rounds_needed"] is None or d["rounds_needed"] > 3
    assert "runs a side would" in d["reason"] and "3 vs 3 runs" in d["reason"]


def test_every_run_of_one_side_beating_every_run_of_the_other_is_not_enough_at_3_runs(results, row):
    # the old rule (bootstrap intervals of 3 runs do not overlap) called this a clear winner; with no real
    # difference such an ordering happens 1 time in 10
    directory = results(*runs(row, {"max_num_seqs": 64}, 104, 110, 140), *runs(row, {"max_num_seqs": 8}, 80, 95, 103))
    [d] = decisions_for(directory)
    assert d["verdict"] == CLOSE and d["margin_ci_low"] < 0


def test_a_real_but_small_difference_is_equivalent_not_a_winner(results, row):
    directory = results(*runs(row, {"max_num_seqs": 64}, 100.5, 100.6, 100.7),
                        *runs(row, {"max_num_seqs": 8}, 100.0, 100.1, 100.2))
    [d] = decisions_for(directory)
    assert d["margin_ci_low"] > 0, "the interval excludes 1 ..."
    assert d["verdict"] == EQUIVALENT, "... but 0.5% is under the 2% minimum effect"
    frame = load_runs(directory)
    [strict] = decide(frame, group_configs(frame), min_effect=0.001)
    assert strict["verdict"] == CLEAR and strict["min_effect"] == 0.001


def test_the_rule_orders_the_sides_when_the_low_median_would_not(results, row):
    # low medians 101 vs 100, but the 8-sequence config's runs are much faster on the geometric mean
    directory = results(*runs(row, {"max_num_seqs": 64}, 60, 101, 102), *runs(row, {"max_num_seqs": 8}, 100, 100, 130))
    [d] = decisions_for(directory)
    assert chosen_knobs(d) == {"max_num_seqs": 8} and d["margin"] > 0


def test_rows_from_different_hosts_are_separate_cells_never_compared(results, row, monkeypatch):
    fast = runs(row, {"max_num_seqs": 64}, 700, 705, 710)
    slow = runs(row, {"max_num_seqs": 8}, 100, 105, 110)
    for r in fast:
        r.update({"env.host_id": "amx-host", "env.host": "Xeon, 2 cores, amx_bf16"})
    for r in slow:
        r.update({"env.host_id": "avx2-host", "env.host": "EPYC, 2 cores, avx2"})
    directory = results(*fast, *slow)
    by_host = {d["host_id"]: d for d in decisions_for(directory)}
    assert set(by_host) == {"amx-host", "avx2-host"}
    assert all(d["verdict"] == INSUFFICIENT and d["flags"] == ["no runner-up"] for d in by_host.values())
    from harness.report import ReportOptions, build_report
    report = build_report(directory, "hosts", options=ReportOptions(record=False))
    summary = str([b.parts for b in report.sections[0].blocks])
    assert "2 different hosts" in summary and "never compared across hosts" in summary
    from harness.report import plots
    drawn = []
    monkeypatch.setattr(plots, "_png", lambda figure: drawn.append(figure) or b"")
    plots.throughput(report.configs)
    bars = [p.get_height() for p in drawn[0].axes[0].patches]
    geo = [(100 * 105 * 110) ** (1 / 3), (700 * 705 * 710) ** (1 / 3)]   # each config's geometric mean of its runs
    assert sorted(bars) == pytest.approx(geo), "the throughput plot keeps one bar per host, not only the faster host's"


def test_a_single_pass_is_flagged_and_not_called(results, row):
    directory = results(row(knobs={"max_num_seqs": 64}, passes=(300,)),
                        row(knobs={"max_num_seqs": 8}, passes=(100, 105, 110)))
    [d] = decisions_for(directory)
    assert d["verdict"] == INSUFFICIENT and d["flags"] == ["single run"]
    assert d["margin"] == pytest.approx(300 / 105 - 1) and d["margin_ci_low"] is None   # one run a side: its rate


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
    assert d["runner_up.relation"] == "first-ranked config of another engine"
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
    gain = (300 * 305 * 310) ** (1 / 3) / (100 * 105 * 110) ** (1 / 3) - 1   # geometric means of the runs
    assert rejected["gain"] == pytest.approx(gain) and "0.820 < 0.99" in rejected["why"]
    assert "faster but rejected for output quality" in d["quality_note"] and f"{gain:+.1%}" in d["quality_note"]
    [loose] = decide(load_runs(directory), group_configs(load_runs(directory)), guard=QualityGuard(min_agreement=0.8))
    assert chosen_knobs(loose) == {"dtype": "float32"} and "rejected_for_quality" not in loose
    report = build_report(directory, "q", options=ReportOptions(record=False))
    text = str([getattr(block, "rows", None) for section in report.sections for block in section.blocks])
    assert "rejected: token agreement with the default config 0.820 < 0.99" in text


def test_the_throughput_plot_lays_out_a_config_label_as_long_as_a_tuned_config_s(results, row):
    """A tuned config's label (four knobs with their values) once collapsed the plot's axes: matplotlib
    warned and dropped the layout. It is wrapped instead, and drawn in full."""
    import warnings

    knobs = {"enable_chunked_prefill": False, "kv_cache_memory_bytes": 268435456, "max_num_batched_tokens": 7172,
             "max_num_seqs": 512, "replicas": "default"}
    directory = results(*runs(row, knobs, 700, 705, 710), *runs(row, {"max_num_seqs": 8}, 100, 105, 110))
    from harness.report import ReportOptions, build_report, plots
    report = build_report(directory, "long", options=ReportOptions(record=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "constrained_layout not applied" is a UserWarning
        [plot] = plots.throughput(report.configs)
    assert plot.png.startswith(b"\x89PNG")


def test_rows_a_rounds_auto_loop_added_are_judged_at_the_loop_s_level(results, row):
    # 5 runs a side, +3.4% with a 2% spread: a clear winner for one look at 0.05, too close to call at the
    # level a loop planned from 3 to 10 runs a side gives its look at 5 (rounds 4 and 5 carry its plan)
    a, b = [100, 103, 106, 101, 104], [98, 99, 101, 97, 100]
    rows = []
    for round_, (x, y) in enumerate(zip(a, b), 1):
        looks = {"looks": "3-10"} if round_ > 3 else {}
        rows.append(row(knobs={"max_num_seqs": 64}, passes=(x - 0.1, x, x + 0.1), round=round_, **looks))
        rows.append(row(knobs={"max_num_seqs": 8}, passes=(y - 0.1, y, y + 0.1), round=round_, **looks))
    [looped] = decisions_for(results(*rows))
    from harness.report.sequential import SequentialPlan

    assert compare(a, b).verdict == CLEAR, "one look at 0.05 would name a winner"
    assert SequentialPlan(3, 10).judge(a, b).verdict == CLOSE
    assert looped["verdict"] == CLOSE and "group-sequential" in looped["method"] and "3 to 10" in looped["method"]


def test_runs_past_the_loop_s_last_look_are_not_another_look(results, row):
    # a loop planned 3 to 4 runs a side left the pair undecided; four rounds added afterwards would make it a clear
    # winner by the plain rule on all 8 runs: the report judges the loop's last look (4 runs a side) and says why
    a, b = [100, 106, 97, 104, 125, 126, 125, 126], [101, 98, 103, 96, 100, 101, 100, 99]
    rows = []
    for round_, (x, y) in enumerate(zip(a, b), 1):
        looks = {"looks": "3-4"} if round_ == 4 else {}
        rows.append(row(knobs={"max_num_seqs": 64}, passes=(x,), round=round_, **looks))
        rows.append(row(knobs={"max_num_seqs": 8}, passes=(y,), round=round_, **looks))
    [decision] = decisions_for(results(*rows))
    from harness.report.sequential import SequentialPlan

    assert compare(a, b).verdict == CLEAR, "one more look at 0.05 on all runs would name a winner"
    final = SequentialPlan(3, 4).judge(a[:4], b[:4])
    assert decision["verdict"] == final.verdict == CLOSE
    assert decision["chosen.knob.max_num_seqs"] == 64
    assert (decision["margin_ci_low"], decision["margin_ci_high"]) == pytest.approx((final.low - 1, final.high - 1))
    assert "8 run(s) of its configs past the last look" in decision["reason"]
    assert "runs past the plan's last look" in decision["flags"]
