"""One knob vocabulary for every engine: canonical names mapped to each engine's native arguments.

``TABLE`` defines each canonical knob (``max_seqs``: its meaning and value check);
where it lands in one engine's arguments (vLLM ``max_num_seqs``, SGLang
``max_running_requests``, TensorRT-LLM ``max_batch_size``) is declared by that
engine's unit (``UNIT.knobs`` in its adapter module, see ``engines.unit``).
``to_native`` maps a knob set that mixes canonical and native names into the engine's
own (nested) arguments, ``canonical_view`` reads them back for the results row, and
``knob_table_markdown`` renders the table, one column per registered engine, for docs/knobs.md.

Standard library only: the worker side imports this module too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engines import find_unit, units
from engines.base import KnobError
from engines.native import UNSET, NativeMapping, flatten, inverted, lookup, nest, prefixed  # noqa: F401 - the knob API


@dataclass(frozen=True)
class Canonical:
    """A canonical knob: its meaning and its value check (engines declare where it lands)."""

    name: str
    meaning: str
    values: str
    check: Callable[[Any], str | None]


def _positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else "must be an integer > 0"


def _fraction(value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
    return None if ok else "must be a fraction in (0, 1]"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _mapping(value: Any) -> str | None:
    return None if isinstance(value, dict) and value else "must be a non-empty mapping"


def _choice(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


TABLE: dict[str, Canonical] = {c.name: c for c in [
    Canonical("max_seqs", "sequences running at once", "int > 0", _positive_int),
    Canonical("max_tokens_per_step", "tokens scheduled per engine step (prefill chunk budget)", "int > 0",
              _positive_int),
    Canonical("kv_memory_fraction", "GPU memory fraction the engine sizes its KV cache from (each engine's "
              "own rule: total for vLLM, weights+KV for SGLang, free after weights for TensorRT-LLM)",
              "fraction in (0, 1]", _fraction),
    Canonical("prefix_caching", "reuse KV of shared prompt prefixes", "true / false", _boolean),
    Canonical("chunked_prefill", "split long prompts across steps", "true / false", _boolean),
    Canonical("tensor_parallel", "GPUs one model is split across", "int > 0", _positive_int),
    Canonical("pipeline_parallel", "GPUs one model's layers are split across, in stages", "int > 0",
              _positive_int),
    Canonical("kv_cache_dtype", "KV cache element type", "the engine's names (checked)", _choice),
    Canonical("speculative", "speculative decoding settings, in the engine's own keys", "mapping", _mapping),
    Canonical("schedule_policy", "order in which waiting requests are admitted", "the engine's names (checked)",
              _choice),
    Canonical("grammar_backend", "library that enforces structured outputs (JSON schema, regex, choice)",
              "the engine's names (checked)", _choice),
    Canonical("json_any_whitespace", "a JSON grammar allows any whitespace (false: compact JSON only)",
              "true / false", _boolean),
    Canonical("context_length", "longest sequence (prompt + output) the engine is configured for", "int > 0",
              _positive_int),
    Canonical("kv_memory_bytes", "KV cache size in bytes (instead of a memory fraction)", "int > 0", _positive_int),
    Canonical("eager", "run without CUDA graphs or compilation (faster start)", "true / false", _boolean),
    Canonical("kv_block_size", "tokens per KV cache block (page)", "int > 0", _positive_int),
    Canonical("images_per_prompt", "most images one prompt may carry", "int > 0", _positive_int),
]}


def mappings(engine: str) -> dict[str, NativeMapping]:
    """Canonical name -> native mapping for ``engine`` (none for an adapter given as ``module:Class``)."""
    unit = find_unit(engine)
    return dict(unit.knobs) if unit else {}


def engine_label(engine: str) -> str:
    unit = find_unit(engine)
    return unit.label if unit else engine


def canonical_of(native_name: str) -> str | None:
    """The canonical knob that plainly is ``native_name`` (same value, no transform) in some engine."""
    for unit in units():
        for name, mapping in unit.knobs.items():
            if mapping.targets == (native_name,) and mapping.forward is None:
                return name
    return None


def to_native(engine: str, knobs: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The engine's own arguments for ``knobs``, which may mix canonical and native names.

    Canonical knobs are checked and mapped (in ``TABLE`` order, so SGLang's
    ``chunked_prefill: false`` overrides the chunk size ``max_tokens_per_step``
    sets); native knobs pass through unchanged; dotted names become nested dicts.
    ``base`` holds native knobs of more general layers (hardware, model): ``knobs``
    override them leaf by leaf, and a canonical knob replaces its native twin there.

    Raises:
        KnobError: a canonical knob this engine lacks, a value out of range, or a
            canonical knob given together with its native twin in ``knobs``.
    """
    label = engine_label(engine)
    own = mappings(engine)
    native = flatten({k: v for k, v in knobs.items() if k not in TABLE})
    merged = _overlay(flatten(base or {}), native)
    mapped: dict[str, Any] = {}
    for name, spec in TABLE.items():
        value = knobs.get(name)
        if value is None:
            continue
        mapping = own.get(name)
        if mapping is None:
            having = ", ".join(u.label for u in units() if name in u.knobs) or "no engine"
            raise KnobError(f"canonical knob {name!r} has no {label} equivalent (it exists for {having}); "
                            f"drop it or set a native {label} knob instead")
        _check_value(spec, mapping, value, label)
        twins = sorted(k for k in native if mapping.owns(k))
        if twins:
            shown = ", ".join(f"{k}={native[k]!r}" for k in twins)
            raise KnobError(f"{name}={value!r} and its {label} twin ({shown}) are both set; set only one of them")
        merged = {k: v for k, v in merged.items() if not mapping.owns(k)}
        mapped.update(mapping.to_native(value))
    return nest({**merged, **mapped})


