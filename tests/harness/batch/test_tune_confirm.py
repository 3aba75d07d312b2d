"""The confirmation inside the main phase (``harness.batch.tune.tune_confirm``): blocks, looks, their error rate."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest

from benchmarks.in_main_confirmation import simulate, simulate_alternating
from harness.batch.job.job import SoFar
from harness.batch.tune.tune_confirm import (AHEAD, BLOCK_STEPS, KEEP, SWITCH, Alternation, Blocks, Confirmation,
                                             InMainRule, LookLog)


def so_far(shards: int, left: int, tokens: float, seconds: float, steps: int = 0) -> SoFar:
    return SoFar(shards=shards, left=left, engines=2, output_tokens=shards * 100, engine_s=shards * 1.0,
                 step_tokens=tokens + 50, step_s=seconds + 5, full_tokens=tokens, full_s=seconds, full_steps=steps)


def test_blocks_are_the_full_steps_rate_over_each_block_of_steps_an_engine():
    seen = []
    blocks = Blocks(lambda s: seen.append(s.shards) or s.shards == 3, steps=100)
    assert blocks(so_far(1, 5, 1000, 10, 150)) is False, "150 full steps of 2 engines: under a block's 200"
    assert blocks(so_far(2, 4, 3000, 20, 300)) is False, "the steps before the first commit count"
    assert blocks.values == [pytest.approx(3000 / 20 * 2)]
    assert blocks(so_far(3, 3, 4000, 25, 350)) is True, "the wrapped hook's answer comes back"
    # nothing left to hand over, but requests still waiting: full steps, a block
    blocks(so_far(4, 0, 9000, 30, 600))
    assert blocks.values[1:] == [pytest.approx(6000 / 10 * 2)] and seen == [1, 2, 3, 4]
    blocks(so_far(5, 0, 9000, 30, 600))   # a drain: no full step since, no block
    assert len(blocks.values) == 2


def test_a_job_s_full_steps_are_those_with_requests_waiting_or_while_shards_are_left():
    """``ShardsRun``'s tally of a shard's steps (``SoFar.full_*``): a step with requests waiting is full; one
    without is a ramp or a drain; an engine that does not say (-1) counts while shards are left to hand over."""
    from harness.batch.job.job import _Runner

    tally = _Runner.__new__(_Runner)
    tally.step_tokens, tally.step_s, tally.full = 0.0, 0.0, [0.0, 0.0, 0]
    trace = {"weight": [1, 1, 2], "decode": [10, 20, 30], "dt": [0.1, 0.2, 0.3], "waiting": [5, 0, 3]}
    tally._stepped(trace, left=0)
    assert tally.full == [pytest.approx(10 + 60), pytest.approx(0.1 + 0.6), 3]
    assert tally.step_tokens == pytest.approx(90) and tally.step_s == pytest.approx(0.9)
    unknown = {"weight": [1], "decode": [8], "dt": [0.5], "waiting": [-1]}
    tally._stepped(unknown, left=0)
    assert tally.full[2] == 3, "unknown and nothing left to hand over: a drain"
    tally._stepped(unknown, left=2)
    assert tally.full == [pytest.approx(78), pytest.approx(1.2), 4]


def test_only_the_last_look_keeps_and_the_earlier_ones_only_switch():
    rule = InMainRule(3, 0.02, 0.0)
    defaults = [100, 101, 99, 100, 100.5]
    early = rule.look([150, 151, 149], defaults)
    assert early.verdict == AHEAD and early.action is None and "only the last look keeps" in early.reason
    assert rule.look([150, 151, 149, 150, 150.5], defaults).action == KEEP
    assert rule.look([150, 151, 149], defaults, last=True).action == KEEP, "the bound's look: the last"
    assert rule.look([50, 51, 49], defaults).action == SWITCH, "a clear loser at the first look"
    tie = rule.look([100, 100.2, 99.8], [100, 100.1, 99.9, 100])
    assert tie.verdict == "equivalent" and tie.action == SWITCH
    noisy = [104, 92, 110]
    assert rule.look(noisy, defaults).action is None, "too close to call at look 1: look again"
    last = rule.look([104, 92, 110, 95, 107], defaults)
    assert last.look == 3 and last.action == SWITCH and "not a clear winner at the last look" in last.reason
    assert rule.look([150, 151, 149], [100, 101]).action == SWITCH, "fewer than 3 blocks of the defaults"
    with pytest.raises(ValueError):
        rule.look([150, 151], defaults)
    assert rule.level == pytest.approx(0.04) and InMainRule(1, 0.02, 0.0).level == pytest.approx(0.04)
    assert "one-sided at 0.04 (α = 0.05 less a reserve of 20%): only the last look keeps" in rule.describe()


def test_the_keep_is_one_sided_at_alpha():
    """One look (level 0.04), no spread in the blocks, a 3% allowance a side: the bound is z(0.96) √2 × 3% below
    the ratio, so 1.08x is a clear winner and 1.07x is not (at two-sided levels adding to α over 3 looks, as before,
    1.10x was not)."""
    rule = InMainRule(1, 0.02, 0.03)
    defaults = [100.0] * 3
    assert rule.look([108.0] * 3, defaults).action == KEEP
    assert rule.look([107.0] * 3, defaults).action == SWITCH
    assert rule.look([108.0] * 3, defaults).low == pytest.approx(1.08 / math.exp(1.7507 * 0.03 * 2 ** 0.5), rel=1e-4)


def test_the_run_allowance_widens_the_interval():
    tight, allowed = InMainRule(1, 0.02, 0.0), InMainRule(1, 0.02, 0.05)
    candidate, defaults = [106, 106.5, 105.5], [100, 100.5, 99.5, 100]
    assert tight.look(candidate, defaults).action == KEEP
    assert allowed.look(candidate, defaults).action == SWITCH, "6% is within what two runs of one config differ by"


def test_looks_are_kept_and_a_resumed_main_phase_goes_on_from_them(tmp_path):
    rule = InMainRule(4, 0.02, 0.0)
    defaults = [100, 100.5, 99.5, 100]
    first = Confirmation(rule, defaults, LookLog(tmp_path))
    tokens = 0.0
    for shards, rate in enumerate([100, 104, 92], 1):   # 3 blocks: one look, too close to call
        tokens += rate * 5
        assert first.blocks(so_far(shards, 10, tokens, shards * 10.0, shards * 2 * BLOCK_STEPS)) is False
    assert len(first.made) == 1 and first.action is None
    again = Confirmation(rule, defaults, LookLog(tmp_path))   # a kill, then the job again
    assert again.candidate == first.candidate and len(again.made) == 1
    tokens = 0.0
    for shards, rate in enumerate([60], 1):   # the new run's first block: look 2
        tokens += rate * 5
        again.blocks(so_far(shards, 10, tokens, shards * 10.0, shards * 2 * BLOCK_STEPS))
    assert [look.look for look in again.made] == [1, 2] and len(again.candidate) == 4
    assert [look.look for look in LookLog(tmp_path).read()] == [1, 2]


def test_the_candidate_s_blocks_meet_the_defaults_blocks_at_the_same_places_in_their_runs(tmp_path):
    """One config on both sides, each run from empty engines: its first blocks run fast (short contexts), the rest
    at its steady rate. Against every block of the defaults' trial the candidate's first three read as a clear
    winner (what the virtual H100 showed: 1.16-1.21x for the defaults against themselves); the looks compare them
    with the trial's first three, and see one config."""
    run = [140.0, 132.0, 125.0] + [100.0 + (i % 3 - 1) * 0.5 for i in range(30)]
    rule = InMainRule(3, 0.02, 0.03)
    assert rule.look(run[:3], run[3:], last=True).action == KEEP, "against a run's later blocks: the bias the " \
        "matching removes"
    assert rule.look(run[:3], run, last=True).action != KEEP, "the rule matches them itself"
    confirmation = Confirmation(rule, run[:5], LookLog(tmp_path))   # the blocks the last look compares: none merged
    _feed(confirmation, run[:3])
    assert confirmation.candidate == pytest.approx(run[:3])
    look = confirmation.made[-1]
    assert look.look == 1 and look.action != KEEP and look.ratio == pytest.approx(1.0)
    assert "3 vs 3 blocks" in look.reason and "same places" in rule.describe()


