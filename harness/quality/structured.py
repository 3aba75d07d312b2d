"""Parse and validity checks for structured outputs: does each constrained answer hold up?

Every constrained output is decoded and checked against its own constraint: it *parses*
(JSON loads; for regex and choice, parsing is matching), it is *valid* (matches the JSON
schema, the regex in full, or is one of the choices), and it was *truncated* (the engine
stopped at ``max_tokens`` rather than at EOS or the end of the grammar). The counts and
rates go into the row as ``quality.*``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from engines.base import Completion, Request


def check(constraint: dict[str, Any], text: str) -> tuple[bool, bool]:
    """``(parses, valid)`` of one output ``text`` under ``constraint``."""
    kind, value = constraint["kind"], constraint.get("value")
    if kind in ("regex", "choice"):
        ok = re.fullmatch(value, text) is not None if kind == "regex" else text in value
        return ok, ok
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return False, False
    if kind == "json_object":
        return True, isinstance(document, dict)
    import jsonschema

    try:
        jsonschema.validate(document, value)
    except jsonschema.ValidationError:
        return True, False
    return True, True


def columns(requests: list[Request], completions: list[Completion],
            text_of: Callable[[Completion], str]) -> dict[str, Any]:
    """``quality.*`` counts and rates over the constrained requests (none when there are none)."""
    counts: Counter[str] = Counter()
    kinds = sorted({r.constraint["kind"] for r in requests if r.constraint})
    for request, completion in zip(requests, completions):
        if not request.constraint:
            continue
        parses, valid = check(request.constraint, text_of(completion))
        counts.update(structured=1, parsed=int(parses), valid=int(valid),
                      truncated=int(completion.finish_reason == "length"))
    total = counts["structured"]
    if not total:
        return {}
    return {
        "quality.constraint_kind": ",".join(kinds),
        "quality.structured_requests": total,
        **{f"quality.{name}": counts[name] for name in ("parsed", "valid", "truncated")},
        **{f"quality.{name}_rate": counts[name] / total for name in ("parsed", "valid", "truncated")},
    }
