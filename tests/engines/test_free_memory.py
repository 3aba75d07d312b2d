"""The pre-run check refuses a config whose memory cannot fit in the run's GPUs' free memory (issue 38, item 5).

vLLM takes ``gpu_memory_utilization`` × total memory at start and refuses when less is free (its worker's
"Free memory on device ... is less than desired GPU memory utilization"), one GPU at a time and only once
the engine started (SGLang's ``mem_fraction_static`` is a share of the memory free before it loads, so it
is not checked). The check reads each GPU's free
memory with its total from NVML (``pynvml``) where it answers, else from ``nvidia-smi --query-gpu=...,
memory.total,memory.free``, and names every GPU that cannot hold it, with the numbers and the fix, before any
engine starts. Neither read is a CUDA call.
"""

import dataclasses
import sys
import types

import pytest

from engines import common
from engines import requirements as req
from engines.base import EngineUnavailable
from engines.common import preflight
from tests.engines.conftest import GIB

# nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total,memory.free (MiB) on an 8-GPU node where
# another job holds 50 GiB of GPU 0 and 70 GiB of GPU 3
QUERY = "\n".join(f"{i}, GPU-{i}a2b3c4d-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA H100 80GB HBM3, 580.95.05, 81559, "
                  f"{81559 - {0: 51200, 3: 71680}.get(i, 0)}" for i in range(8))
FACTS = req.HostFacts(python="3.12.3", glibc="2.39", driver="580.95.05", driver_cuda="13.0",
                      gpus=req.parse_gpu_query(QUERY), cuda_home="/usr/local/cuda-13.1", cuda_toolkit="13.1",
                      libraries=frozenset({"mpi"}))
PASSING = {"python": "3.12.3", "engine": "x", "troughput": "ok", "cuda": True, "cuda_devices": 8,
           "torch": "2.14.1+cu130", "torch_cuda": "13.0"}


def test_free_memory_is_read_with_the_total():
    gpus = req.parse_gpu_query(QUERY)
    assert [(g.index, g.memory_mib, g.free_mib) for g in gpus][:4] == [
        (0, 81559, 30359), (1, 81559, 81559), (2, 81559, 81559), (3, 81559, 9879)]
    assert "memory.free" in req.GPU_QUERY[1]
    assert req.parse_gpu_query("0, GPU-0, H100, 580.95.05, 81559")[0].free_mib is None, "older output: unknown"


def test_memory_problems_name_the_gpu_and_the_numbers():
    gpus = req.parse_gpu_query(QUERY)
    [problem] = req.memory_problems(gpus[:2], "vLLM", "gpu_memory_utilization", 0.9)
    assert "GPU 0 (NVIDIA H100 80GB HBM3, GPU-0a2b3c4d" in problem.what
    assert "29.6 GiB free of 79.6 GiB (50.0 GiB held by other processes)" in problem.what
    assert "gpu_memory_utilization=0.9 takes 71.7 GiB" in problem.what
    assert "lower gpu_memory_utilization to at most 0.37" in problem.fix and "nvidia-smi" in problem.fix
    assert req.memory_problems(gpus[:2], "vLLM", "gpu_memory_utilization", 0.35) == []
    assert req.memory_problems(gpus, "SGLang", "mem_fraction_static", None) == [], "no share set: nothing to check"


@pytest.fixture
def host(monkeypatch):
    def set_host(visible=None):
        monkeypatch.setattr(common, "require_module", lambda *a: None)
        monkeypatch.setattr(common, "installed_variant", lambda engine: "default")
        monkeypatch.setattr(req, "probe_host", lambda libraries=(): dataclasses.replace(FACTS, visible_devices=visible))
        monkeypatch.setattr(req, "import_report", lambda module: dict(PASSING))
        monkeypatch.setitem(sys.modules, "pynvml", None)   # no NVML unless a test installs the fake one
    return set_host


def refusal(engine, knobs, memory):
    try:
        preflight(engine, knobs, memory=memory)
    except EngineUnavailable as e:
        return str(e)
    return ""


def test_vllm_s_default_share_does_not_fit_on_a_gpu_another_job_holds(host):
    host()
    message = refusal("vllm", {}, ("gpu_memory_utilization", 0.9))
    assert "GPU 0 (NVIDIA H100 80GB HBM3" in message and "29.6 GiB free of 79.6 GiB" in message
    assert "gpu_memory_utilization=0.9 takes 71.7 GiB" in message and "GPU 3" not in message, "GPU 3 is not the run's"
    assert refusal("vllm", {"gpu_memory_utilization": 0.3}, ("gpu_memory_utilization", 0.9)) == ""


