"""``batch.scale=ray``: images given by local path are read by the read stage, on the driver's node, and travel
with the records; the convert stage (any node) never looks for the files. The stages' own functions, in order,
with the image files deleted between the read and the convert stage (no mocks; Ray imported, no cluster)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import chat, write_jsonl


def png(path: Path, color: tuple[int, int, int]) -> Path:
    from PIL import Image

    Image.new("RGB", (16, 16), color).save(path, format="PNG")
    return path


@pytest.mark.engine   # imports Ray Data (no cluster): the read and convert stages' functions
def test_local_images_travel_with_the_records_from_the_read_stage(tmp_path: Path) -> None:
    from harness.batch.job.plan import Plan
    from harness.batch.scale.ray_stages import convert, shard_source
    from harness.core.models import resolve_model

    (tmp_path / "pics").mkdir()
    red, blue = png(tmp_path / "pics" / "red.png", (200, 0, 0)), png(tmp_path / "pics" / "blue.png", (0, 0, 200))
    image = {"type": "image_url", "image_url": {"url": "pics/red.png"}}
    path = write_jsonl(tmp_path / "batch.jsonl", [
        chat("red", [{"type": "text", "text": "what colour?"}, image], max_tokens=2, model="tiny_vlm"),
        chat("blue", [{"type": "image_url", "image_url": {"url": str(blue)}}], max_tokens=2, model="tiny_vlm"),
        chat("gone", [{"type": "image_url", "image_url": {"url": "pics/never.png"}}], max_tokens=2, model="tiny_vlm"),
    ])
    model = resolve_model({"name": "tiny_vlm", "path": ".cache/troughput/models/tiny_vlm", "build": "tiny_vlm",
                           "image_token": "<image>"}, sys.executable)
    plan = Plan(input=str(path), format="openai_batch", output_dir=str(tmp_path / "out"), shard_size=3,
                engine=FAKE_ENGINE, model=model, knobs={}, ordering={"name": "as_given"}, python=sys.executable,
                sampling="benchmark", scale="ray")
    [task] = shard_source(str(path), "openai_batch", 3, [0]).get_read_tasks(1)
    [block] = list(task())
    red.unlink(), blue.unlink()   # read: from here on, no stage may look for the files
    batch = {name: np.array(block.column(name).to_pylist(), dtype=object) for name in block.column_names}
    out = convert(batch, plan.to_json(), {})
    [items] = [pickle.loads(b) for b in out["items"]]
    errors = {i.custom_id: i.error for i in items if i.error}
    assert set(errors) == {"gone"} and "pics/never.png' not found (on the input's node)" in errors["gone"], errors
    [requests] = [pickle.loads(b) for b in out["requests"]]
    [images] = [pickle.loads(b) for b in out["images"]]
    assert [r.id for r in requests] == ["red", "blue"]
    sent = [images[r.images[0]] for r in requests]
    assert sent[0] != sent[1] and all(data.startswith(b"\x89PNG") for data in sent), "each request its own image"
