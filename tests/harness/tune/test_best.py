"""Leaders, the written config and seeds from a study: feasible trials only, through harness.tune.ranking."""

from pathlib import Path

import optuna

from harness.tune.best import best_trials, leaders
from harness.tune.ranking import feasible, ranked
from harness.tune.seeds import study_seeds
from harness.tune.space import SearchSpace
from tests.conftest import compose

SEQS = "engine.knobs.max_num_seqs"
DIST = {SEQS: optuna.distributions.IntDistribution(1, 1024)}


def constrained_study(storage: str | None = None) -> optuna.Study:
    """Values grow with max_num_seqs; the two fastest break the preemption constraint."""
    study = optuna.create_study(study_name="constrained", storage=storage, direction="maximize")
    for seqs, value, rate in [(8, 10.0, -0.05), (16, 20.0, -0.01), (32, 30.0, 0.02), (64, 40.0, 0.3)]:
        study.add_trial(optuna.trial.create_trial(params={SEQS: seqs}, distributions=DIST, value=value,
                                                  constraints={"preemption_rate": rate}))
    return study


def test_ranking_leaves_out_trials_that_break_a_constraint(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = constrained_study(storage)
    assert [feasible(t) for t in study.get_trials()] == [True, True, False, False]
    assert [t.params[SEQS] for t in ranked(study)] == [16, 8]
    assert [t.params[SEQS] for t in leaders(study, 3)] == [16, 8], "an infeasible trial is never a leader"
    assert [t.params[SEQS] for t in best_trials(study)] == [16] == [study.best_trial.params[SEQS]]
    space = SearchSpace({"params": {SEQS: {"type": "int", "low": 1, "high": 1024}}})
    assert [s["params"][SEQS] for s in study_seeds(storage, "constrained", space)] == [16, 8]


def test_no_feasible_trial_means_no_best(tmp_path):
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={SEQS: 64}, distributions=DIST, value=40.0,
                                              constraints={"preemption_rate": 0.3}))
    assert best_trials(study) == [] and leaders(study, 2) == []


# A two-cell grid over max_num_seqs on the simulator with a KV cache of ~2,100 tokens:
# 64 sequences run faster than 4 but preempt (about 0.17 per request), 4 never do.
CELL = """
space:
  params:
    engine.knobs.max_num_seqs: {type: categorical, choices: [4, 64]}
seeds: []
heuristic: null
"""


def test_a_faster_trial_over_the_preemption_ceiling_is_neither_confirmed_nor_written(tmp_path, capsys):
    from harness.tune.cli import tune

    (tmp_path / "searchpath" / "tune").mkdir(parents=True)
    (tmp_path / "searchpath" / "tune" / "cell.yaml").write_text(CELL)
    summary = tune(compose(
        f"hydra.searchpath=[file://{tmp_path / 'searchpath'}]", "engine=sim", "tune=cell", "workload=unique",
        "workload.num_requests=64", "run.warmup_requests=0", "run.repeats=1", "run.progress=false",
        "engine.knobs.kv_cache_memory_bytes=2200000", "engine.knobs.max_num_batched_tokens=2048",
        "tune.sampler=grid", "tune.n_trials=10", "tune.max_preemption_rate=0.05", "tune.confirm_rounds=3",
        f"run.results_dir={tmp_path / 'results'}", config_name="tuning"))
    study = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{tmp_path / 'results' / 'optuna.db'}")
    by_seqs = {t.params[SEQS]: t for t in study.get_trials()}
    fast, safe = by_seqs[64], by_seqs[4]
    assert fast.values[0] > safe.values[0], "the premise: more sequences run faster on this cell"
    assert fast.constraints["preemption_rate"] > 0 >= safe.constraints["preemption_rate"]
    assert [t.number for t in summary["best"]] == [safe.number]
    assert set(summary["confirm"]["measured"]) == {"default", f"trial {safe.number}"}, "only feasible leaders"
    # the engine's default config (unconstrained, as the baseline) runs faster than the safe trial side by side:
    # the rule keeps the default and nothing is written
    verdict = summary["confirm"]["verdicts"][f"trial {safe.number}"]
    assert verdict.verdict == "clear winner" and verdict.winner == "b" and summary["chosen"] is None
    assert not Path(tmp_path / "results" / "tuned").exists()
    out = capsys.readouterr().out
    assert f"best trial {safe.number}:" in out and "clear winner for the default" in out
