"""A user's file's format (``format=auto``), told from the file as a whole, never from one line.

A ``.json`` file is a JSON list (ShareGPT). A JSONL file is read through once: each line that
parses as a JSON object votes by its shape, ``custom_id``/``method``/``url``/``body`` for an
OpenAI Batch request and ``prompt`` for a plain record; lines that do not parse, or have
neither shape, do not vote (the reader reports them later, as that format's error lines).
One bad line therefore cannot turn a file of OpenAI Batch requests into plain JSONL: the
format is what the lines that parse say, and a file whose lines disagree is an error naming
lines of each kind (``batch.format=`` / ``workload.format=`` reads it as one format anyway,
the other lines becoming errors). The pass costs about 3 s per 10^6 lines on a 2-core host;
naming the format skips it.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.core.errors import TroughputError

OPENAI_KEYS = ("custom_id", "method", "url", "body")
PLAIN_KEYS = ("prompt",)
SHOWN = 3  # line numbers named per kind in an error


def detect_format(path: Path, setting: str = "format") -> str:
    """``sharegpt`` for a ``.json`` file, else ``openai_batch`` or ``jsonl`` by the shape of every line that parses.

    Raises ``TroughputError`` when the lines disagree (naming lines of each kind) or when no line has
    either shape. ``setting``: the config key that names the format, for the messages' fix.
    """
    if path.suffix.lower() == ".json":
        return "sharegpt"
    openai: list[int] = []
    plain: list[int] = []
    counts = {"openai_batch": 0, "jsonl": 0}
    unparsed = lines = 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            lines += 1
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                unparsed += 1
                continue
            if not isinstance(record, dict):
                continue
            if any(key in record for key in OPENAI_KEYS):
                counts["openai_batch"] += 1
                if len(openai) < SHOWN:
                    openai.append(n)
            elif any(key in record for key in PLAIN_KEYS):
                counts["jsonl"] += 1
                if len(plain) < SHOWN:
                    plain.append(n)
    if counts["openai_batch"] and counts["jsonl"]:
        raise TroughputError(
            f"{path} mixes two formats: OpenAI Batch requests ({'/'.join(OPENAI_KEYS)}) on "
            f"{_lines(counts['openai_batch'], openai)}, plain JSONL records (prompt) on "
            f"{_lines(counts['jsonl'], plain)}; make every line one format, or set {setting}=openai_batch (or jsonl) to read the file as that one format "
            f"(the other lines become error lines)")
    if counts["openai_batch"]:
        return "openai_batch"
    if counts["jsonl"] or not lines:
        return "jsonl"  # (a file of blank lines: the reader says it holds no records)
    why = f" ({unparsed} lines are no JSON)" if unparsed else ""
    raise TroughputError(
        f"cannot tell the format of {path}: no line is a JSON object with an OpenAI Batch request's fields "
        f"({', '.join(OPENAI_KEYS)}) or a plain record's prompt{why}; set {setting}=openai_batch, jsonl or sharegpt")


def _lines(count: int, shown: list[int]) -> str:
    """``'1 line (line 4)'``, ``'7 lines (lines 1, 4, 5, ...)'``."""
    if count == 1:
        return f"1 line (line {shown[0]})"
    return f"{count} lines (lines {', '.join(map(str, shown))}{', ...' if count > len(shown) else ''})"
