"""TensorRT-LLM's iteration statistics: what troughput keeps of them, drained on a timer during a pass.

``LLM.get_stats(timeout)`` hands back the iterations gathered since the last call from a bounded
queue (``max_stats_len``); entries are dicts or JSON strings with the keys recorded in
``engines/snapshots/tensorrt_llm-1.2.1.json`` (``IterationStats``, ``KvCacheStats``,
``InflightBatchingStats``). Worker side: standard library only.
"""

from __future__ import annotations

import threading
from typing import Any

from engines.statread import StatReader

LABEL = "TensorRT-LLM"


class IterationTally:
    """What troughput keeps from ``LLM.get_stats()`` batches (dicts or JSON strings), fed as they are drained.

    ``paused`` sums ``inflightBatchingStats.numPausedRequests`` (one per preemption; ``None``
    until an iteration reports it); ``reused_blocks`` is the last cumulative
    ``kvCacheStats.reusedBlocks``; ``lost`` counts iterations missing between the first and
    last ``iter`` seen (dropped by the bounded stats queue), which would undercount ``paused``.
    Every value is read through ``reader``: one of another shape is skipped with a warning.
    Thread-safe: a ``StatsDrainer`` feeds it while results come in.
    """

    def __init__(self, reader: StatReader | None = None) -> None:
        self.reader = reader or StatReader(LABEL)
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
            for raw in iteration_stats:
                entry = self.reader.mapping(raw, "get_stats() entry")
                if entry is None:
                    continue
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
