"""Feeding one running engine shard after shard, so that its queue never runs dry at a shard boundary.

A ``Feeder`` is an add/poll pair over a started engine: ``feed(shard, requests)`` hands a
shard's requests to the engine and returns at once; ``collect(timeout)`` advances the engine
and returns every shard whose last request has finished (``ShardOutput``), in the order they
finish, not the order they were fed. The batch worker feeds the next shard while the current
one still generates and commits each shard as soon as it comes back.

- ``SerialFeeder``: any engine, through its blocking ``generate`` (one shard at a time, the
  engine drains at each boundary); the fallback for adapters without a streaming API.
- ``AsyncFeeder``: an asyncio loop on its own thread, one task per request; the adapter gives
  the coroutine that runs one request (SGLang ``Engine.async_generate``, TensorRT-LLM
  ``LLM.generate_async`` + ``aresult``).
- The vLLM adapter's feeder (``engines.vllm.VllmFeeder``) adds requests to the running
  ``LLMEngine`` and steps it.

A request the engine rejects with ``ValueError`` is that request's error, not the shard's.
Standard library only (the worker side imports it).
"""

from __future__ import annotations

import abc
import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from engines.base import Completion, Engine, Request


@dataclass
class ShardOutput:
    """One shard, finished: completions in the order of its accepted requests, rejected requests' errors.

    ``fed_at`` and ``finished_at`` are ``time.perf_counter()`` values: when its requests were
    handed to the engine and when its last one finished (``span_s`` apart; a simulator gives
    its predicted span instead).
    """

    shard: str
    completions: list[Completion]
    errors: dict[str, str]
    fed_at: float
    finished_at: float
    simulated_span_s: float | None = None
    startup_s: float = 0.0  # replicas started inside the shard's generate calls (engine=ray): not generation

    @property
    def span_s(self) -> float:
        if self.simulated_span_s is not None:
            return self.simulated_span_s
        return max(0.0, self.finished_at - self.fed_at - self.startup_s)


@dataclass
class OpenShard:
    """A shard fed and not yet finished."""

    shard: str
    requests: list[Request]
    fed_at: float
    done: dict[str, Completion] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def complete(self) -> bool:
        return len(self.done) + len(self.errors) >= len(self.requests)

    def output(self) -> ShardOutput:
        completions = [self.done[r.id] for r in self.requests if r.id in self.done]
        finished = max((c.finished_at or 0.0 for c in completions), default=0.0) or time.perf_counter()
        return ShardOutput(self.shard, completions, self.errors, self.fed_at, max(finished, self.fed_at))


def rejected(error: Exception) -> str:
    return f"the engine rejected the request: {error}"


class Feeder(abc.ABC):
    """Hands shards to one started engine and returns them as they finish."""

    streams = True  # whether shards fed while others run share the engine's running batch

    def __init__(self) -> None:
        self.open: dict[str, OpenShard] = {}
        self.ready: list[ShardOutput] = []  # shards that finished when fed (every request rejected, or none)

    def idle(self) -> bool:
        """Whether the engine has nothing fed that has not come back."""
        return not self.open

    @abc.abstractmethod
    def feed(self, shard: str, requests: list[Request]) -> None:
        """Hand ``requests`` (one shard, ids unique within it) to the engine without waiting for them."""

    @abc.abstractmethod
    def collect(self, timeout: float) -> list[ShardOutput]:
        """Advance the engine for up to about ``timeout`` seconds; return the shards that finished."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the feeder holds (its thread); the engine itself is stopped by its owner."""

    def _finish(self, state: OpenShard) -> ShardOutput:
        del self.open[state.shard]
        return state.output()

    def _take_ready(self) -> list[ShardOutput]:
        ready, self.ready = self.ready, []
        return ready


