"""Accuracy against expected answers: a user's file that says what each request should return.

Expected answers come from a plain-JSONL ``expected`` field (``Workload.expected``) or from a
reference output file in OpenAI Batch output format (``quality.expected_outputs``: one line
per request, ``custom_id`` and ``response.body`` with ``choices[0].message.content`` or
``choices[0].text``). ``quality.exact_match`` is the share of answered requests whose output,
stripped, equals the expected text; where both parse as JSON objects,
``quality.field_accuracy`` is the share of the expected object's fields given the same value
(schema-field accuracy for extraction jobs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.core.errors import TroughputError


def read_batch_outputs(path: Path) -> dict[str, str]:
    """``custom_id`` -> answer text from an OpenAI Batch output file; errors name the line."""
    answers: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                choice = record["response"]["body"]["choices"][0]
                text = choice["message"]["content"] if "message" in choice else choice["text"]
                answers[str(record["custom_id"])] = str(text)
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
                raise TroughputError(f"{path}, line {n}: not an OpenAI Batch output line with "
                                     f"custom_id and response.body.choices[0] ({type(e).__name__}: {e})") from None
    return answers


def columns(texts: dict[str, str], expected: dict[str, str]) -> dict[str, Any]:
    """``quality.*`` accuracy columns of ``texts`` (id -> output) against ``expected`` (id -> answer)."""
    ids = [i for i in expected if i in texts]
    if not ids:
        return {"quality.expected_compared": 0}
    exact = sum(texts[i].strip() == expected[i].strip() for i in ids)
    fields = [_field_matches(texts[i], expected[i]) for i in ids]
    scored = [f for f in fields if f is not None]
    return {
        "quality.expected_compared": len(ids),
        "quality.exact_match": exact / len(ids),
        "quality.field_accuracy": (sum(m for m, _ in scored) / sum(t for _, t in scored)
                                   if scored and sum(t for _, t in scored) else None),
    }


def _field_matches(text: str, answer: str) -> tuple[int, int] | None:
    """``(matching fields, expected fields)`` when ``answer`` is a JSON object, else ``None``."""
    try:
        want = json.loads(answer)
    except json.JSONDecodeError:
        return None
    if not isinstance(want, dict):
        return None
    try:
        got = json.loads(text)
    except json.JSONDecodeError:
        got = {}
    got = got if isinstance(got, dict) else {}
    return sum(got.get(k) == v for k, v in want.items()), len(want)