def _feed(confirmation: Confirmation, rates: list[float], first: int = 1) -> None:
    """Commits of one full block each, at ``rates`` (two engines: a block is the rate per engine × 2)."""
    tokens = 0.0
    for shards, rate in enumerate(rates, first):
        tokens += rate / 2 * 10
        confirmation.blocks(so_far(shards, 10, tokens, (shards - first + 1) * 10.0,
                                   (shards - first + 1) * 2 * BLOCK_STEPS))


def test_a_defaults_trial_of_more_blocks_than_the_looks_compare_is_merged_and_the_candidate_s_blocks_alike(tmp_path):
    """A trial 0 of 3 × 5 + 1 blocks (three looks compare up to 5 a side): each sample, both sides, is 3 consecutive
    blocks (their geometric mean) from the run's start, the incomplete last group left out; the first look comes
    after 9 of the candidate's blocks, and its noisy single blocks average out."""
    defaults = [100.0, 81.0, 121.0] * 5 + [50.0]
    rule = InMainRule(3, 0.02, 0.03)
    confirmation = Confirmation(rule, defaults, LookLog(tmp_path))
    assert confirmation.merged == 3 and confirmation.defaults == pytest.approx([(100 * 81 * 121) ** (1 / 3)] * 5)
    # groups of 3 from the start have the product 125³; any other grouping mixes them (e.g. 125, 125, 250)
    candidate = [125.0, 125.0, 125.0, 250.0, 62.5, 125.0, 62.5, 250.0, 125.0, 400.0]
    _feed(confirmation, candidate)
    assert confirmation.candidate == pytest.approx([125.0] * 3), "the groups start at the run's start"
    [look] = confirmation.made
    assert look.look == 1 and look.verdict == AHEAD and "3 vs 3 samples of 3 blocks" in look.reason
    assert look.merged == 3 and confirmation.columns()["tune.confirm.blocks_merged"] == 3
    assert rule.look(candidate[:3], defaults[:3], last=True).action == SWITCH, "the same blocks unmerged: too " \
        "close to call"