class SerialFeeder(Feeder):
    """One blocking ``generate`` per shard, in the order fed: the engine drains at every boundary."""

    streams = False

    def __init__(self, engine: Any):
        super().__init__()
        self.engine = engine
        self.queued: deque[OpenShard] = deque()

    def feed(self, shard: str, requests: list[Request]) -> None:
        state = OpenShard(shard, list(requests), time.perf_counter())
        self.open[shard] = state
        self.queued.append(state)

    def collect(self, timeout: float) -> list[ShardOutput]:
        if not self.queued:
            return []
        state = self.queued.popleft()
        state.fed_at = time.perf_counter()  # the engine starts on it now, not when it was queued
        spent: dict[str, float] = {}
        generate_isolating(self.engine, state.requests, state.done, state.errors, spent)
        out = self._finish(state)
        out.finished_at = time.perf_counter()
        out.simulated_span_s = spent.get("simulated")
        out.startup_s = spent.get("startup", 0.0)
        return [out]


def feeder_for(engine: Engine) -> Feeder:
    """The engine's own feeder (``Engine.feeder``), or a ``SerialFeeder`` when it has none."""
    return engine.feeder() or SerialFeeder(engine)


def generate_isolating(engine: Any, requests: list[Request], done: dict[str, Completion],
                       errors: dict[str, str], spent: dict[str, float]) -> None:
    """``engine.generate(requests)`` into ``done``; a ``ValueError`` is narrowed by halving to the requests causing it.

    Adds to ``spent``: ``simulated`` seconds where the engine is a simulator, ``startup`` seconds
    of replica start-up inside the calls (``Engine.startup_in_last_generate``).
    """
    if not requests:
        return
    try:
        completions = engine.generate(requests)
    except ValueError as e:
        if len(requests) == 1:
            errors[requests[0].id] = rejected(e)
            return
        half = len(requests) // 2
        for part in (requests[:half], requests[half:]):
            generate_isolating(engine, part, done, errors, spent)
        return
    if [c.id for c in completions] != [r.id for r in requests]:
        raise RuntimeError("engine returned completions out of order or incomplete")
    now = time.perf_counter()
    for c in completions:
        c.finished_at = c.finished_at or now
        done[c.id] = c
    simulated = engine.simulated_seconds()
    if simulated is not None:
        spent["simulated"] = spent.get("simulated", 0.0) + simulated
    spent["startup"] = spent.get("startup", 0.0) + engine.startup_in_last_generate()


class AsyncFeeder(Feeder):
    """One asyncio task per request on a loop of its own thread; ``run_one(request)`` is the engine's call.

    Every coroutine runs on that one loop (an engine's async API binds to the loop it is first
    used from); the shard bookkeeping happens there too and finished shards cross to the
    caller's thread on a queue. Any exception other than ``ValueError`` ends the feeder:
    ``collect`` raises it.
    """

    def __init__(self, run_one: Callable[[Request], Awaitable[Completion]]):
        super().__init__()
        self.run_one = run_one
        self.finished: queue.Queue[ShardOutput | BaseException] = queue.Queue()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="troughput-feeder", daemon=True)
        self.thread.start()

    def feed(self, shard: str, requests: list[Request]) -> None:
        state = OpenShard(shard, list(requests), time.perf_counter())
        self.open[shard] = state
        if not requests:
            self.ready.append(self._finish(state))
            return
        asyncio.run_coroutine_threadsafe(self._shard(state), self.loop)

    async def _shard(self, state: OpenShard) -> None:
        tasks = [asyncio.ensure_future(self._one(state, r)) for r in state.requests]
        try:
            await asyncio.gather(*tasks)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self.finished.put(e)
            return
        self.finished.put(state.output())

    async def _one(self, state: OpenShard, request: Request) -> None:
        try:
            completion = await self.run_one(request)
        except ValueError as e:
            state.errors[request.id] = rejected(e)
            return
        completion.finished_at = completion.finished_at or time.perf_counter()
        state.done[request.id] = completion

    def collect(self, timeout: float) -> list[ShardOutput]:
        outs = self._take_ready()
        try:
            item = self.finished.get(timeout=0 if outs else timeout)
            while True:
                if isinstance(item, BaseException):
                    raise item
                del self.open[item.shard]
                outs.append(item)
                item = self.finished.get_nowait()
        except queue.Empty:
            return outs

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
