"""``troughput-calibrate`` on the checked-in real vLLM-CPU step traces (``tests/fixtures/vllm_cpu_steps``).

The fixture's four fitted runs are written as vLLM rows of this host (``test_stepmodels.write_fixture_rows``),
with the workload, ordering and knob columns the runner writes, so that the command fits their steps, replays
each row, and writes the file ``engine=sim`` loads; the file is then loaded back and prices the held-out run
(32 sequences) it never saw.
"""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from engines.stepmodel import StepModel
from harness.calibration.calibrate import main
from harness.run.results import prefixed
from harness.run.spec import build_spec
from harness.run.stepmodels import this_host_id
from harness.steps.fit import fit_step_model
from harness.steps.predict import replay
from tests.conftest import ROOT, compose
from tests.harness.steps.test_real_trace import CPU, TINY, requests
from tests.harness.test_stepmodels import FIXTURE, write_fixture_rows

# each fitted run's setting, as benchmarks/sim_accuracy.py ran it (the CPU default otherwise)
SETTINGS = {
    "unique_seqs256_n400": ["workload=unique", "workload.num_requests=400"],
    "unique_seqs8": ["workload=unique", "engine.knobs.max_num_seqs=8"],
    "prefix_heavy_4_groups_of_256_seqs64": ["workload=prefix_heavy", "workload.num_groups=4",
                                            "workload.prefix_len={kind: fixed, value: 256}",
                                            "engine.knobs.max_num_seqs=64"],
    "unique_long_prompts_seqs64": ["workload=unique", "engine.knobs.max_num_seqs=64", "workload.num_requests=128",
                                   "workload.input_len={kind: uniform, low: 512, high: 1200}"],
}
SHIPPED = ROOT / "conf" / "calibration" / "vllm" / "cpu-tiny.yaml"


@pytest.fixture(scope="module")
def runs() -> dict:
    return json.loads((FIXTURE / "runs.json").read_text())["runs"]


def row_columns(slug: str) -> dict:
    """What the runner writes of a run's workload, ordering and knobs (``harness.run.row``)."""
    spec = build_spec(compose("engine=vllm", *SETTINGS[slug], "run.progress=false"))
    return {"workload": spec.workload.name, "workload_fingerprint": spec.workload.fingerprint,
            **prefixed("workload_cfg", spec.workload_cfg), **prefixed("ordering_cfg", spec.ordering),
            **prefixed("knob", spec.knobs)}


def calibrate(results: Path, *args: str) -> None:
    main([f"run.results_dir={results}", *args])


def test_the_written_file_is_this_hosts_step_model_and_prices_a_run_it_never_saw(tmp_path, runs, capsys):
    results, out = tmp_path / "results", tmp_path / "calibration"
    run_ids = write_fixture_rows(results, columns=row_columns)
    shipped = SHIPPED.read_bytes() if SHIPPED.exists() else None
    calibrate(results, "--out-dir", str(out))
    printed = capsys.readouterr().out
    path = out / "vllm" / "cpu-tiny.yaml"
    assert f"written to {path}" in printed
    assert (SHIPPED.read_bytes() if SHIPPED.exists() else None) == shipped, "--out-dir: conf/ is left alone"
    text = path.read_text()
    data = yaml.safe_load(text)["step_model"]
    assert data["host_id"] == this_host_id() and data["hardware"] == "cpu"
    # the same fit as the fixture's four traces give on their own (the file rounds to 6 digits)
    expected = fit_step_model({slug: pd.read_parquet(FIXTURE / f"{slug}.parquet") for slug in run_ids})
    assert data["at_bound"] == list(expected.at_bound)
    assert expected.at_bound, "this fit ends on a bound (token_s): without one the checks of at_bound test nothing"
    assert all(data[name] == 0 for name in data["at_bound"])
    assert f"Parts at their bound (0): {', '.join(expected.at_bound)}." in text
    for name in ("step_s", "seq_s", "prefill_token_s", "kv_token_s", "kv_held_s", "prefill_pair_s"):
        assert data[name] == pytest.approx(getattr(expected, name), rel=1e-4, abs=1e-15), name
    # every fitted row is replayed from its own columns, in the comments with its measured rate
    for slug, run_id in run_ids.items():
        [line] = [line for line in text.splitlines() if run_id in line]
        assert "not replayed" not in line and f"{runs[slug]['output_tok_s']:,.0f}" in line, line
        assert abs(float(re.search(r"([+-]\d+\.\d)%\s+\S+$", line)[1])) <= 10, f"in-sample replay: {line}"
    assert "Median absolute replay error (in-sample)" in text
    # loaded back as engine=sim loads it, it prices the held-out run within 10% of what vLLM measured
    model = StepModel.from_dict(data)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    held = runs["unique_seqs32"]
    engine = {f"engine_{k}": v for k, v in held["engine"].items() if v}
    got = replay(model, requests(held["lengths"], 0), {**held["knobs"], **engine},
                 {"name": "tiny", "local_dir": str(tmp_path / "tiny"), "path": str(tmp_path / "tiny")}, CPU)
    assert held["output_tok_s"] / got.rate == pytest.approx(1.0, abs=0.10)


def test_dry_run_fits_and_prints_but_writes_nothing(tmp_path, capsys):
    results, out = tmp_path / "results", tmp_path / "calibration"
    write_fixture_rows(results)
    calibrate(results, "--out-dir", str(out), "--dry-run")
    printed = capsys.readouterr().out
    assert "4 run(s) of engine=vllm model=tiny" in printed and "written to" not in printed
    assert not out.exists()


@pytest.mark.parametrize("engine", ["hf", "sglang", "trtllm"])
def test_an_engine_whose_steps_the_simulator_does_not_replay_is_refused(tmp_path, capsys, engine):
    results, out = tmp_path / "results", tmp_path / "calibration"
    write_fixture_rows(results)
    with pytest.raises(SystemExit) as exit_:
        calibrate(results, f"engine={engine}", "--out-dir", str(out))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "troughput-calibrate: error: the simulator replays vLLM's scheduler" in err
    assert f"not {engine}'s (use engine=vllm" in err
    assert not out.exists()


def test_with_no_trace_of_this_host_it_says_to_run_the_engine_first(tmp_path, capsys):
    out = tmp_path / "calibration"
    with pytest.raises(SystemExit) as exit_:
        calibrate(tmp_path / "empty", "--out-dir", str(out))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: no step trace of engine=vllm model=tiny host {this_host_id()}" in err and "make run" in err
    # another host's traces are no traces of this one
    write_fixture_rows(tmp_path / "other", host_id="another-host")
    with pytest.raises(SystemExit):
        calibrate(tmp_path / "other", "--out-dir", str(out))
    assert "error: no step trace of engine=vllm" in capsys.readouterr().err
    assert not out.exists()
