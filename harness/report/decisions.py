"""Engine-choice decisions: computed from rows, recorded append-only, never edited.

For each cell (workload fingerprint, model, hardware, host id) the first-ranked config (highest
geometric mean of output tok/s over its samples: its independent runs from two runs on, else the
passes of its one run; the estimate the verdict compares) is chosen; the runner-up is the first-ranked
config of another engine, or, with one engine only, its second-ranked config. ``indistinguishable``
lists every other config the rule does not put clearly behind the chosen one, with that pair's verdict:
where the pair is too close to call or equivalent, the page names them all instead of a best. Rows from
different hosts (``env.host_id``) are different cells, so configs are never compared across hosts.

The verdict is the one rule of ``harness.report.verdict`` applied to the two configs' per-run
rates (each run's median pass): ``clear winner``, ``equivalent`` or ``too close to
call``, with the ratio's interval as the margin; or ``insufficient data`` (no runner-up,
no successful run, or fewer than ``MIN_RUNS`` independent runs on a side, flagged
``single run`` or ``too few runs`` with the command that adds rounds). The configs are
ranked by the rule's own estimate, so the chosen config is the faster by the rule.

Decisions live in ``<results_dir>/decisions/<decision_id>.json``, written like runs
(atomic, never overwritten). A decision is only appended when its basis (the rows it
rests on and the method) differs from the cell's latest one, so rebuilding a report
from the same rows adds nothing, and every earlier decision stays.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from harness.report.data import CELL, METRIC, cells
from harness.report.quality import QualityGuard
from harness.report.sequential import SequentialPlan
from harness.report.stats import CI_METHOD, STATISTIC
from harness.run.results import DECISIONS_DIR, prefixed, new_run_id, read_rows, write_row
from harness.report.verdict import (CLEAR, CLOSE, EQUIVALENT, INSUFFICIENT, METHOD, MIN_EFFECT, MIN_RUNS, VERDICTS,
                             compare)

__all__ = ["CLEAR", "CLOSE", "EQUIVALENT", "INSUFFICIENT", "METHOD", "MIN_RUNS", "VERDICTS", "decide", "record",
           "history"]
SIDE_FIELDS = ("engine", "engine_version", "ordering", "config_id", "label", METRIC, "ci_low", "ci_high",
               "n_passes", "n_runs", "run_values", "sample_kind", "cv_runs", "runs_disagree", "run_ids", "commands",
               "total_tok_s", "req_s", "full_engine_tok_s")


def decide(frame: pd.DataFrame, configs: pd.DataFrame, n_boot: int = 2000, level: float = 0.95,
           seed: int = 0, guard: QualityGuard = QualityGuard(), min_effect: float = MIN_EFFECT,
           plan: SequentialPlan | None = None) -> list[dict[str, Any]]:
    """One decision per cell of ``configs`` (as built by ``group_configs`` from ``frame``).

    ``level`` is for the per-config intervals shown beside the decision (``n_boot`` and ``seed`` are no
    longer used: those intervals are t intervals of the geometric mean); the verdict is ``harness.report.verdict.compare`` at its α = 0.05 and ``min_effect``, or,
    with a ``plan`` (a loop that looks again: ``run.rounds=auto``), at the plan's level for the look.

    Configs that fail the quality ``guard`` are never chosen nor the runner-up; those that
    measured faster than the chosen one are named in ``rejected_for_quality`` with their gain.
    """
    decisions = []
    for key, group in cells(configs):
        rows = frame
        for column, value in zip(CELL, key):
            rows = rows[rows[column] == value]
        measured = group[group["n_passes"] > 0]
        failing = {cid: guard.failing(c) for cid, c in zip(measured["config_id"], measured.to_dict("records"))}
        rejected = measured[[failing[cid] is not None for cid in measured["config_id"]]]
        measured = measured[[failing[cid] is None for cid in measured["config_id"]]]
        winner = measured.iloc[0] if len(measured) else None
        runner_up, relation = _runner_up(measured)
        looks = plan or _looks_of(measured)   # a cell a rounds=auto loop added runs to: judged by its plan
        if runner_up is not None and _rule_prefers(runner_up, winner, min_effect, looks):
            winner, runner_up = runner_up, winner
        decision: dict[str, Any] = dict(zip(CELL, key)) | {
            "kind": "engine_choice", "metric": METRIC, "statistic": STATISTIC, "min_runs_for_clear": MIN_RUNS,
            "method": METHOD if looks is None else f"{METHOD}; {looks.describe(min_effect)}", "min_effect": min_effect,
            "ci_level": level, "ci_method": CI_METHOD,
            "rests_on": sorted(rows.loc[rows["status"] == "ok", "run_id"]),
            "failed_runs": sorted(rows.loc[rows["status"] != "ok", "run_id"]),
        }
        if winner is not None:
            decision |= _side("chosen", winner)
        if runner_up is not None:
            decision |= _side("runner_up", runner_up) | {"runner_up.relation": relation}
        decision |= _verdict(winner, runner_up, len(rows), min_effect, looks)
        decision["indistinguishable"] = _indistinguishable(winner, measured, min_effect, looks)
        decision |= _uncounted(measured, looks)
        if decision.get("uncounted_runs"):   # it rests on the counted runs only; the others are named apart
            decision["rests_on"] = [r for r in decision["rests_on"] if r not in set(decision["uncounted_runs"])]
            decision["flags"] = [*decision["flags"], "runs past the plan's last look"]
            decision["reason"] += f"; {decision['uncounted_note']}"
        if decision["verdict"] in (CLOSE, EQUIVALENT) and len(decision["indistinguishable"]) > 1:
            others = "; ".join(f"{c['engine']}: {c['label']} ({c['verdict']})" for c in decision["indistinguishable"])
            decision["reason"] += f"; the rule cannot tell the first-ranked config from any of: {others}"
        elif decision["verdict"] == CLEAR and decision["indistinguishable"]:
            others = "; ".join(f"{c['engine']}: {c['label']} ({c['verdict']})" for c in decision["indistinguishable"])
            decision["reason"] += (f"; the winner is clear against the runner-up, but the rule cannot tell it from: "
                                   f"{others}")
        decision |= _rejections(rejected, winner, failing)
        decision["basis"] = _basis(decision)
        decisions.append(decision)
    return decisions


def _indistinguishable(first: pd.Series | None, measured: pd.DataFrame, min_effect: float,
                       plan: SequentialPlan | None) -> list[dict[str, Any]]:
    """Every other measured config of the cell that the rule does not put clearly behind the first-ranked one
    (too close to call, equivalent, or too few runs to compare), in rank order, with that pair's verdict: where
    the cell is not decided, the configs the page names instead of a best."""
    if first is None:
        return []
    out = []
    for other in measured.to_dict("records"):
        if other["config_id"] == first["config_id"]:
            continue
        if min(len(first["run_values"]), len(other["run_values"])) < MIN_RUNS:
            verdict = INSUFFICIENT
        else:
            verdict = _judge(first["run_values"], other["run_values"], min_effect, plan, estimate_rounds=False).verdict
        if verdict != CLEAR:
            out.append({"engine": other["engine"], "label": other["label"], "config_id": other["config_id"],
                        "verdict": verdict})
    return out


def _rejections(rejected: pd.DataFrame, winner: pd.Series | None,
                failing: dict[str, str | None]) -> dict[str, Any]:
    """The faster configs the quality guard passed over: ``rejected_for_quality`` and ``quality_note``."""
    best = None if winner is None else winner[METRIC]
    faster = [c for c in rejected.to_dict("records") if best is None or c[METRIC] > best]
    if not faster:
        return {}
    entries = [{"engine": c["engine"], "label": c["label"], "config_id": c["config_id"],
                "why": failing[c["config_id"]], "gain": None if not best else c[METRIC] / best - 1} for c in faster]
    told = "; ".join(f"{e['engine']}: {e['label']} ({_gain(e['gain'])}{e['why']})" for e in entries)
    return {"rejected_for_quality": entries, "quality_note": f"faster but rejected for output quality: {told}"}


def _gain(gain: float | None) -> str:
    return "" if gain is None else f"{gain:+.1%} output tok/s over the chosen config, "


def _runner_up(measured: pd.DataFrame) -> tuple[pd.Series | None, str | None]:
    if len(measured) < 2:
        return None, None
    winner = measured.iloc[0]
    others = measured[measured["engine"] != winner["engine"]]
    if len(others):
        return others.iloc[0], "first-ranked config of another engine"
    return measured.iloc[1], "second-ranked config of the same engine (no other engine measured)"


def _side(prefix: str, config: pd.Series) -> dict[str, Any]:
    side = {field: _plain(config.get(field)) for field in SIDE_FIELDS}
    return prefixed(prefix, side) | prefixed(f"{prefix}.knob", dict(config["knobs"]))


def _looks_of(measured: pd.DataFrame) -> SequentialPlan | None:
    """The plan of the first ``rounds=auto`` loop that added runs to the cell (``data.loop_plans``), so the report
    judges its configs at the level of that plan's last look, on the runs it counts; None for a cell no loop added
    runs to (one look: the plain rule)."""
    labels = {str(v) for v in measured.get("looks", pd.Series(dtype=object)) if isinstance(v, str) and "-" in v}
    if not labels:
        return None
    first, last = (int(x) for x in labels.pop().split("-"))   # one per cell (data.loop_plans)
    return SequentialPlan(first, last)


def _uncounted(measured: pd.DataFrame, looks: SequentialPlan | None) -> dict[str, Any]:
    """``uncounted_runs``: the runs past the plan's last look, which no verdict or estimate of the cell counts."""
    ids = sorted(run_id for ids in measured.get("uncounted_run_ids", pd.Series(dtype=object)) if isinstance(ids, list)
                 for run_id in ids)
    if not ids or looks is None:
        return {}
    return {"uncounted_runs": ids,
            "uncounted_note": f"{len(ids)} run(s) of its configs past the last look of the loop that first added "
                              f"rounds here ({looks.last} runs a side) are not counted: another look would spend "
                              f"more than α = {looks.alpha:g}; report them on their own (troughput-report --since "
                              f"or --sweep-id)"}


