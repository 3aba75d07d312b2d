"""The discrete-event core of the simulator: a vLLM-V1-style scheduler over paged KV blocks.

Offline batch: every request arrives at time zero, so scheduling does not depend
on time, and a run is a sequence of steps. Each step follows vLLM's V1 scheduler
(``vllm/v1/core/sched/scheduler.py``, 0.32): running requests first, each taking
what it still needs of the token budget (one token when decoding, a chunk when
prefilling); when the KV blocks run out, the most recently admitted running
request is preempted (its blocks freed, recomputed later). Then, only if nothing
was preempted, waiting requests are admitted in order while the budget, the
sequence limit and the free blocks allow (a request is admitted only when blocks
for its whole current length fit). Full blocks are hashed as they fill; a new
request reuses the longest chain of cached blocks (never its last token); freed
blocks stay cached until evicted, least recently freed first.

The time of each step comes from ``cost(tokens, seqs, attention_pairs, kv_tokens)``,
passed in from outside (``engines.perfmodel`` via ``engines.sim``). Standard library only.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from engines.stepmodel import StepShape

_uids = itertools.count()


@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs the scheduler obeys (vLLM's names in comments)."""

    max_seqs: int                 # max_num_seqs
    max_tokens_per_step: int      # max_num_batched_tokens
    chunked_prefill: bool         # enable_chunked_prefill
    prefix_caching: bool          # enable_prefix_caching
    block_size: int               # block_size
    num_blocks: int               # KV cache bytes ÷ (block_size · KV bytes per token)
    max_model_len: int            # max_model_len


class SimRequest:
    """One request's progress: tokens computed, tokens generated, blocks held."""

    __slots__ = ("index", "prompt", "n_prompt", "max_tokens", "uid", "generated", "computed", "blocks", "hashes",
                 "registered", "preemptions", "cached_tokens", "finished_at", "encoder_tokens", "encode")

    def __init__(self, index: int, prompt: Sequence[int], max_tokens: int, encoder_tokens: int = 0):
        self.index, self.prompt, self.n_prompt, self.max_tokens = index, prompt, len(prompt), max_tokens
        self.encoder_tokens = encoder_tokens  # vision-encoder output tokens, computed with its first chunk
        self.encode = False
        self.uid = next(_uids)
        self.generated = self.computed = self.preemptions = self.registered = 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []
        self.cached_tokens: int | None = None
        self.finished_at: float | None = None

    @property
    def num_tokens(self) -> int:
        return self.n_prompt + self.generated

    def block_hash(self, i: int, block_size: int) -> int:
        """Hash of the chain of full blocks 0..i; generated tokens are unique to this request."""
        while len(self.hashes) <= i:
            j = len(self.hashes)
            start, end = j * block_size, (j + 1) * block_size
            n_prompt = len(self.prompt)
            if end <= n_prompt:
                content: tuple = tuple(self.prompt[start:end])
            else:
                content = (tuple(self.prompt[start:n_prompt]), self.uid, end - max(start, n_prompt))
            self.hashes.append(hash((self.hashes[-1] if self.hashes else None, content)))
        return self.hashes[i]


