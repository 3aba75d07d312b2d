"""Every option of every config group composes, and the knobs merge as documented."""

from pathlib import Path

import pytest

from tests.conftest import ROOT, compose

GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "tune")
TUNE_OPTIONS = sorted(p.stem for p in (ROOT / "conf" / "tune").glob("*.yaml"))


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
    from harness.run.spec import build_spec

    cfg = compose("workload=unique", "workload.num_requests=3", "engine.knobs.max_num_seqs=8",
                  "hardware.canonical.kv_block_size=16", "model.canonical.context_length=512",
                  f"run.image_dir={tmp_path}")
    spec = build_spec(cfg)
    assert spec.knobs["max_num_seqs"] == 8 and spec.knobs["block_size"] == 16
    assert spec.knobs["max_model_len"] == 512 and spec.knobs["enforce_eager"] is True
    assert "max_num_batched_tokens" not in spec.knobs, "null knobs mean the engine's default and are dropped"
    assert spec.knobs["gpu_memory_utilization"] == 0.5, "a null in engine.knobs does not hide hardware's value"
    assert spec.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


@pytest.mark.parametrize("option", [o for o in TUNE_OPTIONS if o != "auto"])
def test_every_search_space_composes_and_parses(option):
    from harness.tune.space import SearchSpace

    engine, _, rest = option.partition("_")   # <engine>_<hardware>[_<variant>], or a generic space
    hardware = next((h for h in options("hardware") if rest == h or rest.startswith(h + "_")), None)
    overrides = [f"engine={engine}", f"hardware={hardware}"] if hardware else ["engine=hf"]
    cfg = compose(*overrides, f"tune={option}", config_name="tuning")
    assert cfg.tune.n_trials > 0
    space = SearchSpace(cfg.tune.space)
    for p in space.params:
        assert p.path.startswith(("engine.", "ordering")), p.path


@pytest.mark.parametrize("engine", options("engine"))
@pytest.mark.parametrize("hardware", options("hardware"))
def test_every_engine_on_every_hardware_gets_a_space_from_its_unit(engine, hardware):
    from engines import unit
    from harness.tune.space import SearchSpace
    from harness.tune.space_choice import with_default_space

    cfg = with_default_space(compose(f"engine={engine}", f"hardware={hardware}", config_name="tuning"))
    expected = unit(engine).tune_space(cfg.hardware.spec.kind)
    assert cfg.tune.auto == expected and SearchSpace(cfg.tune.space).params


def test_settings_given_on_the_command_line_win_over_the_space_file():
    from harness.tune.space_choice import with_default_space

    cfg = with_default_space(compose("tune.seeds=[]", "tune.n_trials=2", config_name="tuning"))
    assert list(cfg.tune.seeds) == [] and cfg.tune.n_trials == 2 and cfg.tune.auto == "vllm_cpu"


def test_tuning_picks_the_space_of_the_engine_and_hardware():
    from harness.tune.space_choice import with_default_space

    cfg = with_default_space(compose(config_name="tuning"))
    assert "engine.canonical.max_seqs" in cfg.tune.space.params
    assert cfg.tune.heuristic.memory_bytes == cfg.hardware.canonical.kv_memory_bytes
    assert cfg.tune.heuristic.params["engine.knobs.kv_cache_memory_bytes"] == cfg.tune.heuristic.memory_bytes, \
        "the heuristic's trial runs on the KV budget it was computed from"


def test_the_cpu_space_seeds_pin_what_they_assume(tmp_path):
    import json

    import optuna
    from omegaconf import OmegaConf

    from harness.tune.seeds import enqueue_seeds
    from harness.tune.space import SearchSpace

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "hidden_size": 128, "head_dim": 32,
                                                      "num_key_value_heads": 2, "num_hidden_layers": 4}))
    from harness.tune.space_choice import with_default_space

    base = OmegaConf.to_container(with_default_space(compose(config_name="tuning")), resolve=True)
    study = optuna.create_study(direction="maximize")
    summary = {"requests": 10, "input_tokens_requested": 1000, "output_tokens_requested": 500}
    names = enqueue_seeds(study, base["tune"], SearchSpace(base["tune"]["space"]), base, summary, str(tmp_path))
    assert names[0] == "engine defaults" and names[3].startswith("trtllm heuristic")
    params = [t.system_attrs["fixed_params"] for t in study.get_trials()]
    assert params[3]["engine.knobs.kv_cache_memory_bytes"] == 256 << 20, "the budget the heuristic assumed"
    assert params[2] == {**params[1], "engine.replicas": 2}, "the batch recipe on every core"
    assert params[1]["engine.replicas"] == params[3]["engine.replicas"] == 1, "no seed leaves replicas to chance"
    assert params[1]["engine.knobs.kv_cache_memory_bytes"] == 1 << 30, "the batch recipe: the most KV allowed"


@pytest.mark.parametrize("option", ["vllm_h100", "sim_h100", "sim_h100_backlog", "trtllm_h100", "sglang_h100",
                                    "ray_gpu"])
def test_the_gpu_heuristic_seed_runs_on_the_kv_share_it_sizes_for(option, tmp_path):
    """TensorRT-LLM's heuristic sizes the resident requests for 0.95 of the memory the weights leave: its seed, as
    the study gets it (``enqueue_seeds``), pins the space's KV share at its top (else the sampler draws one, and a
    draw under it preempts)."""
    import json

    import optuna
    from omegaconf import OmegaConf

    from harness.tune.seeds import enqueue_seeds
    from harness.tune.space import SearchSpace

    (tmp_path / "config.json").write_text(json.dumps({   # Llama-3.1-8B's shape
        "num_attention_heads": 32, "hidden_size": 4096, "head_dim": 128, "num_key_value_heads": 8,
        "num_hidden_layers": 32, "vocab_size": 128256, "intermediate_size": 14336}))
    base = OmegaConf.to_container(compose(f"tune={option}", "hardware=h100", config_name="tuning"), resolve=True)
    space = SearchSpace(base["tune"]["space"])
    study = optuna.create_study(direction="maximize")
    summary = {"requests": 10, "input_tokens_requested": 5000, "output_tokens_requested": 5000}
    names = enqueue_seeds(study, base["tune"], space, base, summary, str(tmp_path))
    [heuristic] = [t.system_attrs["fixed_params"] for name, t in zip(names, study.get_trials()) if "heuristic" in name]
    [share] = [p for p in space.params if p.path.endswith(("kv_memory_fraction", "gpu_memory_utilization"))]
    assert heuristic[share.path] == share.high and len(heuristic) == 2, heuristic