def _judge(a: list, b: list, min_effect: float, plan: SequentialPlan | None, estimate_rounds: bool = True):
    return (compare(a, b, min_effect, estimate_rounds=estimate_rounds) if plan is None
            else plan.judge(a, b, min_effect, estimate_rounds=estimate_rounds))


def _rule_prefers(b: pd.Series, a: pd.Series, min_effect: float, plan: SequentialPlan | None = None) -> bool:
    """Whether the rule's estimate puts ``b`` ahead of ``a`` (both with enough runs)."""
    if min(len(a["run_values"]), len(b["run_values"])) < MIN_RUNS:
        return False
    return _judge(a["run_values"], b["run_values"], min_effect, plan).ratio < 1


def _verdict(winner, runner_up, n_rows: int, min_effect: float, plan: SequentialPlan | None = None
             ) -> dict[str, Any]:
    out: dict[str, Any] = {"margin": None, "margin_ci_low": None, "margin_ci_high": None, "flags": [],
                           "rounds_needed": None, "spread_log": None}
    if winner is None:
        return out | {"verdict": INSUFFICIENT, "flags": ["no successful run"],
                      "reason": f"all {n_rows} run(s) of this cell failed"}
    if runner_up is None:
        return out | {"verdict": INSUFFICIENT, "flags": ["no runner-up"],
                      "reason": "only one config was measured here: nothing to compare it with"}
    out["margin"] = winner[METRIC] / runner_up[METRIC] - 1

    def basis(first: str) -> str:   # 'winner' only for a clear winner: elsewhere the rule named no best
        return f"{first}: {_basis_of(winner)}; runner-up: {_basis_of(runner_up)}"

    sides = (("first-ranked config", winner), ("runner-up", runner_up))
    few = [f"the {name} has {side['n_runs']}" for name, side in sides if side["n_runs"] < MIN_RUNS]
    if few:
        flag = "single run" if any(side["n_runs"] < 2 for _, side in sides) else "too few runs"
        return out | {"verdict": INSUFFICIENT, "flags": [flag], "rounds_needed": MIN_RUNS,
                      "reason": f"the rule needs {MIN_RUNS} independent runs per side and {' and '.join(few)} "
                                f"({basis('first-ranked')}): {_add_runs()}"}
    verdict = _judge(winner["run_values"], runner_up["run_values"], min_effect, plan)
    first = "winner" if verdict.verdict == CLEAR else "first-ranked"
    return out | {"verdict": verdict.verdict, "margin": verdict.ratio - 1, "margin_ci_low": verdict.low - 1,
                  "margin_ci_high": verdict.high - 1, "rounds_needed": verdict.rounds_needed,
                  "spread_log": verdict.spread, "reason": f"{first} ÷ runner-up {verdict.reason} ({basis(first)})"}