def test_merged_samples_survive_a_kill_and_the_bound_reads_them(tmp_path):
    """A kill after look 1: the rerun's blocks are merged from its own start, after the samples the look saw. At
    the bound with no look made, the candidate's merged samples and the defaults' are the rates compared."""
    rule = InMainRule(3, 0.02, 0.03)
    defaults = [100.0, 90.0, 110.0] * 5
    first = Confirmation(rule, defaults, LookLog(tmp_path))
    _feed(first, [104.0, 94.0, 114.0] * 3)   # 4% faster: too close to call
    assert len(first.made) == 1 and first.action is None
    again = Confirmation(rule, defaults, LookLog(tmp_path))
    _feed(again, [150.0, 50.0])   # one incomplete group: no sample yet, no look
    assert again.candidate == first.candidate and len(again.made) == 1
    _feed(again, [150.0, 50.0, 104.0], first=3)   # the rerun's first group: 150, 50, 104 is its first sample
    assert again.candidate == pytest.approx(first.candidate + [(150 * 50 * 104) ** (1 / 3)])
    assert [m.look for m in again.made] == [1, 2]
    longer = Confirmation(rule, defaults * 2, LookLog(tmp_path))   # would merge 6 a sample: the looks' 3 stand
    assert longer.merged == 3 and longer.candidate == again.candidate
    old = tmp_path / "old"
    old.mkdir()
    (old / "confirm.jsonl").write_text(json.dumps({k: v for k, v in asdict(first.made[0]).items() if k != "merged"})
                                       + "\n")   # a look logged before its samples' size was (261f805..f2bdb30)
    assert Confirmation(rule, defaults, LookLog(old)).merged == 3, "as those versions merged: trial 0's blocks ÷ 5"
    bound = Confirmation(rule, defaults, LookLog(tmp_path / "b"), within=4)
    (tmp_path / "b").mkdir()
    _feed(bound, [200.0] * 4)   # 4 blocks: one sample of 3, under the 3 samples the first look needs
    steps = (4 * 200 / 2 * 10 + 50) / (40 + 5) * 2   # ``so_far``'s rate over all steps: lower than the blocks'
    assert bound.action == KEEP and bound.made[-1].ratio == pytest.approx(steps / (100 * 90 * 110) ** (1 / 3))
    assert "1 sample(s) of 3 blocks" in bound.made[-1].reason


