"""Workloads: build one from its Hydra config (a generator or a user's file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from harness.errors import TroughputError
from harness.tokens import TextTokenizer, Vocabulary
from harness.workloads.base import Workload
from harness.workloads.synthetic import multimodal, prefix_heavy, unique

GENERATORS = {"unique": unique, "prefix_heavy": prefix_heavy, "multimodal": multimodal}


def build_workload(cfg: Mapping[str, Any], model: Mapping[str, Any], image_dir: Path) -> Workload:
    """The workload ``cfg`` describes, for the model at ``model["path"]`` (a local directory).

    Args:
        cfg: the ``workload`` config; ``generator`` is a name in ``GENERATORS`` or ``file``;
            an optional ``sample: {fraction, seed}`` keeps that seeded share of the requests
            (``Workload.sample``; the tuner's low-fidelity runs, reproducible from their command).
        model: the resolved ``model`` config (``local_dir`` holds its tokenizer).
        image_dir: where generated images are stored.
    """
    sample = cfg.get("sample")
    workload = _build(cfg, model, image_dir)
    if sample:
        return workload.sample(float(sample["fraction"]), seed=int(sample.get("seed", 0)))
    return workload


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
