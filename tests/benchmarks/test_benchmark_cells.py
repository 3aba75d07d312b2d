"""The benchmark cells compose, and their grids are the size their docs give; no engine is run here."""

import argparse
from pathlib import Path

import pytest

from benchmarks.in_job_tuning import load_grid
from benchmarks.search_efficiency import CELLS, tune_config
from sweeps.space import SearchSpace
from sweeps.study import grid_values


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
    assert space.clip(cell.realtime, base) == cell.realtime


def test_the_in_job_benchmark_refuses_a_grid_of_another_cell_before_running_anything(tmp_path):
    args = argparse.Namespace(grid_cell="cpu_replicas", space="vllm_cpu_backlog", kv_bytes=16777216, shape=[],
                              grid=Path(tmp_path))
    with pytest.raises(SystemExit, match="give the in-job arm the same space"):
        load_grid(args)