def test_a_a_false_winners_stay_under_5_percent_with_run_noise_and_drift_within_the_allowance():
    """Both sides one run whose blocks share its offset, 2% run-to-run, 1% drift, 1% block noise: the allowance of
    3% keeps false winners under 5%; without it (the blocks' own spread only) the rule names a winner in about
    a third of the jobs, and a real 15% gain is still kept most of the time."""
    allowed, bare = InMainRule(6, 0.02, 0.03), InMainRule(6, 0.02, 0.0)
    assert simulate(allowed, 0.02, 0.01, 0.01, 1000) <= 0.05
    assert simulate(bare, 0.02, 0.01, 0.01, 1000) > 0.15
    assert simulate(allowed, 0.02, 0.01, 0.01, 300, candidate_gain=0.15, seed=1) > 0.8


def test_whole_jobs_a_a_and_a_slower_best_candidate_finish_on_the_defaults_in_95_percent():
    """The whole path, 1,000 simulated jobs a case (``benchmarks.in_main_confirmation.simulate_jobs``): four configs
    alike, or the best candidate 5% slower, with runs 3% apart (the allowance) and blocks 3% noisy: the job finishes
    on another config than the defaults in at most 5%; a 2.3x candidate (the real CPU job's) is kept nearly always."""
    from benchmarks.in_main_confirmation import simulate_jobs

    rule = InMainRule(3, 0.02, 0.03)
    assert simulate_jobs(rule, 0.03, 0.03, 0.0, 1000) <= 0.05
    assert simulate_jobs(InMainRule(1, 0.02, 0.03), 0.03, 0.03, 0.0, 1000, seed=6) <= 0.05, "one look: the same level"
    assert simulate_jobs(rule, 0.03, 0.03, 0.0, 1000, rates=(1.0, 0.95, 0.9, 0.8), seed=1) <= 0.05
    assert simulate_jobs(rule, 0.05, 0.03, 0.0, 300, rates=(1.0, 2.3, 1.2, 0.9), seed=2) >= 0.95
    # GPU scale: trials of 80 blocks 10% noisy, merged 16 a sample: the same bars, and more power than unmerged
    assert simulate_jobs(rule, 0.03, 0.10, 0.0, 1000, seed=3, trial_blocks=80) <= 0.05
    assert simulate_jobs(rule, 0.03, 0.10, 0.0, 1000, rates=(1.0, 0.95, 0.9, 0.8), seed=4, trial_blocks=80) <= 0.05
    faster = (1.0, 1.15, 0.9, 0.8)
    assert simulate_jobs(rule, 0.02, 0.10, 0.0, 400, faster, 5, 80) > simulate_jobs(rule, 0.02, 0.10, 0.0, 400,
                                                                                   faster, 5, 80, merged=1) + 0.2



