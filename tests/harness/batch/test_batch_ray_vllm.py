"""``batch.scale=ray`` on vLLM-CPU with the tiny models, against the session's Ray head: OpenAI output,
a killed driver (the rerun resumes) whose rerun's engine actor is killed (Ray restarts it), vLLM failing
inside its living actor mid-job (``engines.faults``); every custom_id exactly once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from harness.batch.job.feeding import most_held
from harness.run.results import read_rows
from tests.ray_head import RayHead
from tests.harness.batch.conftest import (chat, completion, png_data_url, read_jsonl, troughput_batch,
                                          write_jsonl)

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("ray")]

PER_SHARD = 2
IN_FLIGHT = 1       # batch.in_flight: beyond it, shards enter the engine while few requests are unfinished ...
SEATS = 2           # the engine's max_num_seqs in the jobs that count shards in the engine (kill, fault) ...
MOST = most_held(PER_SHARD, IN_FLIGHT, SEATS)  # ... up to this many (4), which may finish together, so commit at once
SHARDS = 2 * MOST + 2   # after a kill at the driver's first commit, more than MOST are left for the rerun


def ray_args(head: RayHead, path: Path, out: Path, *more: str) -> list[str]:
    return [f"batch.input={path}", f"batch.output_dir={out}", "batch.scale=ray", f"batch.ray.address={head.address}",
            "batch.ray.actors=1", f"batch.shard_size={PER_SHARD}", f"batch.in_flight={IN_FLIGHT}",
            "batch.served_model_names=[tiny]", *more]   # the requests name "tiny"; the VLM jobs answer them too


def long_file(path: Path, shards: int) -> Path:
    """Shards that take seconds each (exact 400-token outputs): a kill at a commit lands mid-job."""
    return write_jsonl(path, [completion(f"long-{i}", f"prompt {i}", max_tokens=400)
                              for i in range(shards * PER_SHARD)])


def committed(out: Path) -> list[dict]:
    return [read_jsonl(p)[0] for p in sorted((out / "shards").glob("*/meta.json"))]


def wait_for_commits(out: Path, proc, count: int, timeout_s: float = 400) -> list[dict]:
    """The committed shards' metas once ``count`` are there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        metas = committed(out)
        if len(metas) >= count:
            return metas
        time.sleep(0.2)
    raise AssertionError(f"no {count} shard(s) committed (driver exit code {proc.poll()})")


def assert_each_once(out: Path, ids: list[str]) -> None:
    assert [o["custom_id"] for o in read_jsonl(out / "output.jsonl")] == ids
    assert read_jsonl(out / "errors.jsonl") == []


