"""``troughput-batch`` on the CPU default (vLLM, the tiny VLM): an OpenAI Batch file as a user writes one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.run.results import read_rows
from tests.harness.batch.conftest import chat, completion, png_data_url, read_jsonl, troughput_batch, write_jsonl

pytestmark = pytest.mark.engine

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def showcase(path: Path) -> Path:
    """Chat and completions, unicode custom_ids, content parts, no max_tokens, a data: URL image, a JSON schema."""
    return write_jsonl(path, [
        chat("chat-ünïcode-✓", "Say hello in French.", max_tokens=6, temperature=0.7, top_p=0.9, seed=1),
        completion("补全-1", "Once upon a time", max_tokens=5, temperature=0),
        chat("parts-🙂", [{"type": "text", "text": "Describe"}, {"type": "text", "text": "briefly."}],
             max_completion_tokens=4, stop=["\n"]),
        completion("no-max-tokens", "The capital of France is", temperature=0),
        chat("image-data-url", [{"type": "text", "text": "What is in this image?"},
                                {"type": "image_url", "image_url": {"url": png_data_url()}}], max_tokens=4),
        chat("json-schema", "Answer with JSON.", max_tokens=8,
             response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}),
        chat("remote-image", [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
             max_tokens=4),
    ])


def test_openai_batch_file_on_the_tiny_vlm(tmp_path: Path) -> None:
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    path = showcase(tmp_path / "batch.jsonl")
    out = tmp_path / "out"
    proc = troughput_batch(tmp_path, "model=tiny_vlm", f"batch.input={path}", f"batch.output_dir={out}",
                           "batch.shard_size=3", "batch.default_max_tokens=12",
                           "batch.served_model_names=[tiny]")   # the requests name "tiny" (conftest's chat)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = {o["custom_id"]: o for o in read_jsonl(out / "output.jsonl")}
    errors = {e["custom_id"]: e for e in read_jsonl(out / "errors.jsonl")}
    assert list(outputs) == ["chat-ünïcode-✓", "补全-1", "parts-🙂", "no-max-tokens", "image-data-url", "json-schema"]
    assert list(errors) == ["remote-image"]
    assert "line 7" in errors["remote-image"]["response"]["body"]["error"]["message"]
    assert "batch.allow_remote_images=true" in errors["remote-image"]["response"]["body"]["error"]["message"]
    for cid, line in outputs.items():
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"].startswith("req_")
        body = line["response"]["body"]
        typed = (ChatCompletion if body["object"] == "chat.completion" else Completion).model_validate(body)
        text = typed.choices[0].message.content if body["object"] == "chat.completion" else typed.choices[0].text
        assert isinstance(text, str) and typed.usage.completion_tokens >= 1, cid
    assert outputs["补全-1"]["response"]["body"]["object"] == "text_completion"
    assert outputs["no-max-tokens"]["response"]["body"]["usage"]["completion_tokens"] <= 12
    image = outputs["image-data-url"]["response"]["body"]["usage"]["prompt_tokens"]
    assert image > 64, "the image's tokens are in the prompt"
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["status"] == "ok" and (row["requests_ok"], row["requests_failed"]) == (6, 1)
    (tmp_path / "shown.json").write_text(json.dumps({"outputs": outputs, "errors": errors}, ensure_ascii=False))


def test_vllm_is_fed_the_next_shards_while_the_first_generates(tmp_path: Path) -> None:
    """Shards 0-2 reach the running engine together (three in flight): no idle wait before shard 1, and it
    waits in the engine behind shard 0 (its span is longer than the engine time it accounts for)."""
    path = write_jsonl(tmp_path / "batch.jsonl", [completion(f"c{i}", f"count {i}", max_tokens=4 + 7 * (i % 5))
                                                   for i in range(40)])
    out = tmp_path / "out"
    proc = troughput_batch(tmp_path, f"batch.input={path}", f"batch.output_dir={out}", "batch.shard_size=8",
                           "batch.sampling=benchmark")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lengths = {o["custom_id"]: o["response"]["body"]["usage"]["completion_tokens"]
               for o in read_jsonl(out / "output.jsonl")}
    assert lengths == {f"c{i}": 4 + 7 * (i % 5) for i in range(40)}, "exact lengths, every request once"
    metas = [json.loads((out / "shards" / f"{i:08d}" / "meta.json").read_text()) for i in range(5)]
    assert metas[1]["idle_before_s"] == 0.0 and metas[1]["span_s"] > metas[1]["engine_s"]
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["engine_s"] == pytest.approx(sum(m["engine_s"] for m in metas))
    assert row["engine_s"] <= row["generation_s"] + 0.5, "engine-busy time never exceeds the window"
    assert row["engine_steps"] >= max(lengths.values()), "vLLM's steps are counted"