def test_a_rerun_after_a_switch_runs_the_rest_on_the_defaults_with_no_look_to_stop_them(tmp_path):
    """A kill after the looks said switch: the rerun's main phase is the defaults' with no hook (the hook answers
    ``SWITCH`` at every commit, which stopped the defaults' own run after its first commit, job after job)."""
    from harness.batch.tune.tuning import InJobTuning

    rule = InMainRule(3, 0.02, 0.0)
    first = Confirmation(rule, [100.0, 100.5, 99.5], LookLog(tmp_path))
    for shards, rate in enumerate([50, 51, 49], 1):
        first.blocks(so_far(shards, 10, rate * 5.0 * shards, shards * 10.0, shards * 2 * BLOCK_STEPS))
    assert first.action == SWITCH
    runs = []

    class Tuning(InJobTuning):
        def __init__(self):   # only what _main reads
            pass

        def _run(self, kind, label, values, shards, trial=None, blocks=None, rest=None):
            runs.append((label, values, blocks))

        def _rest_in_main(self, values, shards):
            return None

        def _left(self):
            return []

    again = Confirmation(rule, [100.0, 100.5, 99.5], LookLog(tmp_path))
    assert Tuning()._main({"engine.knobs.max_num_seqs": 64}, again, [5, 6, 7]) == {}
    assert runs == [("main", {}, None)]


