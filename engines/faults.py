"""A test hook: a real engine made to fail after N of its steps, inside its own process (never set it in a job).

``TROUGHPUT_FAULT_AFTER_STEPS=N`` in an engine's environment (``+engine.env.TROUGHPUT_FAULT_AFTER_STEPS=N``;
``batch.scale=ray`` hands ``engine.env`` to its actors) makes an adapter that supports it (vLLM) raise
``InjectedFault`` at its step N + 1: requests are in the engine, unfinished, and its process lives, as when
vLLM's engine-core process is killed for memory on a GPU. With ``TROUGHPUT_FAULT_FILE=<path>`` only the first
``TROUGHPUT_FAULT_TIMES`` engines (default 1) fail, counted across processes in that file, so that an engine
restarted after the failure runs on (the scripted test engine counts its ``fail_file`` knob the same way).
Unset (every real job): nothing is counted or read. Set, it never goes unseen: a value that is not an integer
>= 0 stops the engine before it starts, with an error naming the variable; otherwise every engine start warns
on stderr and says so in its start info (``extra["fault_hook"]``; a batch row's ``engine_info.fault_hook``), also
on an engine whose adapter has no hook. Standard library only (the worker side imports it).
"""

from __future__ import annotations

import fcntl
import os
import sys
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


def after_steps(env: Mapping[str, str] | None = None) -> int | None:
    """``TROUGHPUT_FAULT_AFTER_STEPS`` as an integer >= 0, or ``None`` where it is unset; any other value is an error
    naming the variable (checked before an engine starts, whether or not its adapter has the hook)."""
    env = os.environ if env is None else env
    value = env.get(AFTER_STEPS)
    if value in (None, ""):
        return None
    try:
        after = int(str(value).strip())
    except ValueError:
        after = -1
    if after < 0:
        raise ValueError(f"{AFTER_STEPS}={value!r}: must be an integer >= 0 (a test hook that makes the engine fail "
                         f"after that many steps, engines/faults.py; unset it in a real job)")
    return after


def _times(env: Mapping[str, str]) -> int:
    value = env.get(FAULT_TIMES) or "1"
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{FAULT_TIMES}={value!r}: must be an integer (how many engines fail, with "
                         f"{FAULT_FILE})") from None


def steps_before_fault(env: Mapping[str, str] | None = None) -> int | None:
    """The steps this engine may take before it fails (``TROUGHPUT_FAULT_AFTER_STEPS``), or ``None``: it never
    does (unset, or this engine is past ``TROUGHPUT_FAULT_TIMES`` of ``TROUGHPUT_FAULT_FILE``). Call it once per
    engine start: each call with a fault file counts one engine."""
    env = os.environ if env is None else env
    after = after_steps(env)
    if after is None:
        return None
    return after if claim(env.get(FAULT_FILE), _times(env)) else None


def hook_note(after: int, fails: bool, env: Mapping[str, str] | None = None) -> str:
    """What an adapter with the hook says of it in its start info (``extra["fault_hook"]``)."""
    env = os.environ if env is None else env
    if fails:
        return f"{AFTER_STEPS}={after}: this engine fails at its step {after + 1} (a test hook, engines/faults.py)"
    return (f"{AFTER_STEPS}={after} is set; this engine is past {FAULT_TIMES}={_times(env)} of {FAULT_FILE}="
            f"{env.get(FAULT_FILE)}, so it does not fail (a test hook, engines/faults.py)")


def announce(extra: dict[str, Any], engine: str, env: Mapping[str, str] | None = None) -> str | None:
    """Once an engine has started: where ``TROUGHPUT_FAULT_AFTER_STEPS`` is set, its start info says so
    (``extra["fault_hook"]``: the adapter's own note, else that this engine has no such hook) and a warning goes to
    stderr (the worker's log), so a hook set by mistake leaves a trace in the row (``engine_info.fault_hook``).
    Returns the note, ``None`` where the hook is unset."""
    after = after_steps(env)
    if after is None:
        return None
    note = extra.setdefault("fault_hook", f"{AFTER_STEPS}={after} is set, but engine {engine!r} has no such hook: "
                                          f"it has no effect")
    print(f"troughput: warning: {note}; unset {AFTER_STEPS} in a real job", file=sys.stderr, flush=True)
    return str(note)


def failing_after(step: Callable[..., Any], after: int, label: str) -> Callable[..., Any]:
    """``step`` that raises ``InjectedFault`` in place of its call number ``after + 1`` and every later one."""
    taken = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        if taken[0] >= after:
            raise InjectedFault(f"{label}: injected engine failure after {after} steps ({AFTER_STEPS}={after})")
        taken[0] += 1
        return step(*args, **kwargs)

    return counted
