"""The in-job tuning's run arithmetic: the steady rate and the prediction, on a simulated continuous-batching engine."""

from __future__ import annotations

import random

from harness.batch.tune_runs import RunRecord, confirm_shards, predicted_seconds, steady_rate


def _run(lengths: list[int], seats: int = 16, step_s: float = 0.001) -> tuple[list[tuple[float, int]], float]:
    """(finish time, tokens) per request and the run's time, simulated exactly."""
    queue = list(enumerate(lengths))
    running: dict[int, int] = {}
    out: list[tuple[float, int]] = []
    t = 0.0
    while queue or running:
        while queue and len(running) < seats:
            i, n = queue.pop(0)
            running[i] = n
        t += step_s
        for i in list(running):
            running[i] -= 1
            if running[i] == 0:
                out.append((t, lengths[i]))
                del running[i]
    return out, t


def _lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [max(1, min(512, round(rng.lognormvariate(4.16, 1.0)))) for _ in range(n)]  # median 64, like backlog_cpu


def test_the_steady_rate_leaves_out_the_drain_a_short_run_pays() -> None:
    errors, plain_errors = [], []
    for seed in range(10):   # runs of 8 batches of 32 seats: 32,000 tok/s while full
        finishes, t = _run(_lengths(256, seed), seats=32)
        errors.append(steady_rate(finishes) / 32_000 - 1)
        plain_errors.append(sum(tokens for _, tokens in finishes) / t / 32_000 - 1)
    assert abs(sum(errors) / 10) < 0.08, errors
    assert sum(plain_errors) / 10 < -0.2, "the whole run's rate pays the drain"
    assert steady_rate(finishes[:10]) is None


def test_short_runs_predict_a_long_rest_within_ten_percent() -> None:
    records = []
    for seed in range(3):
        finishes, t = _run(_lengths(256, seed))
        tokens = sum(n for _, n in finishes)
        records.append(RunRecord(kind="confirm", label=f"c{seed}", values={}, shards=[], requests=256,
                                 output_tokens=tokens, generation_s=t, steady_tok_s=steady_rate(finishes)))
    rest = _lengths(6000, 99)   # runs of 16 batches of 16 seats, a rest of 375
    _, measured = _run(rest)
    predicted = predicted_seconds(records, {}, len(rest))
    assert abs(predicted["predicted_rest_s"] / measured - 1) < 0.10, (predicted, measured)
    plain = [RunRecord(**{**r.__dict__, "steady_tok_s": None}) for r in records]
    naive = predicted_seconds(plain, {}, len(rest))["predicted_rest_s"]
    assert naive > 1.15 * measured, "the runs' plain rate would have over-predicted the rest"


def test_finish_times_that_do_not_spread_give_no_steady_rate() -> None:
    """A serial engine's shard finishes all at once: no window to read, so the prediction falls back to plain rates."""
    assert steady_rate([(1.0, 5)] * 40) is None
    records = [RunRecord(kind="confirm", label="c", values={}, shards=[], requests=40, output_tokens=200,
                         generation_s=2.0, steady_tok_s=None)]
    got = predicted_seconds(records, {}, 400)
    assert got["prediction_method"] == "plain" and abs(got["predicted_rest_s"] - 20.0) < 1e-9


def test_runs_smaller_than_what_the_engine_runs_at_once_are_flagged_and_their_prediction_runs_long() -> None:
    """192-request runs on an engine of 512 seats (two replicas of 256, as the CPU default's batch recipe):
    every request starts at once and the run drains. The prediction says the runs were under-filled, and it
    is indeed long: fed without end, the seats stay full."""
    from harness.batch.tune_runs import FILLED, concurrency

    limits = [{"max_num_seqs": 256, "kv_cache_tokens": 1 << 20}] * 2
    records = []
    for seed in range(3):
        lengths = _lengths(192, seed)
        finishes, t = _run(lengths, seats=512)
        tokens = sum(n for _, n in finishes)
        records.append(RunRecord(kind="confirm", label=f"c{seed}", values={}, shards=[], requests=192,
                                 output_tokens=tokens, generation_s=t, steady_tok_s=steady_rate(finishes),
                                 concurrency=concurrency(limits, [(150, n) for n in lengths])))
    assert records[0].concurrency == 512 and records[0].fill == 192 / 512 < FILLED
    rest = _lengths(20_000, 99)
    _, measured = _run(rest, seats=512)
    got = predicted_seconds(records, {}, len(rest))
    assert got["prediction_underfilled"] is True and got["prediction_min_fill"] == 0.375
    assert got["predicted_rest_s"] > 1.5 * measured, "a draining run's rate is far below the full engine's"
    filled = [RunRecord(**{**r.__dict__, "concurrency": 16.0}) for r in records]   # 12× its 16 seats
    assert predicted_seconds(filled, {}, len(rest))["prediction_underfilled"] is False
    unknown = [RunRecord(**{**r.__dict__, "concurrency": None}) for r in records]   # Ray, SGLang, an old record
    assert predicted_seconds(unknown, {}, len(rest))["prediction_underfilled"] is None, "unknown, not 'filled'"


