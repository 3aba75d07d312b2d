"""Every option of every config group composes, and the knobs merge as documented."""

from pathlib import Path

import pytest

from tests.conftest import ROOT, compose

GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_config_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if (group, option) == ("workload", "file"):
        overrides.append("workload.path=x.jsonl")
    cfg = compose(*overrides)
    assert cfg[group].name
    for key in ("repeats", "warmup_requests", "time_limit_s", "results_dir"):
        assert key in cfg.run


def test_groups_the_issue_asks_for_exist():
    assert {"engine", "workload", "model", "ordering"} <= set(GROUPS)
    assert {"as_given", "shuffled"} <= set(options("ordering"))
    assert {"unique", "prefix_heavy", "multimodal", "file"} <= set(options("workload"))


def test_knobs_merge_hardware_then_model_then_engine(tmp_path: Path):
    from harness.cli import spec_from_config

    cfg = compose("workload=unique", "workload.num_requests=3", "engine.knobs.max_num_seqs=8",
                  "hardware.knobs.vllm.block_size=16", "model.knobs.vllm.max_model_len=512",
                  f"run.image_dir={tmp_path}")
    spec = spec_from_config(cfg)
    assert spec.knobs["max_num_seqs"] == 8 and spec.knobs["block_size"] == 16
    assert spec.knobs["max_model_len"] == 512 and spec.knobs["enforce_eager"] is True
    assert "max_num_batched_tokens" not in spec.knobs, "null knobs mean the engine's default and are dropped"
    assert spec.knobs["gpu_memory_utilization"] == 0.5, "a null in engine.knobs does not hide hardware's value"
    assert spec.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
