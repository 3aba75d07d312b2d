"""``troughput-run``: the Hydra app that turns one composed config into one measured run."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from engines.base import KnobError
from engines.knobs import to_native
from harness.environment import PROJECT_ROOT
from harness.errors import TroughputError
from harness.models import resolve_model
from harness.runner import RunSpec, execute
from harness.summary import print_summary
from harness.workloads import build_workload

log = logging.getLogger("troughput")


def spec_from_config(cfg: DictConfig) -> RunSpec:
    """Compose a ``RunSpec``: resolve the model (building it if needed), build the workload, merge knobs.

    Knobs merge from general to specific: hardware, then model, then engine (native and
    canonical); null means "not set here" and never hides a value from a more general layer.
    Canonical names become the engine's native ones (``engines.knobs.to_native``), replacing
    a native twin from the hardware or model layer.
    """
    engine = cfg.engine.name
    python = cfg.engine.python or sys.executable
    model = resolve_model(OmegaConf.to_container(cfg.model, resolve=True), python)
    workload_cfg = OmegaConf.to_container(cfg.workload, resolve=True)
    workload = build_workload(workload_cfg, model, Path(cfg.run.image_dir))
    layers = [(cfg.hardware.get("knobs") or {}).get(engine), (cfg.model.get("knobs") or {}).get(engine),
              cfg.engine.knobs, cfg.engine.get("canonical")]
    general: dict[str, Any] = {}
    knobs: dict[str, Any] = {}
    for index, layer in enumerate(layers):
        values = OmegaConf.to_container(layer, resolve=True) if layer is not None else {}
        target = general if index < 2 else knobs  # hardware and model are the general layers
        target.update({name: value for name, value in values.items() if value is not None})
    knobs = to_native(engine, knobs, base=general)
    labels = dict(OmegaConf.to_container(cfg.run.labels, resolve=True) or {})
    labels.setdefault("command", _command_line())
    labels["hardware"] = cfg.hardware.name
    if cfg.run.get("round") is not None:
        labels["round"] = cfg.run.round
    if HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN":
        labels.setdefault("sweep_id", HydraConfig.get().sweep.dir)
    return RunSpec(
        engine=engine, model=model, workload=workload, knobs=knobs,
        ordering=OmegaConf.to_container(cfg.ordering, resolve=True), python=python,
        env={**cfg.hardware.get("env", {}), **cfg.engine.env}, repeats=int(cfg.run.repeats),
        warmup_requests=int(cfg.run.warmup_requests), time_limit_s=float(cfg.run.time_limit_s),
        memory_limit_bytes=cfg.run.get("memory_limit_bytes"),
        results_dir=Path(cfg.run.results_dir), save_outputs=bool(cfg.run.save_outputs), labels=labels,
        hardware_spec=OmegaConf.to_container(cfg.hardware.spec, resolve=True) if cfg.hardware.get("spec") else None,
        workload_cfg=workload_cfg, replicas=_replicas(cfg.engine.get("replicas", 1)),
    )


def _replicas(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TroughputError(f"engine.replicas={value!r}: must be an integer >= 1")
    return value


def _command_line() -> str:
    """The command that reproduces this job (the overrides of this job, not the whole sweep)."""
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    return " ".join(["troughput-run", *overrides])


@hydra.main(config_path=str(PROJECT_ROOT / "conf"), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> str:
    """One run; prints its row's headline. User errors print one line and exit 2."""
    try:
        row = execute(spec_from_config(cfg), progress=bool(cfg.run.progress))
    except (TroughputError, KnobError) as e:
        print(f"troughput: error: {e}", file=sys.stderr)
        sys.exit(2)
    if not (HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN"):
        print_summary([row], Path(cfg.run.results_dir))
    elif row["status"] != "ok":
        print(f"troughput: run {row['run_id']} {row['status']}: {row['error'].splitlines()[0] if row['error'] else ''}",
              file=sys.stderr)
    return row["status"]


class SummaryCallback(Callback):
    """At the end of a multirun, print the summary table of the rows it wrote."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.results import read_rows

        results_dir = Path(config.run.results_dir)
        rows = [r for r in read_rows(results_dir) if r.get("sweep_id") == config.hydra.sweep.dir]
        print_summary(rows, results_dir)


if __name__ == "__main__":
    main()
