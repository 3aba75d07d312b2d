import math

import pytest

from harness.report.data import group_configs, load_runs
from harness.report.planner import PlannerInputs, plan


def planned(directory, inputs):
    frame = load_runs(directory)
    return plan(frame, group_configs(frame), inputs).set_index("engine")


def test_time_is_backlog_over_measured_rate_plus_startup_plus_compile(results, row):
    # unique: 100 requests, 12,000 + 4,000 tokens per pass -> 160 tokens per request
    directory = results(row("vllm", passes=(400, 400, 400), startup_s=30.0, compile_s=10.0),
                        row("sglang", passes=(200, 200, 200), startup_s=12.0, compile_s=3.0))
    inputs = PlannerInputs(backlog_requests=500_000, window_h=2.0, usd_per_gpu_hour=3.0)
    lines = planned(directory, inputs)
    for engine, rate_out in (("vllm", 400), ("sglang", 200)):
        line = lines.loc[engine]
        req_s = rate_out * 100 / 4000
        assert line["rate"] == pytest.approx(req_s) and line["rate_unit"] == "req/s"
        assert line["tokens_per_request"] == pytest.approx(160)
        assert line["backlog_tokens"] == pytest.approx(500_000 * 160)
        assert line["total_s"] == pytest.approx(500_000 / req_s + line["startup_s"] + line["compile_s"])
        assert line["cost_usd"] == pytest.approx(line["total_s"] / 3600 * 3.0)
        assert line["usd_per_m_tokens"] == pytest.approx(line["cost_usd"] / (500_000 * 160) * 1e6)
    # every engine compiles inside its constructor, which startup times: shown apart, counted once
    assert (lines.loc["vllm", "startup_s"], lines.loc["vllm", "compile_s"]) == (20.0, 10.0)
    assert lines.loc["vllm", "total_s"] == pytest.approx(500_000 / 10 + 30.0)
    assert (lines.loc["sglang", "startup_s"], lines.loc["sglang", "compile_s"]) == (9.0, 3.0)
    assert bool(lines.loc["vllm", "clears"]) is False and lines.loc["vllm", "slack_h"] < 0   # 13.9 h > 2 h
    assert lines.loc["vllm", "total_h"] == pytest.approx((50_000 + 30) / 3600)


def test_a_backlog_in_tokens_uses_total_tokens_per_second(results, row):
    directory = results(row("vllm", passes=(400, 400, 400), startup_s=6.0))
    line = planned(directory, PlannerInputs(backlog_tokens=16_000_000, window_h=8)).loc["vllm"]
    total_tok_s = 400 * 16000 / 4000
    assert line["rate"] == pytest.approx(total_tok_s) and line["rate_unit"] == "tok/s"
    assert line["total_s"] == pytest.approx(16_000_000 / total_tok_s + 6.0)
    assert line["backlog_requests"] == pytest.approx(100_000) and bool(line["clears"]) is True


def test_the_best_config_of_each_engine_is_planned(results, row):
    directory = results(row("vllm", knobs={"max_num_seqs": 8}, passes=(100, 100, 100)),
                        row("vllm", knobs={"max_num_seqs": 64}, passes=(300, 300, 300)))
    lines = planned(directory, PlannerInputs())
    assert list(lines["label"]) == ["max_num_seqs=64"]
    assert lines.loc["vllm", "gpus"] == 1


@pytest.mark.parametrize("engine, knobs", [
    ("vllm", {"tensor_parallel_size": 2}),
    ("sglang", {"tp_size": 2}),
    ("trtllm", {"tensor_parallel_size": 2}),
])
def test_two_replicas_of_tensor_parallel_two_are_costed_as_four_gpus_for_every_engine(results, row, engine, knobs):
    directory = results(row(engine, knobs={**knobs, "replicas": 2}, passes=(400, 400, 400), startup_s=0.0),
                        row(engine, knobs=knobs, workload="prefix_heavy", passes=(400, 400, 400), startup_s=0.0))
    lines = planned(directory, PlannerInputs(usd_per_gpu_hour=1.0)).set_index("cell_label")
    assert lines.loc["unique", "gpus"] == 4 and lines.loc["prefix_heavy", "gpus"] == 2
    assert lines.loc["unique", "cost_usd"] == pytest.approx(lines.loc["unique", "total_h"] * 4)


def test_the_planned_time_has_the_range_of_its_rate_and_says_where_the_full_engine_rate_extrapolated(results, row):
    # three runs of one config, one pass each: the measured rate 100-120 output tok/s, full-engine 180-220
    note = "extrapolates past the run's own steps in seqs"
    directory = results(*(row("vllm", passes=(rate,), round=i, startup_s=0.0, full_engine_tok_s=full,
                              full_engine_note=note if i == 1 else None)
                          for i, (rate, full) in enumerate(((100, 180), (110, 200), (120, 220)), 1)),
                        row("sglang", passes=(50,), round=1, startup_s=0.0))
    lines = planned(directory, PlannerInputs(backlog_requests=100_000))
    vllm, sglang = lines.loc["vllm"], lines.loc["sglang"]
    assert vllm["rate_source"].startswith("full engine")
    # the slow end of the rate gives the long end of the time, around the point estimate and not equal to it
    assert vllm["total_low_h"] < vllm["total_h"] < vllm["total_high_h"]
    assert vllm["note"] == note
    # one run: no interval, so no range, and no full-engine rate to note
    assert sglang["rate_source"] == "measured" and math.isnan(sglang["total_low_h"])
    assert not isinstance(sglang["note"], str)


def test_the_planner_section_shows_the_range_and_the_extrapolation(results, row, tmp_path):
    from harness.report.markdown import render
    from harness.report.report import ReportOptions, build_report

    note = "extrapolates past the run's own steps in context"
    directory = results(*(row("vllm", passes=(rate,), round=i, full_engine_tok_s=2 * rate, full_engine_note=note)
                          for i, rate in enumerate((100, 110, 120), 1)))
    text = render(build_report(directory, "plan", options=ReportOptions(record=False)), tmp_path)
    planner = text[text.index("Idle-window planner"):]
    assert "total h, range" in planner and note in planner
