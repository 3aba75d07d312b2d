"""The results table: one JSON file per run, written atomically, read back as one DataFrame.

Files are never rewritten: a run id is new for every run, a file appears whole
(``os.replace`` of a fsynced temporary in the same directory) or not at all, so
many writers on a shared filesystem and killed processes are both safe.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
RUNS_DIR = "runs"
DECISIONS_DIR = "decisions"
BATCH_DIR = "batch"  # troughput-batch's rows (harness.batch.job.row)


def new_run_id() -> str:
    """Sortable by time, unique across hosts: ``YYYYmmddTHHMMSS-<12 hex>``."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


def write_row(results_dir: str | os.PathLike, row: dict[str, Any], kind: str = RUNS_DIR,
              id_key: str = "run_id") -> Path:
    """Write one row as ``<results_dir>/<kind>/<row[id_key]>.json``; refuse to overwrite.

    ``kind`` names the table: ``runs`` (the default) or ``decisions``, whose rows are keyed by
    ``decision_id``.
    """
    directory = Path(results_dir) / kind
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{row[id_key]}.json"
    if target.exists():
        raise FileExistsError(f"{target} exists: results are never rewritten")
    fd, tmp = tempfile.mkstemp(prefix=f".{row[id_key]}-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"schema_version": SCHEMA_VERSION, **row}, f, default=_jsonable, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, target)  # fails if another writer got there first, unlike os.replace
    finally:
        os.unlink(tmp)
    return target


def read_rows(results_dir: str | os.PathLike, kind: str = RUNS_DIR) -> list[dict[str, Any]]:
    """All rows of one table (``runs`` by default), oldest first; unreadable files are skipped with a warning."""
    import logging

    rows = []
    for path in sorted((Path(results_dir) / kind).glob("*.json")):
        try:
            rows.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            logging.getLogger(__name__).warning("skipping unreadable results file %s: %s", path, e)
    return rows


def read_results(results_dir: str | os.PathLike = "results", kind: str = RUNS_DIR):
    """The whole results table as a pandas DataFrame (one row per run, or per decision)."""
    import pandas as pd

    return pd.DataFrame.from_records(read_rows(results_dir, kind))


def prefixed(prefix: str, value: Any) -> dict[str, Any]:
    """Nested mappings to dotted keys: ``prefixed("knob", {"a": {"b": 1}}) == {"knob.a.b": 1}``."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(prefixed(f"{prefix}.{key}" if prefix else str(key), inner))
        return flat
    return {prefix: value}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