def defaults_to_native(engine: str, canonical: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A model or hardware config's canonical defaults as ``engine``'s flat native knobs.

    Only the defaults the engine's unit takes (``EngineUnit.defaults``) land; the others are
    skipped, as are all for an adapter given as ``module:Class``. ``where`` names the config
    (``conf/hardware/cpu.yaml``) in errors.

    Raises:
        KnobError: a name that is no canonical knob, or a value out of its range.
    """
    unknown = sorted(set(canonical) - set(TABLE))
    if unknown:
        raise KnobError(f"{where}: canonical: {unknown} are not canonical knobs; known: {', '.join(TABLE)}")
    unit = find_unit(engine)
    taken = unit.defaults(canonical) if unit else {}
    native: dict[str, Any] = {}
    for name in TABLE:
        if name in taken:
            _check_value(TABLE[name], unit.knobs[name], taken[name], f"{unit.label} ({where})")
            native.update(flatten(nest(unit.knobs[name].to_native(taken[name]))))
    return native


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Flat ``top`` over flat ``base``: a name in ``top`` replaces that name, its parents and children."""
    def shadowed(name: str) -> bool:
        return any(name == t or name.startswith(t + ".") or t.startswith(name + ".") for t in top)

    return {**{k: v for k, v in base.items() if not shadowed(k)}, **top}


def _check_value(spec: Canonical, mapping: NativeMapping, value: Any, label: str) -> None:
    problem = spec.check(value)
    if problem is None and mapping.choices is not None and value not in mapping.choices:
        problem = f"{label} accepts {', '.join(map(str, mapping.choices))}"
    if problem:
        raise KnobError(f"canonical knob {spec.name}={value!r} is out of range for {label}: {problem}")


def canonical_view(engine: str, native: dict[str, Any]) -> dict[str, Any]:
    """The canonical knobs that ``native`` (an engine's arguments) sets; the reverse of ``to_native``."""
    flat = flatten(native)
    own = mappings(engine)
    view: dict[str, Any] = {}
    for name in TABLE:
        mapping = own.get(name)
        if mapping is None:
            continue
        value = mapping.from_native(flat)
        if value is not UNSET:
            view[name] = value
    return view


def knob_table_markdown() -> str:
    """The canonical knob table as Markdown, one row per knob and one column per engine unit (docs/knobs.md)."""
    engines = units()
    lines = ["| canonical | meaning | values | " + " | ".join(u.label for u in engines) + " |",
             "|---|---|---|" + "---|" * len(engines)]
    for spec in TABLE.values():
        cells = [_cell(u.knobs.get(spec.name)) for u in engines]
        lines.append(f"| `{spec.name}` | {spec.meaning} | {spec.values} | " + " | ".join(cells) + " |")
    taken = ["every one it maps" if u.takes_defaults is None else
             (", ".join(f"`{n}`" for n in sorted(u.takes_defaults)) or "none") for u in engines]
    lines.append("| *model and hardware defaults* | the `canonical:` defaults of `conf/model/`, `conf/hardware/` it "
                 "takes (others are skipped) | | " + " | ".join(taken) + " |")
    return "\n".join(lines)


def _cell(mapping: NativeMapping | None) -> str:
    if mapping is None:
        return "—"
    names = " + ".join(f"`{t}`" for t in mapping.targets)
    return f"{names} ({mapping.note})" if mapping.note else names


__all__ = ["TABLE", "Canonical", "NativeMapping", "canonical_of", "canonical_view", "defaults_to_native",
           "engine_label", "flatten",
           "inverted", "knob_table_markdown", "lookup", "mappings", "nest", "prefixed", "to_native"]
