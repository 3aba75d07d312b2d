"""The benchmark cells compose, and their grids are the size their docs give; no engine is run here."""

import argparse
from pathlib import Path

import pytest

from benchmarks.in_job_tuning import load_grid
from benchmarks.search_efficiency import CELLS, tune_config
from harness.tune.space import SearchSpace
from harness.tune.study import grid_values


def test_the_replicas_cell_is_an_18_cell_grid_whose_seeds_lie_in_its_space(tmp_path):
    from omegaconf import OmegaConf

    cell = CELLS["cpu_replicas"]
    cfg = tune_config(cell, tmp_path, [])
    grid = grid_values(cfg)
    assert [len(v) for v in grid.values()] == [2, 3, 3]
    space = SearchSpace(OmegaConf.to_container(cfg.tune.space, resolve=True))
    base = OmegaConf.to_container(cfg, resolve=True)
    for seed in cfg.tune.seeds:
        params = dict(seed.get("params") or {})
        assert space.clip(params, base) == params, f"seed {seed.name} lies inside the space"
        assert not params or set(params) == set(grid), f"seed {seed.name} names every param (none drawn at random)"
    assert set(cfg.tune.heuristic.params) | {cfg.tune.heuristic.param} == set(grid)
    assert space.clip(cell.realtime, base) == cell.realtime


def test_the_in_job_benchmark_refuses_a_grid_of_another_cell_before_running_anything(tmp_path):
    args = argparse.Namespace(grid_cell="cpu_replicas", space="vllm_cpu_backlog", kv_bytes=16777216, shape=[],
                              grid=Path(tmp_path))
    with pytest.raises(SystemExit, match="no optuna.db there"):
        load_grid(args)
    (tmp_path / "optuna.db").touch()
    with pytest.raises(SystemExit, match="give the in-job arm the same space"):
        load_grid(args)


def test_live_trials_are_scored_at_their_nearest_grid_cell_or_as_the_grid_ran_them():
    from benchmarks.in_job_tuning import grid_best_overrides, live_trials_to_2pct
    from benchmarks.search_efficiency import Grid

    mib = 1 << 20
    grid = Grid(values={"engine.replicas": [1, 2], "engine.knobs.kv_cache_memory_bytes": [4 * mib, 64 * mib]})
    grid.cells = {(1, 4 * mib): 100.0, (1, 64 * mib): 150.0, (2, 4 * mib): 180.0, (2, 64 * mib): 200.0}
    grid.seeds = {"engine defaults": ({}, 120.0),
                  "every core": ({"engine.replicas": 2, "engine.knobs.kv_cache_memory_bytes": 1024 * mib}, 199.0)}
    assert grid_best_overrides(grid) == ["engine.replicas=2", f"engine.knobs.kv_cache_memory_bytes={64 * mib}"]
    trials = [{"values": {}}, {"values": {"engine.knobs.kv_cache_memory_bytes": 16 * mib}},
              {"values": {"engine.replicas": 2, "engine.knobs.kv_cache_memory_bytes": 1024 * mib}}]
    out = live_trials_to_2pct([{"round": 1, "trials": trials}], grid)
    # defaults as the grid ran them; 16 MiB (halfway on the log scale) rounds up to 64 MiB, replicas default 1;
    # the seed as the grid ran it, within 2% of the best at the third trial
    assert out["live"][0]["seen"] == [120.0, 150.0, 199.0] and out["live"][0]["trials_to_2pct"] == 3
