"""An engine's step trace: what each engine step held and how long it took.

A step (one scheduler iteration) is the unit an engine's throughput is made of: its rate
at any moment is (sequences running) ÷ (seconds per step), and the seconds depend on what
the step holds. Each adapter records its steps into a ``StepRecorder`` where the engine
shows them (vLLM: the per-iteration scheduler stats of its engine core; TensorRT-LLM: its
iteration stats; the HF baseline and the simulator: their own loops); the worker takes
the steps of each timed pass (``take``) and hands them to the driver, which keeps them
beside the row (``harness.steps``).

Columns (``STEP_FIELDS``), one value per step:

- ``weight``: steps this line stands for (1; more for an aggregated line, see below);
- ``t``: seconds from the recorder's start to the step's end; ``dt``: the step's seconds;
- ``running``: sequences in the step; ``waiting``: requests queued behind it (-1: unknown);
- ``decode``: sequences generating one token; ``prefill``: prompt tokens computed (chunks);
  ``prefill_seqs``: sequences prefilling;
- ``kv_tokens``: tokens of KV cache in use after the step (-1: unknown);
- ``context``: the step's sequences' context tokens, summed (what attention reads; a prefix shared by
  many sequences counts once per sequence, unlike ``kv_tokens``; -1: unknown); ``decode_context``:
  the decoding sequences' part of it (-1: unknown);
- ``encoder_tokens``: vision-encoder output tokens computed in the step (images);
- ``preempted``: requests preempted in the step.

Bounded: past ``limit`` lines in one take, further steps are aggregated by what they held
(decode sequences, prefill tokens and context in log-spaced buckets, encoder work or
not): each such line is the mean of its steps with ``weight`` = their count, so a job of
10^6 steps keeps at most ``limit`` lines plus a few thousand buckets. Standard library only.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

STEP_FIELDS = ("weight", "t", "dt", "running", "waiting", "decode", "prefill", "prefill_seqs", "kv_tokens",
               "context", "decode_context", "encoder_tokens", "preempted")
RAW_LIMIT = 100_000
_SUMMED = STEP_FIELDS[1:]


def _bucket(value: float) -> int:
    """Log-spaced bucket (about 19% wide) of a non-negative count; 0 stays its own bucket."""
    return 0 if value <= 0 else 1 + int(math.log(value) / math.log(1.19))


class StepRecorder:
    """Collects steps as an engine runs them; ``take`` hands over what was collected since the last take."""

    def __init__(self, limit: int = RAW_LIMIT, clock=time.perf_counter):
        self.limit, self.clock = limit, clock
        self.origin = clock()
        self.last_end: float | None = None
        self.lock = threading.Lock()   # an engine's feeder thread records while the worker takes
        self._reset()

    def _reset(self) -> None:
        self.rows: list[tuple[float, ...]] = []
        self.bins: dict[tuple[int, int, int, bool], list[float]] = {}

    def begin(self) -> None:
        """Work arrives at an engine that had none: the next step's time counts from now, not from the
        last step before the gap (a gap between shards is idle time, not step time)."""
        self.last_end = self.clock()

    def record(self, *, running: int, decode: int, prefill: int, prefill_seqs: int = 0, waiting: int = -1,
               kv_tokens: float = -1, context: float = -1, decode_context: float = -1, encoder_tokens: int = 0,
               preempted: int = 0,
               dt: float | None = None, end: float | None = None) -> None:
        """One step that ended at ``end`` (default: now). ``dt`` default: since the previous step's end
        (or ``begin``); give it where the engine timed the step itself."""
        end = self.clock() if end is None else end
        with self.lock:
            if dt is None:
                dt = end - self.last_end if self.last_end is not None else 0.0
            self.last_end = end
            self._add((1.0, end - self.origin, max(dt, 0.0), running, waiting, decode, prefill, prefill_seqs, kv_tokens,
                       context, decode_context, encoder_tokens, preempted))

    def extend(self, trace: dict[str, list[float]] | None) -> None:
        """Add a taken trace's lines (another recorder's, e.g. a shard's), aggregating past the limit as ``record``."""
        rows = list(zip(*(trace[name] for name in STEP_FIELDS))) if trace and trace.get("weight") else []
        with self.lock:
            for row in rows:
                self._add(tuple(float(v) for v in row))

    def _add(self, row: tuple[float, ...]) -> None:
        if len(self.rows) < self.limit and row[0] == 1.0:
            self.rows.append(row)
            return
        n = row[0]
        key = (_bucket(row[5]), _bucket(row[6]), _bucket(max(row[9], row[8], 0)), row[11] > 0)
        sums = self.bins.setdefault(key, [0.0] * len(STEP_FIELDS))
        sums[0] += n
        for i in range(1, len(row)):
            sums[i] += row[i] * n

    def __len__(self) -> int:
        return len(self.rows) + int(sum(b[0] for b in self.bins.values()))

    def snapshot(self) -> dict[str, list[float]]:
        """The steps since the last take, as columns (``STEP_FIELDS``); an aggregated line holds its steps' means."""
        with self.lock:
            return self._columns()

    def take(self) -> dict[str, list[float]]:
        """``snapshot``, and the recorder starts empty again."""
        with self.lock:
            trace = self._columns()
            self._reset()
        return trace

    def _columns(self) -> dict[str, list[float]]:
        rows = list(self.rows)
        for sums in self.bins.values():
            n = sums[0]
            rows.append((n, *(v / n for v in sums[1:])))
        return {name: [row[i] for row in rows] for i, name in enumerate(STEP_FIELDS)}


