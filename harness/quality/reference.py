"""The reference config's outputs: computed once per (engine, model, workload, reference config), then reused.

The reference is the engine's default config on this model and hardware: only the
hardware and model knob layers (``quality.reference_knobs``, set by ``harness.run.spec``),
one replica, ``as_given`` order. Its greedy outputs are stored under
``<results_dir>/references/<key>.jsonl`` (written once, atomically; never rewritten) beside
``<key>.json`` saying what they are. The reference run writes a results row of its own
(label ``quality_role: reference``), like any other run.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from harness.quality.subject import RunSpec


def key(spec: RunSpec) -> str:
    """``<engine>-<workload fingerprint>-<hash of model, interpreter and reference knobs>``."""
    what = [spec.engine, spec.model.get("path"), spec.python, spec.quality.get("reference_knobs") or {}]
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{spec.engine}-{spec.workload.fingerprint}-{digest}"


def load(spec: RunSpec) -> dict[str, list[int]] | None:
    """The stored reference outputs (id -> token ids), or ``None`` when there are none yet."""
    path = Path(spec.results_dir) / "references" / f"{key(spec)}.jsonl"
    if not path.exists():
        return None
    with open(path) as f:
        return {r["id"]: r["output_token_ids"] for r in map(json.loads, f)}


def compute(spec: RunSpec, for_run: str,
            execute: Callable[..., dict[str, Any]]) -> tuple[dict[str, list[int]] | None, str]:
    """Run the reference config with ``execute`` (the runner's) and store its outputs.

    Returns them (``None`` on failure) and the reference's run id or error.
    """
    reference_spec = replace(
        spec, knobs=dict(spec.quality.get("reference_knobs") or {}), replicas=1, ordering={"name": "as_given"},
        save_outputs=True, quality={},
        labels={**spec.labels, "quality_role": "reference", "quality_for": for_run,
                "command": f"(the quality reference of run {for_run}: its command without the engine's own "
                           f"knobs, one replica, ordering=as_given) {spec.labels.get('command', '')}"})
    row = execute(reference_spec, progress=False)
    if row["status"] != "ok":
        return None, f"reference run {row['run_id']} {row['status']}: {row['error'].splitlines()[0] if row['error'] else ''}"
    outputs = Path(spec.results_dir) / "outputs" / f"{row['run_id']}.jsonl"
    store(spec, outputs.read_text(), row["run_id"])
    return load(spec), row["run_id"]


def store(spec: RunSpec, outputs_jsonl: str, run_id: str) -> None:
    """Write the reference's outputs and its description once; an existing reference is kept."""
    folder = Path(spec.results_dir) / "references"
    folder.mkdir(parents=True, exist_ok=True)
    name = key(spec)
    if (folder / f"{name}.jsonl").exists():
        return
    about = {"engine": spec.engine, "model": spec.model.get("name"), "model_path": spec.model.get("path"),
             "workload": spec.workload.name, "workload_fingerprint": spec.workload.fingerprint,
             "knobs": spec.quality.get("reference_knobs") or {}, "run_id": run_id}
    for suffix, text in ((".json", json.dumps(about, indent=1)), (".jsonl", outputs_jsonl)):
        tmp = folder / f"{name}{suffix}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / f"{name}{suffix}")


def describe(spec: RunSpec) -> dict[str, Any]:
    """What the row says about its reference: the key and the reference knobs."""
    return {"quality.reference": key(spec),
            "quality.reference_knobs": json.dumps(spec.quality.get("reference_knobs") or {}, sort_keys=True)}
