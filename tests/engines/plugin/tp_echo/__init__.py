"""A scripted engine from outside troughput: it echoes each prompt's last token ``max_tokens`` times.

Everything troughput needs is here: the adapter, its unit (found through the ``troughput.engines``
entry point in this package's ``pyproject.toml``) and its config directory (``conf/engine/echo.yaml``,
``conf/tune/echo_cpu.yaml``), named by ``UNIT.conf``.
"""

from __future__ import annotations

import time
from pathlib import Path

from engines.base import Completion, Engine, EngineStats, KnobError, StartInfo
from engines.knobs import NativeMapping
from engines.unit import EngineUnit, Environment

KNOWN = {"batch", "pause_s"}


class EchoEngine(Engine):
    name = "echo"

    def validate(self) -> None:
        unknown = sorted(set(self.knobs) - KNOWN)
        if unknown:
            raise KnobError(f"unknown echo knob(s) {unknown}; known: {', '.join(sorted(KNOWN))}")

    def start(self) -> StartInfo:
        self.started = True
        return StartInfo(startup_s=0.0, engine_version="echo-0.1")

    def generate(self, requests, on_finish=None):
        self.require_started()
        out = []
        for request in requests:
            time.sleep(float(self.knobs.get("pause_s") or 0))
            out.append(Completion(request.id, len(request.prompt_token_ids),
                                  [request.prompt_token_ids[-1]] * request.max_tokens, cached_tokens=0,
                                  finished_at=time.perf_counter()))
            if on_finish:
                on_finish(1)
        return out

    def stats(self) -> EngineStats:
        return EngineStats(preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0)

    def stop(self) -> None:
        self.started = False


UNIT = EngineUnit(
    name="echo", label="Echo (plugin)", adapter="tp_echo:EchoEngine",
    knobs={"max_seqs": NativeMapping(("batch",))},
    environments={"default": Environment("tp_echo", needs_gpu=False)},
    tune_spaces={"cpu": "echo_cpu"},
    conf=str(Path(__file__).resolve().parent / "conf"),
)
