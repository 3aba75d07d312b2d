"""Build a run's spec from a composed config: the one place config becomes a ``RunSpec``.

``build_spec(cfg)`` resolves the model (building it if needed), builds the workload,
layers the knobs and sets the labels. Callers that run many configs of one cell (the
tuner's trials and confirmation runs, the benchmarks) build the cell's ``CellInputs``
once and pass it in: a trial then only re-layers its knobs, and the workload is not
re-tokenised. A config whose model or workload differs from the inputs' (a search
space over ``workload.*``) gets its own, so sharing never changes what runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from engines import find_unit
from engines.knobs import defaults_to_native, to_native
from harness.core.errors import TroughputError
from harness.core.models import resolve_model
from harness.workloads import Workload, build_workload


AUTO = "auto"


def wants_rounds(cfg: DictConfig) -> bool:
    """Whether ``cfg`` asks for rounds until decided; any value but null and ``auto`` is an error."""
    value = cfg.run.get("rounds")
    if value is None:
        return False
    if value != AUTO:
        raise TroughputError(f"run.rounds={value!r}: use auto (add rounds until the verdict is decided) or null; "
                             f"for a fixed count use -m run.round=1,2,3")
    return True


@dataclass
class RunSpec:
    """Everything one run needs; ``labels`` (sweep id, study, trial, ...) go into the row as they are."""

    engine: str
    model: dict[str, Any]
    workload: Workload
    knobs: dict[str, Any] = field(default_factory=dict)
    ordering: dict[str, Any] = field(default_factory=lambda: {"name": "as_given"})
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    repeats: int = 1
    warmup_requests: int = 0
    time_limit_s: float = 900.0
    memory_limit_bytes: int | None = None
    results_dir: Path = Path("results")
    save_outputs: bool = False
    labels: dict[str, Any] = field(default_factory=dict)
    hardware_spec: dict[str, Any] | None = None  # the hardware config's spec: block, for the speed of light
    workload_cfg: dict[str, Any] | None = None   # the workload config, kept in the row to re-simulate the run
    replicas: int = 1                            # data-parallel engine instances (harness/run/replicas.py)
    quality: dict[str, Any] = field(default_factory=dict)  # harness.quality: reference, reference_knobs, expected_outputs


@dataclass(frozen=True)
class CellInputs:
    """What every config of one cell shares: the resolved model and the built workload, with their configs."""

    model_cfg: dict[str, Any]
    workload_cfg: dict[str, Any]
    python: str
    model: dict[str, Any]
    workload: Workload

    def serves(self, cfg: DictConfig) -> bool:
        """Whether ``cfg`` asks for exactly this model and workload."""
        return (_container(cfg.model), _container(cfg.workload), _python(cfg)) == (
            self.model_cfg, self.workload_cfg, self.python)


def build_inputs(cfg: DictConfig) -> CellInputs:
    """Resolve the model (building it where ``model.build`` says so) and build the workload."""
    python = _python(cfg)
    model_cfg, workload_cfg = _container(cfg.model), _container(cfg.workload)
    model = resolve_model(model_cfg, python)
    workload = build_workload(workload_cfg, model, Path(cfg.run.image_dir))
    return CellInputs(model_cfg, workload_cfg, python, model, workload)


def build_spec(cfg: DictConfig, inputs: CellInputs | None = None) -> RunSpec:
    """Compose a ``RunSpec`` from ``cfg``, reusing ``inputs`` when they serve it.

    Knobs merge from general to specific: hardware, then model, then engine (native and
    canonical); null means "not set here" and never hides a value from a more general layer.
    Canonical names become the engine's native ones (``engines.knobs.to_native``), replacing
    a native twin from the hardware or model layer.
    """
    if inputs is None or not inputs.serves(cfg):
        inputs = build_inputs(cfg)
    engine = cfg.engine.name
    return RunSpec(
        engine=engine, model=inputs.model, workload=inputs.workload, knobs=layered_knobs(cfg),
        ordering=_container(cfg.ordering), python=inputs.python,
        env=worker_env(cfg), repeats=int(cfg.run.repeats),
        warmup_requests=int(cfg.run.warmup_requests), time_limit_s=float(cfg.run.time_limit_s),
        memory_limit_bytes=cfg.run.get("memory_limit_bytes"),
        results_dir=Path(cfg.run.results_dir), save_outputs=bool(cfg.run.save_outputs), labels=labels(cfg),
        hardware_spec=_container(cfg.hardware.spec) if cfg.hardware.get("spec") else None,
        workload_cfg=inputs.workload_cfg, replicas=_replicas(cfg.engine.get("replicas", 1)),
        quality=quality_settings(cfg),
    )


def worker_env(cfg: DictConfig) -> dict[str, Any]:
    """The worker's environment variables: the hardware's, the engine unit's for this hardware kind, the engine's."""
    found = find_unit(cfg.engine.name)
    kind = (cfg.hardware.get("spec") or {}).get("kind", "cpu")
    own = dict(found.hardware_env.get(kind, {})) if found else {}
    return {**(_container(cfg.hardware.env) if cfg.hardware.get("env") else {}), **own,
            **(_container(cfg.engine.env) if cfg.engine.get("env") else {})}


def quality_settings(cfg: DictConfig) -> dict[str, Any]:
    """``harness.quality``'s settings: the ``quality`` config, and the reference config's knobs (the
    engine's defaults on this hardware and model: the general knob layers only)."""
    settings = _container(cfg.get("quality") or {}) or {}
    reference = settings.get("reference")
    if reference not in (None, "default"):
        raise TroughputError(f"quality.reference={reference!r}: use default (the engine's default config) or null")
    if reference:
        settings["reference_knobs"] = layered_knobs(cfg, general_only=True)
    return {k: v for k, v in settings.items() if v is not None}


def layered_knobs(cfg: DictConfig, general_only: bool = False) -> dict[str, Any]:
    """The engine's native knobs: hardware, then model defaults (general), then engine native and canonical.

    The hardware and model configs hold engine-neutral canonical defaults (``canonical:``); each
    engine takes those its unit maps and takes (``engines.knobs.defaults_to_native``).
    """
    engine = cfg.engine.name
    general: dict[str, Any] = {}
    for group in ("hardware", "model"):   # general to specific, merged leaf by leaf
        node = cfg[group]
        if node.get("knobs"):
            raise TroughputError(f"{group}.knobs of the {group} config {node.get('name')!r}: per-engine knob blocks "
                                 f"are gone; set engine-neutral defaults under {group}.canonical (docs/knobs.md) "
                                 "or an engine's own knobs under engine.knobs")
        general.update(defaults_to_native(engine, (_container(node.canonical) if node.get("canonical") else {}),
                                          f"{group}.canonical of the {group} config {node.get('name')!r}"))
    knobs: dict[str, Any] = {}
    if not general_only:
        for layer in (cfg.engine.knobs, cfg.engine.get("canonical")):
            values = _container(layer) if layer is not None else {}
            knobs.update({name: value for name, value in (values or {}).items() if value is not None})
    return to_native(engine, knobs, base=general)


def labels(cfg: DictConfig) -> dict[str, Any]:
    """The row's labels: the user's ``run.labels``, the command, hardware, round and multirun sweep."""
    out = dict(OmegaConf.to_container(cfg.run.labels, resolve=True) or {})
    out.setdefault("command", command_line())
    out["hardware"] = cfg.hardware.name
    if cfg.run.get("round") is not None:
        out["round"] = cfg.run.round
    elif wants_rounds(cfg):
        out["round"] = 1
    if HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN":
        out.setdefault("sweep_id", HydraConfig.get().sweep.dir)
    return out


def command_line() -> str:
    """The command that reproduces this job (the overrides of this job, not the whole sweep)."""
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    return " ".join(["troughput-run", *overrides])


def _replicas(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TroughputError(f"engine.replicas={value!r}: must be an integer >= 1")
    return value


def _python(cfg: DictConfig) -> str:
    return cfg.engine.python or sys.executable


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True)
