"""Workloads from users' own files: OpenAI Batch API JSONL, ShareGPT JSON, or plain JSONL.

Records are read one at a time (``read_records``) and converted one at a time
(``harness.workloads.records``). Malformed input raises ``TroughputError`` naming the
file, the place (``line N``, 1-based, in JSONL; ``record N``, the 0-based list index, in
ShareGPT) and the fault.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from engines.base import Request
from harness.core.errors import TroughputError
from harness.workloads.base import Workload
from harness.workloads.detect import detect_format
from harness.workloads.fields import RecordError, kind
from harness.workloads.records import (CHAT_URL, COMPLETIONS_URL, FileRecord, Options,  # noqa: F401 - re-exported
                                       TextTokenizerLike, convert)

Records = Iterator[tuple[str, int, Any]]  # (place for messages, line number or index, parsed JSON or a RecordError)


def from_file(cfg: Mapping[str, Any], tokenizer: TextTokenizerLike) -> Workload:
    """Read ``cfg["path"]`` (``format``: openai_batch, sharegpt, jsonl or auto) into a workload.

    ``cfg["sampling"]``: ``benchmark`` (default: greedy, exact lengths, constraints kept) or
    ``as_given`` (each request's own sampling and constraint, EOS on).
    """
    name = cfg["name"]
    path, fmt = source(cfg)
    try:
        options = Options(_config_int(cfg, "default_max_tokens"), str(cfg.get("sampling") or "benchmark"))
    except ValueError as e:
        raise TroughputError(f"workload {name!r}: {e}") from None
    requests, skipped, expected = _collect(path, fmt, tokenizer, options, _config_int(cfg, "max_requests"))
    if not requests:
        raise TroughputError(f"workload {name!r}: {path} holds no usable requests ({skipped} records skipped)")
    return Workload(name, requests, info={"source_file": str(path), "source_format": fmt, "skipped_records": skipped},
                    expected=expected)


def source(cfg: Mapping[str, Any]) -> tuple[Path, str]:
    """The file ``cfg["path"]`` names (it must exist) and its format (``auto``: ``harness.workloads.detect``,
    from the whole file; ``cfg["format_setting"]``, the config key named in its errors)."""
    path = Path(str(cfg["path"])).expanduser()
    if not path.is_file():
        raise TroughputError(f"workload {cfg['name']!r}: file {path} not found")
    fmt = str(cfg.get("format") or "auto")
    fmt = detect_format(path, str(cfg.get("format_setting") or "workload.format")) if fmt == "auto" else fmt
    if fmt not in READERS:
        raise TroughputError(f"workload {cfg['name']!r}: unknown format {fmt!r}; use one of {', '.join(READERS)} or auto")
    return path, fmt


def _config_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise TroughputError(f"workload {cfg['name']!r}: {key} must be a positive integer, got {value!r}")
    return value


def _collect(path: Path, fmt: str, tok: TextTokenizerLike, options: Options,
             limit: int | None) -> tuple[list[Request], int, dict[str, str]]:
    """Convert records until ``limit`` requests; return them, the number of skipped records and the expected answers."""
    ids = RequestIds(fmt)
    requests: list[Request] = []
    expected: dict[str, str] = {}
    skipped = 0
    for where, n, record in read_records(path, fmt):
        try:
            if isinstance(record, RecordError):
                raise record
            converted = convert(fmt, record, tok, options)
            if converted is None:
                skipped += 1
                continue
            requests.append(converted.request(ids.assign(converted, n, where)))
            if converted.expected is not None:
                expected[requests[-1].id] = converted.expected
        except RecordError as e:
            raise TroughputError(f"{path}, {where}: {e}") from None
        if limit is not None and len(requests) >= limit:
            break
    return requests, skipped, expected


class RequestIds:
    """Request ids for one file: the record's own, else ``<prefix>-<n>``; a clash is an error or renamed."""

    def __init__(self, fmt: str):
        self.prefix, self.rename = ID_RULES[fmt]
        self.seen: dict[str, str] = {}  # id -> where it was first used

    def assign(self, converted: FileRecord, n: int, where: str) -> str:
        rid = base = converted.id if converted.id is not None else f"{self.prefix}-{n}"
        if rid in self.seen and not self.rename:
            raise RecordError(f"duplicate id {rid!r} (first used on {self.seen[rid]})")
        k = 2
        while rid in self.seen:  # a clashing id becomes the first unused of id-2, id-3, ...
            rid, k = f"{base}-{k}", k + 1
        self.seen[rid] = where
        return rid


def read_records(path: Path, fmt: str, digest: Any = None) -> Records:
    """``(place, number, record)`` for each record of ``path``; a line that is no JSON (or no UTF-8) comes as a
    ``RecordError`` in place of the record. ``digest`` (a ``hashlib`` object), where given, is fed every byte of
    the file as it is read, so one pass both parses and hashes the whole file."""
    return READERS[fmt](path, digest)


def _json_lines(path: Path, digest: Any = None) -> Records:
    """Each non-blank line parsed as JSON, with its 1-based line number, read one line at a time."""
    for n, line in raw_lines(path, digest):
        yield f"line {n}", n, line if isinstance(line, RecordError) else parse_line(line)


class _Hashing(io.RawIOBase):
    """A binary file that feeds ``digest`` every byte read from it."""

    def __init__(self, raw: Any, digest: Any):
        self.raw, self.digest = raw, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)
        if n:
            self.digest.update(memoryview(buffer)[:n])
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _open_binary(path: Path, digest: Any = None) -> Any:
    f = path.open("rb")
    return f if digest is None else io.BufferedReader(_Hashing(f, digest), 1 << 20)


