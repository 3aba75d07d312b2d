"""Engine units, found through the ``troughput.engines`` entry-point group; each imported only when asked for.

An entry point names a unit: ``vllm = "engines.vllm:UNIT"`` (``pyproject.toml``). troughput's
own engines are registered there like a plugin's: a separately installed package adds an
engine with an entry point of its own, and no edit here. Each unit
(``engines.unit.EngineUnit``) declares everything troughput knows about its engine.

``registry()`` reads, in this order (a later source overrides an earlier one's name):
the group in this source checkout's ``pyproject.toml`` (so a checkout whose editable
install predates a change sees its own engines, and not the installed metadata's), every
other installed distribution's entry points, and ``TROUGHPUT_ENGINES`` (JSON ``{name: "module:attr"}``), which the
driver sets for its engine workers (``registry_env``): a worker under another interpreter,
or on a Ray node that got troughput as a ``working_dir``, needs no package metadata.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from engines.base import Engine, KnobError
from engines.unit import EngineUnit

GROUP = "troughput.engines"
ENV_VAR = "TROUGHPUT_ENGINES"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@lru_cache(maxsize=None)
def registry() -> dict[str, str]:
    """``engine=`` name -> ``"module:attr"`` of its unit, from the sources in the module docstring.

    A distribution that registers a name another one already holds replaces it, with a warning naming both
    (which one wins among installed distributions depends on their order on ``sys.path``).
    """
    found = _checkout_group()
    owners = dict.fromkeys(found, "troughput")
    for entry in metadata.entry_points(group=GROUP):
        owner = entry.dist.name if entry.dist is not None else "an unnamed distribution"
        if owner == "troughput" and owners:
            continue   # this checkout's pyproject.toml is newer than its installed metadata (an engine removed too)
        if entry.name in found and found[entry.name] != entry.value:
            warnings.warn(f"engine {entry.name!r}: {owner} registers {entry.value!r} in {GROUP}, replacing "
                          f"{found[entry.name]!r} of {owners[entry.name]}", stacklevel=2)
        found[entry.name], owners[entry.name] = entry.value, owner
    found.update(json.loads(os.environ.get(ENV_VAR) or "{}"))
    return found


def registry_env() -> dict[str, str]:
    """The environment variable that hands this process's registry to an engine worker."""
    return {ENV_VAR: json.dumps(registry())}


def _checkout_group() -> dict[str, str]:
    """The group as this source checkout's ``pyproject.toml`` declares it; empty where there is none (or no tomllib)."""
    try:
        import tomllib
        project = tomllib.loads(PYPROJECT.read_text())
    except (ImportError, OSError, ValueError):
        return {}
    if project.get("project", {}).get("name") != "troughput":
        return {}
    return dict(project["project"].get("entry-points", {}).get(GROUP, {}))


def find_unit(name: str) -> EngineUnit | None:
    """The unit registered under ``name``; ``None`` for an unknown name or a ``module:Class`` path."""
    target = registry().get(name)
    if target is None:
        return None
    module_name, attr = target.split(":")
    found = getattr(importlib.import_module(module_name), attr)
    if not isinstance(found, EngineUnit) or found.name != name:
        raise KnobError(f"entry point {name} = {target!r} ({GROUP}) is not an EngineUnit named {name!r}")
    return found


def unit(name: str) -> EngineUnit:
    """The unit registered under ``name``.

    Raises:
        KnobError: for an unknown name, listing the known ones.
    """
    found = find_unit(name)
    if found is None:
        known = ", ".join(registry()) or f"none (no {GROUP} entry points: is troughput installed?)"
        raise KnobError(f"unknown engine {name!r}; known engines: {known}, "
                        "or a 'module:Class' path of your own adapter")
    return found


def units() -> list[EngineUnit]:
    """Every registered unit that loads, in registry order.

    One that does not (a plugin whose module fails to import) is skipped with a warning, so it cannot
    stop the other engines, the knob table or Hydra's config search; ``unit(name)`` raises its error.
    """
    found = []
    for name in registry():
        try:
            found.append(unit(name))
        except Exception as error:  # noqa: BLE001 - any import error of a plugin
            warnings.warn(f"engine {name!r} ({registry()[name]}) cannot be loaded and is skipped: "
                          f"{type(error).__name__}: {error}", stacklevel=2)
    return found


def get_engine_class(name: str) -> type[Engine]:
    """The adapter class registered under ``name``, or named directly as ``"package.module:Class"``.

    Raises:
        KnobError: for an unknown name, listing the known ones.
    """
    target = name if ":" in name else unit(name).adapter
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


__all__ = ["ENV_VAR", "GROUP", "Engine", "EngineUnit", "KnobError", "find_unit", "get_engine_class", "registry",
           "registry_env", "unit", "units"]
