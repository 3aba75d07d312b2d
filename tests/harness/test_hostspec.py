"""This host's spec: measured once per host (cached), at the start of a run, never while writing a row."""

import json
import subprocess

import pytest

import harness.run.hostspec as hostspec
from harness.run.runner import execute
from harness.run.spec import build_spec
from tests.conftest import compose

MEASURED = {"peak_flops_bf16": 5e10, "bandwidth_bytes_s": 1e10, "memory_bytes": 8e9, "name": "host (test)",
            "source": "measured: test"}
CPU = {"name": "cpu", "kind": "cpu", "peak_flops_bf16": None, "peak_flops_fp8": None, "bandwidth_bytes_s": None,
       "memory_bytes": None}


def test_host_measurement_is_cached(tmp_path, monkeypatch):
    # the real measurement in its child process, on small sizes (this checks its output and the cache, not the rates)
    small = {"seconds >= 0.2": "seconds >= 0.01", "copy_rate(64 << 20)": "copy_rate(4 << 20)", "budget_s=1.0": "budget_s=0.1"}
    assert all(old in hostspec._MEASURE for old in small)
    script = hostspec._MEASURE
    for old, new in small.items():
        script = script.replace(old, new)
    monkeypatch.setattr(hostspec, "_MEASURE", script)
    first = hostspec.measure_host(tmp_path)
    assert first["peak_flops_bf16"] > 0 and first["bandwidth_bytes_s"] > 0 and "measured" in first["source"]
    (cache,) = tmp_path.glob("host_spec-*.json")
    cache.write_text(json.dumps({**first, "peak_flops_bf16": 123.0}))
    assert hostspec.measure_host(tmp_path)["peak_flops_bf16"] == 123.0, "the second call reads the cache"


def test_null_rates_are_filled_from_the_host_and_given_ones_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(hostspec, "measure_host", lambda cache_dir: MEASURED)
    spec = hostspec.complete_spec({**CPU, "memory_bytes": 4e9}, tmp_path)
    assert (spec["name"], spec["peak_flops_bf16"], spec["memory_bytes"], spec["source"]) == ("cpu", 5e10, 4e9,
                                                                                            "measured: test")
    h100 = {"name": "h100", "peak_flops_bf16": 9.9e14, "bandwidth_bytes_s": 3.35e12}
    assert hostspec.complete_spec(h100, tmp_path) == h100


def test_a_run_spec_is_completed_with_one_benchmark_per_host(monkeypatch, tmp_path):
    launches = []

    def fake_run(*args, **kwargs):
        launches.append(args)
        out = {k: v for k, v in MEASURED.items() if k not in ("name", "source")}
        return subprocess.CompletedProcess(args, 0, json.dumps({**out, "method": "fake"}), "")

    monkeypatch.setattr(hostspec.subprocess, "run", fake_run)
    run = build_spec(compose("engine=sim", "workload=unique", "workload.num_requests=8"))
    assert run.hardware_spec["peak_flops_bf16"] is None and run.knobs["hardware_spec"].get("peak_flops_bf16") is None
    completed = [hostspec.complete_run_spec(run, tmp_path) for _ in range(3)]
    assert len(launches) == 1, "measured once, then read from the cache"
    assert all(c.hardware_spec["peak_flops_bf16"] == 5e10 == c.knobs["hardware_spec"]["peak_flops_bf16"]
               for c in completed)
    assert run.hardware_spec["peak_flops_bf16"] is None, "the caller's spec is left as it was"


def test_the_runner_measures_at_the_start_and_the_row_uses_it(monkeypatch, tmp_path):
    """A CPU sim row: the speed of light and the simulator both use the host spec measured before the run."""
    monkeypatch.setattr(hostspec, "measure_host", lambda cache_dir: MEASURED)
    row = execute(build_spec(compose("engine=sim", "workload=unique", "workload.num_requests=20",
                                     "++engine.knobs.calibration=null",   # not the shipped file of one host kind
                                     "run.progress=false", f"run.results_dir={tmp_path}")), progress=False)
    assert row["status"] == "ok", row["error"]
    assert row["hw.peak_flops_bf16"] == 5e10 and row["knob.hardware_spec.bandwidth_bytes_s"] == 1e10
    assert row["sol_tok_s"] > 0
    assert row["engine_info.calibrated"] is False and "uncalibrated" in row["engine_info.sim_warning"], \
        "no step trace in this results folder: the roofline's guess, said so"


def test_a_failed_measurement_says_how_to_give_the_spec(monkeypatch, tmp_path):
    def broken(cache_dir):
        raise subprocess.CalledProcessError(1, "python")

    monkeypatch.setattr(hostspec, "measure_host", broken)
    with pytest.raises(hostspec.TroughputError, match="give peak_flops_bf16 and bandwidth_bytes_s"):
        hostspec.complete_spec(CPU, tmp_path)
