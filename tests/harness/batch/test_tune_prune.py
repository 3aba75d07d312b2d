"""In-job tuning's pruner (``batch.tune.prune``): a trial clearly behind after a few shards stops, its committed
shards kept, the rest run by later runs; the job's own config is never pruned; a kill while a pruned trial's last
shards finish resumes. The scripted engine streams (``token_s``) and records its steps; a config's speed is set by
its seats (``max_num_seqs``: tokens a step), so 4 seats against 8 is 2× slower whatever the host's timer jitter."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import optuna
import pytest

from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import batch_app, completion, read_jsonl, troughput_batch, write_jsonl

RECORDS, SHARD, PER_RUN = 800, 8, 10   # 100 shards of 8; trials of 10 shards; 4 shards held at once (in_flight=1)


def _space(*seeds: tuple[str, int | None]) -> str:
    """A space of the scripted engine's seats; seeds in the order given (``None``: the engine defaults)."""
    lines = "".join(f"  - name: engine defaults\n" if seats is None else
                    f"  - name: {name}\n    params: {{engine.knobs.max_num_seqs: {seats}}}\n" for name, seats in seeds)
    return ("space:\n  params:\n    engine.knobs.max_num_seqs: {type: categorical, choices: [4, 7, 8, 16]}\n"
            f"seeds:\n{lines}heuristic: null\n")


def _job(tmp_path: Path, space: str) -> list[str]:
    (tmp_path / "conf" / "tune").mkdir(parents=True, exist_ok=True)
    (tmp_path / "conf" / "tune" / "case.yaml").write_text(space)
    path = write_jsonl(tmp_path / "batch.jsonl", [completion(f"r{i}", f"prompt {i}", max_tokens=10)
                                                  for i in range(RECORDS)])
    return [f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", f"batch.input={path}",
            f"batch.output_dir={tmp_path / 'out'}", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "tune=case",
            f"batch.shard_size={SHARD}", "batch.in_flight=1", "batch.tune.min_run_requests=16",
            "batch.tune.max_share=0.9", "batch.tune.trials=3", f"batch.tune.shards_per_run={PER_RUN}",
            "+engine.knobs.token_s=0.01", "+engine.knobs.max_num_seqs=8"]   # the job's own config: 8 seats


@pytest.fixture
def no_replay(monkeypatch):
    """No step-model replay after each run (seconds of CPU a run, not what these tests are about): each trial's
    value is its measured rate."""
    from harness.batch.tune import tuning
    from harness.batch.tune.tune_predict import NO_PREDICTION

    monkeypatch.setattr(tuning, "full_engine_rate", lambda *a, **k: (None, [], "not computed: not in this test"))
    monkeypatch.setattr(tuning, "predict_rest", lambda *a, **k: dict(NO_PREDICTION))


def _metas(out: Path) -> dict[int, dict]:
    return {int(p.parent.name): read_jsonl(p)[0] for p in (out / "shards").glob("*/meta.json")}


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="in-job", storage=f"sqlite:///{tmp_path / 'out' / 'tune' / 'study.db'}")


def _answered_once(tmp_path: Path) -> None:
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert ids == [f"r{i}" for i in range(RECORDS)], "every request answered once, in file order"
    assert not read_jsonl(tmp_path / "out" / "errors.jsonl")


def test_a_config_2x_slower_is_pruned_after_its_first_shards_and_the_others_run_to_the_end(
        tmp_path: Path, no_replay) -> None:
    args = _job(tmp_path, _space(("engine defaults", None), ("slow", 4), ("near", 7)))
    proc = batch_app(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _answered_once(tmp_path)
    [row] = read_rows(tmp_path / "results", "batch")
    trials = {r["label"]: r for r in row["tune.runs"] if r["kind"] == "trial"}
    defaults, slow, near = trials["trial 0 (engine defaults)"], trials["trial 1 (slow)"], trials["trial 2 (near)"]
    # pruned at its first chance (batch.tune.prune_warmup=2 shards); the shards its engine held then finished and
    # were committed; the rest of its run went to later runs
    assert slow["pruned_at"] == 2 and slow["status"] == "ok" and 2 <= len(slow["shards"]) < PER_RUN, slow
    assert slow["reason"].startswith("pruned after 2 shards")
    # the defaults' trial is handed twice a run for the confirmation's blocks (100 steps a run, under a block)
    assert defaults["pruned_at"] is None and PER_RUN < len(defaults["shards"]) <= 2 * PER_RUN
    assert near["pruned_at"] is None and len(near["shards"]) == PER_RUN, "7 seats of 8: behind, not clearly"
    metas = _metas(tmp_path / "out")
    assert len(metas) == RECORDS // SHARD and (row["requests_ok"], row["shards_run"]) == (RECORDS, RECORDS // SHARD)
    assert sorted(i for i, m in metas.items() if m["run"] == "trial 1 (slow)") == sorted(slow["shards"]), \
        "the pruned trial's committed shards are the job's output"
    assert all(metas[i]["config"] == {"engine.knobs.max_num_seqs": 4} for i in slow["shards"])
    study = _study(tmp_path)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                                               optuna.trial.TrialState.COMPLETE]
    reported = {t.number: t.intermediate_values for t in study.trials}
    assert sorted(reported[1]) == [1, 2] and study.trials[1].user_attrs["pruned"]["at"] == 2
    assert len(reported[0]) >= 2 and len(reported[2]) >= 2, "every trial reports as its shards commit"
    ratio = reported[1][2] / reported[0][2]
    print("slow ÷ defaults at shard 2:", ratio, "near ÷ defaults:", reported[2][2] / reported[0][2])
    assert ratio < 0.75, "clearly behind: under 1 - batch.tune.prune_margin of the defaults"
    assert (row["tune.prune"], row["tune.pruned_trials"], row["tune.pruned_share"]) == ("median", 1, 1 / 3)
    assert row["tune.pruned_shards_left"] == PER_RUN - len(slow["shards"])
    assert "3 trials (1 pruned (batch.tune.prune=median), 33% of the trials that ran" in proc.stdout
    assert "trial 1 (slow): pruned after 2 shards" in proc.stdout + proc.stderr


