"""What quality reads of a run: the fields of its spec (``harness.run.spec.RunSpec`` has them), never imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from harness.workloads import Workload


class RunSpec(Protocol):
    """A run's spec as quality sees it; ``reference.compute`` copies one with ``dataclasses.replace``."""

    engine: str
    model: dict[str, Any]
    workload: Workload
    knobs: dict[str, Any]
    python: str
    results_dir: Path
    labels: dict[str, Any]
    quality: dict[str, Any]
