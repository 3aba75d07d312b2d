"""From real ``troughput-run`` rows on the CPU default to both reports: a multirun over two configs of one workload
(a winner to find) and one run of a second workload on a second model (a cell of one config; the report keeps the
two models apart): three real runs. The multimodal row also serves the image counts (vLLM on the tiny VLM), which
would otherwise need a run of its own."""

import json
import re
import statistics
import subprocess
import sys

import pytest

from harness.report.decisions import VERDICTS, chosen_knobs, read_decisions
from harness.report.sections import role_of
from harness.run.results import read_results
from tests.conftest import ROOT

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("report_engine")]   # one worker: one multirun


@pytest.fixture(scope="module")
def multirun(tmp_path_factory):
    """The real runs' results folder and its rows (3 runs); both tests read it."""
    tmp_path = tmp_path_factory.mktemp("multirun")
    results = tmp_path / "results"
    common = ["run.repeats=2", "run.warmup_requests=2", "++workload.num_requests=16", "++workload.num_groups=2",
              "++workload.prompts_per_group=8", f"run.results_dir={results}", f"run.image_dir={tmp_path / 'images'}",
              "run.progress=false"]
    for args in (["-m", "workload=unique", "engine.knobs.max_num_seqs=2,16"],
                 ["workload=multimodal", "engine.knobs.max_num_seqs=16"]):
        run = subprocess.run([sys.executable, "-m", "harness.cli", *args, *common], cwd=ROOT, capture_output=True,
                             text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
    frame = read_results(results)
    assert len(frame) == 3 and set(frame["status"]) == {"ok"}, frame[["status", "error"]]
    assert frame.groupby("workload").size().to_dict() == {"multimodal": 1, "unique": 2}
    return results, frame


def test_multimodal_rows_count_repeated_images(multirun):
    """vLLM on the tiny VLM: each repeat of an image in a pass is one processor-cache hit (caches are reset
    after warm-up and after each pass), and each image placeholder became the model's image run."""
    _, frame = multirun
    rows = frame[frame["workload"] == "multimodal"].to_dict("records")
    assert len(rows) == 1
    for row in rows:
        assert row["model"] == "tiny_vlm" and row["workload_info.images"] == 16
        repeats = row["workload_info.images"] - row["workload_info.unique_images"]
        assert repeats > 0
        assert row["mm_cache_queries"] == 16
        assert row["mm_cache_hits"] == repeats
        assert row["input_tokens"] > row["workload_info.input_tokens_requested"]


def test_real_multirun_rows_give_both_reports_with_the_winners_the_rows_give(tmp_path, multirun):
    results, frame = multirun
    reports = tmp_path / "reports"
    report = subprocess.run([sys.executable, "-m", "harness.report.cli", "--results-dir", str(results),
                             "--reports-dir", str(reports), "--name", "real"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    out = reports / "real"
    assert (out / "index.html").is_file() and (out / "throughput.png").is_file()
    markdown = (out / "report.md").read_text()

    expected = {}
    for workload, rows in frame.groupby("workload"):
        rates = {seqs: statistics.median_low([p for ps in group["output_tok_s_passes"] for p in ps])
                 for seqs, group in rows.groupby("knob.max_num_seqs")}
        expected[workload] = max(rates, key=rates.get)
    decisions = {d["workload"]: d for d in read_decisions(results)}
    assert {w: chosen_knobs(d)["max_num_seqs"] for w, d in decisions.items()} == expected
    assert all(d["verdict"] in VERDICTS and d["rests_on"] for d in decisions.values())
    for workload, seqs in expected.items():   # a cell of one config is labelled as such: no knob differs in it
        label = f"max_num_seqs={seqs}" if frame["workload"].eq(workload).sum() > 1 else "single config"
        role = role_of(decisions[workload]["chosen.config_id"], decisions[workload])   # "winner" for a clear one only
        line = next(line for line in markdown.splitlines() if line.startswith(f"| {workload} | vllm | {label} | {role} |"))
        assert decisions[workload]["verdict"] in line
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown):
        assert (out / image).is_file()
    json.dumps(decisions)   # records are plain JSON