def test_a_candidate_with_no_decision_within_half_of_the_main_phase_switches_unless_far_faster(tmp_path):
    """An engine that never runs full long enough for the blocks (too few shards to keep it fed) gives the looks
    nothing: the candidate is not kept unconfirmed for the rest of the job; at the bound (the main phase's shards ×
    WITHIN) it switches, and the look says why, unless its rate so far clears the defaults' blocks by the minimum
    effect and the run allowance. Looks made without deciding, or no rate at all: it switches. Looks due before
    the bound are made as usual."""
    rule = InMainRule(3, 0.02, 0.0)
    confirmation = Confirmation(rule, [100, 100.5, 99.5, 100], LookLog(tmp_path), within=5)
    for shards in range(1, 5):   # commits without a full step: no block, no look
        assert confirmation.blocks(so_far(shards, 20, 0.0, 0.0, 0)) is False
    assert confirmation.made == [] and confirmation.action is None
    assert confirmation.blocks(so_far(5, 15, 0.0, 0.0, 0)) is True
    [look] = LookLog(tmp_path).read()
    assert look.action == SWITCH and "no decision after 5 of the main phase's shards (the bound: 50%" in look.reason
    assert "gave 0 block(s)" in look.reason
    assert "0.200x the defaults' blocks' mean: not at or above 1.020x" in look.reason
    allowed = InMainRule(3, 0.02, 0.03)   # the defaults: the bar is 1.02 × exp(z(0.96) √2 × 0.03)
    # no look made, but its engines' steps ran 30x the defaults' blocks' mean (an engine too fast for its feed
    # gives no block): kept, not switched to a config that slow
    fast = Confirmation(allowed, [100, 100.5, 99.5, 100], LookLog(tmp_path / "f"), within=2)
    (tmp_path / "f").mkdir()
    assert fast.blocks(SoFar(shards=1, left=9, engines=2, output_tokens=100, engine_s=1.0, step_tokens=3000.0,
                             step_s=2.0)) is False
    assert fast.blocks(SoFar(shards=2, left=8, engines=2, output_tokens=200, engine_s=2.0, step_tokens=6000.0,
                             step_s=4.0)) is False
    assert fast.action == KEEP and "kept, at or above 1.099x" in fast.made[-1].reason
    # two blocks at 105 and its steps at 3,000: the lower, 1.05x, is what counts: switched
    two = Confirmation(allowed, [100, 100.5, 99.5, 100], LookLog(tmp_path / "t"), within=3)
    (tmp_path / "t").mkdir()
    for shards in (1, 2):
        two.blocks(SoFar(shards=shards, left=9, engines=2, output_tokens=100 * shards, engine_s=1.0 * shards,
                         step_tokens=3000.0 * shards, step_s=2.0 * shards, full_tokens=105 / 2 * 10.0 * shards,
                         full_s=10.0 * shards, full_steps=2 * BLOCK_STEPS * shards))
    assert two.candidate == pytest.approx([105, 105]) and two.action is None
    assert two.blocks(SoFar(shards=3, left=9, engines=2, output_tokens=300, engine_s=3.0, step_tokens=9000.0,
                            step_s=6.0, full_tokens=105 / 2 * 10.0 * 2, full_s=20.0,
                            full_steps=2 * BLOCK_STEPS * 2)) is True
    assert two.made[-1].ratio == pytest.approx(1.05, rel=1e-3)
    # 8% faster: under the allowance's bar (1.099x), switched
    close = Confirmation(allowed, [100, 100.5, 99.5, 100], LookLog(tmp_path / "c"), within=1)
    (tmp_path / "c").mkdir()
    assert close.blocks(SoFar(shards=1, left=9, engines=2, output_tokens=100, engine_s=1.0, step_tokens=108.0,
                              step_s=2.0)) is True and close.made[-1].ratio == pytest.approx(1.08, rel=1e-3)
    # no steps and no engine seconds: no rate, switched
    blind = Confirmation(allowed, [100, 100.5, 99.5, 100], LookLog(tmp_path / "b"), within=1)
    (tmp_path / "b").mkdir()
    assert blind.blocks(SoFar(shards=1, left=9, engines=2, output_tokens=0, engine_s=0.0, step_tokens=0.0,
                              step_s=0.0)) is True and blind.made[-1].ratio is None
    # a look made without deciding, then the bound: the bound's look is the last, on the blocks (not the steps)
    looked = Confirmation(allowed, [100, 100.5, 99.5, 100], LookLog(tmp_path / "l"), within=4)
    (tmp_path / "l").mkdir()
    tokens = 0.0
    for shards, rate in enumerate([100, 104, 92], 1):   # 3 blocks: one look, too close to call
        tokens += rate * 5
        looked.blocks(so_far(shards, 10, tokens, shards * 10.0, shards * 2 * BLOCK_STEPS))
    assert len(looked.made) == 1 and looked.action is None
    assert looked.blocks(SoFar(shards=4, left=6, engines=2, output_tokens=400, engine_s=4.0, step_tokens=9e6,
                               step_s=10.0, full_steps=3 * 2 * BLOCK_STEPS)) is True
    assert looked.action == SWITCH and "the bound's look is the last" in looked.made[-1].reason
    assert looked.made[-1].ratio == pytest.approx((100 * 104 * 92 / (100 * 100.5 * 99.5)) ** (1 / 3))
    # after a kill: the shards the main phase committed before count towards the bound
    resumed = Confirmation(rule, [100, 100.5, 99.5, 100], LookLog(tmp_path / "r"), within=5, before=3)
    (tmp_path / "r").mkdir()
    assert resumed.blocks(so_far(1, 20, 0.0, 0.0, 0)) is False
    assert resumed.blocks(so_far(2, 20, 0.0, 0.0, 0)) is True and "after 5 of" in resumed.made[-1].reason
    # a look due at the bound's commit is the last: a clear winner is kept there
    winner = Confirmation(rule, [100, 100.5, 99.5, 100], LookLog(tmp_path / "w"), within=3)
    (tmp_path / "w").mkdir()
    _feed(winner, [150, 151, 149])
    assert winner.action == KEEP and len(winner.made) == 1 and "at the last look" in winner.made[0].reason
    # the bound at a commit with no look due, after a look that did not decide: the samples it saw, looked at
    # again as the last look (numbered after it)
    again = Confirmation(rule, [100, 100.5, 99.5, 100], LookLog(tmp_path / "a"), within=4)
    (tmp_path / "a").mkdir()
    _feed(again, [150, 151, 149])
    assert again.action is None and [m.verdict for m in again.made] == [AHEAD]
    assert again.blocks(so_far(4, 10, 0.0, 0.0, 0)) is False   # a commit with no full step: no new block
    assert again.action == KEEP and [m.look for m in again.made] == [1, 2]
    assert "the bound's look is the last" in again.made[-1].reason and "look 2 of 3" in again.made[-1].reason


