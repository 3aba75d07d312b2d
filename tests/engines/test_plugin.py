"""An engine from a separately installed package: built and installed here, then found through its
``troughput.engines`` entry point by ``troughput-run``, ``troughput-env``, the knob table and the tuner.

The package is ``tests/engines/plugin/`` (its own ``pyproject.toml``, a scripted adapter module with its
unit, and its config directory): ``pip install --no-deps --no-build-isolation --no-index --target`` puts it
and its ``.dist-info`` into a temporary folder on ``PYTHONPATH``; nothing in troughput is edited.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run.results import read_rows
from tests.conftest import ROOT

PLUGIN = Path(__file__).parent / "plugin"
# One pytest worker runs this file, so the package (``site``, a pip build of seconds) is built once, not on each.
pytestmark = pytest.mark.xdist_group("plugin")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plugin package built and installed into a folder of its own."""
    source, target = tmp_path_factory.mktemp("echo-src") / "echo", tmp_path_factory.mktemp("echo-site")
    shutil.copytree(PLUGIN, source)   # the build writes beside its sources
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (next(target.glob("troughput_echo-*.dist-info")) / "entry_points.txt").is_file()
    return target


def run(site: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(site),
                                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_troughput_run_measures_the_plugin_engine(site, tmp_path):
    proc = run(site, "-m", "harness.cli", "engine=echo", "workload=unique", "workload.num_requests=8",
               "engine.canonical.max_seqs=4", f"run.results_dir={tmp_path}", "run.progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = read_rows(tmp_path)
    assert (row["status"], row["engine"], row["requests_done"]) == ("ok", "echo", 8)
    assert row["knob.batch"] == 4, "the canonical knob landed in the plugin's native name"


def test_troughput_env_and_the_knob_table_know_the_plugin(site):
    env = run(site, "-m", "harness.core.engine_env", "echo", "--dry-run", timeout=120)
    assert env.returncode == 0 and "Echo (plugin) runs in troughput's own environment" in env.stdout, env.stderr
    table = run(site, "-c", "from engines.knobs import knob_table_markdown; print(knob_table_markdown())",
                timeout=120)
    header, *rows = table.stdout.splitlines()
    assert header.rstrip(" |").endswith("Echo (plugin)")
    assert next(r for r in rows if r.startswith("| `max_seqs`")).rstrip(" |").endswith("`batch`")


def test_the_tuner_searches_the_space_the_plugin_ships(site, tmp_path):
    proc = run(site, "-m", "harness.tune.cli", "engine=echo", "workload=unique", "workload.num_requests=8",
               "tune.n_trials=2", "tune.confirm_rounds=0", "run.repeats=1", "run.warmup_requests=0",
               f"run.results_dir={tmp_path}", "run.progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import optuna

    study = optuna.load_study(study_name="echo-tiny-unique-cpu", storage=f"sqlite:///{tmp_path}/optuna.db")
    searched = [t.distributions["engine.canonical.max_seqs"] for t in study.trials if t.distributions]
    assert searched and searched[0].high == 64, "tp_echo/conf/tune/echo_cpu.yaml, not the generic space (256)"


def test_a_worker_without_package_metadata_finds_the_engine_the_driver_hands_it(site, tmp_path):
    """Engine workers under another interpreter or on a Ray node read the driver's registry from the environment."""
    shutil.copytree(ROOT / "engines", tmp_path / "engines", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(site / "tp_echo", tmp_path / "tp_echo")   # the code without its .dist-info
    probe = "from engines import get_engine_class, unit; print(unit('echo').label, get_engine_class('echo').name)"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    bare = subprocess.run([sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert bare.returncode != 0 and "unknown engine 'echo'" in bare.stderr
    handed = {**env, "TROUGHPUT_ENGINES": json.dumps({"echo": "tp_echo:UNIT"})}
    worker = subprocess.run([sys.executable, "-S", "-c", probe], env=handed, capture_output=True, text=True,
                            timeout=60)
    assert worker.returncode == 0 and worker.stdout.split() == ["Echo", "(plugin)", "echo"], worker.stderr
