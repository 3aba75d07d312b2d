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
    "startup_s": "startup s",
    "knobs": "knobs",
}


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table, one line per row, failures with their first error line."""
    import pandas as pd

    if not rows:
        return "(no rows)"
    frame = pd.DataFrame.from_records(rows)
    frame["knobs"] = [
        " ".join(f"{k.removeprefix('knob.')}={v}" for k, v in row.items()
                 if k.startswith("knob.") and not _is_platform_knob(k)) for row in rows
    ]
    for column in COLUMNS:
        if column not in frame:
            frame[column] = None
    table = frame[list(COLUMNS)].rename(columns=COLUMNS)
    text = table.to_string(index=False, float_format=lambda v: f"{v:.3g}" if abs(v) < 1 else f"{v:,.1f}",
                           na_rep="-", max_colwidth=60)
    failures = [f"  {r['run_id']} {r['status']}: {(r.get('error') or '').splitlines()[0][:200]}"
                for r in rows if r.get("status") != "ok"]
    return text + ("\nfailed runs:\n" + "\n".join(failures) if failures else "")


def _is_platform_knob(key: str) -> bool:
    """Knobs every CPU run carries; left out of the summary to keep it readable."""
    return key in {"knob.kv_cache_memory_bytes", "knob.gpu_memory_utilization", "knob.enforce_eager"}


def print_summary(rows: list[dict[str, Any]], results_dir: Path) -> None:
    print()
    print(summary_table(rows))
    print(f"\n{len(rows)} row(s) in {Path(results_dir).resolve() / 'runs'}; engine logs in "
          f"{Path(results_dir).resolve() / 'logs'}")
