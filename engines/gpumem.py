"""GPU memory of a run, read from the driver (NVML), not from torch's allocator in the worker.

Every engine keeps its model in a child process (vLLM's engine core, SGLang's scheduler,
TensorRT-LLM's executor worker), so the worker's own ``torch.cuda`` counters read ~0.
``GpuMemorySampler`` reads each of the run's GPUs' used memory (``engines.devices``: the first
tensor × pipeline parallel visible ones) and its compute processes on a
daemon thread (every ``interval_s``, 0.5 s by default, plus one read at start and stop), from
``pynvml`` when it imports, else from ``nvidia-smi``. It reports, per visible device (by
``nvidia-smi`` index):

- ``device``: device memory used above what was used when sampling began (before the engine
  started), at its peak; this holds whatever the run allocated, in any process, including ones
  outside the worker's process tree (a container's PID namespace hides pids from the driver);
- ``process_tree``: the memory the driver attributes to the worker and its descendants, at its
  peak (None when none of their pids appears, e.g. inside a container).

The totals are peaks of the sum over devices at one sample, not sums of per-device peaks.
No driver (this CPU machine): the sampler yields None. A driver that answers no read (every
NVML or ``nvidia-smi`` read fails) gives null columns and a warning, never 0. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engines.devices import from_environment
from engines.requirements import Gpu, nvml_text, parse_gpu_query, run_quietly

MIB = 1024 * 1024
DEVICE_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name,driver_version,memory.used", "--format=csv,noheader,nounits"]
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class DeviceSample:
    """One device at one instant: bytes used on it, and bytes per compute process (pid)."""

    index: int
    used_bytes: int
    processes: dict[int, int] = field(default_factory=dict)


Reader = Callable[[], list[DeviceSample]]


def parse_smi(device_text: str, apps_text: str) -> list[DeviceSample]:
    """Samples from ``DEVICE_QUERY`` and ``APPS_QUERY`` output (MiB values, as nvidia-smi prints them)."""
    devices = parse_gpu_query(device_text)   # memory.used sits where the query's last column is
    by_uuid: dict[str, dict[int, int]] = {g.uuid: {} for g in devices}
    for line in apps_text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0] in by_uuid and parts[1].isdigit() and parts[2].isdigit():
            by_uuid[parts[0]][int(parts[1])] = int(parts[2]) * MIB
    return [DeviceSample(g.index, (g.memory_mib or 0) * MIB, by_uuid[g.uuid]) for g in devices]


def smi_reader(devices: int | None = None) -> Reader | None:
    """A reader over ``nvidia-smi`` for the run's GPUs (``engines.devices``), or None when it does not answer."""
    if shutil.which("nvidia-smi") is None or run_quietly(DEVICE_QUERY, timeout=10) is None:
        return None
    shown = {g.index for g in from_environment(parse_gpu_query(run_quietly(DEVICE_QUERY, timeout=10) or ""),
                                               devices)}

    def read() -> list[DeviceSample]:
        samples = parse_smi(run_quietly(DEVICE_QUERY, timeout=10) or "", run_quietly(APPS_QUERY, timeout=10) or "")
        return [s for s in samples if s.index in shown]

    return read


