"""The in-job confirmation's rounds: the rounds asked for, then more only while the rule says "too close to call",
up to ``batch.tune.max_confirm_rounds`` and within the tuning budget. Runs are scripted: each confirmation run's
rate comes from a list, so the verdict after each round is known."""

from __future__ import annotations

import optuna
from optuna.distributions import IntDistribution

import json
from pathlib import Path
from types import SimpleNamespace

from harness.batch.job.plan import Plan
from harness.batch.tune.tune_runs import RunRecord
from harness.batch.tune.tuning import InJobTuning


class Scripted(InJobTuning):
    """The confirmation of ``InJobTuning`` with runs that take their rates from ``rates[side]`` in turn."""

    def __init__(self, rates: dict[str, list[float]], cap: int, room_runs: int = 100):
        self.tune = {"confirm_rounds": 3, "max_confirm_rounds": cap, "min_effect": 0.02}
        self.rates, self.records, self.room_runs = {k: list(v) for k, v in rates.items()}, [], room_runs

        class Log:
            read = staticmethod(lambda: self.records)
        self.log = Log()

    def _run(self, kind, label, values, shards, trial=None, side=None):
        rate = self.rates[side].pop(0)   # None: the run failed
        self.records.append(RunRecord(kind=kind, label=label, values=values, shards=[],
                                      output_tokens=round(rate or 0) * 10, generation_s=10.0, trial=trial, side=side,
                                      status="ok" if rate else "failed"))
        return self.records[-1]

    def _next_shards(self, k=None):
        return set()

    def _confirm_sizes(self, trial, values):
        return {"default": 1, "candidate": 1}   # a shard a run: the budget below counts runs

    def _room_for(self, shards: int) -> bool:
        return sum(r.kind == "confirm" for r in self.records) + shards <= self.room_runs


def _study() -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={"engine.knobs.max_num_seqs": 16}, value=1.0,
                                              distributions={"engine.knobs.max_num_seqs": IntDistribution(2, 64)}))
    return study


def _sides(tuning: Scripted) -> list[str]:
    return [r.side for r in tuning.records]


def test_a_clear_winner_after_the_rounds_asked_for_adds_none() -> None:
    tuning = Scripted({"candidate": [110, 111, 109], "default": [100, 101, 99]}, cap=6)
    chosen, (_, verdict, said) = tuning._confirm(_study())
    assert said == "clear winner" and chosen == {"engine.knobs.max_num_seqs": 16}
    assert _sides(tuning) == ["default", "candidate", "candidate", "default", "default", "candidate"]


def test_too_close_to_call_adds_rounds_until_the_rule_decides() -> None:
    # each look at its group-sequential level (plan: 3 to 6 runs a side, docs/verdicts.md): after 3 rounds
    # 1.073x [0.808, 1.425], about 5 rounds a side would decide it; after 4, 1.075x [0.978, 1.181] is still too
    # close at the 4th look's level; the 5th round decides: 1.076x [1.020, 1.134]
    tuning = Scripted({"candidate": [108, 112, 102, 108, 108], "default": [100, 98, 102, 100, 100]}, cap=6)
    chosen, (_, verdict, said) = tuning._confirm(_study())
    assert len(tuning.records) == 10 and verdict.n_a == verdict.n_b == 5
    assert said == "clear winner" and chosen == {"engine.knobs.max_num_seqs": 16}
    assert _sides(tuning)[6:] == ["candidate", "default", "default", "candidate"], "added rounds keep alternating"


def test_rounds_that_would_need_more_than_the_cap_are_not_started() -> None:
    # 1.056x [0.925, 1.205]: about 7 rounds a side would decide it, over a cap of 6: none added, the job keeps its own
    tuning = Scripted({"candidate": [104, 112, 101, 104], "default": [100, 100, 100, 100]}, cap=6)
    chosen, (_, verdict, said) = tuning._confirm(_study())
    assert len(tuning.records) == 6 and said == "too close to call" and chosen == {}


def test_the_cap_and_the_budget_stop_the_rounds_and_the_job_keeps_its_config() -> None:
    # plan 3 to 4: 1.073x after 3 rounds (the 4th look would decide at this spread), 1.054x [0.977, 1.138] after
    # 4: a cap of 4 stops it
    noisy = {"candidate": [108, 110, 104, 100, 108], "default": [100, 99, 101, 100, 100]}
    capped = Scripted(noisy, cap=4)
    chosen, (_, verdict, said) = capped._confirm(_study())
    assert len(capped.records) == 8 and said == "too close to call" and chosen == {}
    broke = Scripted(noisy, cap=6, room_runs=7)   # one more run fits the budget, a round (two) does not
    chosen, (_, verdict, said) = broke._confirm(_study())
    assert len(broke.records) == 6 and said == "too close to call" and chosen == {}


def test_with_the_cap_at_the_rounds_asked_for_nothing_is_added() -> None:
    tuning = Scripted({"candidate": [108, 112, 102, 108], "default": [100, 98, 102, 100]}, cap=3)
    chosen, (_, verdict, said) = tuning._confirm(_study())
    assert len(tuning.records) == 6 and said == "too close to call" and chosen == {}


