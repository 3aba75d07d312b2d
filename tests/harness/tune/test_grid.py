"""tune.sampler=grid: the whole grid under ask/tell, seed trials on top of it, then the best printed and written."""

import itertools

import optuna
from omegaconf import OmegaConf

from harness.tune.study import grid_values
from tests.conftest import compose

GRID = ["engine=sim", "tune=sim_cpu", "workload=unique", "workload.num_requests=32", "run.warmup_requests=0", "run.repeats=1",
        "run.progress=false", "tune.sampler=grid", "tune.grid_points=2", "tune.confirm_rounds=0",
        "tune.write_unconfirmed=true"]


def test_a_grid_study_runs_to_its_last_cell_prints_the_best_and_writes_the_config(tmp_path, capsys):
    from harness.tune.cli import tune

    cfg = compose(*GRID, "tune.n_trials=100", f"run.results_dir={tmp_path}", config_name="tuning")
    summary = tune(cfg)  # Optuna's GridSampler would raise in Study.stop() after the last cell
    out = capsys.readouterr().out
    study = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{tmp_path}/optuna.db")
    trials = study.get_trials()
    seeds = [t for t in trials if "seed" in t.user_attrs]
    cells = [t for t in trials if "seed" not in t.user_attrs]
    grid = grid_values(cfg)
    assert [t.user_attrs["seed"] for t in seeds][:2] == ["engine defaults", "batch recipe"]
    assert seeds[2].user_attrs["seed"].startswith("trtllm heuristic"), "a seed fixing one param runs too"
    assert set(seeds[2].params) == set(grid), "its other params drawn from their ranges"
    expected = {tuple(values) for values in itertools.product(*grid.values())}
    assert len(cells) == len(expected) == 8, "n_trials=100 caps nothing: the grid's 8 cells, each once"
    assert {tuple(t.params[p] for p in grid) for t in cells} == expected
    assert all(t.state.is_finished() for t in trials) and summary["finished"] == len(expected) + len(seeds)
    best = summary["best"][0]
    assert f"best trial {best.number}: values {best.values}" in out
    written = tmp_path / "tuned" / "engine" / f"{summary['study']}.yaml"
    assert f"trial {best.number}," in written.read_text() and f"best config written to {written}" in out
    assert "# UNCONFIRMED" in written.read_text(), "no confirmation ran: the file says it has no verdict"
    # A seed added to the finished grid study runs on resume, alone: the grid is not run again.
    OmegaConf.update(cfg, "tune.seeds", [*OmegaConf.to_container(cfg.tune.seeds),
                                         {"name": "late seed", "params": {"engine.knobs.max_num_seqs": 8}}])
    tune(cfg)
    after = study.get_trials()
    assert len(after) == len(trials) + 1 and after[-1].user_attrs["seed"] == "late seed"
    assert after[-1].state == optuna.trial.TrialState.COMPLETE and after[-1].params["engine.knobs.max_num_seqs"] == 8


def test_a_grid_budget_below_the_grid_runs_that_many_cells_plus_the_seeds(tmp_path):
    from harness.tune.cli import tune

    summary = tune(compose(*GRID, "tune.n_trials=3", f"run.results_dir={tmp_path}", config_name="tuning"))
    trials = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{tmp_path}/optuna.db").get_trials()
    assert len([t for t in trials if "seed" not in t.user_attrs]) == 3
    assert len([t for t in trials if "seed" in t.user_attrs]) == 3, "seed trials are counted apart from the grid"


def test_without_confirmation_nothing_is_written_unless_asked_for(tmp_path, capsys):
    # issue 25: a config is written only when the rule says it beats the default; confirm_rounds=0 gives no verdict
    from harness.tune.cli import tune

    summary = tune(compose(*GRID, "tune.n_trials=1", "tune.write_unconfirmed=false", f"run.results_dir={tmp_path}",
                           config_name="tuning"))
    out = capsys.readouterr().out
    assert summary["chosen"] is None and summary["best"], "the study ran and has a best trial"
    assert "tune.confirm_rounds=0: no side-by-side runs against the default, so no verdict: keeping the default, " \
           "no tuned config written" in out and "best config written" not in out
    assert not (tmp_path / "tuned").exists()
