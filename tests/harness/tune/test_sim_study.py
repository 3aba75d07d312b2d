"""Tuning on the simulator first: a whole study on predicted runs, then its top configs seed another study."""

import optuna
import pytest

from harness.core.errors import TroughputError
from harness.run.results import read_rows
from harness.tune.seeds import enqueue_seeds, knob_key, study_seeds
from harness.tune.space import SearchSpace
from tests.conftest import FAKE_ENGINE, compose
from tests.harness.tune.test_study import FAKE_SPACE


def test_a_simulated_study_completes_every_trial(tmp_path):
    """12 trials: past TPE's startup trials (4 by default), so most proposals come from its model (structure, not speed)."""
    from harness.tune.cli import tune

    cfg = compose("engine=sim", "workload=unique", "workload.num_requests=64", "run.warmup_requests=0",
                  "tune.n_trials=12", "tune.confirm_rounds=0", f"run.results_dir={tmp_path}", "run.progress=false",
                  config_name="tuning")
    summary = tune(cfg)
    study = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{tmp_path}/optuna.db")
    trials = study.get_trials()
    states = [t.state for t in trials]
    assert summary["finished"] == 12 and len(states) == 12
    assert states.count(optuna.trial.TrialState.COMPLETE) >= 10, "only constraint-free proposals fail here"
    rows = {r["trial"]: r for r in read_rows(tmp_path) if r.get("study") == summary["study"]}
    assert sorted(rows) == list(range(12)), "every trial ran once, as a predicted row"
    assert {r["engine"] for r in rows.values()} == {"sim"}
    assert summary["best"][0].params, "a tuned config beats the engine defaults on this workload"
    assert summary["best"][0].values[0] == max(t.values[0] for t in trials if t.state.name == "COMPLETE")


def test_the_simulators_top_configs_are_the_first_trials_of_a_real_study(tmp_path):
    """A fake-engine study (standing in for a real one) seeded from a simulator study in the same storage."""
    from harness.tune.cli import tune

    common = ["workload=unique", "workload.num_requests=16", "run.warmup_requests=0", "tune.confirm_rounds=0",
              f"run.results_dir={tmp_path / 'results'}", "run.progress=false", "tune.sampler=random"]
    sim = tune(compose("engine=sim", *common, "tune.n_trials=8", config_name="tuning"))
    (tmp_path / "searchpath" / "tune").mkdir(parents=True)
    (tmp_path / "searchpath" / "tune" / "fake.yaml").write_text(FAKE_SPACE)
    real = tune(compose(*common, f"hydra.searchpath=[file://{tmp_path / 'searchpath'}]", "tune=fake",
                        f"engine.name={FAKE_ENGINE}", "+engine.knobs.step_s=0.0", "tune.n_trials=5",
                        f"tune.seed_from_study={sim['study']}", config_name="tuning"))
    storage = f"sqlite:///{tmp_path / 'results' / 'optuna.db'}"
    source = optuna.load_study(study_name=sim["study"], storage=storage)
    best = max((t for t in source.get_trials() if t.state == optuna.trial.TrialState.COMPLETE and t.params),
               key=lambda t: t.values[0])
    seeded = [t for t in optuna.load_study(study_name=real["study"], storage=storage).get_trials()
              if str(t.user_attrs.get("seed", "")).startswith(sim["study"])]
    assert seeded and seeded[0].user_attrs["seed"].startswith(f"{sim['study']} #1 (trial {best.number},")
    # The fake space caps max_num_seqs at 64: the simulator's choice, moved into this space's range.
    assert seeded[0].params["engine.knobs.max_num_seqs"] == min(best.params["engine.knobs.max_num_seqs"], 64)


def test_param_paths_match_through_the_canonical_table():
    assert knob_key("engine.knobs.max_num_seqs") == knob_key("engine.canonical.max_seqs") == "max_seqs"
    assert knob_key("engine.knobs.enable_chunked_prefill") == "chunked_prefill"
    assert knob_key("ordering") == "ordering"


@pytest.fixture
def storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def test_study_seeds_map_rank_skip_defaults_and_clip(storage):
    source = optuna.create_study(study_name="sim-study", storage=storage, direction="maximize")
    dist = {"engine.knobs.max_num_seqs": optuna.distributions.IntDistribution(1, 2048, log=True),
            "engine.knobs.enable_chunked_prefill": optuna.distributions.CategoricalDistribution([True, False])}
    for value, seqs in [(10.0, 8), (30.0, 512), (20.0, 64)]:
        source.add_trial(optuna.trial.create_trial(
            params={"engine.knobs.max_num_seqs": seqs, "engine.knobs.enable_chunked_prefill": True},
            distributions=dist, value=value))
    source.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=99.0))  # engine defaults
    target = optuna.create_study(study_name="real-study", storage=storage, direction="maximize")
    space = SearchSpace({"params": {"engine.canonical.max_seqs": {"type": "int", "low": 4, "high": 256},
                                    "engine.canonical.max_tokens_per_step": {"type": "int", "low": 256, "high": 8192}}})
    seeds = study_seeds(storage, {"study": "sim-study", "top_k": 2}, space)
    assert [s["params"] for s in seeds] == [{"engine.canonical.max_seqs": 512}, {"engine.canonical.max_seqs": 64}]
    names = enqueue_seeds(target, {"seed_from_study": "sim-study", "storage": storage}, space, {}, {}, "")
    assert names[0].startswith("sim-study #1")
    waiting = target.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting[0].system_attrs["fixed_params"] == {"engine.canonical.max_seqs": 256}, "clipped into range"
    with pytest.raises(TroughputError, match="no study 'nope'"):
        study_seeds(storage, "nope", space)


def test_the_heuristic_counts_the_architectures_weights_in_a_folder_without_weight_files(tmp_path):
    """A metadata-only (dummy-weights) Llama-3.1-8B folder: 16 GB of weights still occupy the H100."""
    import json

    from harness.tune.seeds import resident_requests, weight_bytes
    from tests.conftest import ROOT

    (tmp_path / "config.json").write_text((ROOT / "conf" / "architectures" / "llama-3.1-8b.json").read_text())
    weights = weight_bytes(tmp_path)
    assert weights == pytest.approx(16.06e9, rel=1e-3), "8.03 B parameters x 2 bytes"
    h100 = 85899345920
    resident = resident_requests(tmp_path, h100, weights, 1000, 1000)
    assert resident == int(0.95 * (h100 - weights) / (2 * 32 * 8 * 128 * 2 * 2000))
    assert resident_requests(tmp_path, h100, 0, 1000, 1000) > 1.2 * resident, "what counting no weights gave"
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    assert weight_bytes(tmp_path) == 4096, "weight files, where there are any, are what is loaded"
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 32
