"""Every registered engine is one unit that declares what the rest of troughput reads."""

from pathlib import Path

import pytest

from engines import KnobError, get_engine_class, registry, unit, units
from engines.knobs import TABLE
from engines.unit import FALLBACK_SPACE
from tests.conftest import ROOT

KINDS = ("cpu", "gpu")


@pytest.mark.parametrize("name", list(registry()))
def test_every_engine_declares_mapping_environment_devices_and_tune_spaces(name):
    declared = unit(name)
    assert declared.name == name and declared.label
    assert declared.knobs and set(declared.knobs) <= set(TABLE), "knobs are keyed by canonical names"
    assert "max_seqs" in declared.knobs, "the generic tune space searches max_seqs"
    environment = declared.environment()
    assert environment.module and environment.pythons
    assert declared.devices({}) == 1 and declared.devices({}, replicas=3) == 3
    own = [Path(declared.conf)] if declared.conf else []   # a plugin's config directory, then troughput's
    for kind in KINDS:
        space = declared.tune_space(kind)
        found = any((d / "tune" / f"{space}.yaml").is_file() for d in [*own, ROOT / "conf"])
        assert found, f"{name} on {kind}: {space}"
    assert declared.tune_space("tpu") == FALLBACK_SPACE
    assert any((d / "engine" / f"{name}.yaml").is_file() for d in [*own, ROOT / "conf"])
    assert get_engine_class(name).name == name


@pytest.mark.parametrize("name", [n for n in registry() if "tensor_parallel" in unit(n).knobs])
def test_devices_read_each_engines_own_tensor_parallel_name(name):
    declared = unit(name)
    native = declared.knobs["tensor_parallel"].to_native(4)
    assert declared.devices(native, replicas=2) == 8


def test_the_knob_table_and_troughput_env_list_every_unit():
    from engines.knobs import knob_table_markdown
    from harness.core import engine_env as envs

    header = knob_table_markdown().splitlines()[0]
    assert all(u.label in header for u in units())
    for name in registry():
        envs.spec_for(name)   # every engine has a recipe troughput-env can print


def test_an_unknown_engine_lists_the_known_ones_and_reserved_knobs_are_refused():
    with pytest.raises(KnobError, match="known engines: vllm, sglang"):
        unit("nope")
    with pytest.raises(KnobError, match=r"vLLM knobs \['model'\] are set by troughput itself"):
        unit("vllm").check_reserved({"model": "x", "max_num_seqs": 4})


def test_the_built_in_engines_are_entry_points_and_the_driver_hands_its_registry_to_workers(monkeypatch):
    """pyproject.toml's ``troughput.engines`` group names each built-in unit, one per ``conf/engine/`` file."""
    import json
    import tomllib

    import engines

    group = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][engines.GROUP]
    assert set(group) == {p.stem for p in (ROOT / "conf" / "engine").glob("*.yaml")}
    assert all(unit(name).name == name for name in group)
    monkeypatch.setenv(engines.ENV_VAR, json.dumps({"vllm": "engines.sim:UNIT"}))
    engines.registry.cache_clear()
    try:
        with pytest.raises(KnobError, match="is not an EngineUnit named 'vllm'"):
            unit("vllm")
    finally:
        monkeypatch.delenv(engines.ENV_VAR)
        engines.registry.cache_clear()
    assert json.loads(engines.registry_env()[engines.ENV_VAR]) == engines.registry()


def test_model_and_hardware_defaults_are_skipped_where_an_engine_does_not_take_them_but_explicit_knobs_are_not():
    from engines.knobs import defaults_to_native, to_native

    cpu = {"kv_memory_bytes": 1 << 28, "eager": True, "kv_block_size": 32, "context_length": 2048}
    assert defaults_to_native("vllm", cpu, "hardware") == {"kv_cache_memory_bytes": 1 << 28, "enforce_eager": True,
                                                           "block_size": 32, "max_model_len": 2048}
    assert defaults_to_native("trtllm", cpu, "hardware") == {}, "TensorRT-LLM takes none (takes_defaults)"
    with pytest.raises(KnobError, match="canonical knob 'eager' has no TensorRT-LLM equivalent"):
        to_native("trtllm", {"eager": True})
    with pytest.raises(KnobError, match=r"hardware: canonical: \['eagre'\] are not canonical knobs"):
        defaults_to_native("vllm", {"eagre": True}, "hardware")


class _Entry:
    """A stand-in for an ``importlib.metadata.EntryPoint`` of one distribution."""

    def __init__(self, name: str, value: str, dist: str):
        self.name, self.value, self.dist = name, value, type("Dist", (), {"name": dist})()


def test_two_distributions_registering_one_name_warn_and_a_broken_plugin_is_skipped_by_units(monkeypatch):
    import engines

    entries = [_Entry("vllm", "engines.vllm:UNIT", "troughput"), _Entry("gone", "engines.gone:UNIT", "troughput"),
               _Entry("echo", "tp_a:UNIT", "plugin-a"),
               _Entry("echo", "tp_b:UNIT", "plugin-b"), _Entry("vllm", "patched_vllm:UNIT", "patched-vllm")]
    monkeypatch.setattr(engines.metadata, "entry_points", lambda group: entries)
    monkeypatch.delenv(engines.ENV_VAR, raising=False)
    engines.registry.cache_clear()
    try:
        with pytest.warns(UserWarning) as caught:
            found = engines.registry()
        # UserWarnings only: an earlier test's event loop collected here adds a ResourceWarning (seen under -n 3)
        messages = sorted(str(w.message) for w in caught if issubclass(w.category, UserWarning))
        assert found["echo"] == "tp_b:UNIT" and found["vllm"] == "patched_vllm:UNIT"
        assert "gone" not in found, "the checkout's pyproject.toml, not stale installed metadata, lists troughput's own"
        assert len(messages) == 2 and "plugin-b registers 'tp_b:UNIT'" in messages[0] and "of plugin-a" in messages[0]
        assert "patched-vllm registers 'patched_vllm:UNIT'" in messages[1] and "of troughput" in messages[1]
        with pytest.warns(UserWarning, match=r"engine 'echo' \(tp_b:UNIT\) cannot be loaded and is skipped"):
            loaded = [u.name for u in engines.units()]
        assert "echo" not in loaded and "sglang" in loaded
        with pytest.raises(ModuleNotFoundError):
            engines.unit("echo")
    finally:
        engines.registry.cache_clear()
