"""The shared vision-language model (``model=qwen2.5-vl-7b``): composes with the multimodal workload on
every GPU engine, names an architecture the engines register, and ships its architecture fields."""

import json
from pathlib import Path

import pytest

from engines.perfmodel import ModelSpec
from tests.conftest import ROOT, compose

VLM = "qwen2.5-vl-7b"
ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
VLLM_REGISTRY = "vllm/model_executor/models/registry.py"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_multimodal_workload_composes_with_the_shared_vlm_on_every_gpu_engine(engine):
    cfg = compose(f"engine={engine}", "workload=multimodal", f"model={VLM}", "hardware=h100")
    assert cfg.engine.name == engine and cfg.workload.name == "multimodal"
    assert cfg.model.name == VLM, "model= on the command line wins over the workload's default VLM"
    assert cfg.model.image_token == "<|image_pad|>"


def test_its_architecture_file_names_the_registered_class_and_loads_for_the_performance_model():
    config = json.loads((ROOT / "conf" / "architectures" / f"{VLM}.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and config["image_token_id"] == 151655
    spec = ModelSpec.load(None, VLM)
    assert (spec.layers, spec.hidden, spec.kv_heads, spec.head_dim, spec.vocab) == (28, 3584, 4, 128, 152064)


def test_vllm_registers_the_architecture_in_its_model_registry():
    import importlib.util

    found = importlib.util.find_spec("vllm")
    if found is None or not found.submodule_search_locations:
        pytest.skip("vllm is not installed here")
    registry = Path(list(found.submodule_search_locations)[0]).parent / VLLM_REGISTRY
    assert f'"{ARCHITECTURE}"' in registry.read_text(), f"{ARCHITECTURE} is not in {registry}"
