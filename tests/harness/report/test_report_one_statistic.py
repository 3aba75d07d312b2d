"""One estimate ranks configs everywhere in a report (issue 38, item 9).

Rows where the low median and the geometric mean of per-run rates disagree: config A ran 100, 100 and 400
output tok/s (low median 100, geometric mean 158.7), config B 150 three times (both 150). The verdict compares
geometric means, so A is ahead by the rule; before, the headline table, the plot and the "best" ranked by the
low median (B first) while the recommendation, ranked by the rule, named A, and the headline had no row for it.
Now the recommendation, the headline, the all-configs table, the throughput plot and the decision file rank
by the same number, show it with its interval, and, the pair being too close to call, call them
indistinguishable instead of naming a best.

Two more configs share the cell: C (140, 160, 150: geometric mean 149.8, third) which the rule cannot tell from A
either, and D (about 20), clearly behind A. Where the cell is too close to call, every section names A, B and C
as indistinguishable (not only the pair the decision compares), none of them "best" or "winner", and not D.
"""

import math
import re

import pytest

from harness.report import write_report
from harness.report import plots as plots_module
from harness.report.data import METRIC
from harness.report.decisions import CLEAR, CLOSE, read_decisions
from harness.report.report import build_report
from harness.report.verdict import compare

A = (100.0, 100.0, 400.0)
B = (150.0, 150.0, 150.0)
C = (140.0, 160.0, 150.0)
D = (20.0, 21.0, 20.0)
SEQS = {64: A, 8: B, 16: C, 2: D}


def rows_where_statistics_disagree(row):
    out = []
    for round_ in range(3):   # interleaved rounds, each run's passes tight around its rate
        for seqs, rates in SEQS.items():
            rate = rates[round_]
            out.append(row(knobs={"max_num_seqs": seqs}, passes=(rate * 0.99, rate, rate * 1.01), round=round_ + 1))
    return out


@pytest.fixture
def report(results, row, tmp_path, monkeypatch):
    annotated = []
    original = plots_module._wrapped
    monkeypatch.setattr(plots_module, "_wrapped", lambda label, *a, **k: annotated.append(label) or original(label, *a, **k))
    directory = results(*rows_where_statistics_disagree(row))
    built = build_report(directory, "one-statistic")
    return built, annotated, directory


def test_the_two_statistics_really_disagree_here():
    assert sorted(A)[1] < sorted(B)[1], "by low median B is ahead"
    assert math.prod(A) ** (1 / 3) > math.prod(B) ** (1 / 3), "by geometric mean (the rule's estimate) A is ahead"
    assert compare(list(A), list(B)).verdict == CLOSE
    assert compare(list(A), list(C)).verdict == CLOSE and compare(list(A), list(D)).verdict == CLEAR
    assert math.prod(B) > math.prod(C), "B is the runner-up, C third"


