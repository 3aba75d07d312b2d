"""troughput-tune's confirmation judges k candidates against one default: k chances to call a false winner.

A/A: every candidate and the default draw their runs from the same distribution (log-normal, 5% spread, 3 runs a
side, the default ``tune.confirm_rounds``), so any candidate called a clear winner over the default is a false
winner, and a tuned file would be written for nothing. Judged at the plain level each, the chance of any grows with
k (about 8% at six candidates here); ``judge_candidates`` keeps it at 5% or under for every k.
"""

import numpy as np
import pytest

from harness.report.verdict import CLEAR, compare
from harness.tune.best import judge_candidates

TRIALS = 3000


def _confirmations(k: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(TRIALS):
        yield {"default": list(100 * np.exp(rng.normal(0, 0.05, 3))),
               **{f"trial {i}": list(100 * np.exp(rng.normal(0, 0.05, 3))) for i in range(k)}}


def _false_winner_rate(judge, k: int, seed: int = 0) -> float:
    hits = 0
    for measured in _confirmations(k, seed):
        verdicts = judge(measured)
        hits += any(v is not None and v.verdict == CLEAR and v.winner == "a" for v in verdicts.values())
    return hits / TRIALS


def _each_at_the_plain_level(measured):
    return {n: compare(v, measured["default"]) for n, v in measured.items() if n != "default"}


def test_the_plain_level_for_each_of_six_candidates_calls_false_winners_too_often():
    assert _false_winner_rate(_each_at_the_plain_level, 6) > 0.06


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_the_confirmation_s_false_winner_rate_is_at_most_five_percent_for_any_number_of_candidates(k):
    assert _false_winner_rate(judge_candidates, k) <= 0.05


def test_two_candidates_keep_the_plain_level():
    """Only the candidate's side of each comparison harms (α/2 each), so two candidates need no correction."""
    measured = next(_confirmations(2, 3))
    judged = judge_candidates(measured)
    assert all((judged[n].low, judged[n].high) == (compare(measured[n], measured["default"]).low,
                                                   compare(measured[n], measured["default"]).high)
               for n in ("trial 0", "trial 1"))
    four = judge_candidates({**measured, "trial 2": measured["trial 0"], "trial 3": measured["trial 1"]})
    assert four["trial 0"].high - four["trial 0"].low > judged["trial 0"].high - judged["trial 0"].low
