"""The resolved job, as plain JSON: what every shard task needs, without Hydra."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import TroughputError

IDENTITY = ("input", "input_digest", "format", "shard_size", "sampling", "default_max_tokens",
            "engine", "model_name", "knobs", "ordering")  # must match when a job is resumed


@dataclass
class Plan:
    """A batch job, resolved: the input, the engine config, and how it is split and run."""

    input: str
    format: str
    output_dir: str
    shard_size: int
    engine: str
    model: dict[str, Any]
    knobs: dict[str, Any]
    ordering: dict[str, Any]
    python: str
    env: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    device_kind: str = "cpu"
    in_flight: int = 2
    sampling: str = "as_given"
    default_max_tokens: int | None = 256
    allow_remote_images: bool = False
    max_model_len: int | None = None
    results_dir: str = "results"
    source: dict[str, Any] = field(default_factory=lambda: {"kind": "overrides"})
    labels: dict[str, Any] = field(default_factory=dict)
    scale: str = "local"                                   # local | ray | slurm
    ray: dict[str, Any] = field(default_factory=dict)      # address, actors, num_cpus, num_gpus
    slurm: dict[str, Any] = field(default_factory=dict)    # tasks, cluster, and submitit's parameters
    input_digest: str = ""

    def __post_init__(self) -> None:
        if not self.input_digest:
            self.input_digest = input_digest(Path(self.input))

    @property
    def model_name(self) -> str:
        return str(self.model.get("name"))

    def identity(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in IDENTITY}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls(**json.loads(text))


def input_digest(path: Path) -> str:
    """Size and a sha256 of the first and last MiB: changes when the file's records change, cheap on huge files."""
    try:
        size = path.stat().st_size
        digest = hashlib.sha256(str(size).encode())
        with path.open("rb") as f:
            digest.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(size - (1 << 20))
                digest.update(f.read())
    except OSError as e:
        raise TroughputError(f"batch input {path}: {e.strerror}") from None
    return f"{size}:{digest.hexdigest()[:16]}"
