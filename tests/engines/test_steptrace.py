"""The step recorder: every step once, idle gaps left out, and a bounded size on a job of 10^6 steps."""

from engines.steptrace import STEP_FIELDS, StepRecorder, concat, summary


def test_a_step_counts_from_the_previous_step_or_from_when_work_arrived():
    now = [0.0]
    recorder = StepRecorder(clock=lambda: now[0])
    recorder.begin()
    for t in (0.5, 0.75):
        now[0] = t
        recorder.record(running=4, decode=4, prefill=0)
    now[0] = 10.0            # idle: no work until 10 s
    recorder.begin()
    now[0] = 10.25
    recorder.record(running=1, decode=0, prefill=30, prefill_seqs=1)
    trace = recorder.take()
    assert trace["dt"] == [0.5, 0.25, 0.25], "the idle gap is no step's time"
    assert summary(trace)["count"] == 3 and summary(trace)["max_running"] == 4
    assert recorder.take()["weight"] == [], "a take empties it"


def test_a_million_steps_stay_bounded_and_keep_their_totals():
    recorder = StepRecorder(limit=1000, clock=lambda: 0.0)
    for i in range(1_000_000):
        recorder.record(running=1 + i % 256, decode=1 + i % 256, prefill=(i % 7) * 64, context=(1 + i % 256) * 300,
                        dt=0.001 * (1 + i % 256) / 256, end=0.0)
    trace = recorder.take()
    assert len(trace["weight"]) < 20_000, "raw steps up to the limit, then a bucket per kind of step"
    assert sum(trace["weight"]) == 1_000_000
    total = sum(w * dt for w, dt in zip(trace["weight"], trace["dt"]))
    assert abs(total - sum(0.001 * (1 + i % 256) / 256 for i in range(1_000_000))) < 1e-6 * total
    assert set(trace) == set(STEP_FIELDS)


def test_shards_traces_join_into_one():
    a, b = StepRecorder(clock=lambda: 0.0), StepRecorder(clock=lambda: 0.0)
    a.record(running=2, decode=2, prefill=0, dt=0.1, end=0.0)
    b.record(running=3, decode=3, prefill=0, dt=0.2, end=0.0)
    joined = StepRecorder(limit=1)
    joined.extend(a.take())
    joined.extend(b.take())
    trace = joined.take()
    assert sum(trace["weight"]) == 2 and len(concat([trace, trace])["weight"]) == 2 * len(trace["weight"])
