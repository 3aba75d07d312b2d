"""``troughput-report`` as a user runs it."""

import subprocess
import sys

from harness.report.cli import main
from harness.report.decisions import read_decisions
from tests.conftest import ROOT


def test_writes_both_reports_and_records_each_decision_once(tmp_path, results, comparison, capsys):
    directory = results(*comparison)
    argv = ["--results-dir", str(directory), "--reports-dir", str(tmp_path / "reports"), "--name", "cmp"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "reports" / "cmp" / "index.html").is_file()
    assert (tmp_path / "reports" / "cmp" / "report.md").is_file()
    assert len(read_decisions(directory)) == 3 and out.count("clear winner") == 3
    assert main(argv) == 0, "a rebuild from the same rows"
    assert len(read_decisions(directory)) == 3, "adds no decision"


def test_filters_narrow_the_report(tmp_path, results, comparison, capsys):
    directory = results(*comparison)
    assert main(["--results-dir", str(directory), "--reports-dir", str(tmp_path), "--name", "u",
                 "--workload", "unique", "--engine", "vllm", "--no-record"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("unique")]
    assert len(lines) == 1 and "vllm: max_num_seqs=64" in lines[0]
    assert not (directory / "decisions").exists()


def test_user_errors_are_one_line_without_a_traceback(tmp_path, capsys):
    """The entry point as a user runs it once (exit code 2, the error, no traceback); the other user errors
    through the same ``main`` in this process (one subprocess costs seconds of imports)."""
    proc = subprocess.run([sys.executable, "-m", "harness.report.cli", "--results-dir", str(tmp_path / "none")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "run troughput-run first" in proc.stderr and "Traceback" not in proc.stderr
    for args, message in ((["--results-dir", str(tmp_path), "--confidence", "1.5"], "--confidence must be"),
                          (["--results-dir", str(tmp_path), "--name", "../x"], "names a folder")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "troughput-report: error: " in err and message in err and "Traceback" not in err, err