def test_every_section_ranks_by_the_rule_s_estimate_and_says_the_pair_is_indistinguishable(report, tmp_path):
    built, annotated, directory = report
    geo_a = math.prod(A) ** (1 / 3)
    configs = built.configs.set_index("label")
    assert configs.loc["max_num_seqs=64", METRIC] == pytest.approx(geo_a)
    low, high = configs.loc["max_num_seqs=64", "ci_low"], configs.loc["max_num_seqs=64", "ci_high"]
    logs = [math.log(x) for x in A]
    centre = sum(logs) / 3
    half = 4.302653 * math.sqrt(sum((x - centre) ** 2 for x in logs) / 2) / math.sqrt(3)   # t(0.975, 2 df)
    assert (low, high) == pytest.approx((math.exp(centre - half), math.exp(centre + half)), rel=1e-5)
    assert configs.loc["max_num_seqs=8", METRIC] == pytest.approx(150.0)

    [decision] = built.decisions
    assert decision["chosen.label"] == "max_num_seqs=64" and decision["runner_up.label"] == "max_num_seqs=8"
    assert decision["chosen." + METRIC] == pytest.approx(geo_a)
    assert decision["margin"] == pytest.approx(compare(list(A), list(B)).ratio - 1)
    assert decision["margin"] == pytest.approx(decision["chosen." + METRIC] / decision["runner_up." + METRIC] - 1), \
        "the margin is the ratio of the numbers the page shows"
    assert decision["verdict"] == CLOSE and "geometric mean" in decision["statistic"]
    alike = [(c["label"], c["verdict"]) for c in decision["indistinguishable"]]
    assert alike == [("max_num_seqs=8", CLOSE), ("max_num_seqs=16", CLOSE)], "every config not clearly behind A"
    assert "winner" not in decision["reason"] and "best" not in decision["reason"]
    assert decision["reason"].startswith("first-ranked ÷ runner-up")
    assert "cannot tell the first-ranked config from any of: vllm: max_num_seqs=8 (too close to call); " \
           "vllm: max_num_seqs=16 (too close to call)" in decision["reason"]
    [recorded] = read_decisions(directory)
    assert recorded["chosen.label"] == "max_num_seqs=64" and recorded["chosen." + METRIC] == pytest.approx(geo_a)
    assert recorded["indistinguishable"] == decision["indistinguishable"], "the decision file names them too"

    text = write_report(built, tmp_path / "out", ("markdown",))
    page = next(p for p in text if p.suffix == ".md").read_text()

    recommendation = page.split("## Recommendation", 1)[1].split("\n## ", 1)[0]
    assert ("any of 3, indistinguishable (too close to call): vllm: max_num_seqs=64, vllm: max_num_seqs=8 or "
            "vllm: max_num_seqs=16") in recommendation
    assert "max_num_seqs=2" not in recommendation.split("Rows behind", 1)[0], "D is clearly behind: not named"
    assert "| winner" not in recommendation and "first-ranked: " in recommendation
    headline = page.split("## Headline", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in headline.splitlines() if "max_num_seqs=" in line]
    shown = [re.search(r"max_num_seqs=(\d+)", line).group(1) for line in lines]
    assert shown == ["64", "8", "16"], "every config named indistinguishable has its row, in the rule's order"
    assert all("indistinguishable (too close to call)" in line for line in lines)
    assert "winner" not in " ".join(lines) and f"{geo_a:,.0f}" in lines[0]
    assert "best" not in headline.split("|", 1)[0], "the headline's text names no best"
    everything = page.split("## All configs", 1)[1].split("\n## ", 1)[0]
    order = list(dict.fromkeys(re.findall(r"max_num_seqs=(\d+)", everything)))
    assert order == ["64", "8", "16", "2"], "the all-configs table ranks by the same estimate"
    assert annotated and "max_num_seqs=64" in annotated[0] and not any("max_num_seqs=8" == a for a in annotated), \
        "the throughput plot's bar is the config the rule ranks first"
    [plot] = [p for p in built.plots if p.name == "throughput"]
    assert "best" not in (plot.title + plot.caption).lower()


def test_a_clear_winner_is_named_winner_in_every_section(results, row, tmp_path):
    rows = []
    for round_ in range(1, 4):
        rows.append(row(knobs={"max_num_seqs": 64}, passes=(199, 200 + round_, 202), round=round_))
        rows.append(row(knobs={"max_num_seqs": 8}, passes=(99, 100 + round_, 102), round=round_))
    built = build_report(results(*rows), "clear")
    page = next(p for p in write_report(built, tmp_path / "out", ("markdown",)) if p.suffix == ".md").read_text()
    headline = page.split("## Headline", 1)[1].split("\n## ", 1)[0]
    [winner] = [line for line in headline.splitlines() if "max_num_seqs=64" in line]
    assert "| winner |" in winner.replace("  ", " ")
    assert "either, indistinguishable" not in page


