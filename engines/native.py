"""Where a canonical knob lands in one engine's own arguments, and dotted-name helpers; no registry.

``engines.unit`` declares each engine's mappings with these; ``engines.knobs`` holds the canonical table
and looks the units up. Standard library only: the worker side imports this module too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engines.base import KnobError


UNSET: Any = object()


@dataclass(frozen=True)
class NativeMapping:
    """Where one canonical knob lands in one engine's arguments.

    Args:
        targets: dotted native names written (``kv_cache_config.free_gpu_memory_fraction``);
            the first one is read back by ``canonical_view``.
        note: how the value is transformed, for the knob table in docs/knobs.md.
        forward: canonical value -> ``{dotted native name: value}``; default: the value under every target.
        backward: flat native knobs -> canonical value or ``UNSET``; default: the first target's value
            (a mapping when it was given as one).
        choices: the values this engine accepts, when it takes an enum.
        prefix: the mapping owns every native name starting with this (SGLang's ``speculative_*``).
    """

    targets: tuple[str, ...]
    note: str = ""
    forward: Callable[[Any], dict[str, Any]] | None = None
    backward: Callable[[dict[str, Any]], Any] | None = None
    choices: tuple[Any, ...] | None = None
    prefix: str | None = None

    def to_native(self, value: Any) -> dict[str, Any]:
        return self.forward(value) if self.forward else {target: value for target in self.targets}

    def from_native(self, flat: dict[str, Any]) -> Any:
        if self.backward:
            return self.backward(flat)
        target = self.targets[0]
        if target in flat:
            return flat[target]
        children = {k[len(target) + 1:]: v for k, v in flat.items() if k.startswith(target + ".")}
        return nest(children) if children else UNSET

    def owns(self, native_name: str) -> bool:
        """Whether setting ``native_name`` would set the same thing as this canonical knob."""
        if self.prefix is not None and native_name.startswith(self.prefix):
            return True
        return any(native_name == t or native_name.startswith(t + ".") for t in self.targets)


def inverted(target: str) -> NativeMapping:
    """A boolean knob that lands negated (``prefix_caching`` -> SGLang ``disable_radix_cache``)."""
    return NativeMapping((target,), note="inverted",
                         forward=lambda v: {target: not v},
                         backward=lambda flat: (not flat[target]) if target in flat else UNSET)


def prefixed(prefix: str) -> NativeMapping:
    """A mapping knob whose keys land with ``prefix`` (``speculative`` -> SGLang ``speculative_*``)."""
    def forward(value: dict[str, Any]) -> dict[str, Any]:
        return {(k if k.startswith(prefix) else prefix + k): v for k, v in value.items()}

    def backward(flat: dict[str, Any]) -> Any:
        found = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
        return found or UNSET

    return NativeMapping((prefix + "*",), note=f"each key k becomes {prefix}k", forward=forward,
                         backward=backward, prefix=prefix)


def flatten(knobs: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested and dotted knobs to one flat dict of dotted names; ``None`` leaves are dropped."""
    flat: dict[str, Any] = {}
    for key, value in knobs.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name))
        elif value is not None:
            flat[name] = value
    return flat


def lookup(values: Any, name: str) -> Any:
    """``values["a.b"]`` or ``values["a"]["b"]`` for ``name="a.b"``; ``None`` when absent."""
    if isinstance(values, Mapping) and name in values:
        return values[name]
    node: Any = values
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted names to nested dicts: ``{"a.b": 1} -> {"a": {"b": 1}}``."""
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise KnobError(f"knob {name!r} sets a field inside {part!r}, which is also set to a value")
        node[leaf] = value
    return nested
