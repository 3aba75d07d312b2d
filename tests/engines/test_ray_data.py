"""engine=ray: Ray Data LLM's vLLM processor on the CPU build with the tiny model.

Knob checks run without a Ray cluster. Two real Ray Data jobs: a troughput-run row on the
session's Ray head (``ray_head``: its own process on the loopback address, joined by address),
and, on a local Ray the adapter starts itself (no ``engine.address``), a job whose engine
replica is killed mid-job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import psutil
import pytest

from engines import unit
from engines.base import KnobError, Request
from engines.ray_data import RayDataEngine, _item
from harness.core.models import resolve_model
from harness.run.runner import execute
from harness.run.spec import build_spec, layered_knobs
from tests.conftest import compose

FIXED = ["workload=unique", "workload.num_requests=16", "workload.input_len=48",
         "workload.output_len=8", "run.warmup_requests=0", "run.progress=false", "run.time_limit_s=300"]


@pytest.fixture(scope="module")
def tiny():
    cfg = compose("engine=ray")
    return resolve_model(dict(cfg.model), sys.executable), layered_knobs(cfg)


def engine(tiny, **knobs) -> RayDataEngine:
    model, base = tiny
    return RayDataEngine(model, {**base, **knobs, "engine_kwargs": {**base["engine_kwargs"], **knobs.pop("engine_kwargs", {})}})


@pytest.mark.engine   # checks the knobs against the installed Ray and vLLM: imports both here
@pytest.mark.xdist_group("ray")
def test_knobs_are_checked_against_ray_and_vllm_before_anything_starts(tiny):
    with pytest.raises(KnobError, match=r"unknown Ray Data LLM knob.*batch_sise.*batch_size\?"):
        engine(tiny, batch_sise=8).validate()
    with pytest.raises(KnobError, match=r"engine_kwargs knob.*max_num_seqz -> max_num_seqs"):
        engine(tiny, engine_kwargs={"max_num_seqz": 8}).validate()
    with pytest.raises(KnobError, match="set by troughput itself"):
        engine(tiny, tokenize_stage=True).validate()
    with pytest.raises(KnobError, match="min > max"):
        engine(tiny, concurrency=[2, 1]).validate()
    with pytest.raises(KnobError, match="vLLM rejects"):
        engine(tiny, engine_kwargs={"max_num_seqs": 64, "max_num_batched_tokens": 16}).validate()
    with pytest.raises(KnobError, match="num_cpus sizes a local Ray"):
        engine(tiny, address="127.0.0.1:1", num_cpus=4).validate()
    engine(tiny, concurrency=[1, 2], batch_size=8, max_concurrent_batches=2).validate()


def test_canonical_knobs_land_in_engine_kwargs_and_replicas_count_as_devices():
    cfg = compose("engine=ray", "engine.canonical.max_seqs=8", "engine.knobs.concurrency=[1,3]")
    knobs = layered_knobs(cfg)
    assert knobs["engine_kwargs"]["max_num_seqs"] == 8 and knobs["concurrency"] == [1, 3]
    assert knobs["engine_kwargs"]["kv_cache_memory_bytes"] == cfg.hardware.canonical.kv_memory_bytes
    ray = unit("ray")
    assert ray.devices(knobs) == 3 and ray.devices({**knobs, **ray.knobs["tensor_parallel"].to_native(2)}) == 6


def test_engine_actors_get_vllm_s_cpu_environment_through_the_processor_s_runtime_env(tiny, monkeypatch):
    """On CPUs with the threads set (hardware cpu: 1) the actors run vLLM's model in the engine core's process
    with them (no worker process of its own), on a local Ray or on a cluster joined by address; a runtime_env
    knob of the user's keeps its own values; without the threads set, vLLM's own executor keeps binding them."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = engine(tiny)._config_kwargs(gpus=0)["runtime_env"]["env_vars"]
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    own = engine(tiny, runtime_env={"pip": ["x"], "env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "A": "b"}})
    assert own._config_kwargs(gpus=0)["runtime_env"] == {
        "pip": ["x"], "env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": "1", "A": "b"}}
    assert "runtime_env" not in engine(tiny)._config_kwargs(gpus=1), "GPU engines keep vLLM's own defaults"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "runtime_env" not in engine(tiny)._config_kwargs(gpus=0)


def test_every_row_of_the_dataset_has_the_same_sampling_keys():
    plain = _item(0, Request("a", [1, 2], 4))
    json = _item(1, Request("b", [1, 2], 4, sampling={"temperature": 0.5, "seed": 3},
                            constraint={"kind": "json", "value": {"type": "object"}}))
    assert set(plain["sampling_params"]) == set(json["sampling_params"])
    assert plain["sampling_params"]["ignore_eos"] and plain["sampling_params"]["structured_outputs"] is None
    assert json["sampling_params"]["structured_outputs"]["json"] == '{"type": "object"}', "a schema travels as text"


def test_per_request_metrics_of_another_shape_are_unknown_with_a_warning_not_a_crash():
    """vLLM's per-request metrics in Ray's output rows go through the stat reader (no Ray started here)."""
    engine = RayDataEngine({"path": "/models/x"}, {})
    engine.totals, engine.preemptions = {}, 0
    good = {"metrics": {"num_preemptions": 1, "arrival_time": 100.0, "queued_ts": 5.0, "last_token_ts": 7.5}}
    no_queue = {"metrics": {"num_preemptions": 0, "arrival_time": 100.0, "last_token_ts": 9.0}}   # was a KeyError
    engine._account([good, no_queue], t_wall=99.0, pipeline_s=4.0, duplicates=0, restarts=0)
    assert engine.preemptions == 1 and engine.totals["ray_engine_span_s"] == pytest.approx(2.5)
    completion = engine._completion(Request("r", [1], 1), {**no_queue, "generated_tokens": [3]}, 99.0, 0.0)
    assert completion.finished_at is None
    engine._account([{"metrics": {"num_preemptions": "1"}}], t_wall=99.0, pipeline_s=1.0, duplicates=0, restarts=0)
    assert engine.preemptions is None, "unknown from a count of another type on, not undercounted"
    assert any("['num_preemptions'] is text ('1')" in w for w in engine.stat_reader.warnings)


@pytest.mark.engine
@pytest.mark.xdist_group("ray")
def test_a_run_joins_a_separately_started_ray_head_by_address(tmp_path, ray_head):
    address, token = ray_head.address, ray_head.token_path
    cfg = compose("engine=ray", *FIXED, f"engine.address={address}", "engine.knobs.batch_size=4",
                  f"+engine.env.RAY_AUTH_TOKEN_PATH={token}", f"run.results_dir={tmp_path}")
    row = execute(build_spec(cfg), progress=False)
    assert row["status"] == "ok", row["error"]
    assert row["knob.address"] == row["engine_info.ray_address"] == address
    assert row["engine_info.ray_auth"] == "token", "the driver used the head's token"
    assert (row["engine_info.ray_nodes"], row["engine_info.ray_cpus"], row["engine_info.ray_gpus"]) == (1, 4.0, 0.0)
    assert row["requests_done"] == 16 and row["output_tokens"] == 16 * 8 and row["input_tokens"] == 16 * 48
    assert row["preemptions"] == 0 and row["prefix_cache_hits"] is None, "Ray's rows carry no prefix-cache hits"
    parts = [row[f"stat.ray_{k}_s"] for k in ("replica_start", "engine_span", "drain")]
    assert all(p >= 0 for p in parts) and sum(parts) == pytest.approx(row["stat.ray_pipeline_s"], rel=1e-6)
    assert row["stat.ray_jobs"] == 1 and row["stat.ray_actor_restarts"] == 0
    assert len({row["completion_p50_s"], row["completion_p99_s"]}) == 2, "finish times come from the engine"
    # one rate definition: replica start-up is start-up, the rate is over the rest of the pass. The rate's
    # span is the generate call less the replica start, so it covers the pipeline's generation part plus the
    # call's own set-up and collection (a fraction of a second), and leaves out the start (seconds).
    span = row["output_tokens"] / row["output_tok_s"]
    start = row["stat.ray_replica_start_s"]
    assert row["stat.ray_pipeline_s"] - start <= span * (1 + 1e-6)
    assert span < row["stat.ray_pipeline_s"] - start / 2, "the replica start-up is outside the rate's span"
    assert row["startup_s"] >= row["stat.ray_replica_start_s"] and row["job_wall_s"] >= row["stat.ray_pipeline_s"]


def _engine_actor_pids() -> list[int]:
    import ray
    from ray._private.state import actors

    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    return [a["Pid"] for a in actors(job_id=job).values()
            if "MapWorker" in a["ActorClassName"] and a["State"] == "ALIVE" and a["Pid"]]


@pytest.mark.engine
@pytest.mark.xdist_group("ray")
def test_a_replica_killed_mid_job_is_restarted_by_ray_and_nothing_counts_twice(tiny, monkeypatch):
    """On a local Ray the adapter starts itself (no ``engine.address``): that path's one real check."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # as hardware cpu sets for a run's worker
    ray_engine = engine(tiny, batch_size=4, max_concurrent_batches=1, num_cpus=4)
    requests = [Request(f"r{i}", [5 + i, 6, 7, 8] * 8, 8) for i in range(40)]
    ray_engine.validate()
    ray_engine.start()
    killed: list[int] = []
    descendants: list = []
    try:
        def kill_after_first_batch(n: int) -> None:
            if not killed:
                killed.extend(_engine_actor_pids())
                for child in psutil.Process(killed[0]).children(recursive=True) if killed else ():
                    with contextlib.suppress(psutil.Error):
                        descendants.append(child.name() + " " + " ".join(child.cmdline()))
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)

        before = ray_engine.stats()
        completions = ray_engine.generate(requests, on_finish=kill_after_first_batch)
        stats = ray_engine.stats().minus(before)
        with pytest.raises(RuntimeError, match="Ray did not recover"):   # a bad row fails the job: no retry helps
            ray_engine.generate([Request("long", [5] * 4096, 4)])
    finally:
        ray_engine.stop()
    assert len(killed) == 1, "one replica was running and was killed"
    engines = [d for d in descendants if "resource_tracker" not in d]   # multiprocessing's own helper aside
    assert len(engines) == 1, f"the actor's one engine process is vLLM's engine core, which runs the model: {descendants}"
    assert [c.id for c in completions] == [r.id for r in requests]
    assert all(len(c.output_token_ids) == 8 for c in completions), "every request once, none lost or doubled"
    assert stats.extra["ray_actor_restarts"] >= 1, "the row says Ray restarted the replica"
    assert stats.extra["ray_jobs"] == 1 and stats.preemptions == 0
