"""This node's part of a batch job: the job's scanned index and the engines that run its shards here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.batch.job.plan import Plan
from harness.batch.job.shards import Index
from harness.batch.job.state import JobState
from harness.batch.scale.pool import LocalPool


def make_pool(plan: Plan, state: JobState, run_id: str, slots: int | None = None) -> Any:
    """The engines this node drives: local batch workers, ``slots`` of them (default: the plan's replicas)."""
    return LocalPool(plan, state.work_dir / run_id, Path(plan.results_dir) / "logs", slots)


def load_index(state: JobState) -> Index:
    data = json.loads((state.root / "index.json").read_text())
    return Index(data["records"], {int(k): v for k, v in data["duplicates"].items()}, data.get("digest", ""))