def test_openai_batch_file_on_ray_data_with_the_tiny_vlm(tmp_path: Path, ray_head: RayHead) -> None:
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    path = write_jsonl(tmp_path / "batch.jsonl", [
        chat("chat-✓", "Say hello in French.", max_tokens=6, temperature=0.7, seed=1),
        completion("completion-1", "Once upon a time", max_tokens=5, temperature=0),
        chat("image", [{"type": "text", "text": "What is in this image?"},
                       {"type": "image_url", "image_url": {"url": png_data_url()}}], max_tokens=4),
        '{"custom_id": "broken", "method": "POST"',
    ])
    out = tmp_path / "out"
    proc = troughput_batch(tmp_path, "model=tiny_vlm", *ray_args(ray_head, path, out), env=ray_head.driver_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = {o["custom_id"]: o for o in read_jsonl(out / "output.jsonl")}
    assert list(outputs) == ["chat-✓", "completion-1", "image"]
    for line in outputs.values():
        body = line["response"]["body"]
        typed = (ChatCompletion if body["object"] == "chat.completion" else Completion).model_validate(body)
        assert typed.usage.completion_tokens >= 1 and line["response"]["status_code"] == 200
    assert outputs["completion-1"]["response"]["body"]["object"] == "text_completion"
    assert outputs["image"]["response"]["body"]["usage"]["prompt_tokens"] > 64, "the image's tokens are in the prompt"
    [error] = read_jsonl(out / "errors.jsonl")
    assert f"{path}, line 4: invalid JSON" in error["response"]["body"]["error"]["message"]
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "ok" and row["scale"] == "ray" and (row["requests_ok"], row["requests_failed"]) == (3, 1)
    assert row["startup_s"] > 0 and row["output_tok_s"] > 0
    assert all("runtime_resources" in m["code_dir"] for m in committed(out)), "code reaches actors by runtime_env"


def test_a_killed_driver_s_rerun_resumes_and_its_killed_engine_actor_is_restarted(tmp_path: Path,
                                                                                  ray_head: RayHead) -> None:
    """One job killed twice: its driver after the first commit (the rerun resumes from the shards it left),
    then the rerun's engine actor after the rerun's first commit (Ray restarts it, the job finishes)."""
    path, out = long_file(tmp_path / "long.jsonl", SHARDS), tmp_path / "out"
    args = ray_args(ray_head, path, out, "batch.sampling=benchmark", f"+engine.knobs.max_num_seqs={SEATS}")
    proc = troughput_batch(tmp_path, *args, env=ray_head.driver_env, popen=True)
    try:
        wait_for_commits(out, proc, 1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(3)   # Ray ends the dead driver's job: its actors and tasks
    before = {m["index"] for m in committed(out)}
    assert 1 <= len(before) < SHARDS - MOST and not (out / "output.jsonl").exists()
    rerun = troughput_batch(tmp_path, *args, env=ray_head.driver_env, popen=True)
    try:
        [first, *_] = [m for m in wait_for_commits(out, rerun, len(before) + 1) if m["index"] not in before]
        os.kill(first["engine_pid"], signal.SIGKILL)
        assert rerun.wait(timeout=600) == 0
    finally:
        rerun.kill()
    assert_each_once(out, [f"long-{i}" for i in range(SHARDS * PER_SHARD)])
    pids = {m["engine_pid"] for m in committed(out) if m["index"] not in before}
    assert len(pids) == 2 and first["engine_pid"] in pids, "the rerun's later shards ran on the restarted actor"
    [row] = read_rows(tmp_path / "results", "batch")   # the killed driver wrote none
    assert row["status"] == "ok" and row["shards_before"] == len(before) and row["shards_run"] == SHARDS - len(before)


def test_vllm_failing_mid_job_inside_its_actor_is_restarted_and_answers_every_custom_id_once(
        tmp_path: Path, ray_head: RayHead) -> None:
    """The real vLLM engine raises at its 21st engine step (the test hook ``TROUGHPUT_FAULT_AFTER_STEPS``,
    ``engines.faults``), requests unfinished in it and its actor's process alive; the restarted actor's engine
    (the fault file counts one failure) runs on. 16 shards of 2 requests of 8 tokens, at most 4 shards in the
    engine at once (``in_flight=1``, 2 seats: 2 shards' worth queued): the first shard is done by step 8 or so, the
    job takes 32 steps or more.
    Before, the actor published the failure to its calls and then stopped vLLM (seconds) before exiting: a call
    waiting at the gate saw it and raised, and Ray Data, which does not retry Python errors, ended the job
    (3 of 16 shards committed, exit 1); the scripted engine stops at once, so its test never saw that."""
    count = 16 * PER_SHARD
    path = write_jsonl(tmp_path / "batch.jsonl", [completion(f"req-{i}", f"prompt {i}", max_tokens=8)
                                                  for i in range(count)])
    out, faults = tmp_path / "out", tmp_path / "faults"
    proc = troughput_batch(tmp_path, *ray_args(ray_head, path, out, "batch.sampling=benchmark",
                                               f"+engine.knobs.max_num_seqs={SEATS}",
                                               "+engine.env.TROUGHPUT_FAULT_AFTER_STEPS=20",
                                               f"+engine.env.TROUGHPUT_FAULT_FILE={faults}"),
                           env=ray_head.driver_env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert faults.read_text() == "1", "one engine failed, its restart did not"
    assert sorted(o["custom_id"] for o in read_jsonl(out / "output.jsonl")) == sorted(f"req-{i}" for i in range(count))
    assert read_jsonl(out / "errors.jsonl") == []
    metas = committed(out)
    assert len({m["engine_pid"] for m in metas}) == 2, "shards committed by the failed engine's actor and its restart"
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "ok" and (row["requests_ok"], row["requests_failed"]) == (count, 0)
    assert row["output_tokens"] == 8 * count


def test_engine_ray_runs_ray_data_llm_s_processor_as_the_engine_stage(tmp_path: Path, ray_head: RayHead) -> None:
    path = write_jsonl(tmp_path / "batch.jsonl", [
        chat("chat-1", "Say hello.", max_tokens=5, temperature=0),
        completion("completion-1", "Once upon a time", max_tokens=4),
        chat("image", [{"type": "image_url", "image_url": {"url": png_data_url()}}], max_tokens=4),
        completion("completion-2", "The capital of France is", max_tokens=3),
    ])
    out = tmp_path / "out"
    proc = troughput_batch(tmp_path, "engine=ray", "model=tiny_vlm", *ray_args(ray_head, path, out), env=ray_head.driver_env,
                           timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = {o["custom_id"]: o for o in read_jsonl(out / "output.jsonl")}
    assert list(outputs) == ["chat-1", "completion-1", "completion-2"]
    for cid, cap in (("chat-1", 5), ("completion-1", 4), ("completion-2", 3)):
        assert 1 <= outputs[cid]["response"]["body"]["usage"]["completion_tokens"] <= cap, cid
    [error] = read_jsonl(out / "errors.jsonl")
    assert error["custom_id"] == "image" and "engine=vllm" in error["response"]["body"]["error"]["message"]
    assert {m.get("engine") for m in committed(out)} == {"ray.data.llm"}
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "ok" and (row["requests_ok"], row["requests_failed"]) == (3, 1)
