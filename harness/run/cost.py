"""What a config occupies and how long it needs: the one place for device counts and job time.

- devices: replicas × tensor parallel × pipeline parallel, as the engine's unit counts
  them through its canonical knob mapping (``EngineUnit.devices``), so vLLM's
  ``tensor_parallel_size``, SGLang's ``tp_size`` and TensorRT-LLM's ``tensor_parallel_size``
  count alike;
- job time: startup (compile included: every adapter times the engine constructor,
  which compiles before it returns) + backlog ÷ measured rate.

The planner (``harness.report.planner``) and the tuner's ``job_time`` objective
(``harness.tune.objective``) both call these.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from engines import find_unit
from engines.unit import device_count


def devices(engine: str, knobs: Mapping[str, Any], replicas: Any = None) -> int:
    """Devices one config occupies: replicas × tensor parallel × pipeline parallel.

    Args:
        engine: the engine name (``vllm``, ``sglang``, ...).
        knobs: the config's native knobs, flat (dotted) or nested; ``replicas`` among them
            counts when ``replicas`` is not given (rows carry it as ``knob.replicas``).
        replicas: data-parallel engine instances, when known apart from the knobs.
    """
    count = replicas if replicas is not None else knobs.get("replicas")
    engine_unit = find_unit(engine)
    if engine_unit is None:   # an adapter given as module:Class declares nothing: one instance per replica
        return device_count(count)
    return engine_unit.devices({k: v for k, v in knobs.items() if k != "replicas"}, count)


def job_seconds(startup_s: Any, backlog: float, rate: Any) -> float:
    """Seconds to clear ``backlog`` (tokens or requests) at ``rate`` (per second), startup included."""
    rate = as_number(rate, math.nan)
    generate = backlog / rate if rate and rate > 0 else math.inf
    return as_number(startup_s) + generate


def as_number(value: Any, default: float = 0.0) -> float:
    """``value`` as a float; ``default`` for None, NaN or anything that is not a number."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(value) else value
