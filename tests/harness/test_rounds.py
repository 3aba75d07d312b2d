"""``run.rounds=auto``: a real multirun (scripted engine, real worker processes) that adds rounds until decided."""

import pytest

from harness.errors import TroughputError
from harness.results import read_rows
from harness.rounds import wants_rounds
from tests.conftest import FAKE_ENGINE, compose
from tests.harness.test_cli import troughput_run

COMMON = [f"engine.name={FAKE_ENGINE}", "workload=unique", "workload.num_requests=4", "run.warmup_requests=0",
          "run.rounds=auto"]


def rounds_of(rows, knob):
    return sorted((r[f"knob.{knob}"], r["round"]) for r in rows)


def test_a_clear_difference_stops_at_the_three_rounds_the_rule_needs(tmp_path):
    proc = troughput_run(tmp_path, "-m", *COMMON, "+engine.knobs.sleep_s=0.05,0.25")
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(tmp_path / "results")
    assert rounds_of(rows, "sleep_s") == [(0.05, 1), (0.05, 2), (0.05, 3), (0.25, 1), (0.25, 2), (0.25, 3)]
    assert len({r["sweep_id"] for r in rows}) == 1 and {r["status"] for r in rows} == {"ok"}
    assert "decided after 3 round(s): clear winner" in proc.stdout
    assert "6 row(s)" in proc.stdout, "the summary comes after the added rounds"
    added = [r for r in rows if r["round"] == 3]
    assert all(r["command"].endswith("run.round=3") for r in added), "each added row says how to reproduce it"


def test_an_undecidable_comparison_runs_to_the_cap_and_says_so(tmp_path):
    # the same config twice (A/A) with a scripted spread: generate calls alternate 0.02 s and 0.3 s across runs,
    # and the rotating order gives both sides the same slow and fast runs: never decided
    cycle = tmp_path / "cycle"
    proc = troughput_run(tmp_path, "-m", *COMMON, "engine.knobs.max_num_seqs=8,9", "run.max_rounds=4",
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
