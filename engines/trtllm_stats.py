"""TensorRT-LLM's iteration statistics: what troughput keeps of them, drained on a timer during a pass.

``LLM.get_stats(timeout)`` hands back the iterations gathered since the last call from a bounded
queue (``max_stats_len``); entries are dicts or JSON strings with the keys recorded in
``engines/snapshots/tensorrt_llm-1.2.1.json`` (``IterationStats``, ``KvCacheStats``,
``InflightBatchingStats``). Each iteration is also one step of the engine's step trace
(``iteration_step``). Worker side: standard library only.
"""

from __future__ import annotations

import threading
from typing import Any

from engines.statread import MAPPING, StatReader
from engines.steptrace import StepRecorder

LABEL = "TensorRT-LLM"
_BATCH = "IterationStats['inflightBatchingStats']"


def iteration_step(entry: Any, reader: StatReader) -> dict[str, Any] | None:
    """One ``IterationStats`` entry as ``StepRecorder.record`` keywords; ``None`` (with a warning) when it lacks
    the iteration's latency or its in-flight batch counts.

    ``dt`` is ``iterLatencyMS`` (under the PyTorch backend's overlap scheduler an iteration's latency runs
    from its start until its outputs are handled during the next one, so consecutive latencies overlap);
    ``running``/``decode``/``prefill_seqs`` are the scheduled, generation and context requests, ``prefill``
    the context tokens (``numCtxTokens``); ``waiting`` the queued requests plus the active ones not scheduled;
    ``kv_tokens`` the used KV blocks × tokens per block; ``preempted`` the paused requests. 1.2.1's stats
    hold no per-iteration context sum, so ``context`` stays unknown (-1).
    """
    latency = reader.read(entry, "iterLatencyMS", where="IterationStats")
    batch = reader.read(entry, "inflightBatchingStats", kind=MAPPING, where="IterationStats")
    if latency is None or batch is None:
        return None
    counts = [reader.read(batch, name, where=_BATCH)
              for name in ("numScheduledRequests", "numGenRequests", "numCtxTokens", "numContextRequests")]
    if any(n is None for n in counts):
        return None
    running, decode, prefill, prefill_seqs = (int(n) for n in counts)
    queued = reader.read(entry, "numQueuedRequests", where="IterationStats", required=False)
    active = reader.read(entry, "numActiveRequests", where="IterationStats", required=False)
    waiting = -1 if queued is None or active is None else int(queued) + max(int(active) - running, 0)
    used = reader.read(entry, "kvCacheStats", "usedNumBlocks", where="IterationStats", required=False)
    block = reader.read(entry, "kvCacheStats", "tokensPerBlock", where="IterationStats", required=False)
    paused = reader.read(batch, "numPausedRequests", where=_BATCH, required=False)
    return {"dt": float(latency) / 1000.0, "running": running, "decode": decode, "prefill": prefill,
            "prefill_seqs": prefill_seqs, "waiting": waiting,
            "kv_tokens": -1 if used is None or block is None else float(used) * float(block),
            "preempted": int(paused or 0)}


class IterationTally:
    """What troughput keeps from ``LLM.get_stats()`` batches (dicts or JSON strings), fed as they are drained.

    ``paused`` sums ``inflightBatchingStats.numPausedRequests`` (one per preemption; ``None``
    until an iteration reports it); ``reused_blocks`` is the last cumulative
    ``kvCacheStats.reusedBlocks``; ``lost`` counts iterations missing between the first and
    last ``iter`` seen (dropped by the bounded stats queue), which would undercount ``paused``.
    Every value is read through ``reader``: one of another shape is skipped with a warning.
    With ``steps``, each iteration is recorded there too (``iteration_step``, ``record_steps``).
    Thread-safe: a ``StatsDrainer`` feeds it while results come in.
    """

    def __init__(self, reader: StatReader | None = None, steps: StepRecorder | None = None) -> None:
        self.reader = reader or StatReader(LABEL)
        self.steps = steps
        self.paused: int | None = None
        self.reused_blocks: float | None = None
        self.seen: set[int] = set()
        self.lock = threading.Lock()

    def drain(self, llm: Any, timeout: float) -> None:
        """Take what ``llm.get_stats`` holds now; a failing call is a warning."""
        try:
            batch = llm.get_stats(timeout=timeout)
        except Exception as e:  # noqa: BLE001 - a stat never kills a run
            self.reader.warn(f"get_stats() raised {type(e).__name__}: {e}; those iterations are not counted")
            return
        self.add(batch)

    def add(self, iteration_stats: Any) -> None:
        if iteration_stats is None:
            return
        if not isinstance(iteration_stats, (list, tuple)):
            self.reader.warn(f"get_stats() returned {type(iteration_stats).__name__}, not a list; skipped")
            return
        with self.lock:
            steps = []
            for raw in iteration_stats:
                entry = self.reader.mapping(raw, "get_stats() entry")
                if entry is None:
                    continue
                step = iteration_step(entry, self.reader) if self.steps is not None else None
                if step is not None:
                    steps.append(step)
                n = self.reader.read(entry, "iter", where="IterationStats")
                if n is not None:
                    self.seen.add(int(n))
                paused = self.reader.read(entry, "inflightBatchingStats", "numPausedRequests",
                                          where="IterationStats", required=False)
                if paused is not None:
                    self.paused = (self.paused or 0) + int(paused)
                reused = self.reader.read(entry, "kvCacheStats", "reusedBlocks", where="IterationStats",
                                          required=False)
                if reused is not None:
                    self.reused_blocks = float(reused)
            if steps:
                self.record_steps(steps)

    def record_steps(self, steps: list[dict[str, Any]]) -> None:
        """Iterations of one drained batch, in order, into ``self.steps``.

        Their stats carry no end time (the PyTorch backend leaves ``timestamp`` empty), so the last one
        ends as it is drained and each earlier one where the next one's latency began, never before the
        previous step recorded: ``t`` is approximate, ``dt`` is the engine's own.
        """
        assert self.steps is not None
        end = self.steps.clock()
        ends = []
        for step in reversed(steps):
            ends.append(end)
            end -= step["dt"]
        floor = self.steps.last_end
        for step, end in zip(steps, reversed(ends)):
            self.steps.record(**step, end=end if floor is None else max(end, floor))

    @property
    def lost(self) -> int:
        return (max(self.seen) - min(self.seen) + 1 - len(self.seen)) if self.seen else 0

    def extra(self) -> dict[str, float]:
        out = {"iterations": float(len(self.seen)), "iteration_stats_lost": float(self.lost)}
        if self.reused_blocks is not None:
            out["kv_reused_blocks"] = self.reused_blocks
        return out


class StatsDrainer:
    """Drains ``llm.get_stats`` into ``tally`` every ``interval_s`` on a daemon thread, for the length of a
    ``with`` block (a long pass would otherwise overflow the bounded queue before its first result), and once
    as it ends."""

    def __init__(self, llm: Any, tally: IterationTally, interval_s: float):
        self.llm, self.tally, self.interval_s = llm, tally, max(interval_s, 0.001)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="trtllm-stats", daemon=True)

    def __enter__(self) -> StatsDrainer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.tally.drain(self.llm, timeout=0.01)   # and once as the pass ends

    def _loop(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.tally.drain(self.llm, timeout=0.01)