def _alternate(alternation: Alternation, candidate: float, defaults: list[float]) -> list[str]:
    """Runs ``alternation`` to its decision: the candidate's runs all at about ``candidate``, the defaults' in turn
    from ``defaults``; returns the sides run, in order."""
    ran, c, d = [], [], []
    while (side := alternation.next(c, d)) is not None:
        ran.append("C" if side else "D")
        c.append(candidate * (1 + 0.001 * len(c))) if side else d.append(defaults[len(d)])
    return ran


def test_alternating_runs_take_turns_from_the_defaults_and_only_the_last_look_keeps(tmp_path):
    rule = InMainRule(3, 0.02, 0.03)
    alternation = Alternation(rule, LookLog(tmp_path))
    assert _alternate(alternation, 1100.0, [1000.0, 1010.0, 990.0, 1005.0, 995.0]) == ["D", "C"] * 5, \
        "the defaults first, so that a keep goes on with the candidate's engines; 5 runs against 5"
    assert [look.look for look in alternation.made] == [1, 2, 3] and alternation.action == KEEP
    assert [look.action for look in alternation.made] == [None, None, KEEP], "10% faster: kept at the last look"
    assert alternation.made[0].verdict == AHEAD and "(3 vs 3 runs)" in alternation.made[0].reason
    assert alternation.rule.run_spread == 0.0, "runs are the samples: their spread is measured, not assumed"
    assert alternation.columns()["tune.confirm.method"].startswith("alternating runs: 3 look(s) at the candidate's")
    # a resumed job goes on from its looks: decided, nothing more runs
    again = Alternation(rule, LookLog(tmp_path))
    assert again.action == KEEP and again.next([1.0] * 5, [1.0] * 5) is None


def test_alternating_runs_switch_a_loser_at_the_first_look_and_a_failed_run_ends_them(tmp_path):
    rule = InMainRule(3, 0.02, 0.03)
    (tmp_path / "a").mkdir()
    lost = Alternation(rule, LookLog(tmp_path / "a"))
    assert _alternate(lost, 800.0, [1000.0, 1010.0, 990.0]) == ["D", "C"] * 3
    assert lost.action == SWITCH and "a clear loser" in lost.made[-1].reason
    (tmp_path / "b").mkdir()
    failed = Alternation(rule, LookLog(tmp_path / "b"))
    assert failed.next([], []) is False and failed.next([], [1000.0]) is True
    failed.stop("main, alternating: engine defaults 2 failed: the rest on the other config, unconfirmed", KEEP)
    assert failed.action == KEEP and failed.next([], [1000.0]) is None
    assert Alternation(rule, LookLog(tmp_path / "b")).action == KEEP, "kept in confirm.jsonl"


def test_a_run_s_sample_is_its_blocks_geometric_mean_and_a_run_with_none_gives_none():
    from harness.batch.tune.tune_confirm import run_sample
    from harness.batch.tune.tune_runs import RunRecord

    run = RunRecord(kind="main", label="main, alternating: candidate 1", values={"x": 1}, shards=[1],
                    output_tokens=100, generation_s=1.0)
    assert run_sample(run) is None, "its plain rate (ramp and drain included) would not compare with the blocks"
    run.blocks = [100.0, 400.0]
    assert run_sample(run) == pytest.approx(200.0)


