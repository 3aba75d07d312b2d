"""The GPUs a run's engine uses: what energy, peak memory and the free-memory check count.

An engine with ``tensor_parallel × pipeline_parallel`` = N GPUs per replica takes CUDA devices
0 … N−1 of those its process sees. Its process sees the GPUs ``CUDA_VISIBLE_DEVICES`` names, in
that order (the replicas of a data-parallel run each get their own slice, ``harness.run.replicas``),
or every GPU where the variable is unset (a one-replica run: nothing sets it). So the run's own GPUs
are the first N of the visible ones, never every GPU of the node: on an 8-GPU node a one-GPU run
meters one GPU, not eight.

NVML numbers devices by PCI bus id; CUDA without ``CUDA_VISIBLE_DEVICES`` numbers them fastest
first, which on a node of identical GPUs is the same PCI order (ties broken by bus id), and with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` always is. ``CUDA_VISIBLE_DEVICES`` entries are matched to NVML
devices by index or by UUID prefix (``engines.requirements.visible``), never by position alone.

Worker side: standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from engines.requirements import Gpu, visible


def per_replica(engine: str | None, knobs: Mapping[str, Any] | None) -> int | None:
    """GPUs one engine instance spans (tensor × pipeline parallel, read in the engine's own knob names);
    None where the engine is not a registered unit (then every visible GPU counts, as before)."""
    if not engine:
        return None
    try:
        from engines import find_unit

        found = find_unit(engine)
    except Exception:  # noqa: BLE001 - a test engine given as module:Class has no unit
        return None
    return found.devices(dict(knobs or {}), 1) if found is not None else None


def run_gpus(gpus: tuple[Gpu, ...], setting: str | None, count: int | None) -> tuple[Gpu, ...]:
    """The GPUs the run uses: the first ``count`` of those ``setting`` (``CUDA_VISIBLE_DEVICES``) leaves
    visible, in its order; all visible ones when ``count`` is None."""
    shown = visible(gpus, setting)
    return shown if count is None else shown[:count]


def from_environment(gpus: tuple[Gpu, ...], count: int | None) -> tuple[Gpu, ...]:
    """``run_gpus`` with this process's ``CUDA_VISIBLE_DEVICES``."""
    return run_gpus(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), count)
