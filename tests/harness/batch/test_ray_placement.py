"""Placement groups of ``batch.ray.bundles`` are released at the end of each run of a job (an in-job tuning's phases
share one Ray session) and of the job: counted in Ray's own placement-group table, on the session's Ray head.

The driver is a child process (``python -m tests.harness.batch.test_ray_placement ...``): two runs of a job in one
session, as an in-job tuning's phases are, printing the groups alive after each and after the session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAKE_ENGINE, ROOT
from tests.harness.batch.conftest import numbered, read_jsonl
from tests.ray_head import RayHead


def _alive(known: set[str]) -> dict[str, int]:
    """Groups made since ``known`` was taken: how many, and how many are not removed."""
    from ray.util import placement_group_table

    table = placement_group_table()
    new = {k: v for k, v in table.items() if k not in known}
    return {"made": len(new), "alive": sum(v["state"] != "REMOVED" for v in new.values())}


def drive(address: str, path: str, out: str, results: str) -> None:
    """Two runs of one job in one session (shards {0, 1}, then {2, 3}); one JSON line of counts after each."""
    import ray

    from harness.batch.job.plan import Plan
    from harness.batch.job.shards import scan
    from harness.batch.job.state import JobState
    from harness.batch.scale.ray_job import run_ray, session
    from harness.core.models import resolve_model

    model = resolve_model({"name": "tiny", "path": ".cache/troughput/models/tiny", "build": "tiny"}, sys.executable)
    plan = Plan(input=path, format="openai_batch", output_dir=out, shard_size=2, engine=FAKE_ENGINE, model=model,
                knobs={"token_s": 0.01}, ordering={"name": "as_given"}, python=sys.executable, sampling="benchmark",
                results_dir=results, scale="ray",
                ray={"address": address, "actors": 1, "bundles": [{"CPU": 1}]})
    state = JobState(out)
    index = scan(Path(path), plan.format)
    plan.input_digest = index.digest
    state.adopt(plan)
    with session(plan) as cluster:
        known = set(ray.util.placement_group_table())
        for phase in ({0, 1}, {2, 3}):
            run = run_ray(plan, state, index, False, phase.__contains__, cluster)
            print(json.dumps({"phase": sorted(phase), "shards_run": run.shards_run, **_alive(known)}), flush=True)
    ray.init(address=address)   # the job is over: a new driver sees what is left of its groups
    try:
        print(json.dumps({"phase": "after the job", **_alive(known)}), flush=True)
    finally:
        ray.shutdown()


@pytest.mark.engine   # joins the session's Ray head and runs two Ray Data pipelines
@pytest.mark.xdist_group("ray")
def test_placement_groups_are_released_after_each_run_and_the_job(tmp_path: Path, ray_head: RayHead) -> None:
    path = numbered(tmp_path / "batch.jsonl", 8)
    proc = subprocess.run([sys.executable, "-m", "tests.harness.batch.test_ray_placement", ray_head.address,
                           str(path), str(tmp_path / "out"), str(tmp_path / "results")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=ray_head.driver_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [c["phase"] for c in counts] == [[0, 1], [2, 3], "after the job"], proc.stdout
    first, second, after = counts
    assert first["shards_run"] == second["shards_run"] == 2
    assert first["made"] >= 1 and second["made"] >= first["made"] + 1, "each run's actor got a group of its own"
    assert (first["alive"], second["alive"], after["alive"]) == (0, 0, 0), counts
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "shards" / "00000000" / "output.jsonl")]
    assert ids == ["req-0", "req-1"]


if __name__ == "__main__":
    drive(*sys.argv[1:5])