def test_the_engine_defaults_run_first_wherever_the_seeds_list_them_then_the_fewest_seats_to_the_most(
        tmp_path: Path, no_replay) -> None:
    """Seeds in the user's order put the engine defaults second, behind a config of twice their seats: the defaults
    still run first (the fallback, and the confirmation's other side; never pruned), then the slow config (pruned
    against them), the widest last, so that the main phase could go on with its engines."""
    args = _job(tmp_path, _space(("wide", 16), ("engine defaults", None), ("slow", 4)))
    proc = batch_app(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _answered_once(tmp_path)
    [row] = read_rows(tmp_path / "results", "batch")
    assert [r["label"] for r in row["tune.runs"] if r["kind"] == "trial"] == [
        "trial 0 (engine defaults)", "trial 1 (slow)", "trial 2 (wide)"]
    trials = {r["label"]: r for r in row["tune.runs"] if r["kind"] == "trial"}
    defaults = trials["trial 0 (engine defaults)"]
    assert defaults["pruned_at"] is None and trials["trial 1 (slow)"]["pruned_at"] is not None
    assert trials["trial 2 (wide)"]["pruned_at"] is None and len(trials["trial 2 (wide)"]["shards"]) == PER_RUN
    study = _study(tmp_path)
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE and "pruned" not in study.trials[0].user_attrs
    assert row["tune.pruned_trials"] == 1
    # its 8-seat engine runs 160 ten-token requests (twice a run) in about 200 steps, one block of 128: nothing to
    # confirm the wide config against, so the main phase runs the defaults from its start, and says why
    assert len(defaults["blocks"]) < 3 and "block(s) of full steps" in row["tune.verdict"]


def test_kill_9_while_a_pruned_trial_s_last_shards_finish_resumes_with_it_pruned(tmp_path: Path) -> None:
    args = _job(tmp_path, _space(("engine defaults", None), ("slow", 4), ("near", 7)))
    log = tmp_path / "first.log"
    proc = troughput_batch(tmp_path, *args, popen=True, start_new_session=True, stdout=open(log, "w"),
                           stderr=open(tmp_path / "first.err", "w"))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and "trial 1 (slow): pruned" not in (
            log.read_text() + (tmp_path / "first.err").read_text()):
        time.sleep(0.02)
    assert proc.poll() is None, "the job ran to its end: the pruner never stopped trial 1"
    os.killpg(proc.pid, signal.SIGKILL)   # its 4 seats hold 32 requests of 10 tokens: about 0.8 s of drain left
    proc.wait()
    before = _metas(tmp_path / "out")
    slow_before = sorted(i for i, m in before.items() if m["run"] == "trial 1 (slow)")
    assert 2 <= len(slow_before) < PER_RUN, f"killed after the pruner stopped trial 1: {slow_before}"
    assert not any(json.loads(line)["label"] == "trial 1 (slow)"
                   for line in (tmp_path / "out" / "tune" / "runs.jsonl").read_text().splitlines()), \
        "killed before its run ended"
    again = batch_app(tmp_path, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    _answered_once(tmp_path)
    after = _metas(tmp_path / "out")
    assert all(after[i]["committed_at"] == m["committed_at"] for i, m in before.items()), "committed shards kept"
    assert sorted(i for i, m in after.items() if m["config"] == {"engine.knobs.max_num_seqs": 4}) == slow_before, \
        "the pruned config is not run again"
    study = _study(tmp_path)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                                               optuna.trial.TrialState.COMPLETE], "pruned, not failed and asked again"
    [row] = read_rows(tmp_path / "results", "batch")   # the killed invocation wrote no row
    slow = next(r for r in row["tune.runs"] if r["label"] == "trial 1 (slow)")
    assert slow["pruned_at"] == 2 and slow["shards"] == slow_before and "cut by a kill" in slow["reason"]
    assert (row["tune.trials"], row["tune.pruned_trials"]) == (3, 1)
    assert row["tune.pruned_shards_left"] == PER_RUN - len(slow_before)


# ---- the parts, without an engine ---------------------------------------------------------------------------------

def _so_far(**kw):
    from harness.batch.job.job import SoFar

    return SoFar(**{"shards": 2, "left": 5, "engines": 1, "output_tokens": 100, "engine_s": 4.0, "step_tokens": 0.0,
                    "step_s": 0.0, **kw})


def test_a_trial_s_value_is_its_engines_step_rate_else_its_committed_shards_rate_times_its_engines() -> None:
    from harness.batch.tune.tune_prune import fed_rate

    # the steps count the shards in flight too: 300 tokens in 2 s of steps, though 100 are committed
    assert fed_rate(_so_far(step_tokens=300.0, step_s=2.0)) == 150.0
    assert fed_rate(_so_far(step_tokens=300.0, step_s=2.0, engines=2)) == 300.0, "the node's rate: × its engines"
    assert fed_rate(_so_far()) == 25.0, "no steps (a serial engine): committed tokens ÷ their engine seconds"
    assert fed_rate(_so_far(output_tokens=0)) is None


@pytest.mark.parametrize("kind", ["median", "halving"])
def test_the_pruner_stops_a_trial_clearly_behind_after_its_warmup_and_never_the_defaults(kind: str) -> None:
    from harness.batch.tune.tune_prune import make_pruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=make_pruner(
        {"prune": kind, "prune_margin": 0.25, "prune_warmup": 2}))

    def trial(values: list[float], seed: str | None = None) -> list[bool]:
        t = study.ask()
        if seed:
            t.set_user_attr("seed", seed)
        said = []
        for step, value in enumerate(values, 1):
            t.report(value, step)
            said.append(t.should_prune())
        study.tell(t, values[-1])
        return said

    assert trial([100.0] * 8, "engine defaults") == [False] * 8
    assert trial([40.0, 45.0]) == [False, True], "not before 2 shards; then under 0.75 × 100 (halving's first rung)"
    assert trial([80.0] * 8) == [False] * 8, "behind, not clearly: within the margin"
    assert trial([40.0] * 8, "engine defaults") == [False] * 8, "the job's own config is the fallback"
    assert trial([120.0] * 8) == [False] * 8


