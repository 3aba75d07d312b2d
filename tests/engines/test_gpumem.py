"""``engines.gpumem``: GPU memory per run from recorded ``nvidia-smi`` text, the process tree from a
fake ``/proc``, peaks over samples, and None (not an error) where no driver answers."""

import shutil
import time

from engines import gpumem
from engines.gpumem import MIB, DeviceSample, GpuMemorySampler, GpuPeak, parse_smi, process_tree

# Recorded on a two-H100 node while vLLM ran on GPU 1 (its engine core is pid 4242, a child of the worker).
DEVICES = """0, GPU-5e1d4a9c-1111-2222-3333-444455556666, NVIDIA H100 80GB HBM3, 580.95.05, 4
1, GPU-7a2b3c4d-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA H100 80GB HBM3, 580.95.05, 72514
"""
APPS = """GPU-7a2b3c4d-aaaa-bbbb-cccc-ddddeeeeffff, 4242, 71980
GPU-7a2b3c4d-aaaa-bbbb-cccc-ddddeeeeffff, 4100, 520
"""


def test_nvidia_smi_text_becomes_per_device_samples_in_bytes():
    samples = parse_smi(DEVICES, APPS)
    assert [(s.index, s.used_bytes) for s in samples] == [(0, 4 * MIB), (1, 72514 * MIB)]
    assert samples[1].processes == {4242: 71980 * MIB, 4100: 520 * MIB}
    assert samples[0].processes == {}
    assert parse_smi("", "") == [] and parse_smi(DEVICES, "[N/A]\n")[1].processes == {}


def test_process_tree_follows_parent_pids(tmp_path):
    for pid, ppid, comm in [(100, 1, "python"), (4100, 100, "py thon) x"), (4242, 4100, "VLLM::EngineCore"),
                            (5000, 1, "other")]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")
    (tmp_path / "self").mkdir()
    assert process_tree(100, tmp_path) == {100, 4100, 4242}
    assert process_tree(5000, tmp_path) == {5000}


def test_peaks_are_above_the_baseline_per_device_and_the_total_is_one_instant():
    peak = GpuPeak([DeviceSample(0, 4 * MIB), DeviceSample(1, 500 * MIB)])
    peak.add([DeviceSample(0, 1004 * MIB), DeviceSample(1, 500 * MIB)], tree={1})
    peak.add([DeviceSample(0, 4 * MIB), DeviceSample(1, 2500 * MIB, {7: 2000 * MIB, 8: 9 * MIB})], tree={7})
    columns = peak.columns()
    assert columns["peak_gpu_bytes_by_device"] == {"0": 1000 * MIB, "1": 2000 * MIB}
    assert columns["peak_gpu_bytes"] == 2000 * MIB, "the peak of the sum at one sample, not a sum of peaks"
    assert columns["peak_gpu_process_bytes"] == 2000 * MIB, "only the tree's pids count"
    assert GpuPeak([DeviceSample(0, 0)]).columns()["peak_gpu_process_bytes"] is None


def test_the_sampler_sees_a_peak_between_phase_boundaries():
    used = iter([0, 0] + [10 * MIB] * 3 + [0] * 1000)   # baseline, then a short spike, then freed
    sampler = GpuMemorySampler(reader=lambda: [DeviceSample(0, next(used) * 1)], interval_s=0.01).start()
    time.sleep(0.2)
    result = sampler.stop()
    assert result["peak_gpu_bytes"] == 10 * MIB and result["peak_gpu_bytes_by_device"] == {"0": 10 * MIB}
    assert result["gpu_memory_source"] == "given"


def test_without_a_driver_the_sampler_yields_none(monkeypatch):
    monkeypatch.setattr(gpumem, "default_reader", lambda devices=None: None)
    assert GpuMemorySampler().start().stop() is None
    if shutil.which("nvidia-smi") is None:
        assert gpumem.smi_reader() is None
        monkeypatch.undo()
        assert GpuMemorySampler().start().stop() is None or gpumem.nvml_reader() is not None
