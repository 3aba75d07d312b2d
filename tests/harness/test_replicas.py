"""Data-parallel replicas: shards of the requests, slices of the devices, one merged result."""

import os

import pytest

from engines.base import Request
from harness.core.errors import TroughputError
from harness.run.replicas import device_envs, merge_results, shard_requests


def requests(lengths):
    return [Request(f"r{i}", [1] * n, 1) for i, n in enumerate(lengths)]


def test_shards_are_contiguous_and_balanced_by_tokens():
    reqs = requests([99, 1, 1, 1, 49, 49])  # weights 100, 2, 2, 2, 50, 50
    shards = shard_requests(reqs, 2)
    assert [r for shard in shards for r in shard] == reqs, "every request once, order kept"
    assert [[r.id for r in s] for s in shards] == [["r0", "r1", "r2"], ["r3", "r4", "r5"]]  # 104 and 102 tokens


def test_every_replica_gets_a_request_and_too_many_replicas_fail():
    shards = shard_requests(requests([1000, 1, 1]), 3)
    assert [len(s) for s in shards] == [1, 1, 1]
    with pytest.raises(TroughputError, match="more than the workload's 3 requests"):
        shard_requests(requests([1, 1, 1]), 4)


def test_gpu_slices_come_from_visible_devices():
    envs = device_envs(2, "gpu", {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert envs == [{"CUDA_VISIBLE_DEVICES": "4,5", "TROUGHPUT_REPLICA": "1/2"},
                    {"CUDA_VISIBLE_DEVICES": "6,7", "TROUGHPUT_REPLICA": "2/2"}]
    with pytest.raises(TroughputError, match="needs at least 3 GPUs; this run has 2"):
        device_envs(3, "gpu", {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert device_envs(1, "gpu", {}) == [{}]


def test_cpu_slices_are_disjoint_cores_of_this_process():
    cores = sorted(os.sched_getaffinity(0))
    envs = device_envs(len(cores), "cpu", {})
    assert [e["TROUGHPUT_CPU_AFFINITY"] for e in envs] == [str(c) for c in cores]


def a_pass(wall, out, hits):
    return {"wall_s": wall, "requests": 2, "prompt_tokens": 10, "output_tokens": out, "cached_tokens": hits,
            "finished_s": [wall], "stats": {"preemptions": 1, "prefix_cache_queries": 10, "prefix_cache_hits": hits,
                                            "mm_cache_queries": None, "extra": {"x": 1.0}}}


def test_merged_pass_lasts_as_long_as_the_slowest_replica_and_counts_add_up():
    results = [{"status": "ok", "start": {"startup_s": s, "compile_s": None}, "passes": [a_pass(w, o, h)],
                "peak_rss_bytes": 100, "final_stats": {"preemptions": 1, "extra": {}}}
               for s, w, o, h in [(1.0, 2.0, 20, 4), (3.0, 1.0, 30, 6)]]
    merged = merge_results(results)
    (p,) = merged["passes"]
    assert (p["wall_s"], p["requests"], p["output_tokens"], p["cached_tokens"]) == (2.0, 4, 50, 10)
    assert p["stats"] == {"preemptions": 2, "prefix_cache_queries": 20, "prefix_cache_hits": 10,
                          "mm_cache_queries": None, "extra": {"x": 2.0}}
    assert p["finished_s"] == [1.0, 2.0] and merged["start"]["startup_s"] == 3.0
    assert merged["peak_rss_bytes"] == 200 and merged["final_stats"]["preemptions"] == 2


def test_the_replica_that_failed_first_speaks_for_the_run():
    results = [{"status": "crash", "error": "stopped by the driver"}, {"status": "oom", "error": "out of memory"}]
    assert merge_results(results, culprit=1) == {"status": "oom", "error": "replica 2 of 2: out of memory"}
    assert merge_results(results)["error"] == "replica 1 of 2: stopped by the driver"


def test_energy_adds_up_over_gpus_and_is_shared_over_one_cpu_package():
    from harness.run.measure import energy_columns
    from harness.run.replicas import _merge_energy

    gpus = [{"energy_j": 100.0, "energy_j_by_device": {"0": 100.0}, "energy_source": "nvml"},
            {"energy_j": 120.0, "energy_j_by_device": {"1": 120.0}, "energy_source": "nvml"}]
    assert _merge_energy(gpus) == {"energy_j": 220.0, "energy_j_by_device": {"0": 100.0, "1": 120.0},
                                   "energy_source": "nvml", "energy_reason": None}
    package = [{"energy_j": 50.0, "energy_j_by_device": {"intel-rapl:0": 50.0}, "energy_source": "rapl"},
               {"energy_j": 52.0, "energy_j_by_device": {"intel-rapl:0": 52.0}, "energy_source": "rapl"}]
    assert _merge_energy(package)["energy_j"] == 52.0, "both replicas read the same package counter"
    unknown = _merge_energy([gpus[0], {"energy_j": None, "energy_reason": "NVML does not answer"}])
    assert unknown["energy_j"] is None and unknown["energy_reason"] == "NVML does not answer"
    columns = energy_columns({**_merge_energy(gpus), "output_tokens": 440})
    assert columns["j_per_output_token"] == 0.5 and columns["energy_j.1"] == 120.0
    assert energy_columns({"energy_j": None, "output_tokens": 4, "energy_reason": "x"})["energy_reason"] == "x"
