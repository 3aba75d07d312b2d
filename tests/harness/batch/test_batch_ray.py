"""``troughput-batch batch.scale=ray`` on the scripted engine, against the session's Ray head (``ray start --head``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.batch.job.plan import Plan
from harness.batch.scale.ray_job import engine_resources, runtime_env, settings
from harness.core.errors import TroughputError
from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import numbered, read_jsonl, troughput_batch
from tests.ray_head import RayHead


@pytest.mark.engine   # joins the session's Ray head and runs a Ray Data job
@pytest.mark.xdist_group("ray")
def test_shards_run_through_a_ray_data_pipeline_of_a_running_cluster(tmp_path: Path, ray_head: RayHead) -> None:
    path = numbered(tmp_path / "batch.jsonl", 8)
    out = tmp_path / "out"
    proc = troughput_batch(tmp_path, f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", f"batch.input={path}",
                           f"batch.output_dir={out}", "batch.shard_size=2", "batch.scale=ray",
                           f"batch.ray.address={ray_head.address}", "batch.ray.actors=2", env=ray_head.driver_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [o["custom_id"] for o in read_jsonl(out / "output.jsonl")] == [f"req-{i}" for i in range(8)]
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["scale"] == "ray" and row["shards_run"] == 4 and row["requests_ok"] == 8
    metas = [read_jsonl(p)[0] for p in sorted((out / "shards").glob("*/meta.json"))]
    assert metas and all("runtime_resources" in m["code_dir"] for m in metas), "code reaches actors by runtime_env"


def _stage_overlap(knobs: dict) -> list[dict]:
    """Two shards handed to one ``EngineStage`` from two threads (as Ray Data's concurrent calls), the
    second while the first generates; their ``result.json`` contents, in shard order."""
    import threading

    from engines.base import Request
    from harness.batch.scale.ray_stages import EngineStage

    stage = EngineStage({"engine": FAKE_ENGINE, "knobs": {"max_num_seqs": 4, **knobs}, "model": {}})
    results: dict[int, dict] = {}

    def call(shard: int) -> None:
        results[shard] = stage.generate(shard, [Request(f"{shard}-{i}", [1, 2, 3], 4) for i in range(4)])

    first = threading.Thread(target=call, args=(0,))
    first.start()
    time.sleep(0.3)   # the first shard is generating (4 tokens at token_s or one step_s): feed the next
    second = threading.Thread(target=call, args=(1,))
    second.start()
    first.join(60), second.join(60)
    return [results[0], results[1]]


@pytest.mark.engine   # imports Ray (no cluster): the stage's node id
def test_the_engine_stage_takes_the_next_shard_while_the_current_one_generates() -> None:
    """Ray Data runs ``batch.in_flight`` calls at once on the engine actor; the stage feeds each to the one
    engine at once: the second shard's span (feed to last finish) exceeds the engine time it accounts
    for (from the first one's finish), with no idle wait. With one blocking generate per shard
    (``step_s``) the second waits its turn and the two are equal."""
    streamed = _stage_overlap({"token_s": 0.5})
    assert len(streamed[1]["completions"]) == 4
    assert streamed[1]["measured"]["span_s"] > streamed[1]["measured"]["wall_s"] + 0.2, streamed[1]
    assert streamed[1]["measured"]["idle_before_s"] == 0.0, streamed[1]
    serial = _stage_overlap({"step_s": 1.0})
    assert all(abs(r["measured"]["span_s"] - r["measured"]["wall_s"]) < 1e-6 for r in serial), serial


def _plan(tmp_path: Path, engine: str = "vllm", **fields) -> Plan:
    return Plan(input=str(tmp_path / "in.jsonl"), format="openai_batch", output_dir=str(tmp_path / "out"),
                shard_size=2, engine=engine, model={"name": "tiny"}, knobs={}, ordering={}, python="python",
                input_digest="-", scale="ray", **fields)


@pytest.mark.parametrize(("ray", "named"), [({"actors": 0}, "batch.ray.actors"),
                                             ({"num_gpus": -1}, "batch.ray.num_gpus"),
                                             ({"bundles": [{}]}, "batch.ray.bundles"),
                                             ({"max_restarts": -1}, "batch.ray.max_restarts")])
def test_ray_settings_are_checked_before_joining(tmp_path: Path, ray: dict, named: str) -> None:
    with pytest.raises(TroughputError, match=named):
        settings(_plan(tmp_path, ray=ray))


def test_unset_actors_follow_the_replicas_of_the_config_or_decision(tmp_path: Path) -> None:
    assert settings(_plan(tmp_path, ray={}, replicas=2))["actors"] == 2, "a decision's replicas are its engine actors"
    assert settings(_plan(tmp_path, ray={"actors": None}, replicas=3))["actors"] == 3
    assert settings(_plan(tmp_path, ray={"actors": 4}, replicas=2))["actors"] == 4, "batch.ray.actors, when set, wins"


def test_bundles_give_each_engine_actor_a_placement_group() -> None:
    resources = engine_resources({"bundles": [{"GPU": 1, "CPU": 1}] * 2, "num_cpus": 1, "num_gpus": 1})
    assert (resources["num_cpus"], resources["num_gpus"]) == (0, 0) and callable(resources["ray_remote_args_fn"])
    assert engine_resources({"num_cpus": 2, "num_gpus": 1}) == {"num_cpus": 2.0, "num_gpus": 1.0}


def test_without_an_engine_start_in_the_shards_start_up_is_the_wait_for_the_first_request(tmp_path: Path) -> None:
    from harness.batch.job.job import ShardsRun
    from harness.batch.job.state import JobState
    from harness.batch.scale.ray_job import tally

    state = JobState(tmp_path / "out")
    state.shards_dir.mkdir(parents=True)
    state.work_dir.mkdir(parents=True)
    shard = {"ok": 1, "failed": 0, "prompt_tokens": 1, "output_tokens": 4, "engine_s": 1.0}
    state.commit(0, [], [], {**shard, "started_at": 130.0, "committed_at": 140.0})  # engine=ray: no startup_s
    state.commit(1, [], [], {**shard, "started_at": 135.0, "committed_at": 150.0})
    run = tally(state, [0, 1], ShardsRun(), began=100.0)
    assert (run.startup_s, run.generation_s, run.output_tokens) == (30.0, 20.0, 8)
    state.commit(2, [], [], {**shard, "started_at": 160.0, "committed_at": 170.0, "startup_s": 12.0})
    assert tally(state, [2], ShardsRun(), began=100.0).startup_s == 12.0, "an engine actor's own start wins"


def test_ray_s_engine_steps_are_each_engine_s_own_latest_count_summed_over_its_processes(tmp_path: Path) -> None:
    """As one node takes them from each worker's results: the engine's own count since start (not the step traces
    in the shards' metas), its latest per engine process (node and pid: a restarted actor's engine counts anew),
    summed over engines; none where no engine counts (the row then takes the traces' steps)."""
    from harness.batch.job.job import ShardsRun
    from harness.batch.job.state import JobState
    from harness.batch.scale.ray_job import tally

    state = JobState(tmp_path / "out")
    state.shards_dir.mkdir(parents=True)
    state.work_dir.mkdir(parents=True)
    shard = {"ok": 1, "failed": 0, "prompt_tokens": 1, "output_tokens": 4, "engine_s": 1.0, "engine_steps": 7}
    for i, (node, pid, count) in enumerate([("a", 11, 120), ("a", 11, 150), ("a", 12, 40), ("b", 11, 90),
                                            ("a", 11, 140)]):   # pid 11 on node a finished shard 4 before shard 1
        state.commit(i, [], [], {**shard, "engine_node": node, "engine_pid": pid, "engine_steps_since_start": count})
    run = tally(state, list(range(5)), ShardsRun())
    assert run.engine_steps == 150 + 40 + 90 and run.traced_steps == 5 * 7
    state.commit(5, [], [], {**shard, "engine_node": "a", "engine_pid": 13, "engine_steps_since_start": None})
    assert tally(state, [5], ShardsRun()).engine_steps is None, "an engine that counts no steps: no count"


def test_a_plugin_engine_s_package_outside_the_checkout_is_shipped_to_the_nodes(tmp_path: Path, monkeypatch) -> None:
    import engines

    package = tmp_path / "site" / "acme_engine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("TROUGHPUT_ENGINES", '{"acme": "acme_engine.unit:UNIT"}')
    engines.registry.cache_clear()
    try:
        env = runtime_env(_plan(tmp_path, engine="acme"))
        assert env["py_modules"] == [str(package.resolve())], "Ray ships the plugin with the job"
        assert "py_modules" not in runtime_env(_plan(tmp_path)), "a built-in engine travels in the working_dir"
    finally:
        monkeypatch.delenv("TROUGHPUT_ENGINES")
        engines.registry.cache_clear()


@pytest.mark.engine   # imports Ray Data (no cluster): the pipeline is built on a recording stand-in
def test_shards_are_converted_and_committed_no_further_ahead_than_the_engines_take_them(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """Each small-task slot is a worker process importing the tokenizer: the convert and commit stages run at
    most ``actors × in_flight`` tasks at once (unbounded, 8 shards at once starved a 2-core node's engine start)."""
    import ray
    from ray.data import ActorPoolStrategy, TaskPoolStrategy

    from harness.batch.job.shards import Index
    from harness.batch.job.feeding import most_held
    from harness.batch.scale.ray_job import pipeline

    calls: dict[str, dict] = {}

    class Recorder:
        def map_batches(self, fn, **kwargs):
            calls[getattr(fn, "__name__", str(fn))] = kwargs
            return self

    class Context:
        def get_node_id(self) -> str:
            return "node"

    monkeypatch.setattr(ray, "get_runtime_context", Context)
    monkeypatch.setattr(ray.data, "read_datasource", lambda *a, **k: Recorder())
    plan = _plan(tmp_path, in_flight=3)
    pipeline(plan, Index(8, {}), [0, 1, 2, 3], {**settings(_plan(tmp_path, ray={"actors": 2})), "gpus": 0})
    assert set(calls) == {"convert", "EngineStage", "commit"}
    for stage in ("convert", "commit"):
        assert isinstance(calls[stage]["compute"], TaskPoolStrategy) and calls[stage]["compute"].size == 2 * 3, stage
    assert isinstance(calls["EngineStage"]["compute"], ActorPoolStrategy)
    # room on each actor for the one-node bound of shards; its gate decides how many are in the engine
    assert calls["EngineStage"]["compute"].max_concurrent_calls_per_actor == most_held(2, 3) > 4 * 3  # small shards
    assert calls["EngineStage"]["fn_constructor_kwargs"]["feeding"] == {"in_flight": 3, "shard_size": 2}
