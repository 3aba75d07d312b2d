"""Predictions kept beside their measurements, read from the rows: each predictor's track record.

A row may carry, for any predictor ``NAME``, the columns ``prediction.<NAME>.predicted``,
``.measured``, ``.unit``, ``.error`` (measured ÷ predicted − 1), ``.lo``/``.hi`` (the
prediction's interval) and ``.note`` (``harness.steps.predict.prediction_columns``). Run rows
(``results/runs``) and batch rows (``results/batch``) are both read; the report's filters apply
to both (a batch row without a filtered column, e.g. ``workload``, is left out when that filter is set).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from harness.report.data import Filters, filter_runs
from harness.report.document import (Figure, Paragraph, RowLink, Section, Table, first_line, fmt,
                                     fmt_interval)
from harness.run.results import BATCH_DIR, read_rows

PREFIX = "prediction."
FIELDS = ("predicted", "measured", "unit", "error", "lo", "hi", "note")
COLUMNS = ["predictor", "engine", "table", "run_id", "timestamp", "_time", "predicted", "measured", "unit",
           "error", "lo", "hi", "inside", "note"]
LATEST = 5   # the latest predictions shown per predictor and engine


def predictor_names(keys: Iterable[str]) -> list[str]:
    """The ``NAME``s of ``prediction.<NAME>.<field>`` keys, sorted."""
    names = set()
    for key in keys:
        if key.startswith(PREFIX) and "." in key[len(PREFIX):]:
            name, field = key[len(PREFIX):].rsplit(".", 1)
            if field in FIELDS:
                names.add(name)
    return sorted(names)


def records(rows: Iterable[dict[str, Any]], table: str = "runs") -> pd.DataFrame:
    """One record per row and predictor that made a prediction (``COLUMNS``); a missing measurement stays None."""
    out = []
    for row in rows:
        for name in predictor_names(row):
            record = _record(row, name, table)
            if record is not None:
                out.append(record)
    frame = pd.DataFrame.from_records(out, columns=COLUMNS)
    frame["_time"] = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce", format="ISO8601")
    return frame.sort_values(["_time", "run_id"], kind="stable").reset_index(drop=True)


def _record(row: dict[str, Any], name: str, table: str) -> dict[str, Any] | None:
    def get(field: str) -> Any:
        return row.get(f"{PREFIX}{name}.{field}")

    predicted = _number(get("predicted"))
    if predicted is None:
        return None
    measured, error, lo, hi = (_number(get(f)) for f in ("measured", "error", "lo", "hi"))
    if error is None and measured is not None and predicted:
        error = measured / predicted - 1
    if measured is None:
        error = None
    inside = None if measured is None or lo is None or hi is None else bool(lo <= measured <= hi)
    return {"predictor": name, "engine": str(row.get("engine") or "unknown"), "table": table,
            "run_id": str(row.get("run_id")), "timestamp": row.get("timestamp"), "_time": None,
            "predicted": predicted, "measured": measured, "unit": _text(get("unit")), "error": error,
            "lo": lo, "hi": hi, "inside": inside, "note": _text(get("note"))}


def collect(results_dir: str | Path, runs: pd.DataFrame, filters: Filters = Filters()) -> pd.DataFrame:
    """The predictions of the report's (filtered) run rows and of the batch rows the same filters keep."""
    batch = [r for r in read_rows(results_dir, BATCH_DIR) if predictor_names(r)]
    frames = [records(runs.to_dict("records"), "runs")]
    if batch:
        kept = pd.DataFrame.from_records(batch)
        kept["run_id"] = kept.get("run_id")
        kept["_time"] = pd.to_datetime(kept.get("timestamp"), utc=True, errors="coerce", format="ISO8601")
        frames.append(records(filter_runs(kept, filters).to_dict("records"), BATCH_DIR))
    found = [f for f in frames if len(f)]
    if not found:
        return frames[0]
    return pd.concat(found, ignore_index=True).sort_values(["_time", "run_id"], kind="stable").reset_index(drop=True)


def track_record(predictions: pd.DataFrame) -> pd.DataFrame:
    """Per predictor and engine: counts, median and worst absolute error (with its row), in-interval share."""
    lines = [_line(predictor, engine, group) for (predictor, engine), group
             in predictions.groupby(["predictor", "engine"], sort=True)]
    return pd.DataFrame.from_records(lines)


