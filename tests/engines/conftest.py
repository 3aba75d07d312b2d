"""Fixtures shared by the adapter tests, and stand-ins built from the recorded API snapshots.

The SGLang and TensorRT-LLM stand-ins accept exactly what the recorded API accepts
(``engines/snapshots/*.json``, recorded from the real packages): a keyword argument the
real method lacks raises ``TypeError`` as the real call would, an unrecorded method does
not exist, and reading an unrecorded result key or attribute fails the test, including
through ``dict.get`` and ``getattr(..., default)``, which would hide a renamed name.

``FakeNvml`` (the ``nvml`` fixture) is ``pynvml`` on an 8-GPU node, for the meters and the pre-run
memory check.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Callable

import pytest

from engines.snapshots import Snapshot


@pytest.fixture
def past_env_checks(monkeypatch, request):
    """Skip the pre-run checks (``preflight``: package, host, GPU) of the test module's ``adapter``."""
    adapter = request.module.adapter
    monkeypatch.setattr(adapter, "preflight", lambda *a, **k: None)


GIB = 1024 ** 3
OWN_J, IDLE_J = 300.0, 60.0   # joules each device's counter advances per read: busy vs idle


class FakeNvml(types.ModuleType):
    """pynvml with 8 devices; ``busy`` are the ones the engine runs on. Every read of a counter advances it
    (busy devices by 300 J, idle ones by 60 J); every memory read adds 1 GiB on a busy device and 2 GiB on an
    idle one (another job's process)."""

    def __init__(self, busy: set[int], count: int = 8):
        super().__init__("pynvml")
        self.busy, self.count = busy, count
        self.energy_mj = dict.fromkeys(range(count), 1e9)
        self.used = dict.fromkeys(range(count), 1 * GIB)

    def nvmlInit(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"580.95.05"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < self.count:
            raise ValueError(f"no device {index}")
        return index

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle:02d}c0ffee-0000-0000-0000-00000000000{handle}"

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"   # bytes, as older pynvml returns it

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_mj[handle] += 1e3 * (OWN_J if handle in self.busy else IDLE_J)
        return self.energy_mj[handle]

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.used[handle] += GIB if handle in self.busy else 2 * GIB
        return types.SimpleNamespace(used=self.used[handle], total=80 * GIB, free=80 * GIB - self.used[handle])

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return []


@pytest.fixture
def nvml(monkeypatch):
    def install(busy: set[int], visible: str | None = None) -> FakeNvml:
        fake = FakeNvml(busy)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        return fake
    return install


class UnrecordedName(AssertionError):
    """The adapter used a name the recorded API does not have."""


def check_fields(snapshot: Snapshot, cls: str, kwargs: dict[str, Any]) -> None:
    """Raise ``TypeError`` (as pydantic/msgspec/dataclass constructors do) for a field ``cls`` lacks."""
    unknown = sorted(set(kwargs) - snapshot.fields(cls))
    if unknown:
        raise TypeError(f"{cls}() got unexpected keyword argument(s) {unknown}: not fields in {snapshot.label}")


def checked_method(snapshot: Snapshot, cls: str, method: str, impl: Callable) -> Callable:
    """``impl`` behind the recorded signature of ``cls.method``: unknown keywords raise ``TypeError``."""
    params = snapshot.params(cls, method)
    var_keyword = snapshot.methods(cls)[method]["var_keyword"]

    def call(self, *args, **kwargs):
        if len(args) > len(params):
            raise TypeError(f"{cls}.{method}() takes {len(params)} arguments, got {len(args)}")
        unknown = sorted(set(kwargs) - params)
        if unknown and not var_keyword:
            raise TypeError(f"{cls}.{method}() got unexpected keyword argument(s) {unknown} "
                            f"(its parameters in {snapshot.label}: {sorted(params)})")
        return impl(self, *args, **kwargs)

    call.__name__ = method
    return call


def fake_class(snapshot: Snapshot, cls: str, methods: dict[str, Callable], init: Callable | None = None) -> type:
    """A stand-in class with only ``methods``, each checked against the recorded signature.

    A method name the snapshot does not record is an error here, so a stand-in can never
    offer a method the real class lacks.
    """
    recorded = snapshot.methods(cls)
    missing = sorted(set(methods) - set(recorded))
    if missing:
        raise UnrecordedName(f"{cls} has no method(s) {missing} in {snapshot.label}")
    body: dict[str, Any] = {name: checked_method(snapshot, cls, name, impl) for name, impl in methods.items()}
    if init is not None:
        body["__init__"] = init
    return type(f"Recorded{cls}", (), body)


