"""``engines.requirements``: host facts parsed from recorded ``nvidia-smi`` text, each unmet requirement
named with its fix, and the adapters' pre-run check (``preflight``) giving exactly ``troughput-env --check``'s."""

import dataclasses
import sys
import types

import pytest

from engines import requirements as req
from engines import unit
from engines import common
from engines.base import EngineUnavailable
from engines.common import preflight
from harness.core import engine_env

# Recorded from `nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total --format=csv,noheader,nounits`
# and the header of plain `nvidia-smi` on a two-GPU H100 node with the 535 driver (CUDA 12.2).
QUERY_535 = """0, GPU-5e1d4a9c-1111-2222-3333-444455556666, NVIDIA H100 80GB HBM3, 535.183.01, 81559
1, GPU-7a2b3c4d-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA H100 80GB HBM3, 535.183.01, 81559
"""
HEADER_535 = """+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.183.01             Driver Version: 535.183.01   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
"""
SGLANG = unit("sglang").environment()
TRTLLM = unit("trtllm").environment()


def facts(**changes):
    gpus = req.parse_gpu_query(QUERY_535)
    driver, cuda = req.parse_driver(QUERY_535, HEADER_535)
    base = req.HostFacts(python="3.12.3", glibc="2.35", driver=driver, driver_cuda=cuda, gpus=gpus,
                         cuda_home="/usr/local/cuda-13.1", cuda_toolkit="13.1", libraries=frozenset({"mpi"}))
    return dataclasses.replace(base, **changes)


def test_nvidia_smi_output_is_parsed_into_gpus_driver_and_cuda():
    gpus = req.parse_gpu_query(QUERY_535)
    assert [(g.index, g.name, g.memory_mib) for g in gpus] == [(0, "NVIDIA H100 80GB HBM3", 81559),
                                                               (1, "NVIDIA H100 80GB HBM3", 81559)]
    assert req.parse_driver(QUERY_535, HEADER_535) == ("535.183.01", "12.2")
    assert req.parse_gpu_query("No devices were found\n") == ()


def test_an_old_driver_is_named_with_the_driver_cuda_13_needs():
    problems = req.unmet(SGLANG, facts(), "SGLang")
    assert len(problems) == 1
    assert problems[0].what.startswith("driver 535.183.01 is older than the 580 that CUDA 13 needs")
    assert "install NVIDIA driver 580 or newer" in problems[0].fix
    assert req.unmet(SGLANG, facts(driver="580.65.06"), "SGLang") == []


def test_visible_devices_by_index_or_uuid_and_hidden_gpus():
    assert [g.index for g in facts(visible_devices="1").visible_gpus()] == [1]
    assert [g.index for g in facts(visible_devices="GPU-7a2b").visible_gpus()] == [1]
    assert facts(visible_devices="0,7,1").visible_gpus() == facts(visible_devices="0").visible_gpus()
    hidden = req.unmet(SGLANG, facts(driver="580.82.07", visible_devices="-1"), "SGLang")
    assert [p.what for p in hidden] == ["CUDA_VISIBLE_DEVICES='-1' hides all 2 GPU(s)"]
    assert "unset CUDA_VISIBLE_DEVICES or set it to one of 0, 1" == hidden[0].fix


def test_each_unmet_requirement_of_tensorrt_llm_comes_with_its_fix():
    bare = facts(python="3.11.9", glibc="2.31", driver=None, driver_error="nvidia-smi is not on PATH",
                 gpus=(), cuda_home=None, cuda_toolkit=None, libraries=frozenset())
    problems = req.unmet(TRTLLM, bare, "TensorRT-LLM")

    def about(word):
        (found,) = [p for p in problems if word in p.what]
        return found

    assert len(problems) == 4 and all(p.fix for p in problems)
    assert "python3.12 or python3.10" in about("Python 3.11.9").fix
    assert "run on a GPU node" in about("driver >= 580 (CUDA 13.0)").fix
    assert "export CUDA_HOME=/usr/local/cuda-13.1" in about("CUDA 13.1 toolkit").fix
    assert "libopenmpi-dev" in about("libmpi.so").fix
    assert "2.31" not in " ".join(p.what for p in problems), "TensorRT-LLM declares no glibc floor"
    assert req.unmet(TRTLLM, facts(driver="590.44.01"), "TensorRT-LLM") == []


