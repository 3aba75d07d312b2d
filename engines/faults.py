"""A test hook: a real engine made to fail after N of its steps, inside its own process (never set it in a job).

``TROUGHPUT_FAULT_AFTER_STEPS=N`` in an engine's environment (``+engine.env.TROUGHPUT_FAULT_AFTER_STEPS=N``;
``batch.scale=ray`` hands ``engine.env`` to its actors) makes an adapter that supports it (vLLM) raise
``InjectedFault`` at its step N + 1: requests are in the engine, unfinished, and its process lives, as when
vLLM's engine-core process is killed for memory on a GPU. With ``TROUGHPUT_FAULT_FILE=<path>`` only the first
``TROUGHPUT_FAULT_TIMES`` engines (default 1) fail, counted across processes in that file, so that an engine
restarted after the failure runs on (the scripted test engine counts its ``fail_file`` knob the same way).
Unset (every real job): nothing is counted or read. Standard library only (the worker side imports it).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Mapping
from typing import Any

AFTER_STEPS = "TROUGHPUT_FAULT_AFTER_STEPS"
FAULT_FILE = "TROUGHPUT_FAULT_FILE"
FAULT_TIMES = "TROUGHPUT_FAULT_TIMES"


class InjectedFault(RuntimeError):
    """The failure ``TROUGHPUT_FAULT_AFTER_STEPS`` asked for."""


def claim(path: str | None, times: int) -> bool:
    """Whether this engine is one of the first ``times`` to fail: counted in the file ``path`` (locked, so
    engines starting at once count apart); without a path, every engine fails."""
    if not path:
        return True
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        count = int(f.read().strip() or 0)
        if count >= times:
            return False
        f.seek(0)
        f.truncate()
        f.write(str(count + 1))
        return True


def steps_before_fault(env: Mapping[str, str] | None = None) -> int | None:
    """The steps this engine may take before it fails (``TROUGHPUT_FAULT_AFTER_STEPS``), or ``None``: it never
    does (unset, or this engine is past ``TROUGHPUT_FAULT_TIMES`` of ``TROUGHPUT_FAULT_FILE``). Call it once per
    engine start: each call with a fault file counts one engine."""
    env = os.environ if env is None else env
    value = env.get(AFTER_STEPS)
    if value in (None, ""):
        return None
    after = int(value)
    if after < 0:
        raise ValueError(f"{AFTER_STEPS}={value!r}: must be an integer >= 0")
    return after if claim(env.get(FAULT_FILE), int(env.get(FAULT_TIMES) or 1)) else None


def failing_after(step: Callable[..., Any], after: int, label: str) -> Callable[..., Any]:
    """``step`` that raises ``InjectedFault`` in place of its call number ``after + 1`` and every later one."""
    taken = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        if taken[0] >= after:
            raise InjectedFault(f"{label}: injected engine failure after {after} steps ({AFTER_STEPS}={after})")
        taken[0] += 1
        return step(*args, **kwargs)

    return counted
