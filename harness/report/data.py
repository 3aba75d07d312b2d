"""Load the results table, filter it, and group its rows into configs and cells.

A *config* is everything that defines a measured setup: engine, model, hardware,
workload fingerprint, ordering and the ``knob.*`` values. Rows with the same
config are its independent runs (one engine process each, e.g. the rounds of
``-m run.round=1,2,3 ...``); its passes are the union of their
``output_tok_s_passes``. A config's *samples* are its runs (each run's median pass)
once it has two or more, else the passes of its one run, which share a process
and a cache state and are not independent (``sample_kind`` says which). A *cell*
is what a decision is made for: one workload (by fingerprint) on one model and
one hardware.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.errors import TroughputError
from harness.report.quality import COLUMNS as QUALITY_COLUMNS
from harness.report.stats import geometric_interval, geometric_mean, representative, spread
from harness.run.results import read_rows

CELL = ["workload", "workload_fingerprint", "model", "hardware", "host_id"]
UNRECORDED_HOST = "unrecorded"
IDENTITY = ["engine", *CELL, "ordering"]
METRIC = "output_tok_s"
MIN_RUNS_FOR_RUN_STATISTICS = 2    # from this many runs on, a config's samples are its runs, not its passes
RUNS_DISAGREE = 0.10               # runs whose (max - min) / median exceeds this are flagged


@dataclass(frozen=True)
class Filters:
    """Which rows a report covers; ``None`` / empty means no restriction."""

    study: str | None = None
    model: str | None = None
    hardware: str | None = None
    engine: str | None = None
    workload: str | None = None
    sweep_id: str | None = None
    since: str | None = None   # ISO date or date-time, inclusive
    until: str | None = None   # ISO date (the whole day) or date-time, inclusive
    run_ids: tuple[str, ...] = field(default_factory=tuple)
    include_predicted: bool = False   # rows a simulator predicted (``predicted`` true) are left out unless asked

    def describe(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v}


def load_runs(results_dir: str | Path, filters: Filters = Filters()) -> pd.DataFrame:
    """The runs table of ``results_dir``, filtered; raises ``TroughputError`` when nothing is left."""
    rows = read_rows(results_dir)
    frame = pd.DataFrame.from_records(rows)
    for column in [c for c in frame.columns if c.startswith("knob.")]:
        # exact values as written (pandas would turn an int knob missing from some rows into a float)
        frame[column] = pd.Series([row.get(column) for row in rows], dtype=object, index=frame.index)
    if frame.empty:
        raise TroughputError(f"no rows in {Path(results_dir) / 'runs'}: run troughput-run first, "
                             f"or point --results-dir at a results folder")
    frame = filter_runs(normalise(frame), filters)
    if frame.empty:
        raise TroughputError(f"no rows in {Path(results_dir) / 'runs'} match the filters {filters.describe()}")
    return frame


def normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Make the columns the report relies on exist, whatever schema the rows were written with."""
    frame = frame.copy()
    for column in [*IDENTITY, "status", "error", "command", "timestamp", "run_id", "engine_version",
                   "git_commit", "study", "trial", "failed_phase", METRIC, "output_tok_s_passes"]:
        if column not in frame:
            frame[column] = None
    frame["ordering"] = frame["ordering"].fillna("as_given")
    for column in ("env.host_id", "env.host", "env.cpu"):
        if column not in frame:
            frame[column] = None
    frame["host_id"] = frame["env.host_id"].fillna(UNRECORDED_HOST)
    frame["host"] = frame["env.host"].fillna(frame["env.cpu"]).fillna("not recorded")
    for column in ("engine", "model", "workload", "hardware"):
        frame[column] = frame[column].fillna("unknown")
    frame["workload_fingerprint"] = frame["workload_fingerprint"].fillna("")
    frame["status"] = frame["status"].fillna("crash")
    frame["error"] = frame["error"].fillna("")
    frame["passes"] = [_passes(p, v) for p, v in zip(frame["output_tok_s_passes"], frame[METRIC])]
    frame["_time"] = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce", format="ISO8601")
    frame["config_id"] = [config_id(row) for row in frame.to_dict("records")]
    labels = workload_labels(frame)
    frame["workload_label"] = [labels[(w, f)] for w, f in zip(frame["workload"], frame["workload_fingerprint"])]
    setups = frame.groupby("workload_label")[["model", "hardware", "host_id"]].apply(lambda g: len(g.drop_duplicates()))
    hosts = frame.groupby("workload_label")["host_id"].nunique()
    frame["cell_label"] = [(f"{w} ({m}, {h}" + (f", host {i}" if hosts[w] > 1 else "") + ")") if setups[w] > 1 else w
                           for w, m, h, i in zip(frame["workload_label"], frame["model"], frame["hardware"],
                                                 frame["host_id"])]
    return frame.sort_values(["_time", "run_id"], kind="stable").reset_index(drop=True)


