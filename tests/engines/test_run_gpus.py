"""Energy and peak GPU memory come from the run's own GPUs (issue 38, item 4), on a fake NVML of 8 devices.

A one-replica run sets no ``CUDA_VISIBLE_DEVICES``; the meters used to count every GPU NVML lists, so
on an 8-GPU node a one-GPU run carried seven idle GPUs' joules (and their memory moves). Now they count
the first tensor × pipeline parallel GPUs of the visible ones (``engines.devices``).
"""

from __future__ import annotations

import pytest

from engines import worker
from engines.base import Request
from engines.devices import per_replica, run_gpus
from engines.energy import EnergyMeter
from engines.gpumem import GpuMemorySampler
from engines.requirements import Gpu
from tests.engines.conftest import GIB, OWN_J, run_worker
from tests.fake_engine import FakeEngine

CASES = [  # knobs (vLLM's names), CUDA_VISIBLE_DEVICES, the NVML indices the run uses
    ({}, None, [0]),
    ({"tensor_parallel_size": 2}, None, [0, 1]),
    ({"tensor_parallel_size": 2}, "5,3", [5, 3]),
    ({}, "4,5,6,7", [4]),                                            # a replica's slice, one GPU used of it
    ({"tensor_parallel_size": 2}, "GPU-06c0ffee,GPU-02c0ffee", [6, 2]),   # UUID prefixes, as CUDA reads them
]


@pytest.mark.parametrize("knobs, visible, used", CASES)
def test_energy_counts_the_run_s_gpus_only(nvml, knobs, visible, used):
    nvml(set(used), visible)
    meter = EnergyMeter(devices=per_replica("vllm", knobs)).start()
    out = meter.stop()
    assert out["energy_source"] == "nvml"
    assert sorted(map(int, out["energy_j_by_device"])) == sorted(used)
    assert out["energy_j"] == pytest.approx(OWN_J * len(used)), "no idle GPU's joules"


@pytest.mark.parametrize("knobs, visible, used", CASES)
def test_peak_memory_counts_the_run_s_gpus_only(nvml, knobs, visible, used):
    nvml(set(used), visible)
    sampler = GpuMemorySampler(devices=per_replica("vllm", knobs), interval_s=60).start()
    out = sampler.stop()
    assert sorted(map(int, out["peak_gpu_bytes_by_device"])) == sorted(used)
    assert out["peak_gpu_bytes"] == len(used) * GIB, "one read past the baseline: 1 GiB a busy GPU, no idle GPU's"


def test_the_worker_meters_the_engine_s_gpus_on_an_8_gpu_node(nvml, tmp_path, monkeypatch):
    # the worker itself, for a vLLM job of tensor_parallel_size=2 and no CUDA_VISIBLE_DEVICES (one replica)
    nvml({0, 1})

    class AnyKnobs(FakeEngine):
        def validate(self) -> None:
            pass

    monkeypatch.setattr(worker, "get_engine_class", lambda name: AnyKnobs)
    requests = [Request(id=str(i), prompt_token_ids=[1, 2, 3], max_tokens=4) for i in range(4)]
    result, columns = run_worker(tmp_path, "vllm", {"path": "unused"}, requests, {"tensor_parallel_size": 2})
    assert result["status"] == "ok", result.get("error")
    [measured] = result["passes"]
    assert sorted(measured["energy_j_by_device"]) == ["0", "1"]
    assert measured["energy_j"] == pytest.approx(2 * OWN_J)
    assert sorted(result["peak_gpu_bytes_by_device"]) == ["0", "1"]


def test_unknown_engines_and_run_gpus():
    gpus = tuple(Gpu(i, f"GPU-{i}", "H100") for i in range(8))
    assert per_replica("tests.fake_engine:FakeEngine", {}) is None, "no unit: every visible GPU, as before"
    assert per_replica("sglang", {"tp_size": 4}) == 4 and per_replica("vllm", {"pipeline_parallel_size": 2,
                                                                                  "tensor_parallel_size": 2}) == 4
    assert [g.index for g in run_gpus(gpus, None, None)] == list(range(8))
    assert [g.index for g in run_gpus(gpus, "7,1", 1)] == [7]
