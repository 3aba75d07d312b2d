"""Workloads: build one from its Hydra config (a generator or a user's file)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from engines.decoding import check_constraint
from harness.core.errors import TroughputError
from harness.core.tokens import TextTokenizer, Vocabulary
from harness.workloads.base import Workload
from harness.workloads.synthetic import multimodal, prefix_heavy, unique

GENERATORS = {"unique": unique, "prefix_heavy": prefix_heavy, "multimodal": multimodal}


def build_workload(cfg: Mapping[str, Any], model: Mapping[str, Any], image_dir: Path) -> Workload:
    """The workload ``cfg`` describes, for the model at ``model["path"]`` (a local directory).

    Args:
        cfg: the ``workload`` config; ``generator`` is a name in ``GENERATORS`` or ``file``;
            an optional ``sample: {fraction, seed}`` keeps that seeded share of the requests
            (``Workload.sample``; the tuner's low-fidelity runs, reproducible from their command);
            an optional ``constraint: {kind, value}`` (``engines.decoding.check_constraint``)
            constrains every request that has none of its own: a structured-output job.
        model: the resolved ``model`` config (``local_dir`` holds its tokenizer).
        image_dir: where generated images are stored.
    """
    sample = cfg.get("sample")
    workload = _build(cfg, model, image_dir)
    if cfg.get("constraint"):
        workload = constrained(workload, cfg["constraint"])
    if sample:
        return workload.sample(float(sample["fraction"]), seed=int(sample.get("seed", 0)))
    return workload


def constrained(workload: Workload, constraint: Mapping[str, Any]) -> Workload:
    """``workload`` with ``constraint`` on every request that has none of its own."""
    try:
        checked = check_constraint(dict(constraint))
    except ValueError as e:
        raise TroughputError(f"workload {workload.name!r}: constraint: {e}") from None
    requests = [r if r.constraint else replace(r, constraint=checked) for r in workload.requests]
    return Workload(workload.name, requests, workload.groups, dict(workload.info), dict(workload.expected))


def _build(cfg: Mapping[str, Any], model: Mapping[str, Any], image_dir: Path) -> Workload:
    generator = cfg.get("generator")
    model_dir = Path(model["local_dir"])
    if generator == "file":
        from harness.workloads.files import from_file

        return from_file(cfg, TextTokenizer(model_dir))
    if generator not in GENERATORS:
        raise TroughputError(f"workload {cfg.get('name')!r}: unknown generator {generator!r}; "
                             f"known: {', '.join([*GENERATORS, 'file'])}")
    return GENERATORS[generator](cfg, Vocabulary(model_dir), model=model, image_dir=image_dir)


__all__ = ["GENERATORS", "Workload", "build_workload"]
