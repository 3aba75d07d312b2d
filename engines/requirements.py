"""What an engine needs from the host, checked against what the host has: one answer for
``troughput-env ENGINE --check`` and for the adapters' pre-run checks.

``probe_host()`` reads the facts (the NVIDIA driver and GPUs from ``nvidia-smi``, glibc,
``$CUDA_HOME``'s toolkit, shared libraries); ``nvml_gpus()`` reads the GPUs' total and free memory
from NVML (``pynvml``, where installed), which the pre-run memory check prefers over ``nvidia-smi``'s;
``unmet(environment, facts, ...)`` compares them with an ``engines.unit.Environment`` and returns one
``Problem`` (what is wrong, the exact fix) per unmet requirement. Standard library only: it runs in every engine's environment.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engines.unit import Environment

# Oldest Linux driver branch that runs every minor release of a CUDA major version
# (CUDA minor-version compatibility; NVIDIA's CUDA compatibility guide, "Minor Version Compatibility").
DRIVER_FOR_CUDA = {12: 525, 13: 580}
MIB = 1024 ** 2
GPU_QUERY = ("nvidia-smi", "--query-gpu=index,uuid,name,driver_version,memory.total,memory.free",
             "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int | None = None
    free_mib: int | None = None       # free memory when the host was probed (None: not read)


@dataclass(frozen=True)
class HostFacts:
    """What this host offers an engine. ``driver`` is None when no NVIDIA driver answers."""

    python: str
    glibc: str | None
    driver: str | None = None
    driver_cuda: str | None = None      # the newest CUDA the driver supports (nvidia-smi's header)
    gpus: tuple[Gpu, ...] = ()
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as set (None: unset, all visible)
    cuda_toolkit: str | None = None
    cuda_home: str | None = None
    driver_error: str | None = None
    libraries: frozenset[str] = field(default_factory=frozenset)

    def visible_gpus(self) -> tuple[Gpu, ...]:
        """The GPUs CUDA_VISIBLE_DEVICES leaves visible (indices or UUIDs, as CUDA reads them)."""
        return visible(self.gpus, self.visible_devices)


@dataclass(frozen=True)
class Problem:
    """One unmet requirement: ``what`` is wrong, ``fix`` is the exact step that mends it."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}; fix: {self.fix}"


def visible(gpus: tuple[Gpu, ...], setting: str | None) -> tuple[Gpu, ...]:
    """``gpus`` filtered by a CUDA_VISIBLE_DEVICES value (None: all; CUDA stops at the first bad entry)."""
    if setting is None:
        return gpus
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in setting.split(",")):
        match = next((g for g in gpus if entry == str(g.index) or (entry and g.uuid.startswith(entry))), None)
        if match is None:
            break
        chosen.append(match)
    return tuple(chosen)


def parse_gpu_query(text: str) -> tuple[Gpu, ...]:
    """The GPUs in ``nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total[,memory.free]`` CSV
    output (MiB)."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            memory = parts[4] if len(parts) > 4 else ""
            free = parts[5] if len(parts) > 5 else ""
            gpus.append(Gpu(int(parts[0]), parts[1], parts[2], int(memory) if memory.isdigit() else None,
                            int(free) if free.isdigit() else None))
    return tuple(gpus)


def nvml_gpus() -> tuple[Gpu, ...] | None:
    """Every GPU NVML lists (NVML's index, as ``nvidia-smi`` numbers them), with its total and free memory in MiB;
    None where NVML does not answer (``pynvml`` not installed, no driver, no device).

    NVML is the driver's management library, not CUDA: reading it creates no CUDA context, so a worker that
    reads it before its engine starts may still fork (vLLM's engine core). No torch, no CUDA call here.
    """
    try:
        import pynvml
        pynvml.nvmlInit()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(index, nvml_text(pynvml.nvmlDeviceGetUUID(handle)),
                            nvml_text(pynvml.nvmlDeviceGetName(handle)), int(memory.total) // MIB,
                            int(memory.free) // MIB))
    except Exception:  # noqa: BLE001 - no module, no driver, a device that does not answer: no NVML
        return None
    return tuple(gpus) or None


def memory_gpus(facts: HostFacts) -> tuple[Gpu, ...]:
    """The GPUs with the free memory the pre-run check reads: NVML's where it answers, else the host probe's
    (``nvidia-smi``)."""
    return nvml_gpus() or facts.gpus


def nvml_text(value: object) -> str:
    """An NVML string (bytes in older ``pynvml``, str in newer) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def memory_problems(gpus: tuple[Gpu, ...], label: str, knob: str, fraction: float | None) -> list[Problem]:
    """Each of the run's ``gpus`` whose free memory cannot hold ``fraction`` × its total, the share the engine
    takes at start (vLLM's ``gpu_memory_utilization``, SGLang's ``mem_fraction_static``), with the numbers.

    vLLM refuses the same thing at start ("Free memory on device ... is less than desired GPU memory
    utilization"), but only after the worker started it, one GPU at a time; this says it before, for every GPU.
    Nothing to check without a fraction, or for a GPU whose memory was not read.
    """
    if not fraction:
        return []
    problems = []
    for gpu in gpus:
        if not gpu.memory_mib or gpu.free_mib is None:
            continue
        need = fraction * gpu.memory_mib
        if need > gpu.free_mib:
            most = gpu.free_mib / gpu.memory_mib
            problems.append(Problem(
                f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}) has {gpu.free_mib / 1024:.1f} GiB free of "
                f"{gpu.memory_mib / 1024:.1f} GiB ({(gpu.memory_mib - gpu.free_mib) / 1024:.1f} GiB held by other "
                f"processes); {label}'s {knob}={fraction:g} takes {need / 1024:.1f} GiB of it at start",
                f"free the GPU (`nvidia-smi` lists the processes holding it), run on another GPU "
                f"(CUDA_VISIBLE_DEVICES), or lower {knob} to at most {most:.2f}"))
    return problems