def test_a_failed_run_gets_a_round_more_and_a_side_that_keeps_failing_does_not() -> None:
    once = Scripted({"candidate": [110, None, 109, 111], "default": [100, 101, 99, 100]}, cap=6)
    chosen, (_, verdict, said) = once._confirm(_study())
    assert len(once.records) == 8 and said == "clear winner" and (verdict.n_a, verdict.n_b) == (3, 4)
    twice = Scripted({"candidate": [110, None, None, 111], "default": [100, 101, 99, 100]}, cap=6)
    chosen, (_, verdict, said) = twice._confirm(_study())
    assert len(twice.records) == 6 and said == "insufficient data" and chosen == {}


def test_a_resume_inside_an_added_round_finishes_that_round_before_deciding_again() -> None:
    """Killed after the first run of round 4: the rerun (same log) runs round 4's other side, then decides."""
    rates = {"candidate": [108, 112, 102, 108, 108], "default": [100, 98, 102, 100, 100]}
    whole = Scripted(rates, cap=6)
    whole._confirm(_study())
    cut = Scripted(rates, cap=6)
    cut.records = whole.records[:7]   # the log as a kill after run 7 left it
    for side in ("candidate", "default"):
        cut.rates[side] = cut.rates[side][sum(r.side == side for r in cut.records):]
    chosen, (_, verdict, said) = cut._confirm(_study())
    assert [r.label for r in cut.records] == [r.label for r in whole.records] and len(cut.records) == 10
    assert said == "clear winner" and verdict.n_a == verdict.n_b == 5


def test_runs_are_sized_to_leave_room_for_the_added_rounds_where_the_job_is_big_enough() -> None:
    from harness.batch.tune.tune_runs import shards_per_run

    class Index:
        def __init__(self, records: int):
            self.records = records

        def shards(self, size: int) -> int:
            return -(-self.records // size)

    tune = {"trials": 4, "confirm_rounds": 3, "max_confirm_rounds": 6, "max_share": 0.1, "min_run_requests": 256,
            "shards_per_run": None}
    assert shards_per_run(tune, Index(1_000_000), 100) == 1000 // (4 + 12), "room for 3 added rounds"
    assert shards_per_run(tune, Index(30_000), 100) == 30 // (4 + 6), "too small for the room: the rounds asked for"
    assert shards_per_run({**tune, "max_confirm_rounds": None}, Index(1_000_000), 100) == 1000 // (4 + 6)


class Sizing(InJobTuning):
    """``InJobTuning._confirm_sizes`` over a run log of trials with known seats and ``room`` shards of budget left."""

    def __init__(self, root: Path, room: int, seats: dict[str, float | None]):
        self.root, self.room, self.k = root, room, 3
        self.tune = {"confirm_rounds": 3, "confirm_fill": 8}
        self.plan = SimpleNamespace(shard_size=64)
        records = [RunRecord(kind="trial", label="trial 0", values={}, shards=[], concurrency=seats["default"]),
                   RunRecord(kind="trial", label="trial 2", values={"engine.replicas": 2}, shards=[],
                             concurrency=seats["candidate"]),
                   RunRecord(kind="trial", label="trial 3", values={"engine.replicas": 1}, shards=[], concurrency=999.0,
                             status="failed")]

        class Log:
            read = staticmethod(lambda: records)
        self.log = Log()

    def _room_left(self) -> int:
        return self.room


def test_the_confirmation_s_sizes_are_kept_for_a_resumed_job_and_made_again_for_another_candidate(tmp_path) -> None:
    seats = {"default": 60.0, "candidate": 512.0}
    first = Sizing(tmp_path, 100, seats)._confirm_sizes(2, {"engine.replicas": 2})
    assert first["candidate"] > 3 * first["default"] >= 9, "each side's seats come from its own ok trial"
    saved = json.loads((tmp_path / "confirm.json").read_text())
    assert saved["trial"] == 2 and saved["shards"] == first and saved["concurrency"] == seats
    # resumed after a kill in the confirmation: less room is left, the sizes are the ones it began with
    assert Sizing(tmp_path, 40, seats)._confirm_sizes(2, {"engine.replicas": 2}) == first
    # another candidate (other settings would have cleared tune/): sized again, and saved
    other = Sizing(tmp_path, 1000, seats)._confirm_sizes(3, {"engine.replicas": 2})
    assert other == {"default": 8, "candidate": 64} and json.loads((tmp_path / "confirm.json").read_text())["trial"] == 3


def test_a_job_folder_made_before_confirm_fill_existed_has_the_same_identity() -> None:
    tune = {"trials": 4, "confirm_rounds": 3, "max_share": 0.1, "seed": 0}
    older = Plan(input="in.jsonl", format="jsonl", output_dir="out", shard_size=8, engine="vllm", model={},
                 knobs={}, ordering={}, python="python", tune=tune)
    newer = Plan(**{**older.__dict__, "tune": {**tune, "confirm_fill": 8, "max_confirm_rounds": 6}})
    assert older.identity() == newer.identity()
    assert Plan(**{**older.__dict__, "tune": {**tune, "seed": 1}}).identity() != older.identity()
