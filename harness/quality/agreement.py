"""How closely a run's greedy outputs agree with a reference config's, token by token.

For each request, the two output token lists are compared position by position:
``identical`` counts requests whose outputs are the same list; ``first_diff_mean`` is the
mean position of the first differing token over the requests that differ (a length
difference counts at the shorter length); ``token_agreement`` is the share of the
reference's output tokens matched at the same position. Only requests present in both
are compared (by id); the count is ``quality.compared``.
"""

from __future__ import annotations

from typing import Any


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ, or ``None`` when they are the same."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def columns(outputs: dict[str, list[int]], reference: dict[str, list[int]]) -> dict[str, Any]:
    """``quality.*`` agreement columns of ``outputs`` (id -> token ids) against ``reference``."""
    ids = [i for i in reference if i in outputs]
    if not ids:
        return {"quality.compared": 0}
    firsts = [first_difference(outputs[i], reference[i]) for i in ids]
    differing = [f for f in firsts if f is not None]
    matched = sum(sum(x == y for x, y in zip(outputs[i], reference[i])) for i in ids)
    reference_tokens = sum(len(reference[i]) for i in ids)
    return {
        "quality.compared": len(ids),
        "quality.identical": len(ids) - len(differing),
        "quality.identical_rate": (len(ids) - len(differing)) / len(ids),
        "quality.first_diff_mean": sum(differing) / len(differing) if differing else None,
        "quality.token_agreement": matched / reference_tokens if reference_tokens else 1.0,
    }
