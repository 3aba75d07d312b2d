"""In-job tuning (``batch.tune.trials``) end to end on the scripted engine: trials are output, resume, guard."""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from pathlib import Path

import optuna
import pytest

from harness.batch.tune.tune_confirm import merge
from harness.batch.tune.tune_predict import trace_paths
from harness.report.stats import geometric_mean
from harness.run.results import read_rows
from tests.conftest import FAKE_ENGINE
from tests.harness.batch.conftest import batch_app, completion, read_jsonl, troughput_batch, write_jsonl

SPACE = """space:
  params:
    engine.knobs.max_num_seqs: {type: int, low: 2, high: 64, log: true}
seeds:
  - name: engine defaults
  - name: batch recipe
    params: {engine.knobs.max_num_seqs: 64}
heuristic: null
"""


def _choices_space(knob: str, choices: list[str]) -> str:
    """A space of one categorical engine knob whose seed trials are the engine defaults, then each choice in order."""
    seeds = "".join(f"  - name: {c}\n    params: {{engine.knobs.{knob}: {c}}}\n" for c in choices)
    return (f"space:\n  params:\n    engine.knobs.{knob}: {{type: categorical, choices: [{', '.join(choices)}]}}\n"
            f"seeds:\n  - name: engine defaults\n{seeds}heuristic: null\n")


LOSSY_SPACE = _choices_space("dtype", ["lossy", "exact"])


def _job(tmp_path: Path, records: int, space: str = SPACE, max_tokens: int = 10) -> tuple[Path, list[str]]:
    (tmp_path / "conf" / "tune").mkdir(parents=True, exist_ok=True)
    (tmp_path / "conf" / "tune" / "case.yaml").write_text(space)
    path = write_jsonl(tmp_path / "batch.jsonl", [completion(f"r{i}", f"prompt {i}", max_tokens=max_tokens)
                                                  for i in range(records)])
    return path, [f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark", f"batch.input={path}",
                  f"batch.output_dir={tmp_path / 'out'}", f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                  "tune=case", "batch.shard_size=8", "batch.tune.min_run_requests=16", "batch.tune.max_share=0.5",
                  "batch.tune.block_steps=8"]


def _metas(out: Path) -> dict[int, dict]:
    return {int(p.parent.name): read_jsonl(p)[0] for p in (out / "shards").glob("*/meta.json")}