class BlockPool:
    """Paged KV blocks with a prefix cache; free blocks are evicted least recently freed first.

    Block 0 is never handed out: vLLM keeps it as its null block.
    """

    def __init__(self, num_blocks: int, caching: bool):
        self.caching = caching
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.refs = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}

    def num_free(self) -> int:
        return len(self.free)

    def lookup(self, request: SimRequest, block_size: int) -> list[int]:
        """The longest run of cached blocks that starts the request (its last token is never a hit)."""
        if not self.caching:
            return []
        hits: list[int] = []
        for i in range((request.num_tokens - 1) // block_size):
            block = self.cached.get(request.block_hash(i, block_size))
            if block is None:
                break
            hits.append(block)
        return hits

    def take(self, blocks: list[int]) -> None:
        """Hold cached blocks (a hit): out of the free queue if nobody held them."""
        for block in blocks:
            if self.refs[block] == 0:
                del self.free[block]
            self.refs[block] += 1

    def allocate(self, n: int) -> list[int]:
        blocks = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            old = self.hash_of[block]
            if old is not None:
                if self.cached.get(old) == block:
                    del self.cached[old]
                self.hash_of[block] = None
            self.refs[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: list[int]) -> None:
        """Drop a request's blocks; the tail goes first into the free queue, so it is evicted first."""
        for block in reversed(blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None

    def register(self, request: SimRequest, upto_tokens: int, block_size: int) -> None:
        """Cache the request's blocks that are full among its first ``upto_tokens`` tokens."""
        full = upto_tokens // block_size
        for i in range(request.registered, full):
            block = request.blocks[i]
            if self.hash_of[block] is None:
                h = request.block_hash(i, block_size)
                if h not in self.cached:
                    self.cached[h] = block
                    self.hash_of[block] = h
        request.registered = max(request.registered, full)

    def reset(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents)."""
        self.cached.clear()
        self.hash_of = [None] * len(self.hash_of)


@dataclass
class Counters:
    """vLLM-style counters: preemptions, prefix-cache queries and hits (tokens, first admissions only)."""

    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass
class SimResult:
    """What one simulated ``generate`` produced: per-request outcomes, predicted seconds, and the step trace."""

    requests: list[SimRequest]
    seconds: float
    steps: int
    trace: list[StepShape] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)  # per step, with trace


StepCostFn = Callable[[StepShape], float]


class Scheduler:
    """Runs batches of requests to completion against one block pool (kept between batches)."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.pool = BlockPool(config.num_blocks, config.prefix_caching)
        self.counters = Counters()

    def run(self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], cost: StepCostFn,
            trace: bool = False, on_finish: Callable[[int], None] | None = None,
            encoder_tokens: Sequence[int] | None = None, on_step: Callable[[StepShape, float, int], None] | None = None
            ) -> SimResult:
        """Simulate every request to its last token; ``cost(step)`` gives each step's seconds.

        Args:
            trace: keep each step's ``StepShape`` (and its preemptions) in the result.
            encoder_tokens: per request, vision-encoder output tokens (0 for text).
            on_step: called after each step with its shape, seconds and preemptions (the step trace).
        """
        encoder_tokens = encoder_tokens or [0] * len(prompts)
        requests = [SimRequest(i, p, m, e) for i, (p, m, e) in enumerate(zip(prompts, max_tokens, encoder_tokens))]
        for r in requests:
            if r.num_tokens + r.max_tokens - 1 > self.config.max_model_len:
                raise ValueError(f"request {r.index}: prompt {len(r.prompt)} + max_tokens {r.max_tokens} "
                                 f"exceeds max_model_len {self.config.max_model_len}")
        waiting: deque[SimRequest] = deque(requests)
        running: list[SimRequest] = []
        clock, steps, steps_trace, preempted_trace = 0.0, 0, [], []
        while waiting or running:
            preempted_before = self.counters.preemptions
            scheduled = self._schedule(waiting, running)
            if not scheduled:
                raise RuntimeError("simulator stalled: no request fits the KV cache (raise its size)")
            preempted = self.counters.preemptions - preempted_before
            shape = self._shape(scheduled, preempted)
            seconds = cost(shape)
            clock += seconds
            steps += 1
            if trace:
                steps_trace.append(shape)
                preempted_trace.append(preempted)
            if on_step is not None:
                on_step(shape, seconds, preempted)
            self._advance(scheduled, running, clock, on_finish)
        return SimResult(requests, clock, steps, steps_trace, preempted_trace)

    def _shape(self, scheduled: list[tuple[SimRequest, int]], preempted: int) -> StepShape:
        """What a step holds; a request counts as prefilling until its first token (as vLLM counts it)."""
        tokens, pairs, context, decode_context, prefill, prefill_seqs, encoder = 0, 0.0, 0, 0, 0, 0, 0
        for r, n in scheduled:
            tokens += n
            pairs += n * (r.computed + (n + 1) / 2)
            context += r.computed + n
            if r.generated > 0:
                decode_context += r.computed + n
            if r.generated == 0:
                prefill += n
                prefill_seqs += 1
            else:   # a resumed (preempted) request recomputes: all but the token it samples is prefill work
                prefill += n - 1
            if r.encode:
                encoder += r.encoder_tokens
                r.encode = False
        held = (self.config.num_blocks - 1 - self.pool.num_free()) * self.config.block_size
        return StepShape(tokens, len(scheduled), pairs, float(held), prefill, len(scheduled) - prefill_seqs, encoder,
                         float(context), float(decode_context), preempted)

    def _schedule(self, waiting: deque[SimRequest], running: list[SimRequest]) -> list[tuple[SimRequest, int]]:
        cfg, pool, bs = self.config, self.pool, self.config.block_size
        budget = cfg.max_tokens_per_step
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = r.n_prompt + r.generated - r.computed
            if n > budget:
                n = budget
            end = r.computed + n
            need = -(-end // bs) - len(r.blocks)
            if need > 0:
                self_preempted = False
                while need > len(pool.free):
                    victim = running.pop()
                    self._preempt(victim, waiting)
                    preempted = True
                    if victim is r:
                        self_preempted = True
                        break
                if self_preempted:
                    break
                r.blocks += pool.allocate(need)
            if pool.caching and end // bs > r.registered:
                pool.register(r, end, bs)
            scheduled.append((r, n))
            budget -= n
            i += 1
        if preempted:
            return scheduled
        while waiting and budget > 0 and len(running) < cfg.max_seqs:
            r = waiting[0]
            hits = pool.lookup(r, bs)
            hit_tokens = len(hits) * bs
            n = r.num_tokens - hit_tokens
            if not cfg.chunked_prefill and n > budget:
                break
            n = min(n, budget)
            evictable = sum(1 for b in hits if pool.refs[b] == 0)
            if -(-r.num_tokens // bs) - len(hits) + evictable > len(pool.free):
                break  # the whole sequence must fit before admission
            pool.take(hits)
            r.blocks = hits + pool.allocate(-(-(hit_tokens + n) // bs) - len(hits))
            r.computed = hit_tokens
            if r.preemptions == 0 and pool.caching:
                self.counters.prefix_cache_queries += r.num_tokens
                self.counters.prefix_cache_hits += hit_tokens
            if r.cached_tokens is None:
                r.cached_tokens = hit_tokens
            r.encode = r.encoder_tokens > 0  # its new images, encoded with its first chunk
            r.registered = len(hits)
            if pool.caching:
                pool.register(r, hit_tokens + n, bs)
            waiting.popleft()
            running.append(r)
            scheduled.append((r, n))
            budget -= n
        return scheduled

    def _preempt(self, r: SimRequest, waiting: deque[SimRequest]) -> None:
        self.pool.release(r.blocks)
        r.blocks = []
        r.computed = r.registered = 0
        r.preemptions += 1
        self.counters.preemptions += 1
        waiting.appendleft(r)

    def _advance(self, scheduled: list[tuple[SimRequest, int]], running: list[SimRequest], clock: float,
                 on_finish: Callable[[int], None] | None) -> None:
        """After a step: chunks computed; a request that caught up samples a token, and may finish."""
        finished = []
        for r, n in scheduled:
            r.computed += n
            if r.computed >= r.n_prompt + r.generated:
                r.generated += 1
                if r.generated >= r.max_tokens:
                    r.finished_at = clock
                    finished.append(r)
        if finished:
            done = set(map(id, finished))
            running[:] = [r for r in running if id(r) not in done]
            for r in finished:
                self.pool.release(r.blocks)
                r.blocks = []
            if on_finish is not None:
                on_finish(len(finished))