def parse_driver(query_text: str, header_text: str = "") -> tuple[str | None, str | None]:
    """(driver version, newest supported CUDA) from the GPU query and the plain ``nvidia-smi`` header."""
    driver = None
    for line in query_text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and re.fullmatch(r"\d+(\.\d+)*", parts[3]):
            driver = parts[3]
            break
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", header_text)
    return driver, cuda.group(1) if cuda else None


def glibc_version() -> str | None:
    """This process's glibc (``"2.35"``); None for another C library."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        found = ""
    if found.startswith("glibc "):
        return found.split()[1]
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else None


def toolkit_version(cuda_home: str | None) -> str | None:
    """The CUDA toolkit version under ``cuda_home`` (its ``version.json``, else ``nvcc --version``)."""
    if not cuda_home:
        return None
    version_file = Path(cuda_home) / "version.json"
    try:
        return str(json.loads(version_file.read_text())["cuda"]["version"])
    except (OSError, KeyError, ValueError, TypeError):
        pass
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    if nvcc.exists():
        out = run_quietly([str(nvcc), "--version"])
        found = re.search(r"release (\d+\.\d+)", out or "")
        return found.group(1) if found else None
    return None


def nvml_driver() -> tuple[str, str | None] | None:
    """(driver version, newest CUDA the driver supports) from NVML; None where NVML does not answer. Like
    ``nvml_gpus``, no CUDA call."""
    try:
        import pynvml
        pynvml.nvmlInit()
        driver = nvml_text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()   # e.g. 13000 for 13.0
    except Exception:  # noqa: BLE001 - no module, no driver: no NVML
        return None
    return driver, f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and cuda > 0 else None


def probe_host(library_names: tuple[str, ...] = ()) -> HostFacts:
    """The facts of this host; never raises (a missing driver is a fact, not an error). The driver and GPUs come
    from NVML where it answers (a host with the driver's library and ``pynvml`` but no ``nvidia-smi`` on PATH, as
    some containers have), else from ``nvidia-smi``."""
    driver = driver_cuda = error = None
    gpus: tuple[Gpu, ...] = ()
    from_nvml = nvml_driver()
    listed = nvml_gpus() if from_nvml is not None else None
    if from_nvml is not None and listed:
        (driver, driver_cuda), gpus = from_nvml, listed
    elif shutil.which("nvidia-smi") is None:
        error = "neither NVML (pynvml) nor nvidia-smi answers: no NVIDIA driver here"
    else:
        query = run_quietly(list(GPU_QUERY))
        if query is None:
            error = "nvidia-smi is installed but did not answer (the driver is not loaded, or no GPU is attached)"
        else:
            gpus = parse_gpu_query(query)
            driver, driver_cuda = parse_driver(query, run_quietly(["nvidia-smi"]) or "")
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    return HostFacts(
        python=".".join(map(str, sys.version_info[:3])), glibc=glibc_version(), driver=driver,
        driver_cuda=driver_cuda, gpus=gpus, visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_toolkit=toolkit_version(cuda_home), cuda_home=cuda_home, driver_error=error,
        libraries=frozenset(name for name in library_names if ctypes.util.find_library(name)))


def unmet(environment: Environment, facts: HostFacts, label: str, python: str | None = None,
          gpu: bool = True) -> list[Problem]:
    """Every requirement of ``environment`` that ``facts`` do not meet, each with its fix.

    Args:
        environment: the engine's recipe (its ``cuda``, ``glibc``, ``python``, ``libraries``...).
        facts: from ``probe_host``.
        label: the engine as people write it, for the messages.
        python: the interpreter version to check (default ``facts.python``).
        gpu: whether to check the driver, the GPUs and the toolkit (``needs_gpu`` engines).
    """
    problems = []
    version = python or facts.python
    if environment.python and not python_matches(version, environment.python):
        wanted = " or ".join(environment.pythons)
        problems.append(Problem(f"Python {version} is outside {label}'s supported {environment.python}",
                                f"install {wanted} and build the environment from it (troughput-env's --python)"))
    if environment.glibc and facts.glibc and _older(facts.glibc, environment.glibc):
        problems.append(Problem(f"glibc {facts.glibc} is older than the {environment.glibc} {label}'s wheels need",
                                f"run on a newer distribution (glibc >= {environment.glibc}, e.g. Ubuntu 22.04+) "
                                "or in the engine's container image"))
    if gpu and environment.needs_gpu:
        problems += _gpu_problems(environment, facts, label)
    for library, fix in environment.libraries:
        if library not in facts.libraries:
            problems.append(Problem(f"lib{library}.so is not found ({label} loads it at run time)", fix))
    return problems


def torch_problems(environment: Environment, label: str, torch_version: str, torch_cuda: str | None,
                   engine: str = "ENGINE", python: str = "python") -> list[Problem]:
    """A torch in the engine's environment built for another CUDA than the engine's (or for none)."""
    if not environment.cuda:
        return []
    fix = _pre_install_fix(environment, python) or f"rebuild the engine's environment (`troughput-env {engine}`)"
    if not torch_cuda:
        return [Problem(f"torch {torch_version} is a CPU build; {label} needs its CUDA {environment.cuda} build", fix)]
    if torch_cuda.split(".")[0] != environment.cuda.split(".")[0]:
        return [Problem(f"torch {torch_version} is built for CUDA {torch_cuda}; {label} is built for CUDA "
                        f"{environment.cuda}", fix)]
    return []


def import_report(module: str) -> dict:
    """Which pieces import in this interpreter: the engine ``module``, troughput's worker, torch and its GPU.

    Whether torch sees a GPU (``cuda``, ``cuda_devices``) is asked in a child interpreter, never with a CUDA
    call in this process (the worker, before its engine starts: see the comment below).
    Self-contained (its imports inside): ``troughput-env ENGINE --check`` runs this function's source
    under the environment's interpreter, and each adapter calls it in-process before it starts.
    """
    import importlib
    import sys

    report = {"python": ".".join(map(str, sys.version_info[:3]))}
    for key, name in (("engine", module), ("troughput", "engines.worker")):
        try:
            imported = importlib.import_module(name)
            report[key] = getattr(imported, "__version__", "ok")
        except Exception as e:  # noqa: BLE001 - any failure to import is the finding
            report[key + "_error"] = f"{type(e).__name__}: {e}"
    try:
        import torch
        report["torch"] = torch.__version__
        report["torch_cuda"] = torch.version.cuda
    except Exception as e:  # noqa: BLE001
        report["cuda"] = False
        report["torch_error"] = f"{type(e).__name__}: {e}"
        return report
    # Never a torch.cuda call in this process: it initialises CUDA here, and an engine that forks its
    # engine core afterwards (vLLM does unless CUDA is already initialised) then dies with "Cannot
    # re-initialize CUDA in forked subprocess". A GPU build of torch is asked in a child interpreter,
    # which exits with its CUDA context; a CPU build has no GPU to find.
    if not torch.version.cuda and not getattr(torch.version, "hip", None):
        report["cuda"] = False
        return report
    import subprocess

    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                               check=False)
        lines = child.stdout.strip().splitlines()
        if child.returncode != 0 or not lines or not lines[-1].isdigit():
            tail = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
            raise RuntimeError(f"the child asking torch for its GPUs failed: {tail}")
        report["cuda_devices"] = int(lines[-1])
        report["cuda"] = report["cuda_devices"] > 0
    except Exception as e:  # noqa: BLE001 - a child that cannot answer means no usable GPU, with the reason
        report["cuda"] = False
        report["cuda_error"] = f"{type(e).__name__}: {e}"
    return report


def environment_problems(engine: str, label: str, environment: Environment, facts: HostFacts, report: dict,
                         python: str, project_root: str = "<troughput checkout>") -> list[Problem]:
    """Every unmet requirement of an engine's environment, given the host ``facts`` and the ``import_report``
    of its interpreter ``python``: the checks ``troughput-env ENGINE --check`` prints and every adapter runs
    before it starts (one function, so the two never differ)."""
    problems = unmet(environment, facts, label, python=report.get("python"))
    if "engine_error" in report:
        problems.append(Problem(f"{environment.module} does not import ({report['engine_error']})",
                                f"rebuild the environment with `troughput-env {engine}`"))
    if "troughput_error" in report:
        problems.append(Problem(f"troughput's core does not import ({report['troughput_error']})",
                                f"`{python} -m pip install --no-deps -e {project_root}`"))
    if environment.needs_gpu and "torch" in report:
        problems += torch_problems(environment, label, report["torch"], report.get("torch_cuda"), engine, python)
    if environment.needs_gpu and not report.get("cuda") and not problems:
        reason = (report.get("torch_error") or report.get("cuda_error")
                  or f"torch {report.get('torch')} sees no CUDA GPU")
        problems.append(Problem(f"no usable NVIDIA GPU ({reason})",
                                "run `nvidia-smi` in this shell to see what the driver reports"))
    return problems


def python_matches(version: str, spec: str) -> bool:
    """Whether ``version`` (``"3.11.4"``) meets ``spec`` (``">=3.11,<3.15"`` or ``"==3.10,==3.12"``)."""
    clauses = [c.strip() for c in spec.split(",") if c.strip()]
    ours = _tuple(version)[:2]
    exact = [c[2:] for c in clauses if c.startswith("==")]
    if exact and not any(ours == _tuple(v)[:2] for v in exact):
        return False
    for clause in clauses:
        if clause.startswith(">=") and ours < _tuple(clause[2:]):
            return False
        if clause.startswith("<") and not clause.startswith("<=") and ours >= _tuple(clause[1:]):
            return False
    return True


def _gpu_problems(environment: Environment, facts: HostFacts, label: str) -> list[Problem]:
    major = int(environment.cuda.split(".")[0]) if environment.cuda else None
    min_driver = DRIVER_FOR_CUDA.get(major) if major else None
    need = f"driver >= {min_driver} (CUDA {environment.cuda})" if min_driver else "an NVIDIA driver"
    install = f"install NVIDIA driver {min_driver} or newer" if min_driver else "install the NVIDIA driver"
    problems = []
    if facts.driver is None:
        problems.append(Problem(f"{label} needs an NVIDIA GPU with {need}; {facts.driver_error or 'no driver answers'}",
                                f"run on a GPU node; there, {install}"))
    elif min_driver and int(facts.driver.split(".")[0]) < min_driver:
        problems.append(Problem(
            f"driver {facts.driver} is older than the {min_driver} that CUDA {major} needs ({label} is built "
            f"for CUDA {environment.cuda}; this driver supports CUDA {facts.driver_cuda or 'unknown'})",
            f"{install} (on data-center GPUs, or install cuda-compat-{major}-<minor> for forward compatibility)"))
    if facts.driver is None:
        pass
    elif not facts.gpus:
        problems.append(Problem(f"driver {facts.driver} reports no GPU", "attach a GPU (check `nvidia-smi -L`)"))
    elif not facts.visible_gpus():
        problems.append(Problem(f"CUDA_VISIBLE_DEVICES={facts.visible_devices!r} hides all {len(facts.gpus)} GPU(s)",
                                f"unset CUDA_VISIBLE_DEVICES or set it to one of "
                                f"{', '.join(str(g.index) for g in facts.gpus)}"))
    if environment.cuda_toolkit:
        want = environment.cuda_toolkit
        if not facts.cuda_home or facts.cuda_toolkit is None:
            where = f"CUDA_HOME={facts.cuda_home} holds no toolkit" if facts.cuda_home else "CUDA_HOME is not set"
            problems.append(Problem(f"{label} needs the CUDA {want} toolkit; {where}",
                                    f"install CUDA toolkit {want} and `export CUDA_HOME=/usr/local/cuda-{want}`"))
        elif _older(facts.cuda_toolkit, want):
            problems.append(Problem(f"CUDA toolkit {facts.cuda_toolkit} at {facts.cuda_home} is older than {want}",
                                    f"install CUDA toolkit {want} and `export CUDA_HOME=/usr/local/cuda-{want}`"))
    return problems


def _pre_install_fix(environment: Environment, python: str) -> str | None:
    torch_steps = [step for step in environment.pre_install if any(a.startswith("torch") for a in step)]
    if not torch_steps:
        return None
    return "`" + " ; ".join(f"{python} -m pip install " + " ".join(step) for step in torch_steps) + "`"


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _older(have: str, want: str) -> bool:
    return _tuple(have) < _tuple(want)


def run_quietly(command: list[str], timeout: float = 20) -> str | None:
    """``command``'s stdout, or None when it is missing, fails or outlives ``timeout`` seconds."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None
