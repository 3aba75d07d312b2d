"""What a request asks of the decoder, in engine-neutral terms, checked before any engine starts.

A benchmark request is greedy and generates exactly ``max_tokens`` (EOS ignored). A request
from a user's batch file brings its own sampling (``SAMPLING_KEYS``) and may carry a
structured-output ``constraint``; both stop at EOS. Each adapter turns a ``Decoding`` into
its own engine's parameters. Standard library only: imported on the worker side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SAMPLING_KEYS = ("temperature", "top_p", "seed", "stop")
CONSTRAINT_KINDS = ("json", "json_object", "regex", "choice")


@dataclass(frozen=True)
class Decoding:
    """One request's decoding, as every adapter reads it.

    ``constraint_kind``/``constraint_value``: ``json`` (a JSON schema dict), ``json_object``
    (any JSON object, value ``None``), ``regex`` (a pattern) or ``choice`` (a list of strings).
    """

    max_tokens: int
    ignore_eos: bool
    temperature: float = 0.0
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    constraint_kind: str | None = None
    constraint_value: Any = None

    def extras(self, seed_key: str = "seed") -> dict[str, Any]:
        """``top_p``, the seed (under the engine's name for it) and ``stop``, where the request sets them."""
        given = {"top_p": self.top_p, seed_key: self.seed, "stop": list(self.stop) or None}
        return {key: value for key, value in given.items() if value is not None}


def decoding_of(request: Any) -> Decoding:
    """The ``Decoding`` of an ``engines.base.Request``."""
    sampling = request.sampling or {}
    constraint = request.constraint or {}
    return Decoding(
        max_tokens=request.max_tokens,
        ignore_eos=request.exact_length,
        temperature=float(sampling.get("temperature", 0.0)),
        top_p=None if sampling.get("top_p") is None else float(sampling["top_p"]),
        seed=None if sampling.get("seed") is None else int(sampling["seed"]),
        stop=tuple(sampling.get("stop") or ()),
        constraint_kind=constraint.get("kind"),
        constraint_value=constraint.get("value"),
    )


def check_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """``sampling`` with ``stop`` as a list; ``ValueError`` naming the first bad key or value."""
    unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"unknown sampling key(s) {unknown}; known: {', '.join(SAMPLING_KEYS)}")
    out = dict(sampling)
    temperature = out.get("temperature")
    if temperature is not None and (not _number(temperature) or not 0 <= temperature <= 2):
        raise ValueError(f"temperature must be a number in [0, 2], got {temperature!r}")
    top_p = out.get("top_p")
    if top_p is not None and (not _number(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
    seed = out.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    stop = out.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise ValueError(f"stop must be a non-empty string or a list of up to 4 of them, got {out['stop']!r}")
        out["stop"] = stop
    return {k: v for k, v in out.items() if v is not None}


def check_constraint(constraint: dict[str, Any]) -> dict[str, Any]:
    """``{"kind", "value"}`` checked for its kind; ``ValueError`` saying what is wrong."""
    kind, value = constraint.get("kind"), constraint.get("value")
    if kind not in CONSTRAINT_KINDS:
        raise ValueError(f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {kind!r}")
    if kind == "json" and not isinstance(value, dict):
        raise ValueError(f"a json constraint needs a JSON schema object as its value, got {type(value).__name__}")
    if kind == "json_object":
        value = None
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise ValueError("a regex constraint needs a non-empty pattern string")
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"regex {value!r} does not compile: {e}") from None
    if kind == "choice" and (not isinstance(value, list) or not value
                             or not all(isinstance(c, str) and c for c in value)):
        raise ValueError("a choice constraint needs a non-empty list of non-empty strings")
    return {"kind": kind, "value": value}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def choice_regex(choices: list[str]) -> str:
    """A regular expression matching exactly one of ``choices``, for engines without a choice mode."""
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def needs_tokenizer(requests: list[Any]) -> bool:
    """Whether the engine must keep its tokenizer: a grammar works on token strings, stop strings on text."""
    return any(r.constraint or (r.sampling or {}).get("stop") for r in requests)


def unsupported(label: str, requests: list[Any], sampling: bool, constraints: bool) -> str | None:
    """Why ``label`` cannot run ``requests`` (own sampling or constraints it lacks), else ``None``."""
    if not constraints and any(r.constraint for r in requests):
        return (f"{label} cannot constrain outputs (structured outputs); the workload has constrained requests: "
                f"use {engines_that('supports_constraints')}")
    if not sampling and any(r.sampling for r in requests):
        return (f"{label} decodes greedily only; the workload's requests bring their own sampling: "
                f"use workload.sampling=benchmark, or {engines_that('supports_sampling')}")
    return None


def engines_that(capability: str) -> str:
    """The registered engines whose adapter has ``capability`` (``supports_sampling``), as "a, b or c"."""
    from engines import get_engine_class, registry

    names = []
    for name in registry():
        try:
            if getattr(get_engine_class(name), capability, False):
                names.append(name)
        except Exception:  # noqa: BLE001 - a broken plugin must not hide this message
            continue
    if not names:
        return "an engine that supports it"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
