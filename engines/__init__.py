"""Engine units, chosen by name; each adapter module is imported only when asked for.

``ENGINES`` maps an ``engine=`` name to the adapter module whose ``UNIT``
(``engines.unit.EngineUnit``) declares everything troughput knows about that engine.
Adapter modules import their engine package lazily, so reading a unit is cheap.
"""

from __future__ import annotations

import importlib

from engines.base import Engine, KnobError
from engines.unit import EngineUnit

ENGINES: dict[str, str] = {
    "vllm": "engines.vllm",
    "sglang": "engines.sglang",
    "trtllm": "engines.trtllm",
    "hf": "engines.hf",
    "sim": "engines.sim",
    "ray": "engines.ray_data",
}


def find_unit(name: str) -> EngineUnit | None:
    """The unit registered under ``name``; ``None`` for an unknown name or a ``module:Class`` path."""
    module = ENGINES.get(name)
    return importlib.import_module(module).UNIT if module else None


def unit(name: str) -> EngineUnit:
    """The unit registered under ``name``.

    Raises:
        KnobError: for an unknown name, listing the known ones.
    """
    found = find_unit(name)
    if found is None:
        raise KnobError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}, "
                        "or a 'module:Class' path of your own adapter")
    return found


def units() -> list[EngineUnit]:
    """Every registered unit, in registry order."""
    return [unit(name) for name in ENGINES]


def get_engine_class(name: str) -> type[Engine]:
    """The adapter class registered under ``name``, or named directly as ``"package.module:Class"``.

    Raises:
        KnobError: for an unknown name, listing the known ones.
    """
    target = name if ":" in name else unit(name).adapter
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


__all__ = ["ENGINES", "Engine", "EngineUnit", "KnobError", "find_unit", "get_engine_class", "unit", "units"]
