"""Every registered engine is one unit that declares what the rest of troughput reads."""

import pytest

from engines import ENGINES, KnobError, get_engine_class, unit, units
from engines.knobs import TABLE
from engines.unit import FALLBACK_SPACE
from tests.conftest import ROOT

KINDS = ("cpu", "gpu")


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_engine_declares_mapping_environment_devices_and_tune_spaces(name):
    declared = unit(name)
    assert declared.name == name and declared.label
    assert declared.knobs and set(declared.knobs) <= set(TABLE), "knobs are keyed by canonical names"
    assert "max_seqs" in declared.knobs, "the generic tune space searches max_seqs"
    environment = declared.environment()
    assert environment.module and environment.pythons
    assert declared.devices({}) == 1 and declared.devices({}, replicas=3) == 3
    for kind in KINDS:
        space = declared.tune_space(kind)
        assert (ROOT / "conf" / "tune" / f"{space}.yaml").is_file(), f"{name} on {kind}: {space}"
    assert declared.tune_space("tpu") == FALLBACK_SPACE
    assert (ROOT / "conf" / "engine" / f"{name}.yaml").is_file()
    assert get_engine_class(name).name == name


@pytest.mark.parametrize("name", [n for n in ENGINES if "tensor_parallel" in unit(n).knobs])
def test_devices_read_each_engines_own_tensor_parallel_name(name):
    declared = unit(name)
    native = declared.knobs["tensor_parallel"].to_native(4)
    assert declared.devices(native, replicas=2) == 8


def test_the_knob_table_and_troughput_env_list_every_unit():
    from engines.knobs import knob_table_markdown
    from harness import engine_env as envs

    header = knob_table_markdown().splitlines()[0]
    assert all(u.label in header for u in units())
    for name in ENGINES:
        envs.spec_for(name)   # every engine has a recipe troughput-env can print


def test_an_unknown_engine_lists_the_known_ones_and_reserved_knobs_are_refused():
    with pytest.raises(KnobError, match="known engines: vllm, sglang"):
        unit("nope")
    with pytest.raises(KnobError, match=r"vLLM knobs \['model'\] are set by troughput itself"):
        unit("vllm").check_reserved({"model": "x", "max_num_seqs": 4})
