"""A Hydra command-line app run in the test's own process, as its console script would run it.

A subprocess pays Python's start and the app's imports (hydra, numpy, transformers: seconds each time);
here they are paid once per pytest worker. The command line, stdout, stderr and exit status are the
same as a subprocess's, so tests that are not about the process boundary (kills, concurrent workers)
assert on them unchanged. Engine workers the app starts are still real processes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable


def run_app(main: Callable[[], object], prog: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``prog args...`` in ``cwd`` through ``main`` (a ``@hydra.main`` function); its exit status, stdout, stderr.

    Process-wide state the app sets (argv, the working directory, root logging's handlers and every
    logger's level, signal handlers, environment, Hydra's global instance) is restored afterwards. Not
    restored: module-level caches and third-party settings an app changes (e.g. Optuna's log verbosity);
    an exception other than ``SystemExit`` propagates (a subprocess would exit 1 with its traceback).
    """
    from hydra.core.global_hydra import GlobalHydra

    root = logging.getLogger()
    levels = {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items()
              if isinstance(logger, logging.Logger)}
    saved = (sys.argv, root.handlers[:], root.level, dict(os.environ),
             {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}, os.getcwd())
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [prog, *args]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as e:
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        GlobalHydra.instance().clear()
        os.chdir(saved[5])
        sys.argv = saved[0]
        for handler in root.handlers:
            if handler not in saved[1]:
                handler.close()
        root.handlers[:] = saved[1]
        root.setLevel(saved[2])
        for name, logger in logging.Logger.manager.loggerDict.items():
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))
        os.environ.clear()
        os.environ.update(saved[3])
        for sig, handler in saved[4].items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess([prog, *args], code, out.getvalue(), err.getvalue())
