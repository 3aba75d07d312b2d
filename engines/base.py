"""The engine interface every adapter implements, and the plain records it speaks.

This module is imported on the worker side, inside an engine's own Python
environment, so it uses the standard library only.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import asdict, dataclass, field
from typing import Any

from engines.statread import StatReader
from engines.steptrace import StepRecorder


class KnobError(ValueError):
    """A knob name or value the engine does not accept; raised before it starts."""


class EngineUnavailable(RuntimeError):
    """The engine cannot run in this interpreter (its package is missing, or no GPU is visible); the fix is named."""


@dataclass(frozen=True)
class Request:
    """One prompt as the engine sees it: token ids, an output length, optional images.

    Args:
        id: unique within a workload.
        prompt_token_ids: the prompt, already tokenized for the model.
        max_tokens: for a benchmark request, exactly this many tokens are generated (EOS is
            ignored); a request with its own ``sampling`` or a ``constraint`` stops at EOS (or
            when its grammar ends) and ``max_tokens`` is its cap.
        images: paths of image files that the prompt's placeholders refer to.
        sampling: the request's own sampling (``engines.decoding.SAMPLING_KEYS``: temperature,
            top_p, seed, stop); ``None``: greedy.
        constraint: structured output, ``{"kind": "json" | "json_object" | "regex" | "choice",
            "value": ...}`` (``engines.decoding.check_constraint``); ``None``: unconstrained.
    """

    id: str
    prompt_token_ids: list[int]
    max_tokens: int
    images: list[str] = field(default_factory=list)
    sampling: dict[str, Any] | None = None
    constraint: dict[str, Any] | None = None

    @property
    def exact_length(self) -> bool:
        """Whether exactly ``max_tokens`` are generated (a benchmark request) rather than up to EOS."""
        return self.sampling is None and self.constraint is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Request:
        return cls(
            id=str(data["id"]),
            prompt_token_ids=[int(t) for t in data["prompt_token_ids"]],
            max_tokens=int(data["max_tokens"]),
            images=list(data.get("images") or []),
            sampling=data.get("sampling"),
            constraint=data.get("constraint"),
        )


@dataclass
class Completion:
    """What the engine returned for one request.

    Args:
        id: the request's id.
        prompt_tokens: prompt length as the engine counted it (image tokens included).
        output_token_ids: the generated tokens.
        cached_tokens: prompt tokens served from the prefix cache, when reported.
        finished_at: ``time.perf_counter()`` when this request finished, where known.
        finish_reason: ``"stop"`` (EOS, a stop string, or the grammar ended) or ``"length"``
            (``max_tokens`` reached), where the engine says.
        text: the decoded output, where the engine detokenized it (requests with ``stop`` strings).
    """

    id: str
    prompt_tokens: int
    output_token_ids: list[int]
    cached_tokens: int | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    text: str | None = None


@dataclass
class StartInfo:
    """Seconds spent bringing the engine up; compile is the part the engine reports as compiling."""

    startup_s: float
    compile_s: float | None = None
    engine_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineStats:
    """Engine counters accumulated since start (differences are taken by the worker)."""

    preemptions: int | None = None
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    mm_cache_queries: int | None = None
    mm_cache_hits: int | None = None
    extra: dict[str, float] = field(default_factory=dict)

    def minus(self, before: EngineStats) -> EngineStats:
        """The counters accumulated between ``before`` and now."""

        def diff(a: int | None, b: int | None) -> int | None:
            return None if a is None else a - (b or 0)

        return EngineStats(
            preemptions=diff(self.preemptions, before.preemptions),
            prefix_cache_queries=diff(self.prefix_cache_queries, before.prefix_cache_queries),
            prefix_cache_hits=diff(self.prefix_cache_hits, before.prefix_cache_hits),
            mm_cache_queries=diff(self.mm_cache_queries, before.mm_cache_queries),
            mm_cache_hits=diff(self.mm_cache_hits, before.mm_cache_hits),
            extra={k: v - before.extra.get(k, 0.0) for k, v in self.extra.items()},
        )


class Engine(abc.ABC):
    """An inference engine driven through its in-process offline API.

    Lifecycle: ``validate`` (cheap, no engine started) -> ``start`` -> any number
    of ``generate``/``stats``/``reset_caches`` -> ``stop``. Calling
    ``generate`` before ``start`` raises ``RuntimeError``.
    """

    name: str = ""
    label: str = ""   # the engine as people write it (warnings); default: ``name``
    # Whether generate honours a request's own sampling / structured-output constraint
    # (engines.decoding); the worker refuses such requests before start where it does not.
    supports_sampling: bool = False
    supports_constraints: bool = False
    # What ``start`` imports first (the engine's package, its heaviest part): ``preload`` imports it ahead,
    # e.g. in a parked batch worker while another slot runs, so that the slot's first start skips it.
    preload_modules: tuple[str, ...] = ()
    # Whether the adapter records each engine step into ``self.step_trace`` (``engines.steptrace``); the
    # worker takes each timed pass's steps from it. An adapter that cannot says why in ``step_trace_gap``.
    records_steps: bool = False
    step_trace_gap: str = "this adapter does not record engine steps"
    # "vllm-v1" where the simulator's scheduler (engines.sim_scheduler) replays how it schedules, so that its
    # step trace may be replayed for predictions (a full-engine rate, the rest of a job); None: not replayed.
    schedules_like: str | None = None

    def __init__(self, model: dict[str, Any], knobs: dict[str, Any]):
        self.model = model
        self.knobs = dict(knobs)
        self.started = False
        # every read of the engine's statistics goes through it; its warnings go into the row
        self.stat_reader = StatReader(self.label or self.name)
        self.step_trace = StepRecorder()

    @classmethod
    def preload(cls) -> None:
        """Import ``preload_modules`` now, where they are installed; a failure is left for ``start`` to report."""
        for name in cls.preload_modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - start() imports it again and fails with the reason
                return

    @abc.abstractmethod
    def validate(self) -> None:
        """Check knobs against the engine's own argument class; raise ``KnobError``."""

    @abc.abstractmethod
    def start(self) -> StartInfo:
        """Construct the engine; return how long it took."""

    @abc.abstractmethod
    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        """Generate for all requests; return completions in the same order.

        ``on_finish(n)`` is called as requests finish, for progress reporting.
        """

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Counters accumulated since ``start``."""

    def startup_in_last_generate(self) -> float:
        """Seconds of the last ``generate`` spent starting engine replicas rather than generating.

        0 for engines started once by ``start``; an engine that starts its replicas inside each
        call (``engine=ray``: one Ray Data job per call) says how long that took, so that every
        engine's rate is over its generation span and start-up is counted in ``startup_s``.
        """
        return 0.0

    def feeder(self) -> Any:
        """An ``engines.feeding.Feeder`` for this started engine: shards fed while earlier ones generate.

        ``None`` (the default): no streaming API, and ``engines.feeding.feeder_for`` runs one blocking
        ``generate`` per shard. Adapters with a streaming API override it.
        """
        return None

    def reset_caches(self) -> None:  # noqa: B027 - optional capability
        """Drop cached prefixes and multimodal inputs (after warm-up, between passes), where the engine can."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Release the engine and its memory."""

    def simulated_seconds(self) -> float | None:
        """Predicted seconds of the last ``generate``, for a simulator; ``None`` for a real engine.

        When not ``None``, the worker reports this instead of the timed wall clock, reads
        ``Completion.finished_at`` as seconds on the same simulated clock, and marks the pass predicted.
        """
        return None

    def require_started(self) -> None:
        if not self.started:
            raise RuntimeError(f"{type(self).__name__}.start() must be called first")