def filter_runs(frame: pd.DataFrame, filters: Filters) -> pd.DataFrame:
    keep = pd.Series(True, index=frame.index)
    for column in ("study", "model", "hardware", "engine", "workload", "sweep_id"):
        wanted = getattr(filters, column)
        if wanted is not None:
            keep &= frame[column].astype(str) == str(wanted) if column in frame else False
    if filters.since:
        keep &= frame["_time"] >= _when(filters.since)
    if filters.until:
        end = _when(filters.until)
        keep &= frame["_time"] < end + pd.Timedelta(days=1) if _is_date(filters.until) else frame["_time"] <= end
    if filters.run_ids:
        keep &= frame["run_id"].isin(list(filters.run_ids))
    if not filters.include_predicted and "predicted" in frame:
        keep &= frame["predicted"].map(lambda v: v is not True and v != 1.0)
    return frame[keep].reset_index(drop=True)


def knob_columns(frame: pd.DataFrame) -> list[str]:
    return sorted(c for c in frame.columns if c.startswith("knob."))


def knobs_of(row: dict[str, Any]) -> dict[str, Any]:
    """The knob values a row set (dotted names without ``knob.``; unset knobs dropped). The simulator's
    ``calibration`` (the step model it priced steps with, refitted as traces come in) is how a prediction was
    made, not part of the config."""
    return {k.removeprefix("knob."): v for k, v in sorted(row.items())
            if k.startswith("knob.") and not k.startswith("knob.calibration.") and not _missing(v)}


def config_id(row: dict[str, Any]) -> str:
    identity = {k: row.get(k) for k in IDENTITY} | {"knobs": knobs_of(row)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]


def varying_knobs(frame: pd.DataFrame) -> list[str]:
    """Knob names (without ``knob.``) whose values differ between rows of one engine and cell."""
    names: set[str] = set()
    for _, group in frame.groupby(["engine", *CELL], dropna=False):
        for column in knob_columns(group):
            if len({_key(v) for v in group[column]}) > 1:
                names.add(column.removeprefix("knob."))
    return sorted(names)


def config_label(knobs: dict[str, Any], shown: list[str], baseline: dict[str, Any], ordering: str,
                 show_ordering: bool) -> str:
    """The knobs that tell this config apart from its engine's other configs in the cell.

    ``shown`` are the knobs varied there (among knobs that successful rows set); after them come
    any knobs where this config departs from what all successful rows share (a failed outlier's
    extra knob, say).
    """
    parts = [f"{name}={knobs.get(name, 'default')}" for name in shown]
    parts += [f"{name}={value}" for name, value in knobs.items()
              if name not in shown and _key(value) != _key(baseline.get(name))]
    if show_ordering:
        parts.append(f"ordering={ordering}")
    return " ".join(parts) or "single config"


def _label_context(frame: pd.DataFrame) -> dict[tuple, tuple[list[str], dict[str, Any]]]:
    """Per (engine, cell): the knobs to show for every config, and the values all successful rows share."""
    context = {}
    for key, group in frame.groupby(["engine", *CELL], dropna=False):
        ok = group[group["status"] == "ok"]
        reference = ok if len(ok) else group
        shown, shared = [], {}
        for column in knob_columns(group):
            name = column.removeprefix("knob.")
            set_by_reference = reference[column].map(lambda v: not _missing(v)).any()
            if set_by_reference and len({_key(v) for v in group[column]}) > 1:
                shown.append(name)
            values = {_key(v): v for v in reference[column]}
            if len(values) == 1 and set_by_reference:
                shared[name] = next(iter(values.values()))
        context[key] = (shown, shared)
    return context


