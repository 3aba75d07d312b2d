"""The resolved job, as plain JSON: what every shard task needs, without Hydra."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


# batch.tune settings that change how the job runs, not what it answers
EXECUTION_ONLY = ("restart", "prune", "prune_margin", "prune_warmup")
# What must match when a job with committed shards is resumed: the input (path and a sha256 of every
# byte, from the scan), how it is split and read, and everything that shapes an answer.
IDENTITY = ("input", "input_digest", "format", "shard_size", "sampling", "default_max_tokens",
            "allow_remote_images", "engine", "model_name", "model_path", "model_revision", "knobs", "ordering", "tune")


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
    stall_timeout_s: float | None = 1800.0  # an engine still STARTING this long, with shards waiting, looks hung:
    #   its worker is killed (on Ray its actor ends, not restarted); None: never. A running engine is not watched
    #   (a request may rightly take longer; ``harness.batch.job.job._Runner._kill_stalled`` says why)
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
    # "sha256:<hex>" of the whole input, set from the scan (``harness.batch.job.shards.scan``)
    input_digest: str = ""
    model_revision: str | None = None  # ``model_revision(model)`` when the plan was built
    # in-job tuning settings and space (``harness.batch.tune.tuning``)
    tune: dict[str, Any] = field(default_factory=dict)
    phase: dict[str, Any] = field(default_factory=dict)  # which run of the job this is; recorded in each shard's meta
    job: str = ""  # the job's id when this plan is one phase of it (its knobs differ from the job's)
    served_model_names: list[str] = field(default_factory=list)  # more names a request's model may give (aliases)

    @property
    def model_name(self) -> str:
        return str(self.model.get("name"))

    @property
    def model_path(self) -> str | None:
        return self.model.get("path")

    def served_models(self) -> frozenset[str]:
        """The names a request's ``model`` may give: the model's name, its path (a hub id, as vLLM serves it by
        default) and ``served_model_names``; a request naming another is an error line (``convert_shard``)."""
        return frozenset(str(name) for name in (self.model_name, self.model_path, *self.served_model_names) if name)

    def identity(self) -> dict[str, Any]:
        """What must match on resume. Of the in-job tuning settings, how engines restart between runs and how
        trials are pruned do not shape an answer, so a job folder made before such a setting existed resumes; a
        job without tuning has none (so its id is the one it had before tuning existed)."""
        identity = {key: getattr(self, key) for key in IDENTITY}
        identity["tune"] = {k: v for k, v in self.tune.items() if k not in EXECUTION_ONLY}
        if not identity["tune"]:
            del identity["tune"]
        if self.served_model_names:  # which requests are refused; absent when none (ids of older jobs unchanged)
            identity["served_model_names"] = sorted(self.served_model_names)
        return identity

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls(**json.loads(text))


def describe_change(key: str, before: Any, now: Any) -> str:
    """One changed identity field, said so that the user sees what differs."""
    if key == "input_digest":
        if before and not str(before).startswith("sha256:"):
            return (f"input_digest: {before!r} was recorded by an older troughput from the file's size and its first "
                    f"and last MiB, which cannot be compared with the whole-file hash {now!r}")
        return f"the input file's contents (sha256 of every byte: {before} then, {now} now)"
    return f"{key}: {before!r} then, {now!r} now"


def model_revision(model: dict[str, Any]) -> str | None:
    """The model's revision: the one its config names (a hub model), else a digest of its local directory.

    The directory digest covers every file's name and size and the text of its small JSON
    files (config, tokenizer, generation config): cheap, and changed by any rebuild or swap
    of weights of another size; same-size weights rewritten in place are not seen.
    """
    if model.get("revision"):
        return str(model["revision"])
    root = Path(str(model.get("local_dir") or model.get("path") or ""))
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root)}\0{size}\0".encode())
        if path.suffix in (".json", ".jinja") and size < 1 << 20:
            digest.update(path.read_bytes())
    return f"local:{digest.hexdigest()[:16]}"
