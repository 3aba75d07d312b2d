"""Hardware and software facts captured with every row."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from engines.common import PROJECT_ROOT


@functools.cache
def capture() -> dict[str, Any]:
    """Host, CPU, memory, GPUs and driver, Python, troughput's git commit (flat, dotted keys)."""
    return {
        "env.hostname": platform.node(),
        "env.platform": platform.platform(),
        "env.python": platform.python_version(),
        "env.cpu": _cpu_model(),
        "env.cpu_count": os.cpu_count(),
        "env.memory_bytes": _memory_bytes(),
        **_gpus(),
        "git_commit": git_commit(),
    }


def git_commit() -> str | None:
    """The harness's commit, with ``+dirty`` when the work tree has changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_count() -> int:
    """GPUs that ``nvidia-smi`` lists (0 without it)."""
    return int(_gpus()["env.gpu_count"])


def _gpus() -> dict[str, Any]:
    if not shutil.which("nvidia-smi"):
        return {"env.gpu": None, "env.gpu_count": 0}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20,
                             check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"env.gpu": None, "env.gpu_count": 0}
    names = [line.split(",")[0].strip() for line in out]
    fields = out[0].split(",") if out else ["", "", ""]
    return {"env.gpu": names[0] if names else None, "env.gpu_count": len(names),
            "env.gpu_memory": fields[1].strip(), "env.gpu_driver": fields[2].strip()}
