"""Recorded API snapshots of the engines troughput cannot run here (SGLang, TensorRT-LLM).

One JSON file per engine and version (``sglang-0.5.23.json``, ``tensorrt_llm-1.2.1.json``),
written by ``engines/snapshots/record.py`` from the real package read as files (a wheel,
or a source tree at a named commit) and never imported. Each holds, for every class
an adapter touches, its constructor fields, its methods with their parameter names and
its result attributes; the result-dict keys (``meta_info``, ``get_server_info()``, iteration
stats) and, where the source shows them, the kinds of their values (``types``); and the
model architectures the engine implements. The adapters' knob checks and model checks,
and the adapter tests' stand-in engines, all read these files: one source of truth.

Standard library only (the worker side imports it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from engines.base import KnobError

SNAPSHOT_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Snapshot:
    """One recorded API: ``data`` is the JSON document (see ``record.py`` for its shape)."""

    data: dict[str, Any]
    path: Path

    @property
    def label(self) -> str:
        """``sglang 0.5.23 (engines/snapshots/sglang-0.5.23.json)``: where a name was looked up."""
        return f"{self.data['package']} {self.data['version']} (engines/snapshots/{self.path.name})"

    def _class(self, name: str) -> dict[str, Any]:
        try:
            return self.data["classes"][name]
        except KeyError:
            raise KeyError(f"{name} is not recorded in {self.label}") from None

    def fields(self, cls: str) -> frozenset[str]:
        """Constructor fields of ``cls`` (a pydantic model, msgspec struct or dataclass)."""
        return frozenset(self._class(cls).get("fields", ()))

    def attributes(self, cls: str) -> frozenset[str]:
        """Attributes a ``cls`` instance has: its fields, properties and attributes set on ``self``."""
        entry = self._class(cls)
        return frozenset(entry.get("fields", ())) | frozenset(entry.get("attributes", ()))

    def methods(self, cls: str) -> dict[str, dict[str, Any]]:
        """Method name -> ``{"params": [...], "var_keyword": bool}`` (``self`` left out)."""
        return dict(self._class(cls).get("methods", {}))

    def params(self, cls: str, method: str) -> frozenset[str]:
        methods = self.methods(cls)
        if method not in methods:
            raise KeyError(f"{cls}.{method} is not recorded in {self.label}")
        return frozenset(methods[method]["params"])

    def keys(self, name: str) -> frozenset[str]:
        """Keys of a recorded result dict (``meta_info``, ``IterationStats``, ...)."""
        try:
            return frozenset(self.data["keys"][name])
        except KeyError:
            raise KeyError(f"keys {name!r} are not recorded in {self.label}") from None

    def types(self, name: str) -> dict[str, str]:
        """Kinds (``number``, ``mapping``, ``text``) of the values of recorded dict ``name``, where recorded."""
        return dict((self.data.get("types") or {}).get(name) or {})

    @property
    def architectures(self) -> frozenset[str] | None:
        """Model architectures the engine implements; ``None`` when not recorded."""
        models = self.data.get("models") or {}
        names = models.get("architectures")
        return None if names is None else frozenset(names)

    def check_architectures(self, architectures: list[str], label: str, model_name: str) -> None:
        """Raise ``KnobError`` when the engine implements none of ``architectures`` (a model config's).

        An empty ``architectures`` (not known before the model is read) or an unrecorded
        registry passes: the engine itself is then the judge.
        """
        known = self.architectures
        if not architectures or known is None or set(architectures) & known:
            return
        raise KnobError(f"model {model_name!r} ({', '.join(architectures)}) is not implemented by {label} "
                        f"{self.data['version']}; it implements: {', '.join(sorted(known))} "
                        f"(recorded in engines/snapshots/{self.path.name})")


@lru_cache(maxsize=None)
def load(engine: str) -> Snapshot:
    """The recorded snapshot of ``engine``: the file its unit names (``EngineUnit.snapshot``), in this folder
    unless the unit gives an absolute path."""
    from engines import unit

    name = unit(engine).snapshot
    if name is None:
        raise KnobError(f"engine {engine!r} declares no API snapshot (EngineUnit.snapshot)")
    path = SNAPSHOT_DIR / name
    return Snapshot(json.loads(path.read_text()), path)


def model_architectures(model: dict[str, Any]) -> list[str]:
    """The model's architectures (``config.json``'s ``architectures``), where known before any engine starts.

    In order: the model config's own ``architectures``; ``<path>/config.json`` when the path
    is a local directory; the shipped ``conf/architectures/<name>.json``. Empty when none is
    at hand (a hub id troughput has no copy of): the engine then judges for itself.
    """
    if model.get("architectures"):
        return list(model["architectures"])
    candidates = [Path(str(model["path"])) / "config.json"] if model.get("path") else []
    candidates.append(SNAPSHOT_DIR.parent.parent / "conf" / "architectures" / f"{model.get('name', '')}.json")
    for path in candidates:
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        return list(config.get("architectures") or [])
    return []