def kind_of(value: Any) -> str:
    """A value's kind as snapshots record them (``engines.statread``'s names)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, dict):
        return "mapping"
    return "text" if isinstance(value, str) else type(value).__name__


class RecordedDict(dict):
    """A result dict whose keys must be recorded ones: reading any other key fails the test.

    Every way of looking a name up is checked (``[]``, ``.get``, ``in``, ``.pop``,
    ``.setdefault``), and the stand-in's values must be of the kinds the snapshot records
    (``types``), so that iterating it (``.items()``, ``.values()``, ``for``) hands the adapter
    only what the real engine could. ``types_as_recorded=False`` builds one that breaks the
    recorded types on purpose (to test that the adapter survives a shape change).
    """

    def __init__(self, snapshot: Snapshot, keys: str, data: dict[str, Any], types_as_recorded: bool = True):
        self.allowed, self.where = snapshot.keys(keys), f"{keys} keys of {snapshot.label}"
        unknown = sorted(set(data) - self.allowed)
        if unknown:
            raise UnrecordedName(f"stand-in built with {unknown}, which are not {self.where}")
        if types_as_recorded:
            wrong = {k: (kind_of(data[k]), want) for k, want in snapshot.types(keys).items()
                     if k in data and kind_of(data[k]) != want}
            if wrong:
                raise UnrecordedName(f"stand-in values of other kinds than recorded ({snapshot.label}): "
                                     + ", ".join(f"{k}: {got}, recorded {want}" for k, (got, want) in wrong.items()))
        super().__init__(data)

    def _check(self, key: Any) -> None:
        if key not in self.allowed:
            raise UnrecordedName(f"the adapter read {key!r}, which is not one of the {self.where}")

    def __getitem__(self, key):
        self._check(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._check(key)
        return super().__contains__(key)

    def pop(self, key, *default):
        self._check(key)
        return super().pop(key, *default)

    def setdefault(self, key, default=None):
        self._check(key)
        return super().setdefault(key, default)


class RecordedObject:
    """A result object with attributes of recorded class ``cls`` only (and its recorded methods)."""

    def __init__(self, snapshot: Snapshot, cls: str, methods: dict[str, Callable] | None = None, **attrs: Any):
        allowed = snapshot.attributes(cls)
        unknown = sorted(set(attrs) - allowed)
        if unknown:
            raise UnrecordedName(f"stand-in {cls} built with {unknown}: not attributes in {snapshot.label}")
        object.__setattr__(self, "_meta", (snapshot, cls, allowed))
        for name, impl in (methods or {}).items():
            bound = checked_method(snapshot, cls, name, impl).__get__(self)
            object.__setattr__(self, name, bound)
        for name, value in attrs.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        snapshot, cls, allowed = object.__getattribute__(self, "_meta")
        if name not in allowed:
            # not AttributeError: getattr(obj, name, default) must not hide a wrong name
            raise UnrecordedName(f"the adapter read {cls}.{name}, which is not recorded in {snapshot.label}")
        raise AttributeError(name)


def run_worker(tmp_path, engine: str, model: dict[str, Any], requests: list,
               knobs: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``engines.worker.run_job`` in this process (the stand-in engine in ``sys.modules`` serves it);
    return the worker's result and the row's measurement columns built from it."""
    from dataclasses import asdict

    from engines import worker
    from harness.run.measure import measurement_columns

    job = tmp_path / "job"
    job.mkdir()
    (job / "job.json").write_text(json.dumps({"engine": engine, "model": model, "knobs": knobs or {}, "repeats": 1}))
    (job / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in requests))
    worker.run_job(job)
    result = json.loads((job / "result.json").read_text())
    return result, measurement_columns(result)


def run_spec_here(tmp_path, spec: Any, monkeypatch: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``run_worker`` on what ``troughput-run`` hands its worker for ``spec`` (engine, model, requests, knobs), in
    this process; with ``monkeypatch``, in the worker's environment (``spec.env``) too. For tests whose pytest
    worker imports vLLM anyway: a worker process of their own would import it again (about 10 s)."""
    for name, value in (spec.env.items() if monkeypatch is not None else ()):
        monkeypatch.setenv(name, str(value))
    return run_worker(tmp_path, spec.engine, spec.model, spec.workload.requests, spec.knobs)


def collect_shards(feeder: Any, count: int, polls: int = 100) -> dict[str, Any]:
    """Poll ``feeder`` until ``count`` shards came back (at most ``polls`` times), then close it; by shard."""
    got: dict[str, Any] = {}
    try:
        for _ in range(polls):
            got.update({out.shard: out for out in feeder.collect(timeout=0.05)})
            if len(got) == count:
                break
    finally:
        feeder.close()
    return got
