"""The input file in shards: consecutive runs of ``shard_size`` records, read as a stream.

Shard ``i`` is records ``[i * size, (i + 1) * size)`` in file order (blank lines are no
records), so the same file and size always give the same shards, on any node and after
any crash. Only the shards asked for are parsed; the others are only counted.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.workloads.fields import RecordError
from harness.workloads.files import ID_RULES, parse_line, raw_lines, read_records

JSONL_FORMATS = ("openai_batch", "jsonl")
ID_FIELDS = {"openai_batch": "custom_id", "jsonl": "id", "sharegpt": "id"}


@dataclass
class Shard:
    """One shard: its index and its records as ``(place, number, parsed JSON or RecordError)``."""

    index: int
    records: list[tuple[str, int, Any]]


@dataclass
class Index:
    """What one pass over the file found: how many records, and which repeat an earlier record's id."""

    records: int
    duplicates: dict[int, int]  # record number -> number of the record that first used its id
    digest: str = ""            # "sha256:<hex>" of the whole file, bytes as read

    def shards(self, size: int) -> int:
        return -(-self.records // size)


def scan(path: Path, fmt: str) -> Index:
    """Count the records, find repeated ids and hash the whole file, in one pass holding 16 bytes per record.

    A record's id is its ``custom_id`` (OpenAI Batch) or ``id``, else the default id the
    workload loader would give it; records that are no JSON objects have none. The sha256
    of every byte read is the job's input identity: any edit, anywhere, changes it.
    """
    digests, numbers = array("Q"), array("Q")
    count = 0
    content = hashlib.sha256()
    for _, n, record in read_records(path, fmt, content):
        count += 1
        key = _id_key(fmt, n, record)
        if key is not None:
            digests.append(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little"))
            numbers.append(n)
    return Index(count, _repeats(np.frombuffer(digests, dtype=np.uint64), np.frombuffer(numbers, dtype=np.uint64)),
                 f"sha256:{content.hexdigest()}")


def _repeats(digests: np.ndarray, numbers: np.ndarray) -> dict[int, int]:
    if not len(digests):
        return {}
    order = np.argsort(digests, kind="stable")  # stable: within one digest, file order
    sorted_digests = digests[order]
    first_of_run = np.r_[True, sorted_digests[1:] != sorted_digests[:-1]]
    run_start = np.maximum.accumulate(np.where(first_of_run, np.arange(len(order)), 0))
    repeated = ~first_of_run
    return {int(numbers[order[i]]): int(numbers[order[run_start[i]]]) for i in np.flatnonzero(repeated)}


def _id_key(fmt: str, n: int, record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    value = record.get(ID_FIELDS[fmt])
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    prefix, _ = ID_RULES[fmt]
    return f"{prefix}-{n}" if prefix else None


def default_id(fmt: str, n: int) -> str:
    """The id of a record that gives none (``line-N``, ``sharegpt-N``)."""
    return f"{ID_RULES[fmt][0]}-{n}"


def iter_shards(path: Path, fmt: str, size: int, wanted: Callable[[int], bool]) -> Iterator[Shard]:
    """The shards ``wanted(index)`` accepts, in order; the others are skipped unparsed where the format allows."""
    batch: list[tuple[str, int, Any]] = []
    index = 0
    for where, n, record in _records(path, fmt, wanted, size):
        batch.append((where, n, record))
        if len(batch) == size:
            if wanted(index):
                yield Shard(index, batch)
            batch, index = [], index + 1
    if batch and wanted(index):
        yield Shard(index, batch)


def _records(path: Path, fmt: str, wanted: Callable[[int], bool], size: int) -> Iterator[tuple[str, int, Any]]:
    if fmt not in JSONL_FORMATS:
        yield from read_records(path, fmt)
        return
    for ordinal, (n, line) in enumerate(raw_lines(path)):
        if not wanted(ordinal // size):
            yield "", n, None  # counted, not parsed
        else:
            yield f"line {n}", n, line if isinstance(line, RecordError) else parse_line(line)
