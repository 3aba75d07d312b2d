"""``troughput-run`` as a user runs it: a subprocess (or, where the process is not the point, the same command
line in this process: ``tests/in_process.py``), single runs and multiruns."""

import json
import subprocess
import sys

from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE, ROOT
from tests.in_process import run_app


def troughput_run(tmp_path, *args, timeout=600):
    command = [sys.executable, "-m", "harness.cli", *args, f"run.results_dir={tmp_path / 'results'}",
               f"run.image_dir={tmp_path / 'images'}", "run.progress=false"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def troughput_run_here(tmp_path, *args):
    """``troughput_run`` in this process: Python's start and the app's imports are paid once per pytest worker."""
    from harness.cli import main

    return run_app(main, "troughput-run", [*args, f"run.results_dir={tmp_path / 'results'}",
                                           f"run.image_dir={tmp_path / 'images'}", "run.progress=false"], cwd=ROOT)


def batch_line(custom_id, text, url="/v1/chat/completions"):
    body = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": text}]}
    if url == "/v1/completions":
        body = {"model": "tiny", "max_tokens": 7, "prompt": text}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_multirun_carries_on_past_a_killed_and_a_timed_out_run(tmp_path):
    proc = troughput_run_here(tmp_path, "-m", f"engine.name={FAKE_ENGINE}", "workload=unique",
                              "workload.num_requests=5", "run.time_limit_s=10",
                              "+engine.knobs.kill_self=false,true", "+engine.knobs.sleep_s=0,30")
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(tmp_path / "results")
    assert len(rows) == 4 and len({r["sweep_id"] for r in rows}) == 1
    by_knobs = {(r["knob.kill_self"], r["knob.sleep_s"]): r for r in rows}
    assert by_knobs[(False, 0)]["status"] == "ok"
    assert by_knobs[(True, 0)]["status"] == "crash" and "SIGKILL" in by_knobs[(True, 0)]["error"]
    assert by_knobs[(False, 30)]["status"] == "timeout"
    assert "4 row(s)" in proc.stdout and "failed runs:" in proc.stdout, "the sweep ends with its summary"


def test_multirun_fans_out_through_a_submitit_launcher(tmp_path):
    proc = troughput_run_here(tmp_path, "-m", "hydra/launcher=submitit_local", f"engine.name={FAKE_ENGINE}",
                              "workload=unique", "workload.num_requests=4", "+engine.knobs.max_num_seqs=1,2")
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(tmp_path / "results")
    assert sorted(r["knob.max_num_seqs"] for r in rows) == [1, 2] and {r["status"] for r in rows} == {"ok"}
    assert "2 row(s)" in proc.stdout


def test_unknown_engine_name_lists_the_known_ones(tmp_path):
    proc = troughput_run_here(tmp_path, "engine.name=vlm", "workload=unique", "workload.num_requests=2")
    row = read_rows(tmp_path / "results")[0]
    assert row["status"] == "invalid" and "known engines: vllm" in row["error"]
    assert "invalid" in proc.stdout


def test_batch_file_with_a_broken_line_fails_with_its_line_number(tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join([batch_line("a", "hello"), batch_line("b", "world"), '{"custom_id": "c", "meth']))
    proc = troughput_run(tmp_path, "workload=file", f"workload.path={path}")
    assert proc.returncode == 2
    assert f"{path}" in proc.stderr and "line 3" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results" / "runs").exists(), "no engine started, no row written"


# A good batch file on the real engine: its vLLM row is the ok row of the three-engine multirun in
# tests/harness/test_cli_engines.py (one vLLM start serves both checks).
