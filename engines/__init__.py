"""Engine adapters, chosen by name; each module is imported only when asked for."""

from __future__ import annotations

import importlib

from engines.base import Engine, KnobError

ENGINES: dict[str, str] = {
    "vllm": "engines.vllm:VllmEngine",
}


def get_engine_class(name: str) -> type[Engine]:
    """The adapter class registered under ``name``.

    Raises:
        KnobError: for an unknown name, listing the known ones.
    """
    try:
        target = ENGINES[name]
    except KeyError:
        raise KnobError(f"unknown engine {name!r}; known engines: {', '.join(sorted(ENGINES))}") from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


__all__ = ["ENGINES", "Engine", "KnobError", "get_engine_class"]
