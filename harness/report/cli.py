"""``troughput-report``: the results table in, ``reports/<name>/index.html`` and ``report.md`` out."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

from harness.core.errors import TroughputError
from harness.report import WRITERS, Filters, PlannerInputs, ReportOptions, build_report, write_report
from harness.report.document import fmt, fmt_interval
from harness.report.quality import QualityGuard
from harness.report.sections import use_text
from harness.report.verdict import MIN_EFFECT

log = logging.getLogger("troughput.report")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="troughput-report",
        description="Compare engines and configs from the results table; record the engine-choice decisions.")
    p.add_argument("--results-dir", default="results",
                   help="the results folder (rows in <dir>/runs/; default: results)")
    p.add_argument("--reports-dir", default="reports", help="where reports go (default: reports)")
    p.add_argument("--name", help="report folder name (default: the study, else the current UTC time)")
    f = p.add_argument_group("filters (all optional, combined with AND)")
    for name in ("study", "model", "hardware", "engine", "workload"):
        f.add_argument(f"--{name}", help=f"only rows whose {name} is this")
    f.add_argument("--sweep-id", help="only rows of this multirun (the row's sweep_id)")
    f.add_argument("--since", help="only rows from this date or ISO date-time on (UTC)")
    f.add_argument("--until", help="only rows up to this date (inclusive) or ISO date-time (UTC)")
    f.add_argument("--include-predicted", action="store_true",
                   help="also use rows a simulator predicted (column predicted=true); measured rows only by default")
    f.add_argument("--run-id", action="append", default=[], metavar="ID",
                   help="only these rows (repeat the flag or separate ids with commas)")
    w = p.add_argument_group("idle-window planner and cost")
    backlog = w.add_mutually_exclusive_group()
    backlog.add_argument("--backlog-requests", type=float, default=1_000_000,
                         help="backlog in requests at the workload's measured mean tokens/request (default: 1e6)")
    backlog.add_argument("--backlog-tokens", type=float, help="backlog in tokens (prompt + output) instead")
    w.add_argument("--window-hours", type=float, default=8.0, help="idle window in hours (default: 8)")
    w.add_argument("--gpu-hour-usd", type=float, default=2.50, help="price of one GPU-hour in USD (default: 2.50)")
    s = p.add_argument_group("statistics and decisions")
    s.add_argument("--resamples", type=int, default=2000, help="unused (per-config intervals are t intervals of the geometric mean now); "
                        "accepted so that existing scripts still run")
    s.add_argument("--confidence", type=float, default=0.95, help="interval level (default: 0.95)")
    s.add_argument("--seed", type=int, default=0, help="unused, like --resamples")
    s.add_argument("--min-agreement", type=float, default=0.99,
                   help="quality guard: a config whose token agreement with the engine's default config is below "
                        "this is never chosen (default: 0.99; only where measured, quality.reference=default)")
    s.add_argument("--min-parse-rate", type=float, default=None,
                   help="quality guard for structured workloads: the share of outputs that parse (default: off)")
    s.add_argument("--min-effect", type=float, default=MIN_EFFECT,
                   help=f"smallest ratio that matters: a clear winner's estimate must clear it, and 'equivalent' "
                        f"means the interval lies within ± it (default: {MIN_EFFECT}; docs/verdicts.md)")
    s.add_argument("--no-record", action="store_true",
                   help="do not append decisions to <results-dir>/decisions/ (e.g. for a read-only copy)")
    p.add_argument("--format", default=",".join(WRITERS),
                   help=f"comma-separated output formats (default: {','.join(WRITERS)})")
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    return p


def options_from(args: argparse.Namespace) -> tuple[Filters, ReportOptions]:
    for name, value, low, high in (("--window-hours", args.window_hours, 0, None),
                                   ("--gpu-hour-usd", args.gpu_hour_usd, -1e-12, None),
                                   ("--confidence", args.confidence, 0, 1), ("--resamples", args.resamples, 99, None),
                                   ("--backlog-requests", args.backlog_requests, 0, None),
                                   ("--backlog-tokens", args.backlog_tokens or 1, 0, None),
                                  ("--min-effect", args.min_effect + 1e-12, 0, 1)):
        if value <= low or (high is not None and value >= high):
            bound = f"between {low} and {high}" if high is not None else f"above {low:g}"
            raise TroughputError(f"{name} must be {bound}, got {value}")
    run_ids = tuple(i.strip() for item in args.run_id for i in item.split(",") if i.strip())
    filters = Filters(study=args.study, model=args.model, hardware=args.hardware, engine=args.engine,
                      workload=args.workload, sweep_id=args.sweep_id, since=args.since, until=args.until,
                      run_ids=run_ids, include_predicted=args.include_predicted)
    planner = PlannerInputs(backlog_requests=args.backlog_requests, backlog_tokens=args.backlog_tokens,
                            window_h=args.window_hours, usd_per_gpu_hour=args.gpu_hour_usd)
    return filters, ReportOptions(resamples=args.resamples, level=args.confidence, seed=args.seed,
                                  planner=planner, record=not args.no_record,
                                  guard=QualityGuard(args.min_agreement, args.min_parse_rate),
                                  min_effect=args.min_effect)


def report_name(args: argparse.Namespace) -> str:
    name = args.name or args.study or datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise TroughputError(f"report name {name!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
    return name


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        filters, options = options_from(args)
        name = report_name(args)
        formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
        report = build_report(args.results_dir, name, filters, options)
        written = write_report(report, Path(args.reports_dir) / name, formats)
    except TroughputError as e:
        print(f"troughput-report: error: {e}", file=sys.stderr)
        return 2
    for d in report.decisions:
        chosen = use_text(d)   # a best only for a clear winner; otherwise the configs it cannot tell apart
        margin = fmt(d.get("margin"), "pct")
        ci = fmt_interval(d.get("margin_ci_low"), d.get("margin_ci_high"), "pct")
        print(f"{d['cell_label']:<24} {d['model']:<12} {d['hardware']:<8} {chosen:<36} {margin:>8} {ci:<20} "
              f"{d['verdict']}")
        print(f"  {d.get('reason', '')}")
    print(f"{len(report.frame)} row(s), {len(report.failed)} failed; report: "
          + ", ".join(str(p.resolve()) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
