"""The table printed at the end of a run or a multirun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLUMNS = {
    "status": "status",
    "engine": "engine",
    "model": "model",
    "workload": "workload",
    "ordering": "ordering",
    "requests_done": "reqs",
    "output_tok_s": "out tok/s",
    "total_tok_s": "total tok/s",
    "req_s": "req/s",
    "preemptions": "preempt",
    "prefix_cache_hit_rate": "prefix hit",
    "sol_fraction": "of SoL",
    "j_per_output_token": "J/out tok",
    "startup_s": "startup s",
    "knobs": "knobs",
}


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table, one line per row, failures with their first error line."""
    import pandas as pd

    if not rows:
        return "(no rows)"
    frame = pd.DataFrame.from_records(rows)
    shown = _knobs_to_show(rows)
    frame["knobs"] = [" ".join(f"{k.removeprefix('knob.')}={row[k]}" for k in shown if k in row) for row in rows]
    for column in COLUMNS:
        if column not in frame:
            frame[column] = None
    for column in ("requests_done", "preemptions"):  # counts stay integers beside failed rows' gaps
        frame[column] = ["-" if pd.isna(v) else str(int(v)) for v in frame[column]]
    # a rate above the speed of light means the hardware spec undershoots: flagged, not shown as a fraction > 1
    frame["sol_fraction"] = [v if pd.isna(v) or v <= 1 else "above SoL!" for v in pd.to_numeric(frame["sol_fraction"])]
    table = frame[list(COLUMNS)].rename(columns=COLUMNS)
    text = table.to_string(index=False, float_format=lambda v: f"{v:.3g}" if abs(v) < 1 else f"{v:,.1f}",
                           na_rep="-", max_colwidth=60)
    failures = [f"  {r['run_id']} {r['status']}: {(r.get('error') or '').splitlines()[0][:200]}"
                for r in rows if r.get("status") != "ok"]
    notes = [f"  {r['run_id']} {r['engine']}: {r['engine_info.sim_warning']}" for r in rows
             if isinstance(r.get("engine_info.sim_warning"), str)]
    notes += [f"  {r['run_id']} {r['engine']}: {past}" for r in rows if (past := extrapolation(r))]
    predicted = [f"  {r['run_id']}: predicted {r['prediction.sim.predicted']:,.0f} output tok/s before it ran "
                 f"(step model of this host), measured {r.get('output_tok_s') or 0:,.0f}"
                 for r in rows if isinstance(r.get("prediction.sim.predicted"), (int, float))]
    return (text + ("\nfailed runs:\n" + "\n".join(failures) if failures else "")
            + ("\nsimulator:\n" + "\n".join(notes) if notes else "")
            + ("\npredictions:\n" + "\n".join(predicted) if predicted else ""))


def _knobs_to_show(rows: list[dict[str, Any]]) -> list[str]:
    """All knobs of a single row; of several rows, only the knobs that differ between them."""
    keys = sorted({k for row in rows for k in row if k.startswith("knob.")})
    if len(rows) == 1:
        return keys
    return [k for k in keys if len({repr(row.get(k)) for row in rows}) > 1]


def print_summary(rows: list[dict[str, Any]], results_dir: Path) -> None:
    print()
    print(summary_table(rows))
    print(f"\n{len(rows)} row(s) in {Path(results_dir).resolve() / 'runs'}; engine logs in "
          f"{Path(results_dir).resolve() / 'logs'}")


def extrapolation(row: dict[str, Any]) -> str | None:
    """A simulated row's steps that lay past the traces its step model was fitted on (``stat.beyond.*``), said."""
    past = {k.removeprefix("stat.beyond."): v for k, v in row.items()
            if k.startswith("stat.beyond.") and isinstance(v, (int, float)) and v > 0}
    if not past:
        return None
    steps = row.get("stat.sim_steps")
    of = f" of {steps:,.0f}" if isinstance(steps, (int, float)) else ""
    return ("extrapolates past the traces its step model was fitted on: "
            + ", ".join(f"{name} in {n:,.0f}{of} steps" for name, n in past.items()))