def group_configs(frame: pd.DataFrame, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """One record per config with its runs, pooled passes, its geometric mean and that mean's ``level`` interval.

    ``n_boot`` and ``seed`` are no longer used (the interval was a bootstrap of the low median; it is now the
    t interval of the statistic the verdict compares); they are accepted so that existing callers still run.

    Only ``ok`` rows carry measurements; a config whose rows all failed appears with
    ``n_ok == 0`` (response curves mark it). Throughput is the geometric mean of the config's
    runs' rates (each run's median pass; one run: its rate), the verdict rule's estimate, with
    the t interval of its samples (its runs from two on, else its one run's passes); total tok/s
    and req/s are scaled from it with the rows' token and request counts, so a single-row
    config reproduces its row's numbers exactly. ``cv_runs`` is the coefficient of variation
    across runs and ``runs_disagree`` flags runs more than ``RUNS_DISAGREE`` apart.
    """
    context = _label_context(frame)
    show_ordering = frame.groupby(["engine", *CELL], dropna=False)["ordering"].nunique().gt(1).any()
    records = []
    plans = loop_plans(frame)
    for cid, rows in frame.groupby("config_id", sort=False):
        first = rows.iloc[0].to_dict()
        looks = plans.get(tuple(first[c] for c in CELL))
        ok, uncounted = counted_runs(rows[rows["status"] == "ok"], looks)
        passes = [p for ps in ok["passes"] for p in ps]
        run_values = [representative(ps) for ps in ok["passes"] if ps]
        by_runs = len(run_values) >= MIN_RUNS_FOR_RUN_STATISTICS
        samples = run_values if by_runs else passes
        variation = spread(run_values)
        record = {k: first.get(k) for k in IDENTITY} | {
            "config_id": cid, "workload_label": first["workload_label"], "cell_label": first["cell_label"],
            "knobs": knobs_of(first),
            "label": config_label(knobs_of(first), *context[tuple(first[c] for c in ["engine", *CELL])],
                                  first["ordering"], bool(show_ordering)),
            "n_rows": len(rows), "n_ok": len(ok), "n_failed": int((rows["status"] != "ok").sum()),
            "n_uncounted": len(uncounted),
            "failed_statuses": sorted(set(rows.loc[rows["status"] != "ok", "status"])),
            "run_ids": list(ok["run_id"]), "failed_run_ids": list(rows.loc[rows["status"] != "ok", "run_id"]),
            "looks": looks, "uncounted_run_ids": uncounted,
            "commands": list(dict.fromkeys(c for c in ok["command"] if c)),
            "engine_version": ", ".join(sorted({str(v) for v in rows["engine_version"] if not _missing(v)})),
            "passes": passes, "n_passes": len(passes), "run_values": run_values, "n_runs": len(run_values),
            "samples": samples, "n_samples": len(samples), "sample_kind": "runs" if by_runs else "passes",
            "runs_x_passes": runs_x_passes(ok["passes"]),
            "cv_runs": variation["cv"], "runs_disagree": variation["range"] > RUNS_DISAGREE,
            "ideal_prefix_hit_rate": _median(ok, "workload_info.ideal_prefix_hit_rate"),
        }
        record.update(_measurements(ok, run_values, samples, level))
        record.update(_full_engine(ok, level))
        records.append(record)
    return pd.DataFrame.from_records(records)


def loop_plans(frame: pd.DataFrame) -> dict[tuple, str]:
    """Per cell, the plan of the first ``run.rounds=auto`` loop that added runs to it (its rows' ``looks`` label,
    ``first-last``, the earliest by time): a cell's verdicts are judged by that plan, and its configs' estimates
    count their runs up to its last look (``counted_runs``), so that a second loop over the same configs is no
    further look at α (docs/verdicts.md, "Looking again")."""
    if "looks" not in frame:
        return {}
    labelled = frame[[isinstance(v, str) and "-" in v for v in frame["looks"]]].sort_values("_time", kind="stable")
    plans: dict[tuple, str] = {}
    for row in labelled.to_dict("records"):
        plans.setdefault(tuple(row[c] for c in CELL), row["looks"])
    return plans


def counted_runs(ok: pd.DataFrame, looks: str | None) -> tuple[pd.DataFrame, list[str]]:
    """The successful runs a cell's loop plan counts (the first ``last`` in the order they ran; all of them where no
    loop added runs), and the run ids of those it does not (runs past the plan's last look). The cut is by time over
    every run given, so hand rounds of another sweep run before the loop count first (docs/verdicts.md)."""
    if not looks or len(ok) <= int(looks.split("-")[1]):
        return ok, []
    last = int(looks.split("-")[1])
    ordered = ok.sort_values("_time", kind="stable")
    return ordered.iloc[:last], list(ordered["run_id"].iloc[last:])


def runs_x_passes(passes_per_run: Any) -> str:
    """``3 × 2`` for three runs of two passes each; ``3 runs, 7 passes`` when the counts differ."""
    counts = [len(p) for p in passes_per_run if len(p)]
    if not counts:
        return "0"
    if len(set(counts)) == 1:
        return f"{len(counts)} × {counts[0]}"
    return f"{len(counts)} runs, {sum(counts)} passes"


def _measurements(ok: pd.DataFrame, run_values: list[float], samples: list[float], level: float) -> dict[str, Any]:
    """The config's rate: the geometric mean of its runs' rates, the verdict's estimate, which every section
    ranks by (one run: that run's rate, its row's number); the interval is over ``samples`` (its runs, or the
    passes of its one run)."""
    if not samples or not run_values:
        return {METRIC: math.nan, "ci_low": math.nan, "ci_high": math.nan}
    rate = geometric_mean(run_values)
    low, high = geometric_interval(samples, level=level, centre_at=rate if samples is not run_values else None)
    low, high = min(low, rate), max(high, rate)   # exp(log(x)) may land a rounding error past x
    measured = {METRIC: rate, "ci_low": low, "ci_high": high}
    inputs, outputs, requests = (_median(ok, c) for c in ("input_tokens", "output_tokens", "requests_done"))
    if outputs and outputs > 0:
        measured["total_tok_s"] = rate * (inputs + outputs) / outputs if inputs is not None else math.nan
        measured["req_s"] = rate * requests / outputs if requests is not None else math.nan
    else:
        measured["total_tok_s"], measured["req_s"] = _median(ok, "total_tok_s"), _median(ok, "req_s")
    for column in ("preemptions", "prefix_cache_hit_rate", "startup_s", "compile_s", "input_tokens",
                   "output_tokens", "requests_done", "sol_fraction", "energy_j", "j_per_output_token",
                   "full_engine_tok_s"):
        measured[column] = _median(ok, column)
    for column, row_column in QUALITY_COLUMNS.items():
        measured[column] = _median(ok, row_column)
    return measured


def workload_labels(frame: pd.DataFrame) -> dict[tuple[str, str], str]:
    """The workload name, qualified by its fingerprint where one name has several fingerprints."""
    labels = {}
    pairs = frame[["workload", "workload_fingerprint"]].drop_duplicates()
    counts = pairs.groupby("workload")["workload_fingerprint"].nunique()
    for name, fingerprint in pairs.itertuples(index=False):
        qualified = counts.get(name, 1) > 1 and fingerprint
        labels[(name, fingerprint)] = f"{name}@{fingerprint[:8]}" if qualified else str(name)
    return labels


def cells(configs: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(cell key, its configs sorted best first) for every cell, in workload-label order."""
    out = []
    for key, group in configs.groupby(CELL, sort=False, dropna=False):
        out.append((key, group.sort_values(METRIC, ascending=False, na_position="last")))
    return sorted(out, key=lambda kv: str(kv[1]["cell_label"].iloc[0]))


def _passes(passes: Any, value: Any) -> list[float]:
    if isinstance(passes, (list, tuple, np.ndarray)) and len(passes):
        return [float(p) for p in passes if not _missing(p)]
    return [] if _missing(value) else [float(value)]


def _full_engine(ok: pd.DataFrame, level: float) -> dict[str, Any]:
    """The full-engine rate's interval over the config's runs (``full_engine_low``/``_high``: a t interval of the
    geometric mean, centred on the median the tables show; none from one run) and the first run's note on it
    (``full_engine_note``: what the replay extrapolated, or why there is no rate)."""
    values = [float(v) for v in pd.to_numeric(ok.get("full_engine_tok_s", pd.Series(dtype=float)),
                                              errors="coerce").dropna() if v > 0]
    low = high = math.nan
    if len(values) >= 2:
        centre = float(np.median(values))
        low, high = geometric_interval(values, level=level, centre_at=centre)
        low, high = min(low, centre), max(high, centre)
    notes = [str(n) for n in ok.get("full_engine_note", pd.Series(dtype=object)) if not _missing(n) and str(n)]
    return {"full_engine_low": low, "full_engine_high": high, "full_engine_note": notes[0] if notes else None}


def _median(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame:
        return None
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return float(values.median()) if len(values) else None


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value)) if not isinstance(value, (list, dict, tuple, np.ndarray)) else False
    except (TypeError, ValueError):
        return False


def _key(value: Any) -> str:
    return "<unset>" if _missing(value) else json.dumps(value, sort_keys=True, default=str)


def _when(text: str) -> pd.Timestamp:
    try:
        when = pd.Timestamp(text)
    except ValueError as e:
        raise TroughputError(f"cannot read {text!r} as a date: use YYYY-MM-DD or an ISO date-time") from e
    return when.tz_localize("UTC") if when.tzinfo is None else when.tz_convert("UTC")


def _is_date(text: str) -> bool:
    return len(text.strip()) == 10