def test_trial_shards_are_output_and_the_rest_runs_with_the_candidate_confirmed_in_the_main_phase(tmp_path: Path
                                                                                               ) -> None:
    # 30-token outputs at 2 ms a token: 60 ms a request. 144 shards of 8, a budget of 72 split over the trials and
    # one more: runs of 18 shards (the defaults' trial up to 36), of which the engines hold at most 12 at once
    path, args = _job(tmp_path, 1152, max_tokens=30)
    proc = batch_app(tmp_path, *args, "batch.tune.trials=3", "+engine.knobs.token_s=0.002",
                     "+engine.knobs.max_num_seqs=2")  # the job's own config: 2 sequences at once
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert ids == [f"r{i}" for i in range(1152)], "every request once, in file order, trial shards included"
    [row] = read_rows(tmp_path / "results", "batch")
    runs = row["tune.runs"]
    assert [r["kind"] for r in runs] == ["trial"] * 3 + ["main"], "no confirmation runs: it is in the main phase"
    assert row["tune.shards_per_run"] == 18 and all(len(r["shards"]) == 18 or r["pruned_at"] for r in runs[1:-1])
    assert 18 <= len(runs[0]["shards"]) <= 36, "the defaults' trial: a run, up to two until it has its blocks"
    sampled = sorted(i for r in runs[:-1] for i in r["shards"])
    assert sampled != list(range(72)) and max(sampled) >= 72, "trial shards are drawn from the whole file"
    assert row["tune.phase_requests"] == sum(r["requests"] for r in runs[:-1]) <= 72 * 8
    # the defaults' side: trial 0's blocks (its own start, not repeated); the candidate's: the main phase's
    defaults = runs[0]
    assert defaults["values"] == {} and len(defaults["blocks"]) >= 3
    # each sample of both sides: as many of its blocks as trial 0 gave beyond the 5 the last look compares
    assert row["tune.confirm.blocks_merged"] == max(1, len(defaults["blocks"]) // 5)
    assert row["tune.confirm.defaults_blocks"] == merge(defaults["blocks"], row["tune.confirm.blocks_merged"])
    looks = [json.loads(line) for line in (tmp_path / "out" / "tune" / "confirm.jsonl").read_text().splitlines()]
    assert len(looks) == row["tune.confirm.looks"] >= 1 and looks[-1]["action"] == "keep the candidate"
    assert [look["look"] for look in looks] == list(range(1, len(looks) + 1)), "one look per block from the 3rd"
    # 64 or 12 sequences at once against the job's 2: many times the rate, a clear winner at the last look; or,
    # where the driver could not keep so fast an engine full (a loaded host), fewer than 3 blocks by the bound and its
    # rate many times the defaults' blocks' mean: kept either way, never switched to the defaults
    assert row["tune.chosen"]["engine.knobs.max_num_seqs"] in (12, 64) and not row["tune.switched"]
    assert looks[-1]["ratio"] > 2
    if looks[-1]["verdict"] == "clear winner":
        assert len(row["tune.confirm.candidate_blocks"]) >= 3
    else:
        assert looks[-1]["verdict"] == "insufficient data" and "kept, at or above" in looks[-1]["reason"]
    metas = _metas(tmp_path / "out")
    assert len(metas) == 144 and {m["phase"] for m in metas.values()} == {"trial", "main"}
    main = [m for m in metas.values() if m["phase"] == "main"]
    assert len(main) == 144 - sum(len(r["shards"]) for r in runs[:-1])
    assert all(m["config"] == row["tune.chosen"] for m in main)
    # one engine start per distinct config: three trials, and the main phase on the candidate's engines where its
    # trial ran last, else one more start
    kept = runs[-1]["engines_kept"]
    assert kept == (runs[2]["values"] == row["tune.chosen"])
    assert row["tune.engine_starts"] == 3 + (not kept) and row["tune.distinct_configs"] == 3
    assert row["tune.restarts"] == 2 + (not kept) and row["tune.overhead_share"] is not None
    assert all(r["concurrency"] == r["values"].get("engine.knobs.max_num_seqs", 2) for r in runs[:-1])
    # each trial's value is its config's full-engine rate from its own steps
    assert all(r["full_engine_tok_s"] for r in runs if r["kind"] == "trial" and not r["pruned_at"])
    assert (tmp_path / "out" / "tune" / "steps" / "main.parquet").exists()
    # the rest of the job, replayed with the chosen config's step model, beside what the main phase measured
    assert row["tune.prediction_method"] == "replay" and row["tune.predicted_rest_s"] > 0
    assert row["prediction.rest_of_job.measured"] == row["tune.measured_rest_s"] > 0
    assert row["prediction.rest_of_job.unit"] == "seconds"
    # and again inside the main phase, at its first look, with its own steps so far in the fit
    assert row["prediction.rest_in_main.predicted"] > 0 and row["prediction.rest_in_main.measured"] > 0
    assert 0 < row["tune.in_main_prediction_at_s"] < row["tune.measured_rest_s"]
    assert row["prediction.rest_in_main.measured"] + row["tune.in_main_prediction_at_s"] == \
        pytest.approx(runs[-1]["generation_s"]), "the rest measured: the main run's generation after the prediction"
    assert row["tune.in_main_measured_run_s"] == pytest.approx(runs[-1]["generation_s"])
    assert row["tune.in_main_prediction_cost_s"] > 0
    assert "main phase so far among them" in row["prediction.rest_in_main.note"]
    chosen = [r for r in runs[:-1] if r["values"] == row["tune.chosen"] and r["full_engine_tok_s"]]
    assert row["prediction.full_engine.predicted"] == pytest.approx(
        sum(r["full_engine_tok_s"] for r in chosen) / len(chosen))
    assert row["prediction.full_engine.measured"] == pytest.approx(row["tune.measured_rest_tok_s"])
    assert row["tune.trial_statistics"] == "full engine", "every trial valued by one statistic"
    assert row["steps.count"] > 0 and Path(row["steps.file"]).exists(), "the job's step trace beside its row"
    assert row["tune.predicted_rest_output_tokens"] == len(main) * 8 * 30, "sampled tokens a request × requests left"
    assert "tuning" in proc.stdout and "confirmed in the main phase" in proc.stdout
    logs = list((tmp_path / "results" / "logs").glob("*.worker*.log"))
    assert len(logs) == 1, "one worker for the whole job: each run restarts the engine in it (batch.tune.restart)"
    assert "trial 0 (engine defaults): the workers started ahead for it" in proc.stdout, "started before the study"
    assert runs[0]["ahead_s"] > 0 and all(r["ahead_s"] == 0 for r in runs[1:]), "only the first run's started ahead"
    assert row["tune.first_start_s"] == pytest.approx(runs[0]["wall_s"] - runs[0]["generation_s"] + runs[0]["ahead_s"])


def test_a_candidate_that_loses_in_the_main_phase_hands_the_rest_to_the_defaults(tmp_path: Path) -> None:
    """The candidate is slower in the main phase than in its trial (its tokens cost 10x there, as if the host or
    the requests changed): the looks call it a clear loser, the rest runs on the engine defaults (one more start),
    and the candidate's committed shards stay."""
    space = ("space:\n  params:\n    engine.knobs.max_num_seqs: {type: categorical, choices: [64]}\n"
             "    engine.knobs.slow_after_steps: {type: categorical, choices: [112]}\n"
             "seeds:\n  - name: engine defaults\n  - name: slows down\n"
             "    params: {engine.knobs.max_num_seqs: 64, engine.knobs.slow_after_steps: 112}\nheuristic: null\n")
    path, args = _job(tmp_path, 1152, space=space, max_tokens=30)
    # four trials of 18 shards (about 100 steps each): the third and fourth propose the one config of the space
    # again, which is not run again (its trial's value is told); the candidate slows a few steps into the main phase
    proc = batch_app(tmp_path, *args, "batch.tune.trials=4", "+engine.knobs.token_s=0.002",
                     "+engine.knobs.max_num_seqs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert ids == [f"r{i}" for i in range(1152)], "every request once"
    assert "again, as trial 1 (slows down): its value, not another run" in proc.stdout + proc.stderr
    [row] = read_rows(tmp_path / "results", "batch")
    runs = row["tune.runs"]
    assert [r["label"] for r in runs] == ["trial 0 (engine defaults)", "trial 1 (slows down)", "main",
                                          "main (engine defaults)"]
    assert row["tune.switched"] and row["tune.chosen"] == "engine defaults"
    # a clear loser, or (on a loaded host, where its first block, before the slowdown, is far from the rest) not a
    # clear winner by the last look: either way the looks switch, and never keep it
    assert row["tune.confirm.action"] == "switch to the engine defaults"
    assert "clear loser" in row["tune.confirm.reason"] or "not a clear winner at the last look" in \
        row["tune.confirm.reason"], row["tune.confirm.reason"]
    # medians: on a loaded host the defaults' blocks spread widely (593 to 896 tok/s in one fresh-clone run, whose
    # slowed candidate's 319 was not under half their lowest)
    assert row["tune.confirm.candidate_blocks"] and statistics.median(row["tune.confirm.candidate_blocks"]) < \
        0.5 * statistics.median(row["tune.confirm.defaults_blocks"])
    metas = _metas(tmp_path / "out")
    on_candidate = [m for m in metas.values() if m["phase"] == "main" and m["config"]]
    assert 3 <= len(on_candidate) < 96 and len(metas) == 144, "the candidate's shards kept, the rest on the defaults"
    assert row["tune.engine_starts"] == 3 and runs[2]["engines_kept"], "its trial ran last: one switch back only"
    # the main run on kept engines keeps what they said at their start (the replay's engines and limits)
    steps = tmp_path / "out" / "tune" / "steps"
    trial, main = (json.loads(trace_paths(steps.parent, label)[1].read_text()) for label in (runs[1]["label"], "main"))
    assert main["knobs"] == trial["knobs"] and main["engines"] == trial["engines"] == 1
    assert any(k.startswith("engine_") for k in main["knobs"])


ALTERNATING = [f"{side} {n}" for n in range(1, 6) for side in ("engine defaults", "candidate")]


def _alternating_job(tmp_path: Path) -> tuple[Path, list[str]]:
    """A job whose main phase alternates runs: ``batch.tune.alternate_share`` near 1 makes them cheap enough here
    (on the virtual H100 at 10^6 requests they cost 0.5–0.8% of the job), runs of 4 shards, a candidate of 4
    sequences at once against the job's 2."""
    path, args = _job(tmp_path, 1152, space=_choices_space("max_num_seqs", ["4"]), max_tokens=30)
    return path, args + ["batch.tune.trials=2", "batch.tune.shards_per_run=4", "batch.tune.alternate_share=0.99",
                         "+engine.knobs.token_s=0.002", "+engine.knobs.max_num_seqs=2"]


def test_where_they_cost_little_the_main_phase_alternates_runs_of_both_configs_then_runs_the_rest_on_the_winner(
        tmp_path: Path) -> None:
    """Runs of 4 sampled shards, the defaults first, then the candidate, in turn; looks at whole runs, the last one
    keeps; the rest on the candidate's engines, kept from its last run."""
    path, args = _alternating_job(tmp_path)
    proc = batch_app(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert ids == [f"r{i}" for i in range(1152)], "every request once, in file order"
    [row] = read_rows(tmp_path / "results", "batch")
    runs = row["tune.runs"]
    sides = [r["label"].removeprefix("main, alternating: ") for r in runs[2:-1]]
    assert sides == ALTERNATING, sides
    assert all(len(r["shards"]) == 4 for r in runs[2:-1]), "each a trial's size"
    main = sorted(i for r in runs[2:-1] for i in r["shards"])
    assert main != list(range(min(main), min(main) + 40)), "on sampled shards, as the trials"
    assert row["tune.confirm.alternate"]["alternate"] and row["tune.confirm.alternate"]["why"].startswith("made: ")
    assert json.loads((tmp_path / "out" / "tune" / "alternate.json").read_text()) == row["tune.confirm.alternate"]
    assert row["tune.confirm.method"].startswith("alternating runs") and row["tune.confirm.blocks_merged"] == 0
    # trial 0 is no sample: each side's are its alternating runs' blocks' geometric means
    assert row["tune.confirm.defaults_blocks"] == pytest.approx(
        [geometric_mean(r["blocks"]) for r in runs[2:-1] if not r["values"]])
    assert len(row["tune.confirm.candidate_blocks"]) == 5
    # 2x the rate: a clear winner at the last look, with no run allowance (the runs' own spread)
    assert row["tune.confirm.action"] == "keep the candidate", row["tune.confirm.reason"]
    assert "(5 vs 5 runs)" in row["tune.confirm.reason"] and row["tune.confirm.looks"] == 3
    assert runs[-1]["label"] == "main" and runs[-1]["values"] == row["tune.chosen"] and runs[-1]["engines_kept"]
    assert row["tune.engine_starts"] == 2 + 10 and row["tune.distinct_configs"] == 2, "every alternating run starts"
    assert "alternated runs of them" in row["prediction.rest_of_job.note"]
    assert row["prediction.full_engine.measured"] == pytest.approx(runs[-1]["output_tokens"] / runs[-1]["generation_s"])


def test_a_config_s_second_failed_run_ends_the_alternating_runs_and_the_rest_runs_on_the_other(
        tmp_path: Path) -> None:
    """The third and fourth engine starts fail (``fail_start_after``, ``fail_times``): after trial 0 and the
    candidate's trial, the defaults' first alternating run, then its run again. The first failure is run again; the
    second ends the runs, and the rest of the job goes on the candidate, unconfirmed, not on the config that failed."""
    path, args = _alternating_job(tmp_path)
    proc = batch_app(tmp_path, *args, f"+engine.knobs.start_file={tmp_path / 'starts'}",
                     "+engine.knobs.fail_start_after=2", f"+engine.knobs.fail_file={tmp_path / 'f'}",
                     "+engine.knobs.fail_times=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert ids == [f"r{i}" for i in range(1152)], "every request once: the failed runs' shards ran later"
    [row] = read_rows(tmp_path / "results", "batch")
    labels = [r["label"] for r in row["tune.runs"]]
    assert labels[2:] == ["main, alternating: engine defaults 1", "main, alternating: engine defaults 2", "main"], \
        labels
    assert [r["status"] for r in row["tune.runs"][2:4]] == ["failed", "failed"]
    assert row["tune.runs"][-1]["values"] == row["tune.chosen"] != {}
    assert row["tune.confirm.action"] == "keep the candidate" and "unconfirmed" in row["tune.confirm.reason"]
    assert row["tune.confirm.looks"] == 0 and not row["tune.switched"], "a stop is no look"


def test_kill_9_in_the_alternating_runs_resumes_them_from_the_finished_runs(tmp_path: Path) -> None:
    path, args = _alternating_job(tmp_path)
    proc = troughput_batch(tmp_path, *args, popen=True, start_new_session=True, stdout=open(os.devnull, "w"),
                           stderr=open(tmp_path / "first.err", "w"))
    log = tmp_path / "out" / "tune" / "runs.jsonl"

    def cut_run() -> bool:   # an alternating run that committed shards and has not finished
        done = {json.loads(line)["label"] for line in log.read_text().splitlines()} if log.exists() else set()
        return len(done) >= 4 and any(m["run"].startswith("main, alternating") and m["run"] not in done
                                      for m in _metas(tmp_path / "out").values())

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not cut_run():
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _metas(tmp_path / "out")
    done = {json.loads(line)["label"] for line in log.read_text().splitlines()}
    assert any(m["run"].startswith("main, alternating") and m["run"] not in done for m in before.values()), \
        "killed while an alternating run had committed shards"
    decided = (tmp_path / "out" / "tune" / "alternate.json").read_text()
    again = batch_app(tmp_path, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert ids == [f"r{i}" for i in range(1152)]
    after = _metas(tmp_path / "out")
    assert all(after[i]["committed_at"] == m["committed_at"] for i, m in before.items()), "committed shards kept"
    [row] = read_rows(tmp_path / "results", "batch")
    sides = [r["label"].removeprefix("main, alternating: ") for r in row["tune.runs"][2:-1]]
    # the finished runs are the samples; the run the kill cut is run again under its label, on other shards
    assert sides == ALTERNATING, sides
    assert len(row["tune.confirm.candidate_blocks"]) == len(row["tune.confirm.defaults_blocks"]) == 5
    looks = [json.loads(line) for line in (tmp_path / "out" / "tune" / "confirm.jsonl").read_text().splitlines()]
    assert [look["look"] for look in looks] == [1, 2, 3] and looks[-1]["action"] == row["tune.confirm.action"]
    # the decision made before the kill, not made again on fewer shards left (its estimate would differ)
    assert (tmp_path / "out" / "tune" / "alternate.json").read_text() == decided


def test_the_defaults_trial_takes_shards_until_it_has_given_the_confirmation_its_blocks(tmp_path: Path) -> None:
    """Trials of 8 shards, too few for the five blocks of 240 full steps (one a look's candidate block) at the job's 2
    sequences: the engine defaults' trial is handed twice a run (within the budget's room less the later trials'
    runs), and stops being handed shards once it has its five blocks; the later trials take a run each, and the
    confirmation runs against those blocks (no pruner: under a loaded host a later trial's rate at its third shard
    can read 25% under the defaults', and a pruned trial takes fewer shards)."""
    path, args = _job(tmp_path, 1152, max_tokens=30)
    proc = batch_app(tmp_path, *args[:-1], "batch.tune.block_steps=240", "batch.tune.trials=3", "batch.tune.prune=none",
                     "batch.tune.shards_per_run=8", "+engine.knobs.token_s=0.001", "+engine.knobs.max_num_seqs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = read_rows(tmp_path / "results", "batch")
    runs = row["tune.runs"]
    defaults, later = runs[0], runs[1:3]
    assert defaults["values"] == {} and len(defaults["blocks"]) >= 5
    # 8 shards of 8 requests of 30 tokens at 2 sequences: 960 steps, under the 1,200 five blocks need; the stop comes
    # at about 10 shards, and the engine's queue (4 requests, within a shard) finishes after it, short of the 16
    assert 8 < len(defaults["shards"]) < 16, len(defaults["shards"])
    assert [len(r["shards"]) for r in later] == [8, 8] and [r["kind"] for r in later] == ["trial", "trial"]
    assert row["tune.confirm.defaults_blocks"] == merge(defaults["blocks"], row["tune.confirm.blocks_merged"])
    assert row["tune.confirm.looks"] >= 1
    assert len(_metas(tmp_path / "out")) == 144


def test_a_defaults_trial_with_too_few_blocks_runs_the_main_phase_on_the_defaults(tmp_path: Path) -> None:
    """Blocks of more full steps than trial 0 runs: it gives none, so there is nothing to confirm a candidate against.
    The main phase runs the engine defaults from its start (no candidate shards run only to be switched away from),
    and the row says why."""
    path, args = _job(tmp_path, 1152, max_tokens=30)
    proc = batch_app(tmp_path, *args[:-1], "batch.tune.block_steps=100000", "batch.tune.trials=2",
                     "+engine.knobs.token_s=0.002", "+engine.knobs.max_num_seqs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = read_rows(tmp_path / "results", "batch")
    assert row["tune.runs"][0]["blocks"] == [] and row["tune.chosen"] == "engine defaults"
    assert row["tune.candidate"] and not row["tune.switched"], "the trials' best is named, not run"
    assert row["tune.engine_starts"] == 3, "two trials and the defaults' main phase: no candidate run to switch from"
    assert "gave 0 block(s) of full steps" in row["tune.verdict"] and "tune.confirm.looks" not in row
    assert all(not m["config"] for m in _metas(tmp_path / "out").values() if m["phase"] == "main")
    assert not (tmp_path / "out" / "tune" / "confirm.jsonl").exists()


def test_a_trial_whose_steps_give_no_full_engine_rate_keeps_why_in_its_record(tmp_path: Path, monkeypatch) -> None:
    """The step model cannot be fitted (scripted): every trial and confirmation run says why it has no full-engine
    rate, in ``tune.runs`` and in its log line, and the job goes on with the plain rates."""
    from harness.batch.tune import tune_predict

    def failing(traces, **kwargs):
        raise ValueError("scripted: no usable step")

    monkeypatch.setattr(tune_predict, "fit_step_model", failing)
    path, args = _job(tmp_path, 256)
    proc = batch_app(tmp_path, *args, "batch.tune.trials=2", "batch.tune.prune=none",
                     "+engine.knobs.token_s=0.002", "+engine.knobs.max_num_seqs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = read_rows(tmp_path / "results", "batch")
    asked = [r for r in row["tune.runs"] if r["kind"] == "trial"]
    assert len(asked) == 2 and all(r["full_engine_tok_s"] is None and r["output_tok_s"] for r in asked)
    assert {r["full_engine_note"] for r in asked} == {"not computed: ValueError: scripted: no usable step"}
    assert row["tune.runs"][-1]["kind"] == "main" and row["tune.runs"][-1]["full_engine_note"] is None
    assert row["tune.trial_statistics"] == "run rate" and "prediction.full_engine.predicted" not in row
    assert "(no full-engine rate: not computed: ValueError: scripted: no usable step)" in proc.stdout + proc.stderr


def test_a_job_too_small_for_the_trials_is_refused_before_any_engine_starts(tmp_path: Path) -> None:
    path, args = _job(tmp_path, 40)
    proc = batch_app(tmp_path, *args, "batch.tune.trials=4", "+engine.knobs.fail_in=start")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "too small for 4 trials" in proc.stderr and "needs about" in proc.stderr
    assert not (tmp_path / "out" / "shards").exists() or not list((tmp_path / "out" / "shards").iterdir())


def test_bad_confirmation_settings_are_refused_before_any_engine_starts(tmp_path: Path) -> None:
    path, args = _job(tmp_path, 200)
    for bad in ("batch.tune.confirm_looks=0", "batch.tune.confirm_looks=lots", "batch.tune.run_spread=-1",
                "batch.tune.run_spread=nan", "batch.tune.block_steps=0", "batch.tune.sampler=nope",
                "batch.tune.startup=nope", "batch.tune.n_startup_trials=lots", "batch.tune.alternate_share=1",
                "batch.tune.alternate_share=-0.1"):
        proc = batch_app(tmp_path, *args, "batch.tune.trials=3", bad, "+engine.knobs.fail_in=start")
        assert proc.returncode == 2 and bad.split("=")[0] in proc.stderr, (bad, proc.stderr[-2000:])
    assert not (tmp_path / "out" / "shards").exists() or not list((tmp_path / "out" / "shards").iterdir())


def test_every_sampler_in_job_tuning_takes_passes_the_check_made_when_the_job_is_planned() -> None:
    from harness.batch.tune.tune_config import check_sampler
    from harness.core.errors import TroughputError

    space = {"params": {"engine.knobs.max_num_seqs": {"type": "int", "low": 1, "high": 8}}}
    for sampler in ("tpe", "random", "grid"):   # grid reads the space's params: the real space is checked
        check_sampler({"sampler": sampler, "seed": 0, "grid_points": 2, "trials": 3}, space)
    with pytest.raises(TroughputError, match="batch.tune.sampler='nope'"):
        check_sampler({"sampler": "nope", "trials": 3}, space)


def test_an_output_changing_knob_is_refused_in_job_and_sent_to_troughput_tune(tmp_path: Path) -> None:
    """In-job tuning commits every trial's outputs, so it has no quality guard: a space that changes outputs by design
    is refused before any engine starts, pointing to troughput-tune and its guard."""
    path, args = _job(tmp_path, 200, LOSSY_SPACE)
    proc = batch_app(tmp_path, *args, "batch.tune.trials=3", "+engine.knobs.fail_in=start")
    assert proc.returncode == 2 and "engine.knobs.dtype" in proc.stderr and "troughput-tune" in proc.stderr
    assert "tune.min_agreement" in proc.stderr and "batch.engine_file=" in proc.stderr
    assert not (tmp_path / "out" / "shards").exists() or not list((tmp_path / "out" / "shards").iterdir())


def test_kill_9_in_the_tuning_phase_resumes_it_without_losing_a_committed_shard(tmp_path: Path) -> None:
    path, args = _job(tmp_path, 288)
    args += ["batch.tune.trials=3", "+engine.knobs.token_s=0.01", "batch.tune.restart=new_worker"]
    proc = troughput_batch(tmp_path, *args, popen=True, start_new_session=True, stdout=open(os.devnull, "w"),
                           stderr=open(tmp_path / "first.err", "w"))
    log = tmp_path / "out" / "tune" / "runs.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 2):
        time.sleep(0.05)
    time.sleep(0.3)  # into the third trial
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _metas(tmp_path / "out")
    assert 4 <= len(before) < 36, "killed in the tuning phase"
    again = batch_app(tmp_path, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "started ahead" not in again.stdout, "a resumed study starts no workers ahead"
    ids = [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")]
    assert ids == [f"r{i}" for i in range(288)]
    after = _metas(tmp_path / "out")
    assert all(after[i]["committed_at"] == m["committed_at"] for i, m in before.items()), "committed shards kept"
    study = optuna.load_study(study_name="in-job", storage=f"sqlite:///{tmp_path / 'out' / 'tune' / 'study.db'}")
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 3, "the budget of 3 trials is met after the kill"
    [row] = read_rows(tmp_path / "results", "batch")   # the killed invocation wrote no row
    assert row["tune.trials"] == 3 and [r["kind"] for r in row["tune.runs"]].count("main") == 1
    assert json.loads(json.dumps(row["tune.runs"]))[0]["label"].startswith("trial 0")
    logs = list((tmp_path / "results" / "logs").glob("*.worker*.log"))
    started = sum(not r["engines_kept"] for r in row["tune.runs"])
    assert len(logs) >= started + 1, "new_worker: a worker per started run, the one the kill cut included"


def test_in_job_tuning_on_ray_is_refused_before_any_engine_starts(tmp_path: Path) -> None:
    """Its confirmation looks at each shard as it commits, which a Ray Data pipeline does not report."""
    path, args = _job(tmp_path, 200)
    proc = batch_app(tmp_path, *args, "batch.tune.trials=2", "batch.scale=ray")
    assert proc.returncode == 2 and "batch.scale=ray" in proc.stderr and "batch.engine_file=" in proc.stderr
    assert "troughput-tune" in proc.stderr


def test_each_config_s_plan_carries_its_knobs_replicas_and_ordering_and_an_unknown_knob_fails_first(
        tmp_path: Path) -> None:
    """``vllm_cpu``'s space (replicas, canonical knobs, KV bytes) mapped to each run's plan without an engine."""
    from harness.batch.cli import build_plan
    from harness.batch.job.job import job_id
    from harness.batch.job.source import apply_source
    from harness.batch.tune.tune_config import check_space, phase_planner
    from harness.core.errors import TroughputError
    from tests.conftest import compose

    path = write_jsonl(tmp_path / "b.jsonl", [completion(f"r{i}", "x", max_tokens=2) for i in range(4000)])
    cfg = compose(f"batch.input={path}", f"batch.output_dir={tmp_path / 'out'}", "batch.tune.trials=4",
                  f"run.results_dir={tmp_path / 'results'}", config_name="batch")
    cfg, origin = apply_source(cfg)
    plan = build_plan(cfg, origin)
    assert plan.tune["space_name"] == "vllm_cpu" and "engine.replicas" in plan.tune["space"]["params"]
    plan_for = phase_planner(cfg, plan)
    check_space(plan_for, plan.tune["space"])
    trial = plan_for({"engine.replicas": 2, "engine.canonical.max_seqs": 48, "ordering": "length_bucketed"},
                     {"phase": "trial"})
    assert trial.replicas == 2 and trial.knobs["max_num_seqs"] == 48 and trial.ordering["name"] == "length_bucketed"
    assert trial.phase == {"phase": "trial"} and job_id(trial) == job_id(plan) and plan.knobs != trial.knobs
    try:
        check_space(plan_for, {"params": {"engine.canonical.no_such_knob": {"type": "int", "low": 1, "high": 2}}})
    except TroughputError as e:
        assert "no_such_knob" in str(e)
    else:
        raise AssertionError("an unknown canonical knob must fail before any engine starts")


def test_when_the_job_s_own_config_fails_the_best_trial_runs_the_rest_unconfirmed(tmp_path: Path) -> None:
    space = SPACE.replace("low: 2, high: 64", "low: 1, high: 4").replace(
        "  - name: batch recipe\n    params: {engine.knobs.max_num_seqs: 64}\n", "")
    path, args = _job(tmp_path, 288, space)
    proc = batch_app(tmp_path, *args, "batch.tune.trials=3", "+engine.knobs.oom_above=4")  # its own 8 fail
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")] == [f"r{i}" for i in range(288)]
    [row] = read_rows(tmp_path / "results", "batch")
    kinds = [(r["kind"], r["status"]) for r in row["tune.runs"]]
    assert kinds[0] == ("trial", "failed") and "out of memory" in row["tune.runs"][0]["reason"]
    assert all(kind != "confirm" for kind, _ in kinds), "no confirmation runs against a config that cannot run"
    assert row["tune.verdict"].startswith("the job's own config failed") and row["tune.chosen"] != "engine defaults"
    assert row["tune.chosen_knobs"]["max_num_seqs"] <= 4 and row["status"] == "ok"


def test_an_engine_that_fails_to_start_after_a_restart_fails_its_trial_and_the_next_run_gets_new_workers(
        tmp_path: Path) -> None:
    path, args = _job(tmp_path, 288, _choices_space("fail_in", ["start", "never"]))
    proc = batch_app(tmp_path, *args, "batch.tune.trials=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")] == [f"r{i}" for i in range(288)]
    [row] = read_rows(tmp_path / "results", "batch")
    broken = next(r for r in row["tune.runs"] if r["label"] == "trial 1 (start)")
    assert broken["status"] == "failed" and "scripted failure in start" in broken["reason"] and broken["shards"] == []
    assert len(list((tmp_path / "results" / "logs").glob("*.worker*.log"))) == 2, "new workers after the failed start"


# Replicas 1 -> 2 -> 1 in the trials (all seeds). The 1-replica configs fail in replica 2 (TROUGHPUT_REPLICA=2/2,
# the second slot): a 1-replica run that fed the parked slot a shard would fail, the 2-replica one does not.
REPLICAS_SPACE = """space:
  params:
    engine.replicas: {type: int, low: 1, high: 2}
    engine.knobs.fail_replica: {type: categorical, choices: [0, 2]}
seeds:
  - name: engine defaults
  - name: two
    params: {engine.replicas: 2, engine.knobs.fail_replica: 0}
  - name: one
    params: {engine.replicas: 1, engine.knobs.fail_replica: 2}
heuristic: null
"""


@pytest.mark.parametrize("threads", ["1", None])
def test_a_replica_switch_keeps_the_workers_and_a_1_replica_run_leaves_the_second_slot_parked(
        tmp_path: Path, threads: str | None) -> None:
    """OMP_NUM_THREADS=1 (hardware cpu's): a slot's core holds the engine, so 2 slots start once; unset: the
    threads are not known to fit a slot, so every switch starts new workers, as before slots."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two replicas need two cores")
    path, args = _job(tmp_path, 288, REPLICAS_SPACE)
    env = [] if threads else ["~hardware.env.OMP_NUM_THREADS"]
    proc = batch_app(tmp_path, *args, *env, "batch.tune.trials=3", "+engine.knobs.fail_replica=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [o["custom_id"] for o in read_jsonl(tmp_path / "out" / "output.jsonl")] == [f"r{i}" for i in range(288)]
    [row] = read_rows(tmp_path / "results", "batch")
    runs = row["tune.runs"]
    assert [r["values"].get("engine.replicas", 1) for r in runs[:3]] == [1, 2, 1], "two switches in the trials"
    assert all(r["status"] == "ok" for r in runs), "no 1-replica run fed the second slot"
    metas = _metas(tmp_path / "out")
    assert len(metas) == 36 and (row["shards_run"], row["requests_ok"]) == (36, 288), "every shard committed once"
    workers = {run: {m["worker"] for m in metas.values() if m["run"] == run}
               for run in ("trial 1 (two)", "trial 2 (one)")}
    assert workers == {"trial 1 (two)": {1, 2}, "trial 2 (one)": {1}}, "two replicas use both slots, one only the first"
    logs = list((tmp_path / "results" / "logs").glob("*.worker*.log"))
    if threads:
        assert len(logs) == 2, "one worker per slot for the whole job"
        assert "trial 2 (one): workers kept, engines restarted in 1 of 2 slots, 1 parked" in proc.stdout
        assert "parked worker 2 imported wave in" in proc.stdout, "the slot parked at start imported its engine"
    else:
        assert len(logs) >= 4, "a worker per replica per switch: 1, then 2, then 1 again"
        assert "trial 2 (one): new workers (slots 1, replicas 1): a slot has" in proc.stdout


def test_a_run_takes_the_kept_slots_only_where_its_replicas_fit_their_devices(monkeypatch) -> None:
    from dataclasses import replace

    from harness.batch.job.plan import Plan
    from harness.batch.scale.pool import slot_misfit
    from harness.batch.tune.tune_config import replica_slots

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})

    def plan(replicas: int, kind: str = "cpu", engine: str = "vllm", **env: str) -> Plan:
        return Plan(input="in.jsonl", format="jsonl", output_dir="out", shard_size=8, engine=engine, model={},
                    knobs={}, ordering={}, python="python", env=env, replicas=replicas, device_kind=kind)

    # CPU, 2 slots of 2 cores: one replica fits a slot when its threads are known to fit the slot's cores
    assert slot_misfit(plan(1, OMP_NUM_THREADS="2"), 2) is None
    assert "OMP_NUM_THREADS=3" in slot_misfit(plan(1, OMP_NUM_THREADS="3"), 2)
    assert "OMP_NUM_THREADS=unset" in slot_misfit(plan(1), 2)
    assert slot_misfit(plan(2), 2) is None, "as many replicas as slots: the plan's own layout"
    assert slot_misfit(plan(3, OMP_NUM_THREADS="1"), 2) == "3 replicas on 2 slots"
    assert "needs at least 8 CPU cores" in slot_misfit(plan(1, OMP_NUM_THREADS="1"), 8)
    # GPU, 2 slots: a slot's GPUs must be exactly one replica's (tensor x pipeline parallel); unknown: refused
    gpu = plan(1, "gpu", CUDA_VISIBLE_DEVICES="0,1")
    assert slot_misfit(gpu, 2) is None
    assert "a replica needs 2" in slot_misfit(replace(gpu, knobs={"tensor_parallel_size": 2}), 2)
    assert "a slot has 2 GPUs, a replica needs 1" in slot_misfit(plan(1, "gpu", CUDA_VISIBLE_DEVICES="0,1,2,3"), 2)
    assert "unknown" in slot_misfit(plan(1, "gpu", "tests.fake_engine:FakeEngine", CUDA_VISIBLE_DEVICES="0,1"), 2)
    # the slots: the space's replicas bound, or the job's own replicas
    tuned = plan(1)
    tuned.tune = {"space": {"params": {"engine.replicas": {"type": "int", "low": 1, "high": 2}}}}
    assert replica_slots(tuned) == 2
    tuned.tune = {"space": {"params": {"engine.replicas": {"type": "categorical", "choices": [1, 4]}}}}
    assert replica_slots(tuned) == 4
    tuned.tune, tuned.replicas = {"space": {"params": {}}}, 3
    assert replica_slots(tuned) == 3


def test_a_run_on_fewer_replicas_than_slots_gets_its_own_cores_and_an_earlier_run_s_start_is_not_its(
        monkeypatch, tmp_path: Path) -> None:
    """On the CPU a 1-replica run on 2 slots is laid out as the config run on its own (all the cores), a
    2-replica run one slice each; a ``started`` from an engine started for an earlier run is dropped."""
    from harness.batch.job.plan import Plan
    from harness.batch.scale.pool import LocalPool

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    plan = Plan(input="in.jsonl", format="jsonl", output_dir="out", shard_size=8, engine="vllm", model={},
                knobs={}, ordering={}, python="python", env={"OMP_NUM_THREADS": "1"}, replicas=1, device_kind="cpu")
    pool = LocalPool(plan, tmp_path / "run", tmp_path / "logs", slots=2)
    assert pool._job(0)["cores"] == [0, 1, 2, 3] and pool._job(1) == {"park": True, "engine": "vllm"}
    pool.plan = Plan(**{**plan.__dict__, "replicas": 2})
    assert [pool._job(i)["cores"] for i in range(2)] == [[0, 1], [2, 3]], "a later run gets its slices back"
    # a started event of generation 0 arriving after the pool moved on to run 1 is an earlier run's
    pool.procs, pool.parked = [None, None], [False, False]
    pool.outstanding, pool.sent, pool.pending, pool.fed, pool.capacity = [0, 0], [0, 0], [0, 0], [-1, -1], [None, None]
    pool.alive, pool.restarting, pool.up = [True, True], [True, True], [False, False]
    pool.generation = 1
    pool.events.put((1, {"event": "started", "generation": 0, "start": {}}))
    pool.events.put((0, {"event": "started", "generation": 1, "start": {}}))
    assert pool.next_event(timeout=1) is None and pool.up == [False, False]
    assert pool.next_event(timeout=1)[0] == 0 and pool.up == [True, False]


def test_the_main_phase_goes_on_with_engines_that_run_its_config_and_any_other_config_restarts_them(
        monkeypatch, tmp_path: Path) -> None:
    """``LocalPool.runs_as``: only engines that are all up, with the same knobs, model limits, replicas and cores,
    are kept for the next plan; anything else (another knob, another replica count, an engine still starting,
    a dead worker) needs a restart, and ``keep`` refuses it."""
    from harness.batch.job.plan import Plan
    from harness.batch.scale.pool import LocalPool

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    plan = Plan(input="in.jsonl", format="jsonl", output_dir="out", shard_size=8, engine="vllm", model={},
                knobs={"max_num_seqs": 256}, ordering={}, python="python", env={"OMP_NUM_THREADS": "1"},
                replicas=2, device_kind="cpu", phase={"phase": "trial", "run": "trial 3"})
    pool = LocalPool(plan, tmp_path / "run", tmp_path / "logs", slots=2)
    pool.procs, pool.parked, pool.alive = [None, None], [False, False], [True, True]
    pool.restarting, pool.up, pool.generation = [False, False], [True, True], 9
    main = Plan(**{**plan.__dict__, "phase": {"phase": "main", "run": "main"}})
    assert pool.ready() and pool.runs_as(main), "the same config under another run's label"
    assert not pool.runs_as(Plan(**{**main.__dict__, "knobs": {"max_num_seqs": 128}}))
    assert not pool.runs_as(Plan(**{**main.__dict__, "replicas": 1})), "one replica: other cores, a parked slot"
    assert not pool.runs_as(Plan(**{**main.__dict__, "max_model_len": 512})), "other model limits"
    assert not pool.runs_as(Plan(**{**main.__dict__, "env": {"OMP_NUM_THREADS": "2"}})), "another environment"
    pool.up = [True, False]
    assert not pool.ready() and not pool.runs_as(main), "an engine still starting"
    pool.up, pool.restarting = [True, True], [False, True]
    assert not pool.runs_as(main), "told to restart, its started not in yet"
    pool.restarting = [False, False]
    pool.up, pool.alive = [True, True], [True, False]
    assert not pool.runs_as(main), "a worker has ended"
    with pytest.raises(ValueError, match="restart them"):
        pool.keep(main)
    pool.alive = [True, True]
    pool.keep(main)
    assert pool.plan is main and pool.generation == 9 and pool.up == [True, True], "no restart, no new run number"
    # one replica on two slots (the second parked): its engine has all the cores, as the main phase's would
    one = Plan(**{**plan.__dict__, "replicas": 1})
    pool.plan, pool.parked = one, [False, True]
    assert pool._job(0)["cores"] == [0, 1] and pool.runs_as(Plan(**{**one.__dict__, "phase": {"phase": "main"}}))
    pool.closed = True
    assert not pool.runs_as(main) and not pool.runs_as(Plan(**{**one.__dict__, "phase": {"phase": "main"}})), \
        "a closed pool (a shard failed) keeps nothing"
