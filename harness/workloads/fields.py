"""Typed field access for one record of a user's file; faults raise ``RecordError`` without the place.

The caller (``harness.workloads.files`` or ``troughput-batch``) adds the file and the line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_KINDS = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
          bool: "a boolean", type(None): "null"}


class RecordError(Exception):
    """What is wrong with one record; the caller adds the file and the place."""


def kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def as_object(value: Any, at: str) -> dict:
    if not isinstance(value, dict):
        raise RecordError(f"{at} must be a JSON object, got {kind(value)}")
    return value


def name(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def field(obj: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], at: str = "") -> Any:
    """``obj[key]``, which must be present, not null, and of one of ``kinds`` (a boolean is no integer)."""
    full, kinds = name(at, key), kinds if isinstance(kinds, tuple) else (kinds,)
    value = obj.get(key)
    if value is None:
        raise RecordError(f"missing field {full!r}")
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise RecordError(f"field {full!r} must be {' or '.join(_KINDS[k] for k in kinds)}, got {kind(value)}")
    return value


def nonempty(text: str, full_name: str) -> str:
    if not text.strip():
        raise RecordError(f"field {full_name!r} is empty")
    return text


def or_default(default: int | None, why: str) -> int:
    if default is None:
        raise RecordError(f"{why}, and no default_max_tokens is set")
    return default


def max_tokens(obj: Mapping[str, Any], keys: tuple[str, ...], default: int | None, at: str = "") -> int:
    """The first of ``keys`` present (a positive integer), else the default."""
    for key in keys:
        if obj.get(key) is not None:
            value = field(obj, key, int, at)
            if value <= 0:
                raise RecordError(f"field {name(at, key)!r} must be positive, got {value}")
            return value
    return or_default(default, f"missing field {name(at, keys[0])!r}")
