"""A request's own decoding, read from its record: sampling, a structured-output constraint, ``n``.

The fields are OpenAI's, in an OpenAI Batch ``body`` and at the top of a plain JSONL record alike:
``temperature``, ``top_p``, ``seed``, ``stop``, ``n`` (must be 1) and ``response_format``
(``{"type": "json_schema", "json_schema": {"schema": ...}}``, ``{"type": "json_object"}`` or
``{"type": "text"}``). For regex and choice constraints, which OpenAI's format cannot say,
``structured_outputs`` takes exactly one of ``json``, ``regex``, ``choice`` or ``json_object``
(vLLM's extra request field of that name).

``sampling`` mode ``benchmark`` drops the request's sampling (greedy, exactly ``max_tokens``)
but keeps its constraint, since a constrained job is a different job; ``as_given`` keeps both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engines.decoding import CONSTRAINT_KINDS, SAMPLING_KEYS, check_constraint, check_sampling
from harness.workloads.fields import RecordError, field, kind, name

SAMPLING_MODES = ("benchmark", "as_given")
OPENAI_DEFAULTS = {"temperature": 1.0}  # OpenAI's documented default when a body gives none
ONE_CHOICE = ("n", "best_of")
# Fields that would change the output but are not honoured: set to anything but their neutral value, an error.
UNSUPPORTED = ("presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
               "tools", "functions", "echo", "suffix")


def own_decoding(obj: Mapping[str, Any], at: str, mode: str,
                 defaults: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(sampling, constraint)`` for ``Request``; ``sampling`` is ``None`` in ``benchmark`` mode.

    Args:
        obj: the mapping that holds the fields (an OpenAI ``body`` or a plain record).
        at: its name in messages (``"body"`` or ``""``).
        mode: one of ``SAMPLING_MODES``.
        defaults: sampling values a record's format implies when it gives none (``OPENAI_DEFAULTS``).
    """
    for key in ONE_CHOICE:
        if obj.get(key) is not None and obj[key] != 1:
            raise RecordError(f"field {name(at, key)!r} must be 1 (one choice per request), got {obj[key]!r}")
    constraint = _constraint(obj, at)
    if mode == "benchmark":
        return None, constraint
    for key in UNSUPPORTED:
        if obj.get(key) not in (None, 0, False, "", [], {}):
            raise RecordError(f"field {name(at, key)!r} is not supported (honoured: {', '.join(SAMPLING_KEYS)}, "
                              f"max_tokens, response_format); remove it or use sampling=benchmark")
    given = {key: obj[key] for key in SAMPLING_KEYS if obj.get(key) is not None}
    try:
        return check_sampling({**(defaults or {}), **given}), constraint
    except ValueError as e:
        raise RecordError(f"sampling in {at or 'the record'}: {e}") from None


def _constraint(obj: Mapping[str, Any], at: str) -> dict[str, Any] | None:
    constraints = [c for c in (_response_format(obj, at), _structured_outputs(obj, at)) if c is not None]
    if len(constraints) > 1:
        raise RecordError(f"fields {name(at, 'response_format')!r} and {name(at, 'structured_outputs')!r} "
                          f"both constrain the output; give one")
    if not constraints:
        return None
    try:
        return check_constraint(constraints[0])
    except ValueError as e:
        raise RecordError(f"the output constraint of {at or 'the record'}: {e}") from None


def _response_format(obj: Mapping[str, Any], at: str) -> dict[str, Any] | None:
    if obj.get("response_format") is None:
        return None
    full = name(at, "response_format")
    fmt = field(obj, "response_format", dict, at)
    kind_ = field(fmt, "type", str, full)
    if kind_ == "text":
        return None
    if kind_ == "json_object":
        return {"kind": "json_object", "value": None}
    if kind_ == "json_schema":
        spec = field(fmt, "json_schema", dict, full)
        return {"kind": "json", "value": field(spec, "schema", dict, f"{full}.json_schema")}
    raise RecordError(f"field '{full}.type' must be 'text', 'json_object' or 'json_schema', got {kind_!r}")


def _structured_outputs(obj: Mapping[str, Any], at: str) -> dict[str, Any] | None:
    if obj.get("structured_outputs") is None:
        return None
    full = name(at, "structured_outputs")
    spec = field(obj, "structured_outputs", dict, at)
    given = [k for k in CONSTRAINT_KINDS if spec.get(k) not in (None, False)]
    if len(given) != 1 or set(spec) - set(CONSTRAINT_KINDS):
        raise RecordError(f"field {full!r} must hold exactly one of {', '.join(CONSTRAINT_KINDS)}, "
                          f"got {kind(spec)} with keys {sorted(spec)}")
    return {"kind": given[0], "value": None if given[0] == "json_object" else spec[given[0]]}