def _basis_of(side) -> str:
    if side["sample_kind"] == "runs":
        return f"{side['n_runs']} independent runs"
    return f"{side['n_passes']} passes of 1 run, not independent"


def _add_runs() -> str:
    return (f"measure {MIN_RUNS} or more independent runs per config, interleaved, with a round dimension first "
            f"in the multirun (troughput-run -m run.round=1,2,3 <the configs compared>), or let troughput-run "
            f"add rounds until the rule decides (troughput-run -m run.rounds=auto <the configs compared>)")


def _basis(decision: dict[str, Any]) -> str:
    keys = [*CELL, "metric", "statistic", "min_runs_for_clear", "method", "min_effect", "ci_level", "ci_method",
            "rests_on", "failed_runs"]
    return hashlib.sha256(json.dumps({k: decision[k] for k in keys}, sort_keys=True).encode()).hexdigest()[:16]


def cell_of(decision: dict[str, Any]) -> tuple:
    return tuple(decision.get(column) for column in CELL)


def read_decisions(results_dir: str | Path) -> list[dict[str, Any]]:
    """All recorded decisions, oldest first."""
    return sorted(read_rows(results_dir, DECISIONS_DIR), key=lambda d: (d.get("timestamp", ""), d["decision_id"]))


def history(results_dir: str | Path) -> dict[tuple, list[dict[str, Any]]]:
    """Recorded decisions per cell, oldest first (the last one is the cell's latest)."""
    by_cell: dict[tuple, list[dict[str, Any]]] = {}
    for decision in read_decisions(results_dir):
        by_cell.setdefault(cell_of(decision), []).append(decision)
    return by_cell


