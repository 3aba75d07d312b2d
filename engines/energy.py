"""Energy over a timed pass: joules per visible GPU from NVML's total-energy counter, else the CPU packages'
from RAPL (``/sys/class/powercap``), else none, with the reason.

``EnergyMeter().start()`` reads the counters; ``stop()`` reads them again and returns the pass's
``energy_j`` (the sum over devices), ``energy_j_by_device``, ``energy_source`` (``nvml`` or
``rapl``) and, when ``energy_j`` is null, ``energy_reason``. Counters:

- NVML ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver loaded; Volta and
  newer), per GPU the run uses (``engines.devices``: the first tensor × pipeline parallel of those
  ``CUDA_VISIBLE_DEVICES`` leaves visible, whether or not it is set; on an 8-GPU node a one-GPU run
  meters one GPU, not eight idle ones). A GPU row's energy is the GPUs' only, not the host's.
- RAPL package domains (``/sys/class/powercap/intel-rapl:N/energy_uj``, microjoules, wrapping at
  ``max_energy_range_uj``; AMD CPUs appear there too). The whole package, whatever else runs on it.
  Never on a host with an NVIDIA driver, so a GPU row never carries the CPU's joules.

Worker side: standard library only (``pynvml`` where installed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from engines.devices import from_environment
from engines.requirements import Gpu, nvml_text

POWERCAP = Path("/sys/class/powercap")
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")   # present where an NVIDIA kernel driver is loaded
Counters = Callable[[], dict[str, float]]   # device -> joules so far


def nvml_counters(devices: int | None = None) -> tuple[Counters | None, str]:
    """A reader of the energy counter (joules) of each GPU the run uses (the first ``devices`` visible ones;
    all visible ones when None), or None and why not."""
    try:
        import pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        gpus = tuple(Gpu(i, nvml_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))), "")
                     for i in range(count))
        handles = {str(g.index): pynvml.nvmlDeviceGetHandleByIndex(g.index)
                   for g in from_environment(gpus, devices)}
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    except Exception as e:  # noqa: BLE001 - no driver, no device, a device that does not answer: no NVML
        return None, f"NVML does not answer ({type(e).__name__}: {e})"
    if not handles:
        return None, "NVML sees no visible GPU"

    def read() -> dict[str, float]:
        return {index: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3 for index, h in handles.items()}

    return read, ""


def rapl_domains(root: Path = POWERCAP) -> tuple[list[Path], str]:
    """The top-level RAPL package domains under ``root``, or none and why."""
    if not root.is_dir():
        return [], f"{root} does not exist on this host (no RAPL interface exposed, as in most VMs and containers)"
    packages = [d for d in sorted(root.glob("intel-rapl:*")) if d.name.count(":") == 1
                and _read(d / "name", "").startswith("package")]
    if not packages:
        return [], f"{root} holds no RAPL package domain (intel-rapl:N with name package-N)"
    unreadable = [d for d in packages if not os.access(d / "energy_uj", os.R_OK)]
    if unreadable:
        return [], (f"{unreadable[0] / 'energy_uj'} is not readable by this user (root only since the "
                    "2020 RAPL side-channel fix; `sudo chmod a+r` it, or run as root)")
    return packages, ""


def rapl_counters(root: Path = POWERCAP, nvidia_driver: Path = NVIDIA_DRIVER) -> tuple[Counters | None, str]:
    """A reader of each RAPL package's energy counter (joules, unwrapped), or None and why not.

    Not on a host with an NVIDIA driver: there the engine runs on GPUs, and the CPU packages' joules
    would stand in for theirs (NVML is the GPUs' meter; without it the energy is null, with the reason).
    """
    if nvidia_driver.exists():
        return None, (f"not used on a host with an NVIDIA driver ({nvidia_driver}): RAPL meters the CPU "
                      "packages, not the GPUs")
    packages, why = rapl_domains(root)
    if not packages:
        return None, why
    ranges = {d.name: float(_read(d / "max_energy_range_uj", "0") or 0) / 1e6 for d in packages}
    last: dict[str, float] = {}
    offset = dict.fromkeys(ranges, 0.0)

    def read() -> dict[str, float]:
        out = {}
        for domain in packages:
            now = float(_read(domain / "energy_uj")) / 1e6
            if domain.name in last and now < last[domain.name]:   # the counter wrapped
                offset[domain.name] += ranges[domain.name]
            last[domain.name] = now
            out[domain.name] = now + offset[domain.name]
        return out

    return read, ""


class EnergyMeter:
    """Joules between ``start()`` and ``stop()``: NVML where a GPU answers, else RAPL, else null with the reason.

    Args:
        sources: ``(name, factory)`` pairs tried in order (default NVML, then RAPL); a factory
            returns ``(counters or None, why not)``.
        devices: GPUs the run's engine spans (``engines.devices.per_replica``); None: every visible GPU.
    """

    def __init__(self, sources: list[tuple[str, Callable[[], tuple[Counters | None, str]]]] | None = None,
                 devices: int | None = None):
        self.reasons: list[str] = []
        self.counters: Counters | None = None
        self.source: str | None = None
        defaults = [("nvml", lambda: nvml_counters(devices)), ("rapl", rapl_counters)]
        for name, factory in sources if sources is not None else defaults:
            counters, why = factory()
            if counters is not None:
                self.counters, self.source = counters, name
                break
            self.reasons.append(f"{name}: {why}")
        self.before: dict[str, float] | None = None

    def start(self) -> EnergyMeter:
        self.before = self._read()
        return self

    def stop(self) -> dict[str, Any]:
        """``energy_j``, ``energy_j_by_device``, ``energy_source``; ``energy_reason`` when ``energy_j`` is null."""
        after = self._read() if self.before is not None else None
        if self.counters is None or self.before is None or after is None:
            return {"energy_j": None, "energy_j_by_device": {}, "energy_source": self.source,
                    "energy_reason": "; ".join(self.reasons) or "no energy counter"}
        by_device = {k: after[k] - self.before[k] for k in after if k in self.before}
        return {"energy_j": sum(by_device.values()), "energy_j_by_device": by_device, "energy_source": self.source,
                "energy_reason": None}

    def _read(self) -> dict[str, float] | None:
        if self.counters is None:
            return None
        try:
            return self.counters()
        except Exception as e:  # noqa: BLE001 - a failed read loses the pass's energy, never the run
            self.reasons.append(f"{self.source}: reading the counter failed ({type(e).__name__}: {e})")
            return None


def _read(path: Path, default: str | None = None) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        if default is None:
            raise
        return default
