"""Engine adapters, chosen by name; each module is imported only when asked for."""

from __future__ import annotations

import importlib

from engines.base import Engine, KnobError

ENGINES: dict[str, str] = {
    "vllm": "engines.vllm:VllmEngine",
    "hf": "engines.hf:HfEngine",
    "sglang": "engines.sglang:SglangEngine",
    "trtllm": "engines.trtllm:TrtllmEngine",
    "sim": "engines.sim:SimEngine",
}


def get_engine_class(name: str) -> type[Engine]:
    """The adapter class registered under ``name``, or named directly as ``"package.module:Class"``.

    Raises:
        KnobError: for an unknown name, listing the known ones.
    """
    target = name if ":" in name else ENGINES.get(name)
    if target is None:
        raise KnobError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}, "
                        "or a 'module:Class' path of your own adapter")
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


__all__ = ["ENGINES", "Engine", "KnobError", "get_engine_class"]