def test_whole_jobs_with_alternating_runs_keep_an_equal_or_slower_candidate_in_under_5_percent():
    """The whole tuning path with the confirmation by alternating runs (``simulate_alternating``): the trials rank
    the configs, the main phase's runs alternate. 1,000 jobs a case (seed 0: 2.1% at runs 2%, 3.2% at runs 10%, 0.0%
    for a 5% slower best, 1.1% on a host 1% faster each run; a 5% faster one is kept in 73%)."""
    rule = InMainRule(3, 0.02, 0.03)
    for run_sigma in (0.02, 0.05, 0.10):   # no allowance to exceed: each run's spread is measured
        assert simulate_alternating(rule, run_sigma, 0.10, 0.0, 1000) <= 0.05, run_sigma
    assert simulate_alternating(rule, 0.02, 0.10, 0.01, 1000, trend=True) <= 0.05, "a host that speeds up"
    assert simulate_alternating(rule, 0.02, 0.10, 0.0, 1000, (1.0, 0.95, 0.9, 0.8)) <= 0.05
    assert simulate_alternating(rule, 0.02, 0.10, 0.0, 1000, (1.0, 1.05, 0.9, 0.8)) >= 0.6, "the power it was built for"


def _trial(label: str, values: dict, shards: int, gen_s: float, wall_s: float, blocks: int, full: float | None,
           tokens: int = 10_000) -> "RunRecord":
    from harness.batch.tune.tune_runs import RunRecord

    return RunRecord(kind="trial", label=label, values=values, shards=list(range(shards)), output_tokens=tokens,
                     generation_s=gen_s, wall_s=wall_s, blocks=[1000.0] * blocks, full_engine_tok_s=full)


def test_the_alternating_runs_estimate_counts_starts_ramps_drains_and_the_slower_shards():
    from harness.batch.tune.tune_confirm import alternate_estimate

    # trial 0: 20 shards in 100 s (5 s a shard), 10,000 tokens at 125 tok/s full: 20 s of ramp and drain; the
    # candidate: 10 shards in 40 s (4 s a shard), 10 s of its own; its restart 10 s (50 - 40)
    records = [_trial("trial 0", {}, 20, 100.0, 130.0, 8, 125.0), _trial("trial 1", {"x": 1}, 10, 40.0, 50.0, 6, 333.3)]
    made = alternate_estimate(records, {"x": 1}, k=10, shards_left=1000, share=0.1, runs=5)
    drains = 20.0 + (40.0 - 10_000 / 333.3)
    assert made["cost_s"] == pytest.approx(5 * (2 * 10.0 + drains + 10 * (5.0 - 4.0)))
    assert made["rest_s"] == pytest.approx(1000 * 4.0)
    assert made["alternate"] and made["why"].startswith("made: 10 runs of 10 shards")
    assert not alternate_estimate(records, {"x": 1}, 10, 1000, 0.05, 5)["alternate"], "300 s of 4,000: over 5%"
    assert "do not fit" in alternate_estimate(records, {"x": 1}, 10, 150, 0.5, 5)["why"], "10 runs of 10 in 75"
    few = [records[0], _trial("trial 1", {"x": 1}, 10, 40.0, 50.0, 1, 333.3)]   # the candidate: 1 block in 10 shards
    assert "under 2" in alternate_estimate(few, {"x": 1}, 10, 1000, 0.5, 5)["why"], "the fewer blocks a shard"
    assert alternate_estimate(records, {"x": 1}, 10, 1000, 0.0, 5)["why"] == "not made: batch.tune.alternate_share=0"
    kept = [records[0], _trial("trial 1", {"x": 1}, 10, 40.0, 0.0, 6, 333.3)]   # no restart measured (cut, no timings)
    assert alternate_estimate(kept, {"x": 1}, 10, 1000, 0.5, 5)["why"] == "not made: no restart measured"
    # no full-engine rate: a ramp and drain priced at the blocks' rate (1,000 tok/s: 10 s of 100 and of 40)
    plain = [_trial("trial 0", {}, 20, 100.0, 130.0, 8, None), _trial("trial 1", {"x": 1}, 10, 40.0, 50.0, 6, None)]
    assert alternate_estimate(plain, {"x": 1}, 10, 1000, 0.5, 5)["cost_s"] == \
        pytest.approx(5 * (20.0 + (100.0 - 10.0) + (40.0 - 10.0) + 10.0))
