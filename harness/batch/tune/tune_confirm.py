"""The confirmation inside the main phase: the candidate against the engine defaults, block by block, as its shards
commit; on a long job, by alternating runs instead (``Alternation``, at the end of this module).

**The samples.** Each side's samples are **blocks**: the decode tokens per second of its engines' *full* steps
(steps with requests waiting behind them: the engine ran all it could hold; ``SoFar.full_*``), × engines, over
each ``BLOCK_STEPS`` full steps an engine, closed at the shard commit that completes them (the step trace comes
with each commit). A ramp from empty or a drain has no requests waiting, so it is in no block, and a trial of
fewer requests than its engines keep queued (all of it handed over at once) still gives blocks until its queue
runs out. A run's first block starts at its first full step: the steps before its first commit count (on long
outputs and large shards that commit comes after most of a short trial's full steps). Blocks of one engine fill follow the prefill/decode mix of the shards arriving (a one-commit block of
16-request shards spread by 35% on vLLM-CPU); blocks of 128 full steps of the engine defaults' trial spread by
2.2% and 2.7% in two jobs there (``docs/benchmarks.md``).

- the **engine defaults**: the blocks of trial 0, the job's own config (its one engine start, already run:
  nothing is restarted for the confirmation);
- the **candidate**: the blocks of the main phase, which starts on it. Its trial's blocks are not counted: it
  was chosen because they looked best, and counting them again would carry that selection into the verdict.

**Like for like.** Each look compares the candidate's ``n`` blocks so far with the defaults' trial's first ``n``
(all of them where it gave fewer): both runs start from empty engines, and a run's first blocks need not read like
its later ones (on the virtual H100 they read high, its engines holding short contexts; on vLLM's CPU build trial
0's first block read low). The defaults' trial is run until it has given as many blocks as the last look compares
(``MIN_RUNS + looks - 1``) where the budget allows; where it gave fewer, the later looks compare the candidate's
later blocks with its first ones. The matching costs power where the defaults gave more blocks than the candidate
has (look 1 uses 3 of them). After a kill the candidate's blocks are the cut run's then the rerun's, which started
from empty again: from there on they are not at the same places as the defaults'.

**Merged blocks.** Where trial 0 gave more blocks than the last look compares (a trial sized by the budget, not by
its blocks: about 80 at 10^6 requests on the virtual H100), each sample of both sides is ``merged`` consecutive
blocks (their geometric mean; ``merged``: trial 0's blocks ÷ the last look's count, rounded down), at the same
places in the two runs. The looks then use all of trial 0's run, and the candidate runs as many full steps before
its last look: the confirmation grows with the job, and a sample's spread shrinks as its blocks average out.

Every block's shards are real output, whichever side it is on.

**The looks.** After the candidate's ``MIN_RUNS`` th sample, and after each sample to the ``looks`` th
(``batch.tune.confirm_looks``), the rule compares the two sides' log rates: Welch's bounds on their difference, each
one-sided at ``level`` (``t`` at ``1 − level``). **Only the last look keeps the candidate**, and only where its
lower bound is above 1 and its ratio above the minimum effect; the looks before it only switch (a clear loser: the
upper bound below 1; or a tie within ``±min_effect``). Keeping earlier would not make the job faster (the main phase
runs on the candidate either way until a switch), and it would spend α at each look. So a false winner can be made
at one look only, one-sided because keeping an equal or slower candidate is the only error that makes a job slower
than its defaults; the earlier looks' switches only lower that rate (a non-binding futility rule). ``level`` is α
less ``KEEP_RESERVE`` (0.04, at any number of looks): Welch's t and trial 0's selection (a low trial-0 run both
loses the ranking and lowers the defaults' side) put whole jobs simulated at α = 0.05, with runs as far apart as the
allowance, at 4.4-5.6%. Before this (up to f2bdb30) every look could keep, at two-sided Pocock levels adding to α:
with 3 looks a look's bound stood at z 2.29 rather than 1.75, which at a 3% run allowance asked about 1.11x of a
candidate rather than 1.08x and switched back virtual H100 candidates truly 5-9% faster (``docs/benchmarks.md``).
``tests/harness/batch/test_tune_confirm.py`` and ``benchmarks/in_main_confirmation.py`` measure the false winners.

**Drift and the runs themselves.** Blocks of one run share that run's engine and the host's state during it,
so their spread understates how far two runs of one config differ; and trial 0 ran before the main phase, so
a host that drifts between them moves one side only. Both are covered by one allowance, ``run_spread``
(``batch.tune.run_spread``): the log-rate spread of two runs of one config on this kind of host, added to each
side's variance (``2 run_spread²`` to the difference). A drift or run-to-run difference beyond it can make a
false winner or loser; the A/A simulation reports the rate with drift and run noise.

**What follows.** A clear winner by ``min_effect`` at the last look keeps the candidate; the looks stop. A clear
loser, a candidate within ``±min_effect`` of the defaults (not worth a config that was not tried before), at any
look, or no clear winner at the last look switches the main phase to the defaults (one engine start); the
candidate's committed shards stay. The looks must decide once ``WITHIN`` of the main phase's shards have committed
(where its engines were never full long enough for the samples the looks need: shards too few to keep it fed, or an
engine too fast for its feed): the bound on how long a candidate runs unconfirmed. Where looks were made by then,
the bound makes the look it is at the last (``Confirmation._at_the_bound``): the candidate's samples so far, kept
only as a clear winner, so the one keep stays at ``level``. Where no look was made, one comparison decides instead:
the candidate is kept if its rate so far (the lower of its rate over all its steps and its blocks' geometric mean)
is above the defaults' blocks' geometric mean by ``min_effect`` and the run allowance at ``level`` (about 1.10× at
the defaults, what the last look asks of blocks with no spread), so that a candidate many times faster than the
defaults, on an engine too fast for its feed, is not switched away; a point comparison, not the rule, so α does not
bound its false winners, and how often it keeps an equal candidate is not measured (the A/A runs, in which every
config gives blocks, never reach this path); with the one-sided level (a578592) its bar fell from 1.124× to 1.099×.
The bound counts the main phase's shards committed before a kill; the blocks of a candidate's run cut before its
first look are not kept (only a look keeps the blocks it saw), so a rerun may reach the bound with too few blocks
and switch a winner away (unless its rate alone clears the bar above). Where trial 0 gave fewer than ``MIN_RUNS``
blocks there is no defaults' side to look against, and the main phase runs the defaults from its start
(``harness.batch.tune.tuning``). Every look is appended to ``tune/confirm.jsonl`` as it is made, so a killed job
resumes with the looks it has made and the samples they saw (merged as they were).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from statistics import NormalDist
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness.batch.job.job import SoFar
from harness.batch.tune.tune_prune import run_rate
from harness.batch.tune.tune_runs import RunRecord
from harness.report.stats import geometric_mean
from harness.report.verdict import ALPHA, CLEAR, CLOSE, EQUIVALENT, INSUFFICIENT, MIN_RUNS, t_quantile

KEEP, SWITCH = "keep the candidate", "switch to the engine defaults"
AHEAD = "ahead, not kept before the last look"   # a look's verdict where the candidate leads before the last look
# the share of α the keep holds back: whole jobs simulated at the full α, with runs as far apart as the allowance,
# kept an equal candidate in 4.5-5.2% (3 looks) and 5.05-5.6% (one look: helper-38) of jobs; at 0.8 α, 3.5-4.15%
KEEP_RESERVE = 0.2
WITHIN = 0.5    # the share of the main phase's shards by which the looks must have decided
ALTERNATE = "main, alternating"   # the label of the alternating runs' (``Alternation``)


BLOCK_STEPS = 128   # full steps an engine a block spans


class Blocks:
    """An ``on_commit`` hook that keeps a run's blocks (see the module's notes), then asks ``then``, if any (a trial's
    pruner, or the main phase's looks), and returns its answer (true: stop handing shards over); ``enough`` blocks
    (0: no such stop) once no more than ``left`` of the run's shards wait to be handed over stop it too."""

    def __init__(self, then: Any = None, steps: int = BLOCK_STEPS, enough: int = 0, left: int = 0):
        self.then, self.steps, self.values = then, steps, []
        self.enough, self.left = enough, left
        self._origin: tuple[float, float, int] = (0.0, 0.0, 0)   # full tokens, seconds and steps at the last block's end

    def __call__(self, so_far: SoFar) -> bool:
        point = (so_far.full_tokens, so_far.full_s, so_far.full_steps)
        if point[2] - self._origin[2] >= self.steps * max(so_far.engines, 1) and point[1] > self._origin[1]:
            self.values.append((point[0] - self._origin[0]) / (point[1] - self._origin[1]) * so_far.engines)
            self._origin = point
        stop = bool(self.then(so_far)) if self.then is not None else False
        return stop or bool(self.enough) and len(self.values) >= self.enough and so_far.left <= self.left


@dataclass
class Look:
    """One look of the in-main confirmation."""

    look: int                 # 1-based
    level: float              # the keep's one-sided level (``InMainRule.level``; before a578592 the look's two-sided
                              # Pocock level; 0.0: the bound's comparison with no look made)
    candidate: list[float]    # the candidate's blocks so far
    verdict: str
    ratio: float | None
    low: float | None
    high: float | None
    action: str | None        # KEEP, SWITCH, or None (look again)
    reason: str
    merged: int | None = None   # blocks a sample (0: a whole run, ``Alternation``; None: a log written before
                                # a578592, which did not record it)


class InMainRule:
    """The looks' rule: ``looks`` looks from the candidate's ``MIN_RUNS`` th sample on; only the last may keep the
    candidate, one-sided at ``level`` (see the module's notes)."""

    def __init__(self, looks: int, min_effect: float, run_spread: float, alpha: float = ALPHA):
        if looks < 1:
            raise ValueError("at least one look")
        self.looks, self.min_effect, self.run_spread, self.alpha = looks, min_effect, run_spread, alpha
        self.level = alpha * (1 - KEEP_RESERVE)   # the keep's one-sided level
        self.last_samples = MIN_RUNS + looks - 1   # the samples a side the last look compares

    def describe(self, runs: bool = False) -> str:
        samples = (f"the candidate's runs {MIN_RUNS} to {self.last_samples} (each a sample: its blocks' geometric "
                   "mean) against as many of the engine defaults', run in turn in the main phase" if runs else
                   f"the candidate's blocks {MIN_RUNS} to {self.last_samples} against the engine defaults' trial "
                   "blocks at the same places in its run (each sample as many consecutive blocks merged as trial 0 "
                   "gave over the last look's count)")
        return (f"{self.looks} look(s) at {samples}, Welch bounds one-sided at {self.level:g} (α = {self.alpha:g} "
                f"less a reserve of {KEEP_RESERVE:.0%}): only the last look keeps (the earlier ones only switch), a "
                f"run-to-run allowance of {self.run_spread:.1%} a side, minimum effect {self.min_effect:.0%}")

    def per_sample(self, blocks: int) -> int:
        """Blocks merged into each sample where the defaults' trial gave ``blocks``: those over the last look's count
        (``last_samples``) spread over its samples, rounded down; at least 1."""
        return max(1, blocks // self.last_samples)

    def look(self, candidate: list[float], defaults: list[float], merged: int = 1, last: bool = False,
             number: int | None = None) -> Look:
        """Look ``len(candidate) - MIN_RUNS + 1`` (or ``number``: the bound's look, on samples already looked at):
        the verdict on the samples so far against the defaults' first as many (like for like: see the module's
        notes), and what to do; ``last``: the last look whatever its number (the bound's). ``merged``: blocks a
        sample (named in the reason)."""
        j = len(candidate) - MIN_RUNS + 1
        if j < 1 or j > self.looks:
            raise ValueError(f"look {j} is outside 1..{self.looks}")
        j = number or j
        last = last or j == self.looks
        if len(defaults) < MIN_RUNS:
            return Look(j, self.level, list(candidate), INSUFFICIENT, None, None, None, SWITCH,
                        f"the defaults' trial gave {len(defaults)} block(s), under the {MIN_RUNS} the rule needs",
                        merged)
        lc, ld = [math.log(x) for x in candidate], [math.log(x) for x in defaults[:len(candidate)]]
        diff = statistics.fmean(lc) - statistics.fmean(ld)
        vc, vd = statistics.variance(lc) / len(lc), statistics.variance(ld) / len(ld)
        variance = vc + vd + 2 * self.run_spread ** 2   # the allowance is known, not estimated: no degrees of freedom
        estimated = vc ** 2 / (len(lc) - 1) + vd ** 2 / (len(ld) - 1)
        df = variance ** 2 / estimated if estimated > 0 else math.inf   # Welch-Satterthwaite
        half = (t_quantile(1 - self.level, df) if math.isfinite(df) and df < 1e6
                else NormalDist().inv_cdf(1 - self.level)) * math.sqrt(variance)
        # a tiny level with few blocks a side makes a huge t quantile: keep exp in range
        ratio, low, high = (math.exp(max(-700.0, min(700.0, x))) for x in (diff, diff - half, diff + half))
        margin = math.log1p(self.min_effect)
        text = (f"candidate ÷ defaults {ratio:.3f}x [{low:.3f}, {high:.3f}] (bounds one-sided at {self.level:g}) at "
                f"look {j} of {self.looks} ({len(lc)} vs {len(ld)} {samples(merged)})")
        ahead = diff - half > 0 and diff >= margin

        def made(verdict: str, action: str | None, why: str) -> Look:
            return Look(j, self.level, list(candidate), verdict, ratio, low, high, action, f"{text}: {why}", merged)

        if diff + half < 0:
            return made(CLEAR, SWITCH, "a clear loser")
        if abs(diff) + half <= margin:
            return made(EQUIVALENT, SWITCH,
                        f"within ±{self.min_effect:.0%} of the defaults, not worth an untried config")
        if last:
            return (made(CLEAR, KEEP, f"a clear winner by the {self.min_effect:.0%} minimum effect at the last look")
                    if ahead else made(CLOSE, SWITCH, "not a clear winner at the last look"))
        return made(AHEAD if ahead else CLOSE, None, ("ahead so far; " if ahead else "too close to call so far; ")
                    + "only the last look keeps")


class LookLog:
    """``tune/confirm.jsonl``: the looks made, oldest first (appended and fsynced as each is made)."""

    def __init__(self, root: Path):
        self.path = root / "confirm.jsonl"

    def read(self) -> list[Look]:
        if not self.path.exists():
            return []
        looks = []
        for line in self.path.read_text().splitlines():
            try:
                looks.append(Look(**json.loads(line)))
            except (json.JSONDecodeError, TypeError):   # a line cut by a kill: that look was not made
                continue
        return looks

    def append(self, look: Look) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(asdict(look)) + "\n")
            f.flush()
            os.fsync(f.fileno())


class Confirmation:
    """The main phase's looks: an ``on_commit`` hook (through ``Blocks``) that looks as the candidate's blocks come
    and stops the main phase on the candidate where the rule says to switch."""

    def __init__(self, rule: InMainRule, defaults: list[float], log: LookLog, steps: int = BLOCK_STEPS,
                 within: int | None = None, before: int = 0):
        # within: the main phase's shards (``WITHIN`` of them) by which it must decide; before: those it committed
        # in earlier invocations (a kill)
        self.rule, self.log, self.within, self.before = rule, log, within, before
        self.made = log.read()
        # a trial 0 of more blocks than the last look compares: each sample, both sides, ``merged`` blocks (as the
        # looks made before a kill merged them)
        self.merged = (self.made[-1].merged if self.made else None) or rule.per_sample(len(defaults))
        self.defaults = merge(defaults, self.merged)
        self.earlier = self.made[-1].candidate if self.made else []   # blocks of a run a kill cut
        self.blocks = Blocks(self._after_commit, steps)

    @property
    def action(self) -> str | None:
        """KEEP or SWITCH once decided (possibly by an earlier invocation), else None."""
        return self.made[-1].action if self.made else None

    @property
    def candidate(self) -> list[float]:
        return self.earlier + merge(self.blocks.values, self.merged)

    def _after_commit(self, so_far: SoFar) -> bool:
        if self.action is not None:
            return self.action == SWITCH
        done = self.before + so_far.shards
        bound = self.within is not None and done >= self.within
        candidate = self.candidate
        if len(candidate) >= MIN_RUNS and len(candidate) - MIN_RUNS + 1 > len(self.made):   # a look due
            look = self.rule.look(candidate, self.defaults, self.merged, last=bound)   # at the bound: the last
        elif bound:
            look = self._at_the_bound(so_far, done)
        else:
            return False
        self.log.append(look)
        self.made.append(look)
        return look.action == SWITCH

    def _at_the_bound(self, so_far: SoFar, done: int) -> Look:
        """The bound reached undecided. Where looks were made, the rule looks again at the samples so far as its
        last look (a clear winner is kept; else the rest runs on the defaults). Where none was made (fewer samples
        than the first look needs: an engine too fast for its feed), the candidate is kept if its rate so far (over
        all its steps, and over its blocks where it gave any: the lower) is above the defaults' blocks' geometric
        mean by the minimum effect and by the run allowance at the rule's level (``keep_above``): a point comparison
        with the rule's allowance, not the rule, so α does not bound its false winners."""
        text = (f"no decision after {done} of the main phase's shards (the bound: {WITHIN:.0%} of them, "
                f"{self.within}): the candidate gave {len(self.candidate)} {samples(self.merged, '(s)')} and the "
                f"looks made {len(self.made)} without deciding (the rule's first look needs {MIN_RUNS})")
        if self.made and self.defaults:
            look = self.rule.look(self.candidate, self.defaults, self.merged, last=True, number=len(self.made) + 1)
            return replace(look, reason=f"{text}; the bound's look is the last: {look.reason}")
        rates = [r for r in (run_rate(so_far), geometric_mean(self.candidate) if self.candidate else None) if r]
        mean = geometric_mean(self.defaults) if self.defaults else None
        ratio = min(rates) / mean if rates and mean else None
        if ratio is None:
            return Look(1, 0.0, list(self.candidate), INSUFFICIENT, None, None, None, SWITCH, text, self.merged)
        bar = self.keep_above()
        keep = ratio >= bar
        return Look(1, 0.0, list(self.candidate), INSUFFICIENT, ratio, None, None, KEEP if keep else SWITCH,
                    f"{text}; its rate so far, {min(rates):,.0f} tok/s, is {ratio:.3f}x the defaults' blocks' mean: "
                    f"{'kept, at or above' if keep else 'not at or above'} {bar:.3f}x (the {self.rule.min_effect:.0%} "
                    f"minimum effect and the run allowance at the rule's level)", self.merged)

    def keep_above(self) -> float:
        """The ratio a candidate with no look must reach at the bound: (1 + min_effect) × exp(z √2 run_spread), z at
        the rule's one-sided level: what the last look would ask of blocks with no spread."""
        z = NormalDist().inv_cdf(1 - self.rule.level)
        return (1 + self.rule.min_effect) * math.exp(z * math.sqrt(2) * self.rule.run_spread)

    def columns(self) -> dict[str, Any]:
        """The row's ``tune.confirm.*``."""
        last = self.made[-1] if self.made else None
        return {"tune.confirm.method": self.rule.describe(), "tune.confirm.looks": len(self.made),
                "tune.confirm.blocks_merged": self.merged,
                "tune.confirm.defaults_blocks": self.defaults, "tune.confirm.candidate_blocks": self.candidate,
                "tune.confirm.action": last.action if last else None,
                "tune.confirm.reason": last.reason if last else "no look made (the main phase ended first)"}


def samples(merged: int, plural: str = "s") -> str:
    """What a look's samples are: ``blocks``, ``samples of n blocks`` where ``merged`` (n) is over 1, ``runs`` at 0."""
    return f"run{plural}" if merged == 0 else f"block{plural}" if merged == 1 else f"sample{plural} of {merged} blocks"


def merge(blocks: list[float], n: int) -> list[float]:
    """Each ``n`` consecutive blocks as one (their geometric mean), a run's last incomplete group left out."""
    if n == 1:
        return list(blocks)
    return [geometric_mean(blocks[i:i + n]) for i in range(0, len(blocks) - n + 1, n)]


def run_sample(record: RunRecord) -> float | None:
    """A run's sample in the alternating runs' looks: its blocks' geometric mean (its full steps); None where it gave
    no block (its rate, ramp and drain included, would not compare with the others')."""
    return geometric_mean(record.blocks) if record.blocks else None


def alternate_estimate(records: list[RunRecord], candidate: dict[str, Any], k: int, shards_left: int, share: float,
                       runs: int) -> dict[str, Any]:
    """Whether the main phase alternates ``runs`` runs a side of ``k`` shards (``Alternation``), from the trials'
    ``records``: ``alternate``, the estimate (``cost_s``, ``rest_s``) and ``why``.

    Their cost: each run one engine start (the mean of the trials' restarts: their time outside generation) and one
    more ramp and drain (a trial's generation time beyond its tokens at its full-steps rate: its full-engine rate,
    else its blocks' geometric mean), and the defaults' runs' shards at trial 0's time a shard less the candidate's
    trial's; the rest: the shards left at the candidate's trial's time a shard. They alternate where that cost is at
    most ``share`` of the rest, the runs fit in ``WITHIN`` of the shards left, and a run would give at least 2
    blocks (by the fewer blocks a shard of the two trials)."""
    trials = [r for r in records if r.kind == "trial" and r.status == "ok"]
    own, mine = ([r for r in trials if r.values == values][-1:] for values in ({}, candidate))
    starts = [r.wall_s - r.generation_s for r in records[1:] if not r.engines_kept and r.wall_s > 0]
    pair = own + mine   # trial 0's last ok run, the candidate's (where both ran)

    def full_rate(run: RunRecord) -> float | None:
        return run.full_engine_tok_s or (geometric_mean(run.blocks) if run.blocks else None)

    why = ("batch.tune.alternate_share=0" if not share else "no ok trial of both configs" if len(pair) < 2
           else "no restart measured" if not starts else "no full-steps rate to price a ramp and drain"
           if not all(full_rate(r) for r in pair) else None)
    if why:
        return {"alternate": False, "why": f"not made: {why}"}
    d, c = (r.generation_s / max(len(r.shards), 1) for r in pair)
    drains = sum(max(0.0, r.generation_s - r.output_tokens / full_rate(r)) for r in pair)
    cost = runs * (2 * sum(starts) / len(starts) + drains + k * max(0.0, d - c))
    rest = shards_left * c
    blocks = min(len(r.blocks) / max(len(r.shards), 1) for r in pair) * k
    fits = 2 * runs * k <= WITHIN * shards_left
    alternate = fits and blocks >= 2 and 0 < cost <= share * rest
    why = (f"{2 * runs} runs of {k} shards would cost about {cost:,.0f} s (starts, ramps and drains, the defaults' "
           f"slower shards) of a rest of about {rest:,.0f} s: {cost / rest if rest else math.inf:.2%}, "
           f"{'within' if cost <= share * rest else 'over'} batch.tune.alternate_share={share:g}"
           + ("" if fits else "; their shards do not fit in half of those left")
           + ("" if blocks >= 2 else f"; a run would give about {blocks:.1f} blocks, under 2"))
    return {"alternate": alternate, "cost_s": cost, "rest_s": rest, "why": ("made: " if alternate else "not made: ")
            + why}


class Alternation:
    """The confirmation by alternating runs, where the job is long enough for them to cost little
    (``batch.tune.alternate_share``): the main phase's first runs take ``shards_per_run`` sampled shards each, the
    engine defaults and the candidate in turn (the defaults first, so that a keep goes on with the candidate's
    engines), each one engine start and one sample (``run_sample``). Trial 0 is no sample: it ran before the main
    phase, on more shards, with workers started ahead, and it lost the ranking that picked the candidate (a low
    trial 0 would carry that selection into the verdict). The rule looks as in the blocks' confirmation (only the
    last look keeps, one-sided at ``level``) but on whole runs, with no run allowance: each sample is an independent
    run of the same size, so the spread between runs is measured, not assumed, and host drift falls on both sides.
    The looks come after the candidate's ``MIN_RUNS`` th run and each run to its ``last_samples`` th; the job then
    runs the rest on the config the looks chose."""

    def __init__(self, rule: InMainRule, log: LookLog | None):   # log None: not kept (a simulation's)
        self.rule = InMainRule(rule.looks, rule.min_effect, 0.0, rule.alpha)
        self.log, self.made = log, log.read() if log else []
        self.samples: tuple[list[float], list[float]] = ([], [])   # the candidate's, the defaults'

    @property
    def action(self) -> str | None:
        return self.made[-1].action if self.made else None

    def next(self, candidate: list[float], defaults: list[float]) -> bool | None:
        """Looks where a look is due; then which config runs next (True: the candidate), None once decided."""
        self.samples = (candidate, defaults)
        due = len(candidate) - MIN_RUNS + 1
        if self.action is None and due > len(self.made) and len(defaults) >= len(candidate):
            self._append(self.rule.look(candidate, defaults, merged=0))
        return None if self.action is not None else len(defaults) > len(candidate)

    def stop(self, why: str, action: str = SWITCH) -> None:
        """Decided without a look (a run failed, gave no block, or the shards ran out): ``action``."""
        self._append(Look(len(self.made) + 1, 0.0, list(self.samples[0]), INSUFFICIENT, None, None, None, action,
                          why, 0))

    def _append(self, look: Look) -> None:
        if self.log:
            self.log.append(look)
        self.made.append(look)

    def columns(self) -> dict[str, Any]:
        """The row's ``tune.confirm.*``."""
        last = self.made[-1] if self.made else None
        return {"tune.confirm.method": f"alternating runs: {self.rule.describe(runs=True)}",
                "tune.confirm.looks": sum(look.ratio is not None for look in self.made),   # a stop is no look
                "tune.confirm.blocks_merged": 0, "tune.confirm.candidate_blocks": self.samples[0],
                "tune.confirm.defaults_blocks": self.samples[1], "tune.confirm.action": last.action if last else None,
                "tune.confirm.reason": last.reason if last else "no look made"}