def nvml_reader(devices: int | None = None) -> Reader | None:
    """A reader over ``pynvml`` (nvidia-ml-py) for the run's GPUs, or None without it or a driver."""
    try:
        import pynvml
        pynvml.nvmlInit()
        gpus = tuple(Gpu(i, nvml_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))), "")
                     for i in range(pynvml.nvmlDeviceGetCount()))
    except Exception:  # noqa: BLE001 - no module, no driver, no device: all mean "no NVML"
        return None
    handles = {g.index: pynvml.nvmlDeviceGetHandleByIndex(g.index) for g in from_environment(gpus, devices)}

    def read() -> list[DeviceSample]:
        samples = []
        for index, handle in handles.items():
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            samples.append(DeviceSample(index, int(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
                                        {p.pid: int(p.usedGpuMemory or 0) for p in procs}))
        return samples

    return read


def default_reader(devices: int | None = None) -> tuple[Reader, str] | None:
    """NVML when ``pynvml`` imports, else ``nvidia-smi``, over the run's GPUs; None without a driver."""
    for make, name in ((nvml_reader, "nvml"), (smi_reader, "nvidia-smi")):
        reader = make(devices)
        if reader is not None:
            return reader, name
    return None


def process_tree(root: int, proc: Path = Path("/proc")) -> set[int]:
    """``root`` and all its descendants, from each ``/proc/<pid>/stat``'s parent pid."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


class GpuPeak:
    """Running peaks over samples (see the module docstring for what ``device`` and ``process_tree`` mean)."""

    def __init__(self, baseline: Iterable[DeviceSample]):
        self.baseline = {s.index: s.used_bytes for s in baseline}
        self.device = dict.fromkeys(self.baseline, 0)
        self.device_total = 0
        self.process_total: int | None = None

    def add(self, samples: list[DeviceSample], tree: set[int]) -> None:
        above = {s.index: max(s.used_bytes - self.baseline.get(s.index, 0), 0) for s in samples}
        for index, used in above.items():
            self.device[index] = max(self.device.get(index, 0), used)
        self.device_total = max(self.device_total, sum(above.values()))
        ours = [b for s in samples for pid, b in s.processes.items() if pid in tree]
        if ours:
            self.process_total = max(self.process_total or 0, sum(ours))

    def columns(self) -> dict[str, object]:
        """The worker result's fields: ``peak_gpu_bytes`` (total), per device, and the process tree's."""
        return {"peak_gpu_bytes": self.device_total,
                "peak_gpu_bytes_by_device": {str(i): b for i, b in sorted(self.device.items())},
                "peak_gpu_process_bytes": self.process_total}


class GpuMemorySampler:
    """Samples GPU memory on a daemon thread between ``start()`` and ``stop()``.

    Args:
        reader: what reads the devices (default: ``default_reader()``; none: the sampler is off).
        interval_s: seconds between samples.
        root: the process whose tree counts as the run's (default: this process).
        devices: GPUs the run's engine spans (``engines.devices.per_replica``); None: every visible GPU.
    """

    def __init__(self, reader: Reader | None = None, interval_s: float = 0.5, root: int | None = None,
                 devices: int | None = None):
        found = (reader, "given") if reader is not None else default_reader(devices)
        self.reader, self.source = found if found else (None, None)
        self.interval_s = interval_s
        self.root = root or os.getpid()
        self.peak: GpuPeak | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads_ok = self.reads_failed = 0
        self.last_error = ""

    def start(self) -> GpuMemorySampler:
        if self.reader is None:
            return self
        self.peak = GpuPeak(self._read())
        self._thread = threading.Thread(target=self._loop, name="gpu-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, object] | None:
        """The peaks (``GpuPeak.columns``) and ``gpu_memory_warnings``; None when there is no driver to read.

        When no read answered, the peaks are null (unknown), not 0; some failed reads are a warning.
        """
        if self.reader is None or self.peak is None:
            return None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sample()
        tries = self.reads_ok + self.reads_failed
        if self.reads_ok == 0:
            return {"peak_gpu_bytes": None, "peak_gpu_bytes_by_device": {}, "peak_gpu_process_bytes": None,
                    "gpu_memory_source": self.source,
                    "gpu_memory_warnings": [f"GPU memory: all {tries} reads through {self.source} failed "
                                            f"(last: {self.last_error}); peak_gpu_bytes is null, not measured"]}
        warnings = [f"GPU memory: {self.reads_failed} of {tries} reads through {self.source} failed (last: "
                    f"{self.last_error}); the peak is over the other reads"] if self.reads_failed else []
        return {**self.peak.columns(), "gpu_memory_source": self.source, "gpu_memory_warnings": warnings}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        samples = self._read()
        if samples and self.peak is not None:
            self.peak.add(samples, process_tree(self.root))

    def _read(self) -> list[DeviceSample]:
        try:
            samples = self.reader() if self.reader else []
        except Exception as e:  # noqa: BLE001 - a failed read loses one sample, never the run
            self.reads_failed += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return []
        if samples:
            self.reads_ok += 1
        else:
            self.reads_failed += 1
            self.last_error = "no visible device answered"
        return samples