def raw_lines(path: Path, digest: Any = None) -> Iterator[tuple[int, str | RecordError]]:
    """``(line number, text)`` for each non-blank line, split on newlines and decoded one by one.

    A line that is not UTF-8 comes as a ``RecordError`` in place of its text, named exactly.
    """
    with _open_binary(path, digest) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                yield n, RecordError(f"not UTF-8 text ({e.reason} at byte {e.start})")
                continue
            if line.strip():
                yield n, line


def parse_line(line: str) -> Any:
    """One JSONL line parsed, or a ``RecordError`` (returned, not raised) saying why it is no JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        return RecordError(f"invalid JSON ({e.msg}, column {e.colno})")


def _json_list(path: Path, digest: Any = None, chunk_chars: int = 1 << 20) -> Records:
    """The items of a JSON list, with their 0-based index, decoded one item at a time (bounded memory)."""
    with io.TextIOWrapper(_open_binary(path, digest), encoding="utf-8-sig") as f:
        yield from _json_items(path, f, chunk_chars)
        while digest is not None and f.buffer.read(chunk_chars):  # the bytes after the list, into the digest
            pass


def _json_items(path: Path, f: Any, chunk_chars: int) -> Records:
    decoder = json.JSONDecoder()
    buffer, pos = "", 0
    lines_before, column_before = 0, 0  # where the buffer starts: newlines dropped, characters since the last

    def fill() -> bool:
        nonlocal buffer, lines_before, column_before, pos
        try:
            more = f.read(chunk_chars)
        except UnicodeDecodeError as e:
            raise TroughputError(f"{path}: not UTF-8 text ({e.reason})") from None
        if not more:
            return False  # the buffer stays as it is, so error positions still point into it
        dropped, last = buffer.count("\n", 0, pos), buffer.rfind("\n", 0, pos)
        lines_before += dropped
        column_before = pos - last - 1 if dropped else column_before + pos
        buffer, pos = buffer[pos:] + more, 0
        return True

    def skip_space() -> str:
        nonlocal pos
        while True:
            while pos < len(buffer) and buffer[pos] in " \t\r\n":
                pos += 1
            if pos < len(buffer) or not fill():
                return buffer[pos] if pos < len(buffer) else ""

    def fail(message: str, at: int) -> TroughputError:
        line = lines_before + buffer.count("\n", 0, at) + 1
        last = buffer.rfind("\n", 0, at)
        column = at - last if last >= 0 else column_before + at + 1
        return TroughputError(f"{path}: invalid JSON at line {line}, column {column}: {message}")

    first = skip_space()
    if first != "[":
        try:
            data = json.loads(buffer[pos:] + f.read())
        except json.JSONDecodeError as e:
            raise TroughputError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
        raise TroughputError(f"{path}: expected a JSON list of records, got {kind(data)}")
    pos += 1
    index = 0
    while True:
        if skip_space() == "]" and index == 0:
            return
        while True:  # an item must end inside the buffer; read on until it does
            try:
                record, end = decoder.raw_decode(buffer, pos)
                break
            except json.JSONDecodeError as e:
                if not fill():
                    raise fail(e.msg, e.pos) from None
        yield f"record {index}", index, record
        pos, index = end, index + 1
        separator = skip_space()
        if separator == "]":
            return
        if separator != ",":
            raise fail("Expecting ',' delimiter" if separator else "Expecting ']'", pos)
        pos += 1
        skip_space()


READERS: dict[str, Callable[[Path, Any], Records]] = {
    "openai_batch": _json_lines, "sharegpt": _json_list, "jsonl": _json_lines}
# format -> (prefix of default ids, whether clashing ids are renamed rather than an error)
ID_RULES: dict[str, tuple[str, bool]] = {"openai_batch": ("", False), "sharegpt": ("sharegpt", True),
                                         "jsonl": ("line", False)}
