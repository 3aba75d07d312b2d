"""Both writers on synthetic rows: valid GFM, existing links, a self-contained HTML file."""

import re
import statistics
from html.parser import HTMLParser
from pathlib import Path

from harness.report import ReportOptions, build_report, write_report
from harness.report.decisions import CLEAR, CLOSE
from harness.run.results import read_results

CELL_SPLIT = re.compile(r"(?<!\\)\|")


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every table of a markdown text as rows of cells; asserts GFM structure on the way."""
    tables, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            assert len(block) >= 2, f"a table needs a header and a separator: {block}"
            assert re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", block[1]), f"bad separator {block[1]!r}"
            rows = [[c.strip() for c in CELL_SPLIT.split(line)[1:-1]] for line in block]
            widths = {len(r) for r in rows}
            assert len(widths) == 1, f"rows with different cell counts {widths} in table starting {block[0]!r}"
            assert all(line.rstrip().endswith("|") for line in block)
            tables.append([rows[0], *rows[2:]])
            block = []
    return tables


def table_with(tables, first_column: str, *columns: str):
    matching = [t for t in tables if t[0][0] == first_column and all(c in t[0] for c in columns)]
    assert matching, f"no table with columns {first_column}, {columns}"
    header, *rows = matching[0]
    return [dict(zip(header, r)) for r in rows]


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def expected_winners(results_dir: Path) -> dict[str, tuple[str, int]]:
    """Recomputed straight from the DataFrame: the best (engine, max_num_seqs) per workload by low-median pass."""
    frame = read_results(results_dir)
    ok = frame[frame["status"] == "ok"]
    best = {}
    for (workload, engine, seqs), group in ok.groupby(["workload", "engine", "knob.max_num_seqs"]):
        rate = statistics.median_low([statistics.median_low(passes) for passes in group["output_tok_s_passes"]])
        if rate > best.get(workload, ("", 0, -1.0))[2]:
            best[workload] = (engine, int(seqs), rate)
    return {w: (e, s) for w, (e, s, _) in best.items()}


def test_both_reports_show_the_winner_the_rows_give(tmp_path, results, comparison):
    directory = results(*comparison)
    report = build_report(directory, "cmp")
    html_path, md_path = write_report(report, tmp_path / "out")
    assert (html_path.name, md_path.name) == ("index.html", "report.md")

    tables = markdown_tables(md_path.read_text())
    headline = table_with(tables, "workload", "role", "output tok/s", "verdict")
    winners = {r["workload"]: (r["engine"], r["config"]) for r in headline if r["role"] == "winner"}
    assert winners == {w: (e, f"max_num_seqs={s}") for w, (e, s) in expected_winners(directory).items()}
    assert {r["verdict"] for r in headline if r["role"] == "winner"} == {CLEAR}
    engines_per_workload = {w: {r["engine"] for r in headline if r["workload"] == w} for w in winners}
    assert all(e == {"vllm", "sglang"} for e in engines_per_workload.values()), "engines side by side"
    for column in ("total tok/s", "req/s", "preemptions", "prefix-cache hit", "J / output token", "energy J",
                   "startup s", "compile s", "margin [CI]"):
        assert column in headline[0] or column.replace("[", "\\[").replace("]", "\\]") in headline[0]


def test_markdown_images_and_row_links_exist(tmp_path, results, comparison):
    directory = results(*comparison)
    out = tmp_path / "reports" / "cmp"
    _, md_path = write_report(build_report(directory, "cmp"), out)
    text = md_path.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert {"throughput.png", "response-max-num-seqs.png", "preemptions.png", "startup.png"} <= set(images)
    assert all((out / image).is_file() and (out / image).read_bytes()[:4] == b"\x89PNG" for image in images)
    links = re.findall(r"(?<!!)\[[^\]]*\]\(([^)#]+\.json)\)", text)
    assert links and all((out / link).resolve().is_file() for link in links)
    assert any("/decisions/" in link for link in links), "each decision links its record"


def test_html_is_one_self_contained_file(tmp_path, results, comparison):
    directory = results(*comparison)
    report = build_report(directory, "cmp")
    [html_path] = write_report(report, tmp_path / "out", ("html",))
    assert [p.name for p in html_path.parent.iterdir()] == ["index.html"]
    parser = Tags()
    parser.feed(html_path.read_text())
    images = [attrs for tag, attrs in parser.tags if tag == "img"]
    assert len(images) == len(report.plots) >= 4
    assert all(img["src"].startswith("data:image/png;base64,") for img in images)
    for tag, attrs in parser.tags:
        assert tag not in ("script", "link", "iframe"), tag
        for name in ("src", "href"):
            assert not re.match(r"(https?:)?//", attrs.get(name) or ""), f"network reference {attrs}"
    ids = {attrs.get("id") for _, attrs in parser.tags}
    assert {"headline", "decisions", "planner", "failures"} <= ids
    run_anchors = {attrs["href"][1:] for tag, attrs in parser.tags
                   if tag == "a" and attrs.get("href", "").startswith("#run-")}
    assert run_anchors and run_anchors <= ids, "every run link lands on its row"


def test_failures_are_listed_with_their_reasons_and_the_report_still_renders(tmp_path, results, row):
    directory = results(row(status="oom", error="CUDA out of memory\ntraceback..."),
                        row(workload="prefix_heavy", status="timeout", error="time limit of 10 s exceeded"))
    report = build_report(directory, "failed")
    html_path, md_path = write_report(report, tmp_path / "out")
    failures = table_with(markdown_tables(md_path.read_text()), "run", "status", "reason")
    assert {(r["status"], r["reason"]) for r in failures} == {("oom", "CUDA out of memory"),
                                                               ("timeout", "time limit of 10 s exceeded")}
    assert "traceback..." in html_path.read_text(), "the full error is in the HTML"
    assert "No successful run to compare." in md_path.read_text()


def test_overlapping_configs_are_reported_too_close_to_call(tmp_path, results, row):
    directory = results(*[row(knobs={"max_num_seqs": 64}, passes=(m,)) for m in (100, 130, 160)],
                        *[row(knobs={"max_num_seqs": 8}, passes=(m,)) for m in (110, 120, 150)])
    _, md_path = write_report(build_report(directory, "close"), tmp_path / "out")
    tables = markdown_tables(md_path.read_text())
    [decision] = table_with(tables, "workload", "use", "verdict")
    assert decision["verdict"] == CLOSE and "includes 1" in decision["why"] and "runs a side would" in decision["why"]


def test_the_planner_table_shows_its_inputs_and_their_sum(tmp_path, results, row):
    directory = results(row("sglang", passes=(400, 400, 400), startup_s=12.0, compile_s=3.0))
    options = ReportOptions(record=False)
    _, md_path = write_report(build_report(directory, "plan", options=options), tmp_path / "out")
    [line] = table_with(markdown_tables(md_path.read_text()), "workload", "backlog requests", "total h")
    # 1e6 requests at 10 req/s = 100,000 s = 27.78 h, + 12 s of startup, 3 s of it compiling
    assert (line["backlog requests"], line["rate"], line["startup s"], line["compile s"]) == \
           ("1,000,000", "10 req/s (measured)", "9.0", "3.0")   # no step trace: the measured rate
    assert line["generate h"] == "27.78" and line["total h"] == f"{(100_000 + 12) / 3600:,.2f}"
    assert line["clears the window"].startswith("no") and line["tokens / request"] == "160"
    assert "backlog 1,000,000 requests, idle window 8 h, price 2.50 USD per GPU-hour" in md_path.read_text()
    assert not (directory / "decisions").exists(), "--no-record writes no decision"


def test_study_plots_appear_only_where_study_and_trial_columns_exist(tmp_path, results, row):
    trials = [row(knobs={"max_num_seqs": s, "max_num_batched_tokens": t}, passes=(v, v, v), study="s1", trial=i)
              for i, (s, t, v) in enumerate([(8, 512, 100), (16, 1024, 180), (32, 512, 250), (64, 2048, 260)])]
    trials.append(row(knobs={"max_num_seqs": 512, "max_num_batched_tokens": 512}, status="oom", error="oom",
                      study="s1", trial=4))
    report = build_report(results(*trials), "study", options=ReportOptions(record=False))
    names = {p.name for p in report.plots}
    assert {"study-s1-history", "study-s1-importance", "response-max-num-seqs",
            "response-max-num-batched-tokens"} <= names
    plain = build_report(_fresh(tmp_path, row), "plain", options=ReportOptions(record=False))
    assert not [p for p in plain.plots if p.name.startswith("study-")]


def _fresh(tmp_path, row):
    from harness.run.results import write_row

    directory = tmp_path / "plain"
    for r in (row(knobs={"max_num_seqs": 8}), row(knobs={"max_num_seqs": 64})):
        write_row(directory, r)
    return directory
