"""Python packages carried as wheels to a machine without network (the device machine: 64 MiB of files a call).

Fetched here (``fetch``), checked against that machine's ``python -V`` (``tag_problem``), installed there with
``pip install --no-index --no-deps --target DIR`` (``install``), never into its system Python: the processes
that need them get DIR on ``PYTHONPATH`` (``pythonpath``). Standard library only.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path


def fetch(dest: Path, pins: list[str], timeout: float = 600) -> str:
    """Here, with network: a wheel for each of ``pins`` (no dependencies) in ``dest``; returns its size line."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), *pins],
                   check=True, timeout=timeout)
    return size_line(dest)


def size_line(folder: Path) -> str:
    wheels = sorted(folder.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    return (f"{len(wheels)} wheels, {size / 2 ** 20:.2f} MiB ({size:,} bytes) in {folder}: "
            + ", ".join(w.name for w in wheels))


def distribution(wheel: Path) -> str:
    """A wheel's distribution name, normalised (``hydra_core-1.3.8-py3-none-any.whl`` -> ``hydra-core``)."""
    return normalise(wheel.name.split("-")[0])


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_tags(wheel: Path) -> list[str]:
    """The Python tags of a wheel's file name (``py3``, ``cp312``...)."""
    return wheel.name[: -len(".whl")].split("-")[-3].split(".")


def tag_problem(wheels: list[Path], version: tuple[int, int] | None = None) -> str | None:
    """Why ``wheels`` do not suit this interpreter (its ``python -V``), or None: each must be for any Python 3
    (``py3``) or for this one (``cp312`` on Python 3.12)."""
    major, minor = version or sys.version_info[:2]
    fits = {"py3", f"py{major}{minor}", f"cp{major}{minor}"}
    wrong = [w.name for w in wheels if not fits & set(python_tags(w))]
    if not wrong:
        return None
    here = platform.python_version() if version is None else f"{major}.{minor}"
    return (f"`python -V` is Python {here}, and {', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} for "
            f"another Python: fetch the wheels with this Python's version (or carry pure-Python wheels only)")


def install(wheels: list[Path], target: Path, timeout: float) -> subprocess.CompletedProcess:
    """``pip install --no-index --no-deps --target`` of ``wheels`` (the system Python is left as it was)."""
    target.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--target", str(target), *map(str, wheels)],
                          capture_output=True, text=True, timeout=timeout)


def pythonpath(*folders: Path | str) -> dict[str, str]:
    """This environment with ``folders`` first on ``PYTHONPATH``, for the child processes."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, folders), *rest])}


def unimportable(modules: list[str], env: dict[str, str], timeout: float = 60) -> list[str]:
    """Those of ``modules`` a child interpreter with ``env`` cannot find."""
    probe = ("import importlib.util, sys; "
             "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    proc = subprocess.run([sys.executable, "-c", probe, *modules], capture_output=True, text=True, env=env,
                          timeout=timeout, check=True)
    return proc.stdout.split()