def test_glibc_and_python_ranges():
    assert req.python_matches("3.12.1", "==3.10,==3.12") and not req.python_matches("3.11.7", "==3.10,==3.12")
    assert req.python_matches("3.14.0", ">=3.11,<3.15") and not req.python_matches("3.15.0", ">=3.11,<3.15")
    old_glibc = req.unmet(SGLANG, facts(driver="580.65.06", glibc="2.31"), "SGLang")
    assert [p.what for p in old_glibc] == ["glibc 2.31 is older than the 2.34 SGLang's wheels need"]


def test_a_cuda_12_torch_beside_tensorrt_llm_names_the_guide_step():
    (problem,) = req.torch_problems(TRTLLM, "TensorRT-LLM", "2.9.1+cu128", "12.8", "trtllm", "/env/bin/python")
    assert problem.what == "torch 2.9.1+cu128 is built for CUDA 12.8; TensorRT-LLM is built for CUDA 13.0"
    assert problem.fix == ("`/env/bin/python -m pip install torch==2.9.1 torchvision==0.24.1 "
                           "--index-url https://download.pytorch.org/whl/cu130`")
    assert req.torch_problems(TRTLLM, "TensorRT-LLM", "2.9.1+cu130", "13.0") == []


def test_this_host_is_probed_without_raising():
    found = req.probe_host(("c",))
    assert found.python == ".".join(map(str, sys.version_info[:3]))
    assert found.driver is not None or found.driver_error


def test_nvml_is_asked_first_and_nvidia_smi_only_where_it_does_not_answer(nvml, monkeypatch):
    # nvidia-smi on PATH answering the recorded 535 node; NVML (the fake 8-GPU node, driver 580) asked first
    for name in ("CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    ran = []
    monkeypatch.setattr(req.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(req, "run_quietly", lambda command, timeout=20: ran.append(command) or (
        QUERY_535 if command == list(req.GPU_QUERY) else HEADER_535))
    fake = nvml(set())
    found = req.probe_host()
    assert (found.driver, len(found.gpus), ran) == ("580.95.05", 8, []), "NVML answered: no nvidia-smi call"

    def no_library():
        raise RuntimeError("NVML Shared Library Not Found")
    fake.nvmlInit = no_library
    found = req.probe_host()
    assert (found.driver, found.driver_cuda, len(found.gpus)) == ("535.183.01", "12.2", 2) and ran


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_preflight_runs_exactly_the_checks_of_troughput_env_check(monkeypatch, tmp_path, engine):
    """The adapters' pre-run check and ``troughput-env ENGINE --check`` give the same problems, in order."""
    report = {"python": "3.12.3", "engine": "x", "troughput": "ok", "cuda": False, "torch": "2.14.1+cu130",
              "torch_cuda": "13.0"}
    monkeypatch.setattr(common, "require_module", lambda *a: None)
    monkeypatch.setattr(req, "probe_host", lambda libraries=(): facts())
    monkeypatch.setattr(req, "import_report", lambda module: report)
    monkeypatch.setattr(engine_env, "_run_check_script", lambda python, module: report)
    python = tmp_path / "python"
    python.touch()
    spec = unit(engine).environment()

    def both():
        problems = engine_env.check(engine, spec, python, req.probe_host())
        try:
            preflight(engine)
        except EngineUnavailable as e:
            return problems, str(e)
        return problems, ""

    problems, message = both()
    assert problems, "a 535 driver cannot run a CUDA 13 engine"
    assert message.endswith("; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    assert "driver 535.183.01 is older than the 580 that CUDA 13 needs" in message
    monkeypatch.setattr(req, "probe_host", lambda libraries=(): facts(driver="580.95.05", driver_cuda="13.0"))
    report["cuda"] = True
    problems, message = both()
    assert problems == [] and message == "", "a CUDA 13 torch that sees a GPU passes both"
    report.update(torch="2.14.1+cu128", torch_cuda="12.8")
    problems, message = both()
    assert len(problems) == 1 and "built for CUDA 12.8" in message


def test_the_check_script_is_the_function_adapters_call():
    assert "def import_report(module" in engine_env.CHECK_SCRIPT
    report = req.import_report("no_such_module_here")
    assert "engine_error" in report and report["troughput"] == "ok"
