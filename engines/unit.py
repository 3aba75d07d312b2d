"""What troughput knows about one engine, declared once, next to its adapter.

Every adapter module (``engines/vllm.py``, ``engines/sglang.py``, ...) ends with
``UNIT = EngineUnit(...)``: its label, its adapter class, where each canonical knob
lands in its native arguments, how to build its Python environment, the native knobs
troughput sets itself, and its default search space per hardware kind. The registry
(``engines.registry()``, from the ``troughput.engines`` entry points), the knob table
(``engines.knobs``), ``troughput-env``, the cost planner and the tuner read these
declarations; none of them lists engines itself.

Standard library only: the worker side imports the adapter modules that hold units.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engines.base import KnobError
from engines.native import UNSET, NativeMapping, flatten

FALLBACK_SPACE = "generic"   # conf/tune/generic.yaml: canonical knobs only, for any engine and hardware


@dataclass(frozen=True)
class Environment:
    """How to build one engine's Python environment (``troughput-env``), and what the host must offer.

    Args:
        module: the engine's import name.
        pythons: interpreters to create the environment with, in order of preference.
        packages: pip requirements of the engine; empty when it runs in troughput's own environment.
        pip_args: extra arguments for that pip install (package indexes).
        remove: packages to uninstall afterwards (they break the engine's import).
        needs_gpu: whether the engine only runs with a CUDA GPU.
        notes: system prerequisites pip cannot install.
        pre_install: pip install argument lists run before the engine's, in order (an install
            guide's "install this first" steps, e.g. a CUDA build of torch from its own index).
        constraints: requirement lines written to ``<env>/constraints.txt`` and passed to the
            engine's install with ``-c``, so it cannot replace what ``pre_install`` put there.
        cuda: the CUDA version the engine's wheels are built for (``"13.0"``); it sets the
            minimum NVIDIA driver (``engines.requirements.DRIVER_FOR_CUDA``).
        cuda_toolkit: the CUDA toolkit the host must have under ``$CUDA_HOME`` (``"13.1"``).
        glibc: the oldest glibc the engine's wheels run on (their manylinux tag).
        python: the Python versions the engine supports: comma-separated ``>=X.Y``, ``<X.Y``
            (all must hold) and ``==X.Y`` (any one must hold), e.g. ``">=3.11,<3.15"``.
        libraries: (shared library, fix) pairs the engine loads at run time, e.g. MPI.
    """

    module: str
    pythons: tuple[str, ...] = ("python3.11", "python3.12")
    packages: tuple[str, ...] = ()
    pip_args: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    needs_gpu: bool = True
    notes: tuple[str, ...] = ()
    pre_install: tuple[tuple[str, ...], ...] = ()
    constraints: tuple[str, ...] = ()
    cuda: str | None = None
    cuda_toolkit: str | None = None
    glibc: str | None = None
    python: str | None = None
    libraries: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EngineUnit:
    """One engine, as the rest of troughput sees it.

    Args:
        name: the ``engine=`` name (and ``conf/engine/<name>.yaml``).
        label: how people write it (``TensorRT-LLM``).
        adapter: ``"module:Class"`` of its ``engines.base.Engine``.
        knobs: canonical knob name -> where it lands in the native arguments.
        environments: variant -> recipe; ``"default"`` is required, others are flags of
            ``troughput-env`` (``"cpu"`` is ``--cpu``).
        tune_spaces: hardware kind (``cpu``, ``gpu``) -> ``conf/tune/<name>.yaml``; a kind not
            listed gets ``FALLBACK_SPACE``.
        reserved: native knobs troughput sets itself (a user setting one is an error).
        takes_defaults: the canonical knobs this engine takes from the model and hardware configs'
            ``canonical:`` defaults; ``None``: every one it maps. A default it does not take, or has
            no mapping for, is skipped (an explicit ``engine.canonical`` knob it lacks is an error).
        quantization: the native knob naming its weight quantization (dotted), for the performance model.
        snapshot: its recorded API snapshot, a JSON file name in ``engines/snapshots/``.
        hardware_env: hardware kind (``cpu``, ``gpu``) -> environment variables its worker gets on that
            kind, under the hardware config's engine-neutral ``env`` and the engine config's own ``env``.
        conf: a directory holding the engine's ``engine/<name>.yaml`` (and any ``tune/<space>.yaml`` it
            names), for an engine outside this repository; Hydra searches it
            (``hydra_plugins/troughput_engines``). ``None``: the file lives in troughput's ``conf/``.
        acceptance: whether the GPU acceptance matrix (``benchmarks/gpu_acceptance.py``) runs it, with its
            tune space's "batch recipe" seed.
        baseline: whether reports measure other engines against it (the "× <engine>" column): a plain
            reference implementation such as HF transformers.
    """

    name: str
    label: str
    adapter: str
    knobs: Mapping[str, NativeMapping]
    environments: Mapping[str, Environment]
    tune_spaces: Mapping[str, str] = field(default_factory=dict)
    reserved: frozenset[str] = frozenset()
    takes_defaults: frozenset[str] | None = None
    quantization: str | None = None
    snapshot: str | None = None
    acceptance: bool = False
    conf: str | None = None
    hardware_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    baseline: bool = False

    def __post_init__(self) -> None:
        if "default" not in self.environments:
            raise ValueError(f"engine unit {self.name!r} declares no default environment")

    def devices(self, knobs: Mapping[str, Any], replicas: Any = 1) -> int:
        """Devices one config occupies: replicas × tensor parallel × pipeline parallel (canonical knobs)."""
        flat = flatten(dict(knobs))
        count = device_count(replicas)
        for name in ("tensor_parallel", "pipeline_parallel"):
            value = self.knobs[name].from_native(flat) if name in self.knobs else UNSET
            count *= device_count(None if value is UNSET else value)
        return count

    def tune_space(self, hardware_kind: str | None) -> str:
        """The default search space (a ``conf/tune/`` name) on hardware of this kind."""
        return self.tune_spaces.get(hardware_kind or "", FALLBACK_SPACE)

    def environment(self, variant: str = "default") -> Environment:
        if variant not in self.environments:
            raise KnobError(f"{self.label} has no {variant!r} environment; it has "
                            f"{', '.join(self.environments)}")
        return self.environments[variant]

    def defaults(self, canonical: Mapping[str, Any]) -> dict[str, Any]:
        """The model or hardware config's canonical defaults this engine takes (see ``takes_defaults``)."""
        return {name: value for name, value in canonical.items() if value is not None and name in self.knobs
                and (self.takes_defaults is None or name in self.takes_defaults)}

    def check_reserved(self, knobs: Mapping[str, Any]) -> None:
        """Raise ``KnobError`` when ``knobs`` set a native knob troughput sets itself."""
        clash = sorted(self.reserved & set(knobs))
        if clash:
            raise KnobError(f"{self.label} knobs {clash} are set by troughput itself; remove them")


def dummy_weights_args(model: Mapping[str, Any]) -> dict[str, Any]:
    """``load_format="dummy"`` when the model config asks for dummy weights (vLLM, SGLang, TensorRT-LLM)."""
    return {"load_format": "dummy"} if model.get("dummy_weights") else {}


def device_count(value: Any) -> int:
    """A replica or parallelism count as a positive int; unset or unreadable values count as 1."""
    try:
        return max(int(value or 1), 1)
    except (TypeError, ValueError):
        return 1
