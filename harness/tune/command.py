"""The ``troughput-run`` command line that reproduces one trial's (or confirmation run's) row.

It is the tune invocation's own overrides (this job's, in a multirun) without the
study settings (``tune...``, Hydra's launcher and output dirs), plus the ``run.*``
values ``conf/tuning.yaml`` sets differently from ``conf/config.yaml`` (e.g.
``run.repeats``), plus the trial's values: ``++<path>=<value>`` for each knob path,
as ``harness.tune.study.apply_values`` sets them, and ``ordering=<name>`` for the
ordering. Pasted into a shell, it reruns that config as one ``troughput-run``.

A ``tune.fidelity`` trial's low-fidelity row ran on a seeded sample of the
workload; its command (like the trial's full row) runs the whole workload.
"""

from __future__ import annotations

import shlex
from typing import Any, Mapping

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from engines.common import PROJECT_ROOT

KEPT_HYDRA = ("hydra.searchpath",)  # config groups may come from there; the rest is the tune job's plumbing


def run_command(cfg: DictConfig, values: Mapping[str, Any], overrides: list[str] | None = None) -> str:
    """``troughput-run ...`` for ``cfg`` (a composed tune config) with the trial's ``values`` applied.

    Args:
        cfg: the tune invocation's config.
        values: the trial's params, dotted config paths (``{}`` for the engine defaults).
        overrides: the invocation's overrides; default: Hydra's for this job (none outside Hydra).
    """
    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    parsed = OverridesParser.create().parse_overrides(overrides)
    kept: list[str] = []
    keys: set[str] = set()
    for text, override in zip(overrides, parsed):
        key = override.key_or_group
        if _study_setting(key) or key in values:
            continue
        kept.append(text)
        keys.add(key)
    run_defaults = OmegaConf.load(PROJECT_ROOT / "conf" / "tuning.yaml").get("run") or {}
    kept += [f"run.{name}={hydra_value(cfg.run[name])}" for name in run_defaults if f"run.{name}" not in keys]
    for path, value in values.items():
        kept.append(f"ordering={value}" if path == "ordering" else f"++{path}={hydra_value(value)}")
    return " ".join(["troughput-run", *map(shlex.quote, kept)])


def hydra_value(value: Any) -> str:
    """``value`` as a Hydra override value that reads back as the same type and value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"  # quoted: always a string, whatever it looks like


def _study_setting(key: str) -> bool:
    if key == "tune" or key.startswith("tune.") or key.startswith("tune/"):
        return True
    return key.startswith("hydra") and key not in KEPT_HYDRA