def record(results_dir: str | Path, decisions: list[dict[str, Any]], extra: dict[str, Any] | None = None
           ) -> list[dict[str, Any]]:
    """Append each decision whose basis differs from its cell's latest; return the cells' latest decisions.

    Each returned decision carries ``recorded`` (``new`` or ``unchanged``).
    """
    previous = history(results_dir)
    latest = []
    for decision in decisions:
        before = previous.get(cell_of(decision), [])
        if before and before[-1].get("basis") == decision["basis"]:   # same rows and method: the recorded one, with
            latest.append(decision | before[-1] | {"recorded": "unchanged"})   # what newer code derives from them
            continue
        row = _jsonable(decision | (extra or {}) | {
            "decision_id": new_run_id(), "timestamp": datetime.now(timezone.utc).isoformat(),
            "supersedes": before[-1]["decision_id"] if before else None})
        write_row(results_dir, row, kind=DECISIONS_DIR, id_key="decision_id")
        latest.append(row | {"recorded": "new"})
    return latest


def chosen_knobs(decision: dict[str, Any], side: str = "chosen") -> dict[str, Any]:
    prefix = f"{side}.knob."
    return {k.removeprefix(prefix): v for k, v in decision.items() if k.startswith(prefix) and v is not None}


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return _plain(value)