def empty_trace() -> dict[str, list[float]]:
    return {name: [] for name in STEP_FIELDS}


def concat(traces: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Traces one after another (a shard's takes, a run's passes)."""
    out = empty_trace()
    for trace in traces:
        for name in STEP_FIELDS:
            out[name].extend(trace.get(name) or [])
    return out


def summary(trace: dict[str, Any]) -> dict[str, float | None]:
    """What a row shows of its trace: steps, mean and largest batch, mean step seconds, preemptions."""
    w = trace.get("weight") or []
    n = sum(w)
    if not n:
        return {"count": 0, "mean_running": None, "max_running": None, "mean_step_s": None, "preempted": None}

    def mean(name: str) -> float:
        return sum(a * b for a, b in zip(w, trace[name])) / n
    return {"count": int(n), "mean_running": mean("running"), "max_running": max(trace["running"]),
            "mean_step_s": mean("dt"), "preempted": sum(a * b for a, b in zip(w, trace["preempted"]))}


def occupancy(trace: dict[str, Any] | None, capacity: Any) -> dict[str, float | int | None]:
    """How full an engine ran over ``trace``'s steps: ``engine_steps`` (their count), ``mean_running`` (sequences
    per step, each step weighted alike) and ``occupancy`` = mean running ÷ ``capacity`` (the sequences the engine
    holds at once, its ``max_num_seqs``). ``None`` where there is no trace (an engine that records no steps) or no
    capacity, never a guess; a trace without steps (a shard that finished in the same step as the one before it)
    has 0 steps and no occupancy."""
    if trace is None:
        return {"engine_steps": None, "mean_running": None, "occupancy": None}
    n = sum(trace.get("weight") or [])
    if not n:
        return {"engine_steps": 0, "mean_running": None, "occupancy": None}
    mean_running = sum(w * r for w, r in zip(trace["weight"], trace["running"])) / n
    cap = float(capacity) if isinstance(capacity, (int, float)) and not isinstance(capacity, bool) else 0.0
    return {"engine_steps": int(round(n)), "mean_running": mean_running,
            "occupancy": mean_running / cap if cap > 0 else None}


__all__ = ["RAW_LIMIT", "STEP_FIELDS", "StepRecorder", "concat", "empty_trace", "occupancy", "summary"]
