"""One defensive accessor for every read of an engine's statistics: a stat never kills a run.

Engines report statistics in shapes troughput cannot pin down before it meets the real
package (SGLang's ``get_server_info()``, TensorRT-LLM's iteration stats as JSON strings,
vLLM's ``Metric`` objects). Every read goes through ``StatReader.read``: a missing value,
a value of another type, or a container that is not one gives ``None`` (a null column)
and one warning, kept in ``StatReader.warnings`` and written to the row as
``engine_info.stat_warnings``. Never an exception.

Worker side: standard library only.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import Any

NUMBER = "number"      # int or float, not bool
MAPPING = "mapping"    # a dict (or a JSON string holding an object)
TEXT = "text"
ANY = "any"
_MISSING = object()


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, numbers.Real):   # numpy scalars too (Ray Data rows, pandas-backed blocks)
        return NUMBER
    if isinstance(value, Mapping):
        return MAPPING
    if isinstance(value, str):
        return TEXT
    return type(value).__name__


class StatReader:
    """Reads nested engine statistics; every failure is a ``None`` and a warning, once per path.

    Args:
        label: the engine as people write it, for the warnings (``"SGLang"``).
    """

    def __init__(self, label: str):
        self.label = label
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        """Record one warning (the same text once)."""
        text = f"{self.label}: {message}"
        if text not in self.warnings:
            self.warnings.append(text)

    def mapping(self, value: Any, where: str) -> Mapping[str, Any] | None:
        """``value`` as a mapping: a dict as is, a JSON string parsed; else ``None`` with a warning."""
        if isinstance(value, Mapping):
            return value
        if isinstance(value, (str, bytes)):
            try:
                parsed = json.loads(value)
            except ValueError as e:
                self.warn(f"{where} is not valid JSON ({e}); its statistics are left empty")
                return None
            if isinstance(parsed, Mapping):
                return parsed
            value = parsed
        self.warn(f"{where} is {_kind_of(value)} ({_short(value)}), expected mapping; its statistics are left empty")
        return None

    def read(self, source: Any, *path: str, kind: str = NUMBER, where: str = "", required: bool = True) -> Any:
        """The value at ``path`` (keys of mappings, else attributes) in ``source``, if it is of ``kind``.

        Args:
            source: a mapping, a JSON string of one, or an object with attributes.
            path: keys or attribute names, outermost first.
            kind: ``NUMBER``, ``MAPPING``, ``TEXT`` or ``ANY``; a number comes back as ``int`` or ``float``.
            where: how the source is written in a warning (``"get_server_info()"``).
            required: warn when the value is absent (``False``: absence is normal, e.g. an optional phase).

        Returns:
            The value, or ``None`` (with a warning) when a step is missing or the value is of another kind.
        """
        current, walked = source, where or "stats"
        for name in path:
            container = current
            if isinstance(container, (str, bytes)) or isinstance(container, Mapping):
                container = self.mapping(container, walked)
                if container is None:
                    return None
                current = container[name] if name in container else _MISSING
            elif container is None:
                current = _MISSING
            elif isinstance(container, (int, float, list, tuple, set)):   # a plain value where a container was due
                self.warn(f"{walked} is {_kind_of(container)} ({_short(container)}), expected mapping; "
                          "its statistics are left empty")
                return None
            else:
                try:
                    current = getattr(container, name, _MISSING)
                except AssertionError:   # a test stand-in's unrecorded name: the adapter's bug, not a stat's shape
                    raise
                except Exception as e:  # noqa: BLE001 - a property that raises is a missing stat
                    self.warn(f"reading {walked}.{name} raised {type(e).__name__}: {e}; left empty")
                    return None
            walked = f"{walked}[{name!r}]" if isinstance(container, Mapping) else f"{walked}.{name}"
            if current is _MISSING or current is None:
                if required:
                    self.warn(f"{walked} is missing; the column is left empty")
                return None
        if kind == ANY:
            return current
        if kind == MAPPING:
            return self.mapping(current, walked)
        found = _kind_of(current)
        if found != kind:
            self.warn(f"{walked} is {found} ({_short(current)}), expected {kind}; the column is left empty")
            return None
        return current

    def number(self, value: Any, where: str) -> float | int | None:
        """``value`` itself when it is a number, else ``None`` with a warning (for values already in hand)."""
        if _kind_of(value) == NUMBER:
            return value
        self.warn(f"{where} is {_kind_of(value)} ({_short(value)}), expected number; the column is left empty")
        return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