def test_the_run_s_own_gpus_are_checked(host):
    host("3,4")   # the run sees GPUs 3 and 4; tensor parallel 2 uses both
    message = refusal("vllm", {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5},
                      ("gpu_memory_utilization", 0.9))
    assert "GPU 3 (" in message and "9.6 GiB free of 79.6 GiB" in message and "GPU 4 (" not in message
    assert "GPU 0" not in message
    host("1,0")   # one GPU used: GPU 1, which is free
    assert refusal("vllm", {}, ("gpu_memory_utilization", 0.9)) == ""


def test_sglang_is_not_refused_for_a_share_of_memory_others_hold(host):
    """SGLang's mem_fraction_static is a share of the memory free before it loads: a GPU partly held by other
    processes gives it a smaller KV pool, not a failure, so the pre-run check asks nothing of it."""
    import inspect

    from engines import sglang

    host()
    assert 'preflight("sglang", self.knobs)' in inspect.getsource(sglang.SglangEngine.validate)


def test_the_adapters_pass_their_share():
    import inspect

    from engines import sglang, vllm

    assert 'memory=("gpu_memory_utilization", 0.9)' in inspect.getsource(vllm.VllmEngine.validate)
    assert "memory=" not in inspect.getsource(sglang.SglangEngine.validate)


def nvml_memory(fake, free_gib: dict[int, float]):
    """``fake``'s memory reads fixed: 80 GiB a GPU, ``free_gib`` free where given, else all but 2 GiB."""
    def info(handle):
        free = int(free_gib.get(handle, 78) * GIB)
        return types.SimpleNamespace(total=80 * GIB, free=free, used=80 * GIB - free)
    fake.nvmlDeviceGetMemoryInfo = info
    return fake


def test_free_memory_comes_from_nvml_first(host, nvml):
    # nvidia-smi (FACTS) says another job holds 50 GiB of GPU 0; NVML, asked first, says GPU 0 is free now and
    # another job holds 72 GiB of GPU 1
    host()
    nvml_memory(nvml(set()), {1: 8})
    assert refusal("vllm", {}, ("gpu_memory_utilization", 0.9)) == "", "GPU 0 by NVML: 78 GiB free"
    host("1")   # (host() leaves NVML unanswered: install it again)
    nvml_memory(nvml(set()), {1: 8})
    message = refusal("vllm", {}, ("gpu_memory_utilization", 0.9))
    assert "GPU 1 (NVIDIA H100 80GB HBM3, GPU-01c0ffee" in message and "8.0 GiB free of 80.0 GiB" in message
    assert "gpu_memory_utilization=0.9 takes 72.0 GiB" in message


def test_nvidia_smi_s_numbers_where_nvml_does_not_answer(host, nvml):
    host()
    fake = nvml(set())

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")
    fake.nvmlInit = no_driver
    assert req.nvml_gpus() is None
    assert "29.6 GiB free of 79.6 GiB" in refusal("vllm", {}, ("gpu_memory_utilization", 0.9)), "nvidia-smi's GPU 0"


def test_the_memory_check_makes_no_cuda_call(host, nvml, monkeypatch):
    # torch's CUDA calls initialise the driver in the worker, which then cannot fork vLLM's engine core; NVML
    # does not. A torch stand-in records any use while the check reads memory through NVML
    used = []

    class Torch(types.ModuleType):
        def __getattr__(self, name):
            used.append(name)
            raise AttributeError(name)

    monkeypatch.setitem(sys.modules, "torch", Torch("torch"))
    host()
    nvml_memory(nvml(set()), {0: 20})
    assert "GPU 0" in refusal("vllm", {}, ("gpu_memory_utilization", 0.9))
    assert used == []


def test_the_driver_and_gpus_come_from_nvml_where_nvidia_smi_is_missing(nvml, monkeypatch):
    """A container with the driver's library and pynvml but no nvidia-smi on PATH: before, the host probe said
    'no NVIDIA driver here' and every GPU engine was refused."""
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    nvml(set())
    facts = req.probe_host()
    assert facts.driver_error is None and (facts.driver, facts.driver_cuda) == ("580.95.05", "13.0")
    assert len(facts.gpus) == 8 and facts.gpus[0].memory_mib == 80 * 1024
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "no NVIDIA driver here" in req.probe_host().driver_error, "neither answers: no driver"
