"""``troughput-batch batch.scale=ray`` on the scripted engine, against the session's Ray head (``ray start --head``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.batch.plan import Plan
from harness.batch.ray_job import engine_resources, settings
from harness.errors import TroughputError
from harness.results import read_rows
from tests.ray_head import RayHead
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import numbered, read_jsonl, troughput_batch


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


def _plan(tmp_path: Path, **fields) -> Plan:
    return Plan(input=str(tmp_path / "in.jsonl"), format="openai_batch", output_dir=str(tmp_path / "out"),
                shard_size=2, engine="vllm", model={"name": "tiny"}, knobs={}, ordering={}, python="python",
                input_digest="-", scale="ray", **fields)


@pytest.mark.parametrize(("ray", "named"), [({"actors": 0}, "batch.ray.actors"),
                                             ({"num_gpus": -1}, "batch.ray.num_gpus"),
                                             ({"bundles": [{}]}, "batch.ray.bundles")])
def test_ray_settings_are_checked_before_joining(tmp_path: Path, ray: dict, named: str) -> None:
    with pytest.raises(TroughputError, match=named):
        settings(_plan(tmp_path, ray=ray))


def test_bundles_give_each_engine_actor_a_placement_group() -> None:
    resources = engine_resources({"bundles": [{"GPU": 1, "CPU": 1}] * 2, "num_cpus": 1, "num_gpus": 1})
    assert (resources["num_cpus"], resources["num_gpus"]) == (0, 0) and callable(resources["ray_remote_args_fn"])
    assert engine_resources({"num_cpus": 2, "num_gpus": 1}) == {"num_cpus": 2.0, "num_gpus": 1.0}
