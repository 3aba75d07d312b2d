"""The predictions section: each predictor's track record from rows with known predictions."""

import html

import pytest

from harness.report import Filters, ReportOptions, build_report, write_report
from harness.report.predictions import NO_TRACK_RECORD, TITLE, track_record
from harness.run.results import write_row
from harness.steps.predict import prediction_columns
from tests.harness.report.test_report_writers import markdown_tables, table_with


def predicted_row(row, measured: float, predicted: float = 100.0, name: str = "sim", interval: float = 0.1,
                  engine: str = "vllm", unit: str = "output tok/s", note: str = "", **extra):
    """A run row whose ``prediction.<name>.*`` says ``predicted`` beside the ``measured`` it then got."""
    columns = prediction_columns(name, predicted, measured, unit, interval, note or None)
    return row(engine, passes=(measured,), **columns, **extra)


@pytest.fixture
def known(row):
    """sim on vLLM: errors +5%, −20%, +1% (interval ±10%), and a failed run that was predicted, not measured."""
    rows = [predicted_row(row, 105.0), predicted_row(row, 80.0, note="extrapolates past the traces in seqs"),
            predicted_row(row, 101.0)]
    failed = row("vllm", status="crash", error="engine died",
                 **prediction_columns("sim", 100.0, None, "output tok/s", 0.1, None))
    return rows, failed


def test_track_record_numbers_are_the_known_errors(tmp_path, results, known):
    rows, failed = known
    report = build_report(results(*rows, failed), "pred", options=ReportOptions(record=False))
    [line] = track_record(report.predictions).to_dict("records")
    assert (line["predictor"], line["engine"], line["units"]) == ("sim", "vllm", "output tok/s")
    assert (line["predictions"], line["measured"]) == (4, 3)
    assert line["median_abs_error"] == pytest.approx(0.05, abs=1e-12)
    assert line["median_error"] == pytest.approx(0.01, abs=1e-12)
    assert line["worst_abs_error"] == pytest.approx(0.20, abs=1e-12)
    assert line["worst_error"] == pytest.approx(-0.20, abs=1e-12)
    assert (line["worst_run_id"], line["worst_table"]) == (rows[1]["run_id"], "runs")
    assert (line["inside"], line["with_interval"]) == (2, 3)
    assert line["inside_share"] == pytest.approx(2 / 3)

    _, md = write_report(report, tmp_path / "out")
    [record] = table_with(markdown_tables(md.read_text()), "predictor", "median \\|error\\|", "inside interval")
    assert record["predictions"] == "4" and record["measured"] == "3"
    assert (record["median \\|error\\|"], record["median error"], record["worst \\|error\\|"]) == ("5.0%", "+1.0%",
                                                                                                  "20.0%")
    assert record["worst row (error)"] == f"[{rows[1]['run_id']}](../results/runs/{rows[1]['run_id']}.json) (-20.0%)"
    assert record["inside interval"] == "2 of 3 (66.7%)"


def test_latest_predictions_newest_first_with_interval_and_note(tmp_path, results, row):
    rows = [predicted_row(row, 100.0 + i, note=f"note {i}") for i in range(7)]
    report = build_report(results(*rows), "pred", options=ReportOptions(record=False))
    _, md = write_report(report, tmp_path / "out")
    latest = table_with(markdown_tables(md.read_text()), "predictor", "row", "predicted", "measured", "interval")
    assert [r["note"] for r in latest] == ["note 6", "note 5", "note 4", "note 3", "note 2"]
    assert latest[0]["error"] == "+6.0%" and latest[0]["interval"] == "\\[90, 110\\]" and latest[0]["inside"] == "yes"
    assert latest[0]["row"].startswith(f"[{rows[6]['run_id']}]")


def test_any_predictor_name_and_batch_rows_count(tmp_path, results, row):
    run = predicted_row(row, 60.0, predicted=50.0, name="planner", unit="seconds", engine="sglang")
    directory = results(predicted_row(row, 105.0), run)
    batch = {"run_id": "20260301T130000-batch0000001", "kind": "batch", "timestamp": "2026-03-01T13:00:00+00:00",
             "engine": "vllm", "model": "tiny", "status": "ok",
             **prediction_columns("rest_of_job", 1000.0, 1100.0, "seconds", 0.2, "replayed 900 requests")}
    write_row(directory, batch, kind="batch")
    report = build_report(directory, "pred", options=ReportOptions(record=False))
    lines = {(r["predictor"], r["engine"]): r for r in track_record(report.predictions).to_dict("records")}
    assert set(lines) == {("planner", "sglang"), ("rest_of_job", "vllm"), ("sim", "vllm")}
    assert lines[("planner", "sglang")]["median_abs_error"] == pytest.approx(0.2)
    assert lines[("rest_of_job", "vllm")]["worst_table"] == "batch"
    _, md = write_report(report, tmp_path / "out")
    assert f"(../results/batch/{batch['run_id']}.json)" in md.read_text()

    only_vllm = build_report(directory, "pred", Filters(engine="vllm"), ReportOptions(record=False))
    assert set(only_vllm.predictions["predictor"]) == {"sim", "rest_of_job"}, "the report's filters apply"


def test_both_writers_show_the_section_and_its_plot(tmp_path, results, known):
    rows, _ = known
    report = build_report(results(*rows), "pred", options=ReportOptions(record=False))
    page, md = write_report(report, tmp_path / "out")
    text, markup = md.read_text(), page.read_text()
    assert f"## {TITLE}" in text and f"[{TITLE}](#predictions-and-their-track-record)" in text
    assert "![Predicted against measured](predictions.png)" in text and (tmp_path / "out/predictions.png").is_file()
    assert f'<section id="predictions"><h2>{TITLE}</h2>' in markup
    assert 'id="prediction-track-record"' in markup and 'id="plot-predictions"' in markup
    assert markup.count('id="plot-predictions"') == 1, "drawn in its section only, not among the other plots"


def test_rows_without_predictions_say_how_to_get_a_track_record(tmp_path, results, comparison):
    report = build_report(results(*comparison), "none", options=ReportOptions(record=False))
    assert report.predictions.empty and not [p for p in report.plots if p.name == "predictions"]
    page, md = write_report(report, tmp_path / "out")
    assert f"## {TITLE}" in md.read_text() and "run the real engine twice on this host" in md.read_text()
    assert NO_TRACK_RECORD in html.unescape(page.read_text())