def test_runs_past_a_loop_s_last_look_are_left_out_of_every_section(results, row, tmp_path):
    """A rounds=auto loop planned 3-4 added round 4; four later rounds (another loop, or by hand) put B far ahead.
    The verdict may only count the runs up to the plan's last look, and every section ranks by that same count:
    before, the verdict counted 4 runs while the tables ranked by all 8 (B shown faster than the chosen A)."""
    a = (104, 98, 103, 101, 100, 100, 100, 100)
    b = (100, 101, 99, 100, 130, 131, 129, 130)
    out = []
    for round_, (x, y) in enumerate(zip(a, b), 1):
        looks = {"looks": "3-4"} if round_ == 4 else {"looks": "3-8"} if round_ > 4 else {}
        out.append(row(knobs={"max_num_seqs": 64}, passes=(x,), round=round_, **looks))
        out.append(row(knobs={"max_num_seqs": 8}, passes=(y,), round=round_, **looks))
    built = build_report(results(*out), "truncated")
    configs = built.configs.set_index("label")
    geo = {label: math.prod(v[:4]) ** 0.25 for label, v in (("max_num_seqs=64", a), ("max_num_seqs=8", b))}
    for label, value in geo.items():
        assert configs.loc[label, METRIC] == pytest.approx(value), "the estimate counts the first 4 runs only"
        assert configs.loc[label, "n_runs"] == 4 and len(configs.loc[label, "uncounted_run_ids"]) == 4
        assert configs.loc[label, "n_failed"] == 0 and configs.loc[label, "n_uncounted"] == 4, "ok, not failed"
    [decision] = built.decisions
    assert decision["chosen.label"] == "max_num_seqs=64", "ahead on the counted runs"
    assert decision["chosen." + METRIC] == pytest.approx(geo["max_num_seqs=64"])
    assert decision["verdict"] == CLOSE and "runs past the plan's last look" in decision["flags"]
    assert len(decision["uncounted_runs"]) == 8 and "troughput-report --since or --sweep-id" in decision["reason"]
    assert len(decision["rests_on"]) == 8 and not set(decision["rests_on"]) & set(decision["uncounted_runs"])
    page = next(p for p in write_report(built, tmp_path / "out", ("markdown",)) if p.suffix == ".md").read_text()
    everything = page.split("## All configs", 1)[1].split("\n## ", 1)[0]
    assert list(dict.fromkeys(re.findall(r"max_num_seqs=(\d+)", everything))) == ["64", "8"]
    assert everything.count("4 ok / 0 failed / 4 ok, not counted") == 2 and "4 failed" not in everything


def test_a_second_loop_over_the_same_configs_is_judged_by_the_first_loop_s_plan(results, row):
    """Two loops on one pair (plans 3-4, then 3-6): before, two plans made the report fall back to the plain
    α = 0.05 rule over all runs, which called a winner here that neither plan's last look calls."""
    a = (100, 106, 97, 104, 108, 109, 110, 108)
    b = (101, 98, 103, 96, 100, 101, 100, 99)
    assert compare(list(a), list(b)).verdict == CLEAR, "the plain rule on all 8 runs calls a winner"
    out = []
    for round_, (x, y) in enumerate(zip(a, b), 1):
        looks = {"looks": "3-4"} if round_ == 4 else {"looks": "3-6"} if round_ > 4 else {}
        out.append(row(knobs={"max_num_seqs": 64}, passes=(x,), round=round_, **looks))
        out.append(row(knobs={"max_num_seqs": 8}, passes=(y,), round=round_, **looks))
    [decision] = build_report(results(*out), "two-loops").decisions
    assert decision["verdict"] == CLOSE and "4 runs a side" in decision["method"] + decision["reason"]
    assert "runs past the plan's last look" in decision["flags"]


def test_a_clear_winner_over_another_engine_is_not_named_alone_where_its_own_engine_has_a_config_as_fast(
        results, row, tmp_path):
    """vLLM 64 and vLLM 32 cannot be told apart; SGLang is clearly behind. The runner-up is SGLang's config, so the
    verdict is a clear winner; before, the page named vLLM 64 alone and vLLM 32 had no row."""
    out = []
    for r in range(3):
        out.append(row("vllm", knobs={"max_num_seqs": 64}, passes=((200, 205, 210)[r],), round=r + 1))
        out.append(row("vllm", knobs={"max_num_seqs": 32}, passes=((201, 203, 208)[r],), round=r + 1))
        out.append(row("sglang", knobs={"max_running_requests": 8}, passes=((100, 101, 99)[r],), round=r + 1))
    built = build_report(results(*out), "clear-and-alike")
    [decision] = built.decisions
    assert decision["verdict"] == CLEAR and decision["runner_up.engine"] == "sglang"
    assert [c["label"] for c in decision["indistinguishable"]] == ["max_num_seqs=32"]
    assert "cannot tell it from: vllm: max_num_seqs=32 (too close to call)" in decision["reason"]
    page = next(p for p in write_report(built, tmp_path / "out", ("markdown",)) if p.suffix == ".md").read_text()
    recommendation = page.split("## Recommendation", 1)[1].split("\n## ", 1)[0]
    assert "or any config the rule cannot tell from it: vllm: max_num_seqs=32" in recommendation
    headline = page.split("## Headline", 1)[1].split("\n## ", 1)[0]
    [alike] = [line for line in headline.splitlines() if "max_num_seqs=32" in line]
    assert "indistinguishable (too close to call)" in alike
