"""A job's output folder: its plan, its committed shards, and the merged output.

::

    <output_dir>/plan.json                 the job (checked on every rerun)
    <output_dir>/shards/00000042/          a committed shard: output.jsonl, errors.jsonl, meta.json
    <output_dir>/work/                     scratch for shards in flight (never read back)
    <output_dir>/output.jsonl, errors.jsonl  all shards, in file order, once every shard is committed

A shard is committed by renaming a complete, fsynced folder into ``shards/``: it is there
whole or not at all, and a second commit of the same shard (two workers, a rerun racing an
orphan) finds it there and is dropped. ``kill -9`` at any moment loses only shards in flight.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from harness.batch.job.plan import Plan, describe_change
from harness.core.errors import TroughputError

OUTPUT, ERRORS, META = "output.jsonl", "errors.jsonl", "meta.json"


class JobState:
    """The output folder of one job."""

    def __init__(self, output_dir: str | os.PathLike):
        self.root = Path(output_dir)
        self.shards_dir = self.root / "shards"
        self.work_dir = self.root / "work"

    def adopt(self, plan: Plan) -> None:
        """Record ``plan`` in a new folder, or check that it is the folder's job (same input, split and config).

        A folder with no committed shard takes any plan: there is nothing to mix with.
        """
        path = self.root / "plan.json"
        if path.exists() and self.committed():
            before = _identity(json.loads(path.read_text()))
            now = plan.identity()
            changed = [k for k in {*now, *before} if before.get(k) != now.get(k)]
            if changed:
                raise TroughputError(
                    f"{self.root} holds {len(self.committed())} committed shards of a batch job with a different "
                    f"{', '.join(changed)} ({'; '.join(describe_change(k, before.get(k), now.get(k)) for k in changed)}); "
                    f"resuming would mix their answers with this job's: use another batch.output_dir, or delete "
                    f"this one to start over")
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        write_whole(path, plan.to_json())  # this invocation's settings (replicas, scale) for its tasks

    def committed(self) -> set[int]:
        """Indices of the committed shards."""
        if not self.shards_dir.is_dir():
            return set()
        return {int(p.name) for p in self.shards_dir.iterdir() if p.name.isdigit()}

    def scratch(self, index: int) -> Path:
        """A new folder for a shard in flight."""
        path = self.work_dir / f"{index:08d}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def commit(self, index: int, outputs: list[dict], errors: list[dict], meta: dict[str, Any]) -> bool:
        """Commit shard ``index``; ``False`` when it was already committed (this copy is dropped)."""
        tmp = self.work_dir / f".commit-{index:08d}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        for name, lines in ((OUTPUT, outputs), (ERRORS, errors)):
            _write_lines(tmp / name, lines)
        _write_lines(tmp / META, [meta])
        _fsync_dir(tmp)
        try:
            os.rename(tmp, self.shards_dir / f"{index:08d}")
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        _fsync_dir(self.shards_dir)
        return True

    def take(self, other: JobState, index: int) -> bool:
        """Commit ``other``'s committed shard ``index`` here by renaming it in; ``False`` if this job has it already."""
        try:
            os.rename(other.shards_dir / f"{index:08d}", self.shards_dir / f"{index:08d}")
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return False
        _fsync_dir(self.shards_dir)
        return True

    def meta(self, index: int) -> dict[str, Any]:
        return json.loads((self.shards_dir / f"{index:08d}" / META).read_text())

    def merge(self, shards: int) -> tuple[Path, Path]:
        """``output.jsonl`` and ``errors.jsonl`` from shards ``0 .. shards-1``, in order; all must be committed."""
        missing = sorted(set(range(shards)) - self.committed())
        if missing:
            raise TroughputError(f"{len(missing)} of {shards} shards are not committed yet (first: {missing[0]})")
        targets = []
        for name in (OUTPUT, ERRORS):
            target = self.root / name
            tmp = target.with_name(f".{name}.tmp")
            with open(tmp, "wb") as out:
                for index in range(shards):
                    with open(self.shards_dir / f"{index:08d}" / name, "rb") as part:
                        shutil.copyfileobj(part, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
            targets.append(target)
        shutil.rmtree(self.work_dir, ignore_errors=True)
        return targets[0], targets[1]


def _identity(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded plan's identity; fields an older plan.json lacks compare as their default."""
    return Plan(**{k: v for k, v in recorded.items() if k in Plan.__dataclass_fields__}).identity()


def _write_lines(path: Path, lines: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: a temporary file, fsynced, renamed over it, the folder fsynced."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