def _line(predictor: str, engine: str, group: pd.DataFrame) -> dict[str, Any]:
    measured = group[group["error"].notna()]
    errors = measured["error"].astype(float)
    worst = measured.loc[errors.abs().idxmax()] if len(measured) else None
    judged = measured[measured["inside"].notna()]
    return {
        "predictor": predictor, "engine": engine, "units": ", ".join(sorted({u for u in group["unit"] if u})),
        "predictions": len(group), "measured": len(measured),
        "median_abs_error": float(np.median(errors.abs())) if len(measured) else math.nan,
        "median_error": float(np.median(errors)) if len(measured) else math.nan,
        "worst_abs_error": abs(float(worst["error"])) if worst is not None else math.nan,
        "worst_error": float(worst["error"]) if worst is not None else math.nan,
        "worst_run_id": worst["run_id"] if worst is not None else None,
        "worst_table": worst["table"] if worst is not None else None,
        "with_interval": len(judged), "inside": int(judged["inside"].astype(bool).sum()),
        "inside_share": float(judged["inside"].astype(bool).mean()) if len(judged) else math.nan,
    }


def latest(predictions: pd.DataFrame, n: int = LATEST) -> pd.DataFrame:
    """The ``n`` newest predictions of each predictor and engine, newest first within each."""
    newest = predictions.sort_values(["_time", "run_id"], ascending=False, kind="stable")
    return newest.groupby(["predictor", "engine"], sort=True).head(n).sort_values(
        ["predictor", "engine", "_time", "run_id"], ascending=[True, True, False, False], kind="stable")


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


TITLE = "Predictions and their track record"
NO_TRACK_RECORD = ("No row here carries a prediction (prediction.<name>.* columns), so there is no track record yet. "
                   "To get one, run the real engine twice on this host (e.g. troughput-run engine=vllm "
                   "workload=unique, twice): every vLLM run is predicted before it runs from the step traces of this "
                   "host's earlier runs, so the second run is predicted from the first's step trace, and its row "
                   "keeps that prediction beside what it then measured.")


def section(report) -> Section:
    """The track record per predictor and engine, the plot, and the latest predictions; or how to get one."""
    predictions = report.predictions
    if predictions is None or predictions.empty:
        return Section(TITLE, "predictions", [Paragraph([NO_TRACK_RECORD])])
    lines = track_record(predictions)
    measured = int(lines["measured"].sum())
    names = ", ".join(sorted(lines["predictor"].unique()))
    lead = (f"{len(predictions)} prediction(s) by {lines['predictor'].nunique()} predictor(s) ({names}), {measured} of "
            f"them with a measurement. Each was made before its run and kept in the row beside what was then "
            f"measured. The error is measured ÷ predicted − 1 (positive: the measurement came out above the "
            f"prediction, whether a rate or seconds); |error| is its size and the median error its bias. "
            f"'inside interval' counts measurements within the prediction's interval [lo, hi]. Read the median "
            f"|error| as how far to trust the next prediction of that predictor on that engine, and the worst as "
            f"how far one has gone wrong.")
    blocks: list[Any] = [Paragraph([lead]), track_record_table(lines)]
    blocks += [Figure(p) for p in report.plots if p.name == "predictions"]
    blocks += [Paragraph([f"The latest {LATEST} prediction(s) of each predictor and engine, newest first:"]),
               latest_table(latest(predictions))]
    return Section(TITLE, "predictions", blocks)


def track_record_table(lines: pd.DataFrame) -> Table:
    rows = []
    for line in lines.to_dict("records"):
        worst = ([RowLink(line["worst_run_id"], line["worst_table"]), f" ({fmt(line['worst_error'], 'pct')})"]
                 if line["worst_run_id"] else "–")
        inside = (f"{line['inside']} of {line['with_interval']} ({fmt(line['inside_share'], 'share')})"
                  if line["with_interval"] else "– (no interval)")
        rows.append([line["predictor"], line["engine"], line["units"] or "–", str(line["predictions"]),
                     str(line["measured"]), fmt(line["median_abs_error"], "share"), fmt(line["median_error"], "pct"),
                     fmt(line["worst_abs_error"], "share"), worst, inside])
    return Table(["predictor", "engine", "unit", "predictions", "measured", "median |error|", "median error",
                  "worst |error|", "worst row (error)", "inside interval"], rows, id="prediction-track-record")


def latest_table(shown: pd.DataFrame) -> Table:
    rows = []
    for r in shown.to_dict("records"):
        inside = "–" if r["inside"] is None or pd.isna(r["inside"]) else fmt(bool(r["inside"]))
        rows.append([r["predictor"], r["engine"], RowLink(r["run_id"], r["table"]), str(r["timestamp"] or "–")[:19],
                     fmt(r["predicted"]), fmt(r["measured"]), r["unit"] or "–", fmt(r["error"], "pct"),
                     fmt_interval(r["lo"], r["hi"]), inside, first_line(r["note"], 200) or "–"])
    return Table(["predictor", "engine", "row", "time", "predicted", "measured", "unit", "error", "interval",
                  "inside", "note"], rows, id="prediction-latest")