def test_what_an_engine_runs_at_once_is_its_sequences_or_what_its_kv_cache_holds() -> None:
    from harness.batch.tune_runs import concurrency

    # 128 prompt and 64 output tokens each: a request holds 160 tokens on average while it runs
    same = [(128, 64)] * 100
    assert concurrency([{"max_num_seqs": 256, "kv_cache_tokens": 16_000}], same) == 100.0
    assert concurrency([{"max_num_seqs": 32, "kv_cache_tokens": 16_000}] * 2, same) == 64.0
    assert concurrency([{"max_num_seqs": 32, "kv_cache_tokens": None}], same) == 32.0
    # skewed outputs: the long ones run longest, so what a running request holds is output-weighted
    skewed = [(128, 8)] * 90 + [(128, 512)] * 10   # unweighted 128 + 58.4 / 2 = 157 tokens; weighted 353
    assert round(concurrency([{"max_num_seqs": 256, "kv_cache_tokens": 35_293}], skewed)) == 100
    assert concurrency([{"max_num_seqs": None, "kv_cache_tokens": None}], same) is None, \
        "an engine that does not say: unknown, and no fill"
    assert concurrency([], same) is None and concurrency([{"max_num_seqs": 8}], []) is None
    # fed a shard at a time (an engine without feeder()), an engine runs at most a shard's requests at once
    assert concurrency([{"max_num_seqs": 256, "kv_cache_tokens": 16_000}] * 2, same, per_engine_cap=64) == 128.0
    assert concurrency([{"max_num_seqs": 32, "kv_cache_tokens": None}], same, per_engine_cap=64) == 32.0
    kept = RunRecord(kind="confirm", label="c", values={}, shards=[], requests=400, concurrency=100.0)
    assert kept.fill == 4.0 and RunRecord(**{**kept.__dict__, "concurrency": None}).fill is None


def test_confirmation_runs_are_sized_to_one_fill_as_far_as_the_budget_holds() -> None:
    seats = {"default": 60.0, "candidate": 512.0}
    # room for the target: each side at 8x its seats (60 x 8 = 480 requests = 7.5 shards of 64, rounded up)
    assert confirm_shards(3, 64, 1000, 3, seats, 8.0) == {"default": 8, "candidate": 64}
    # 100 shards for 3 rounds: the largest common fill that fits, each side at least the trials' 3 shards
    sizes = confirm_shards(3, 64, 100, 3, seats, 8.0)
    assert 3 * sum(sizes.values()) <= 100 and sizes["candidate"] > 3 * sizes["default"]
    fills = {side: sizes[side] * 64 / seats[side] for side in seats}
    assert abs(fills["candidate"] - fills["default"]) < 1.2 and 1.5 < fills["candidate"] < 8
    assert 3 * sum(confirm_shards(3, 64, 100 + 3 * 8, 3, seats, 8.0).values()) > 3 * sum(sizes.values())
    # no room beyond the trials' size (or not even that), a side whose seats are unknown (sizing one side only would
    # compare two fills), or no target: runs as large as a trial's
    assert confirm_shards(3, 64, 18, 3, seats, 8.0) == {"default": 3, "candidate": 3}
    assert confirm_shards(3, 64, 10, 3, seats, 8.0) == {"default": 3, "candidate": 3}
    assert confirm_shards(3, 64, 1000, 3, {"default": None, "candidate": 512.0}, 8.0) == {"default": 3, "candidate": 3}
    assert confirm_shards(3, 64, 1000, 3, seats, 0.0) == {"default": 3, "candidate": 3}
    # the search steps by less than one shard of the side that runs most at once: every shard that fits is used
    big = confirm_shards(1, 1, 3000, 3, {"default": 1.0, "candidate": 100_000.0}, 8.0)
    assert big["default"] == 1 and big["candidate"] == 999


def test_the_run_log_reads_lines_with_derived_or_unknown_keys_and_old_lines_without_engines_kept(tmp_path) -> None:
    import json

    from harness.batch.tune_runs import RunLog

    log = RunLog(tmp_path)
    log.append(RunRecord(kind="main", label="main", values={}, shards=[1], engines_kept=True))
    old = {k: v for k, v in RunRecord(kind="trial", label="trial 0", values={}, shards=[0]).to_dict().items()
           if k != "engines_kept"}
    newer = {**old, "label": "trial 1", "a_later_field": 1}
    with open(log.path, "a") as f:
        f.write(json.dumps(old) + "\n" + json.dumps(newer) + "\n")
    kept, before, after = log.read()
    assert kept.engines_kept and not before.engines_kept and after.label == "trial 1"
