"""vLLM's compile time from its engine-core log, for a GPU run where the engine core is another process.

On a GPU, vLLM 0.32 runs its engine core in a child process; the workers there compile (``torch.compile``,
CUDA graphs), and the executor sets ``compilation_config.compilation_time`` in *that* process's config
(``v1/executor/abstract.py``, ``compile_or_warm_up_model``). The front end's config, which the adapter reads,
stays at 0, so ``compile_s`` came out empty. The engine core does log the figure once, when its caches are
initialised (``v1/engine/core.py``, ``_initialize_kv_caches``), in one of three forms:

    init engine (profile, create kv cache, warmup model) took %.2f s
    init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)
    init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s — language_model: %.2f s, encoder: %.2f s)

(the middle number is language model + encoder), after vLLM's record prefix ``(EngineCore_DP0 pid=N) INFO
MM-DD HH:MM:SS [core.py:L]``. The engine core inherits the worker's stderr, which the runner sends to the
run's log file, so the adapter marks where that file ends before ``LLM(...)`` and reads what was written
since (``StderrSince``). Read from vLLM's source (the installed 0.32 and vllm-project/vllm's
``v1/engine/core.py``); ``tests/engines/test_vllm_log.py`` renders those format strings from the installed
source and parses them back.

Worker side: standard library only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<total>\d+(?:\.\d+)?) s"
                         r"(?: \(compilation: (?P<compile>\d+(?:\.\d+)?) s)?")


def compile_seconds(text: str) -> float | None:
    """Compile seconds from the engine core's last "init engine ... took" line in ``text``: its compilation
    figure, 0.0 where the line has none (nothing compiled: eager mode), None where no such line is in ``text``."""
    found = None
    for found in INIT_ENGINE.finditer(text):
        pass
    if found is None:
        return None
    return float(found.group("compile")) if found.group("compile") else 0.0


RECORD_PID = re.compile(r"\((?P<name>[^()\s]+) pid=(?P<pid>\d+)\)[^\n]*init engine \(profile")


def engine_core_pid(text: str) -> int | None:
    """The pid in vLLM's record prefix of the last "init engine ... took" line (the engine core's process)."""
    found = None
    for found in RECORD_PID.finditer(text):
        pass
    return int(found.group("pid")) if found else None


class StderrSince:
    """What this process's stderr file received after ``mark()``; empty where stderr is not a regular file
    (a terminal or a pipe: nothing to read back) or cannot be read."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.offset = 0

    def mark(self) -> StderrSince:
        try:
            target = Path(os.readlink("/proc/self/fd/2"))
            if target.is_file():
                self.path, self.offset = target, target.stat().st_size
        except OSError:
            self.path = None
        return self

    def read(self, limit: int = 4 * 1024 * 1024) -> str:
        if self.path is None:
            return ""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                return f.read(limit).decode("utf-8", errors="replace")
        except OSError:
            return ""