def test_the_pruner_is_off_with_prune_none_and_bad_settings_fail_before_any_engine_starts() -> None:
    from harness.batch.tune.tune_prune import check_settings, make_pruner
    from harness.core.errors import TroughputError

    assert isinstance(make_pruner({"prune": "none"}), optuna.pruners.NopPruner)
    check_settings({"prune": "median", "prune_margin": 0, "prune_warmup": 1})
    for bad, name in (({"prune": "sometimes"}, "batch.tune.prune="), ({"prune_margin": 1.0}, "prune_margin"),
                      ({"prune_margin": -0.1}, "prune_margin"), ({"prune_warmup": 0}, "prune_warmup"),
                      ({"prune_warmup": 1.5}, "prune_warmup")):
        with pytest.raises(TroughputError, match=name):
            check_settings({"prune": "median", **bad})


def test_a_trial_reports_only_while_shards_are_left_to_hand_over() -> None:
    """Once every shard is in flight the engines drain: nothing is reported (and stopping would save nothing)."""
    from harness.batch.tune.tune_prune import Reporter, make_pruner, reporting_points

    study = optuna.create_study(direction="maximize", pruner=make_pruner({"prune": "median"}))
    reporter = Reporter(study, study.ask(), "trial 0", {})
    assert reporter(_so_far(shards=1, left=3, step_tokens=10.0, step_s=1.0)) is False
    assert reporter(_so_far(shards=2, left=0, step_tokens=20.0, step_s=1.0)) is False
    assert study.trials[0].intermediate_values == {1: 10.0} and reporter.reported == 1
    # what the engines hold at once, and so the commits a run has to report at: 3 shards of 1000 (in_flight), up to
    # 4× that while fewer than 2 shards' worth (at least 512) of requests are unfinished; small shards: as many as
    # hold 512 requests (64 of 8), not a count of 4× in_flight that would starve the engine
    assert reporting_points(10, 1000, 3, 1) == 7 and reporting_points(10, 1000, 3, 2) == 4
    assert reporting_points(10, 8, 1, 1) == 0 and reporting_points(100, 8, 1, 1) == 36
    assert reporting_points(100, 8, 3, 2) == 0
