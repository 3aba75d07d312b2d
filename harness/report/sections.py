"""The report's sections, each only where the rows allow it."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from harness.report.data import CELL, METRIC, RUNS_DISAGREE, cells
from harness.report.decisions import CLEAR, CLOSE, EQUIVALENT, INSUFFICIENT, METHOD, MIN_RUNS
from harness.report.document import Details, Figure, Paragraph, RowLink, Section, Table, first_line, fmt, fmt_interval
from harness.report.predictions import section as predictions
from harness.report.stats import CI_METHOD, STATISTIC
from harness.report.verdict import ALPHA

def baseline_engine() -> str:
    """The engine reports measure others against: the first unit declaring ``baseline`` (HF transformers).

    Read when a report is built: reading the units imports the adapter modules, which the driver's
    modules never do on import.
    """
    from engines import units

    return next((unit.name for unit in units() if unit.baseline), "baseline")


def build(report) -> list[Section]:
    out = [overview(report), recommendation(report), headline(report), *figures(report), planner(report),
           predictions(report), failures(report), provenance(report), all_configs(report), runs(report)]
    return [section for section in out if section is not None]


def overview(report) -> Section:
    frame = report.frame
    when = frame["_time"].dropna()
    span = f"{when.min():%Y-%m-%d %H:%M} – {when.max():%Y-%m-%d %H:%M} UTC" if len(when) else "unknown dates"
    filters = ", ".join(f"{k}={v}" for k, v in report.filters.describe().items()) or "none"
    text = (f"{len(frame)} run(s) ({len(report.ok)} ok, {len(report.failed)} failed) from {span}; "
            f"engines: {', '.join(sorted(frame['engine'].unique()))}; workloads: "
            f"{', '.join(sorted(frame['cell_label'].unique()))}; {len(report.configs)} config(s). "
            f"Results table: {report.results_dir.resolve()}; filters: {filters}. Generated {report.created}.")
    configs = report.configs[report.configs["n_passes"] > 0]
    by_runs = int((configs["sample_kind"] == "runs").sum())
    runs = sorted(set(configs["n_runs"])) if len(configs) else [0]
    counts = f"{runs[0]}" if len(runs) == 1 else f"{runs[0]}–{runs[-1]}"
    how = (f"A config is one engine with one set of knobs (and ordering) on one workload fingerprint, model, "
           f"hardware config and host; each of its rows is one independent run (its own engine process). Throughput "
           f"is the {STATISTIC}; every section (recommendation, headline, plots, decision file) ranks configs by it, "
           f"and per-config intervals are its {report.options.level:.0%} {CI_METHOD}. Here {by_runs} of "
           f"{len(configs)} measured config(s) rest on independent runs ({counts} run(s) per config). Verdicts: "
           f"{METHOD} (minimum effect {report.options.min_effect:.0%}), on at least {MIN_RUNS} independent runs a "
           f"side; the margin is the ratio of geometric means − 1 with that interval. Measure runs interleaved with "
           f"a round dimension first in the multirun (troughput-run -m run.round=1,2,3 ...), or let "
           f"troughput-run -m run.rounds=auto ... add rounds until the rule decides.")
    hosts = frame.drop_duplicates("host_id")
    blocks = [Paragraph([text]), Paragraph([how])]
    if len(hosts) > 1:
        blocks.append(Paragraph([f"These rows come from {len(hosts)} different hosts: "
                                 + "; ".join(f"{h['host_id']}: {h['host']}" for h in hosts.to_dict("records"))
                                 + ". Configs are grouped per host and never compared across hosts."]))
    return Section("Summary", "summary", blocks)


def recommendation(report) -> Section:
    rows = []
    for d in report.decisions:
        chosen = use_text(d)
        runner = (f"{d['runner_up.engine']}: {d['runner_up.label']} ({d['runner_up.relation'].split(' (')[0]})"
                  if d.get("runner_up.engine") else "–")
        margin = fmt(d.get("margin"), "pct")
        ci = fmt_interval(d.get("margin_ci_low"), d.get("margin_ci_high"), "pct")
        first = "winner" if d["verdict"] == CLEAR else "first-ranked"
        basis = _links(first, d.get("chosen.run_ids")) + _links("runner-up", d.get("runner_up.run_ids"))
        count = report.history.get(tuple(d.get(c) for c in CELL), 0)
        recorded = [RowLink(d["decision_id"], "decisions")] if d.get("decision_id") else []
        recorded.append(f" {d['recorded']}" + (f", {count - 1} earlier kept" if count > 1 else ""))
        verdict = d["verdict"] + (f" ({', '.join(d['flags'])})" if d.get("flags") else "")
        why = " ".join(filter(None, [d.get("reason", ""), d.get("quality_note") and f"Also {d['quality_note']}."]))
        rows.append([d["cell_label"], d["model"], f"{d['hardware']} (host {d.get('host_id')})", chosen, runner, margin,
                     ci, verdict, why, basis or "–", recorded])
    table = Table(["workload", "model", "hardware", "use", "runner-up", "margin", f"{1 - ALPHA:.0%} CI",
                   "verdict", "why", "rests on", "decision"], rows, id="decisions")
    clear = sum(d["verdict"] == CLEAR for d in report.decisions)
    lead = (f"{clear} of {len(report.decisions)} cell(s) have a clear winner; where the rule cannot tell the "
            f"configs apart, 'use' names them all as indistinguishable instead of a best. The latest decision per cell, "
            f"recomputed from the rows (results/decisions/, append-only: a decision is added only when the rows "
            f"behind it change). Margin = first-ranked config (the winner, where there is one) ÷ runner-up − 1 on "
            f"output tok/s (ratio of the geometric means of their per-run rates).")
    blocks: list[Any] = [Paragraph([lead]), table]
    for d in report.decisions:
        everything = [RowLink(r) for r in d.get("rests_on", [])] + [RowLink(r) for r in d.get("failed_runs", [])]
        if everything:
            blocks.append(Paragraph([f"Rows behind {d['cell_label']} ({d['model']}, {d['hardware']}): ",
                                     _join(everything)]))
    return Section("Recommendation", "recommendation", blocks)


def use_text(decision: dict[str, Any]) -> str:
    """What the recommendation says to use: the clear winner; every config the rule cannot tell from the
    first-ranked one, named indistinguishable, where the cell is too close to call or equivalent; the config
    measured ahead, marked as such, where there is too little data."""
    if not decision.get("chosen.engine"):
        return "–"
    chosen = f"{decision['chosen.engine']}: {decision['chosen.label']}"
    if decision["verdict"] == CLEAR:   # clear against the runner-up; configs the rule cannot tell from it named too
        alike = [f"{c['engine']}: {c['label']} ({c['verdict']})" for c in indistinguishable(decision)]
        return chosen + (f", or any config the rule cannot tell from it: {', '.join(alike)}" if alike else "")
    if not decision.get("runner_up.engine"):
        return f"{chosen} (the only config measured; not compared)"
    other = f"{decision['runner_up.engine']}: {decision['runner_up.label']}"
    if decision["verdict"] == INSUFFICIENT:
        return f"no best yet: {chosen} measured ahead of {other}, too few runs to compare"
    names = [chosen, *(f"{c['engine']}: {c['label']}" for c in indistinguishable(decision))]
    return (f"{'either' if len(names) == 2 else f'any of {len(names)}'}, indistinguishable ({decision['verdict']}): "
            f"{', '.join(names[:-1])} or {names[-1]}")


def indistinguishable(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """The configs the page names beside the first-ranked one as indistinguishable: every config the rule does not
    put clearly behind it (the decision's ``indistinguishable``), where the cell is too close to call or equivalent,
    and where it has a clear winner over the runner-up (another engine's config) but not over one of its own engine's
    (the runner-up alone in a decision recorded before that field); none where there is too little data."""
    if decision.get("verdict") == CLEAR:
        return list(decision.get("indistinguishable") or [])
    if decision.get("verdict") not in (CLOSE, EQUIVALENT):
        return []
    if "indistinguishable" in decision:
        return list(decision["indistinguishable"])
    return [{"engine": decision.get("runner_up.engine"), "label": decision.get("runner_up.label"),
             "config_id": decision.get("runner_up.config_id"), "verdict": decision["verdict"]}]


def role_of(config_id: str, decision: dict[str, Any]) -> str:
    """A config's role in its cell's decision, as the headline shows it ('' when it has none)."""
    chosen, runner = decision.get("chosen.config_id"), decision.get("runner_up.config_id")
    alike = {c["config_id"]: c["verdict"] for c in indistinguishable(decision)}
    if config_id in alike:   # its own pair's verdict against the first-ranked config
        return f"indistinguishable ({alike[config_id]})"
    if config_id not in (chosen, runner):
        return ""
    if decision.get("verdict") == CLEAR:
        return "winner" if config_id == chosen else "runner-up"
    if runner is None:
        return "only config (nothing to compare)"
    if decision.get("verdict") == INSUFFICIENT:
        return f"{'ahead' if config_id == chosen else 'behind'}, not compared (insufficient data)"
    return f"indistinguishable ({decision['verdict']})"


def headline(report) -> Section:
    baseline_name = baseline_engine()
    by_cell = {tuple(d.get(c) for c in CELL): d for d in report.decisions}
    rows, ids = [], []
    for key, group in cells(report.configs):
        decision = by_cell.get(key, {})
        measured = group[group["n_passes"] > 0]
        baseline = measured[measured["engine"] == baseline_name][METRIC].max()
        shown = measured.drop_duplicates("engine")
        runner_id = decision.get("runner_up.config_id")
        named = [decision.get("chosen.config_id"), runner_id, *(c["config_id"] for c in indistinguishable(decision))]
        for wanted in named:   # the configs the decision names always have rows
            if wanted and wanted not in set(shown["config_id"]):
                shown = pd.concat([shown, measured[measured["config_id"] == wanted]])
        shown = shown.sort_values(METRIC, ascending=False, na_position="last")
        for config in shown.to_dict("records"):
            role, margin, verdict = role_of(config["config_id"], decision), "", ""
            if config["config_id"] == decision.get("chosen.config_id"):
                verdict = decision["verdict"]
                margin = (f"{fmt(decision.get('margin'), 'pct')} "
                          f"{fmt_interval(decision.get('margin_ci_low'), decision.get('margin_ci_high'), 'pct')}"
                          ).strip() if decision.get("margin") is not None else "–"
            elif config["config_id"] == runner_id:
                role += " (same engine)" if config["engine"] == decision.get("chosen.engine") else ""
            elif report.options.guard.failing(config):
                role = f"rejected: {report.options.guard.failing(config)}"
            rows.append([config["cell_label"], config["engine"], config["label"], role, fmt(config[METRIC]),
                         fmt_interval(config["ci_low"], config["ci_high"]), runs_cell(config),
                         _cv(config), _over_baseline(config, baseline),
                         fmt(config.get("total_tok_s")), fmt(config.get("req_s")),
                         fmt(config.get("preemptions"), "int"), fmt(config.get("prefix_cache_hit_rate"), "share"),
                         fmt(config.get("ideal_prefix_hit_rate"), "share"), fmt(config.get("sol_fraction"), "sol"),
                         fmt(config.get("j_per_output_token"), "j"), fmt(config.get("energy_j")),
                         fmt(config.get("startup_s"), "s"), fmt(config.get("compile_s"), "s"),
                         *quality_cells(config), margin, verdict])
            ids.append(f"headline-{config['config_id']}")
    table = Table(["workload", "engine", "config", "role", "output tok/s", "95% interval", "runs × passes",
                   "CV across runs", f"× {baseline_name}", "total tok/s", "req/s", "preemptions",
                   "prefix-cache hit", "ideal hit (ceiling)", "of speed of light", "J / output token", "energy J", "startup s", "compile s",
                   *QUALITY_HEADERS, "margin [CI]", "verdict"],
                  rows, id="headline", row_ids=ids)
    lead = ("Per workload, each engine's first-ranked config side by side, and every config the decision names "
            "(the two it compares and, where the cell is too close to call or equivalent, every config the rule "
            "cannot tell from the first-ranked one, each named indistinguishable). Numbers are the geometric mean of the "
            "config's independent runs (each run's median pass) from 2 runs on, else of its one run's passes, with "
            "its t interval: the estimate the verdict compares, so rows rank as the recommendation does; "
            f"'runs × passes' says which it rests on, and a CV marked '!' means its runs disagree by more than "
            f"{RUNS_DISAGREE:.0%} ((max − min) ÷ median). 'ideal hit (ceiling)' is the share of prompt tokens an "
            f"unbounded prefix cache could serve (token grain), beside the measured hit rate; '× {baseline_name}' "
            f"is the "
            f"config's output tok/s over the first-ranked {baseline_name} baseline config of the same workload, "
            "model and hardware, where baseline rows exist. 'agreement' is the share of the engine default "
            "config's greedy output tokens the config reproduced (quality.reference=default; '–' where not "
            "measured); 'parsed / valid / truncated' are shares of constrained outputs (structured workloads). "
            f"A config below {report.options.guard.min_agreement} agreement"
            + (f" or {report.options.guard.min_parse_rate} parse rate" if report.options.guard.min_parse_rate else "")
            + " is marked rejected and never chosen.")
    if not rows:
        return Section("Headline", "headline-section", [Paragraph(["No successful run to compare."]), table])
    return Section("Headline", "headline-section", [Paragraph([lead]), table])


QUALITY_HEADERS = ("agreement", "parsed", "valid", "truncated")


def quality_cells(config: dict[str, Any]) -> list[str]:
    """The quality columns of one config: agreement with the default config, structured-output shares."""
    return [fmt(config.get(column), "share") for column in ("agreement", "parsed_rate", "valid_rate", "truncated_rate")]


def runs_cell(config: dict[str, Any]) -> str:
    """``3 × 2`` (runs × passes), with ``, by passes`` when one run's passes are the samples."""
    return config["runs_x_passes"] + (", by passes" if config.get("sample_kind") == "passes"
                                      and config.get("n_passes", 0) > 1 else "")


def _cv(config: dict[str, Any]) -> str:
    text = fmt(config.get("cv_runs"), "share")
    return text + (" !" if config.get("runs_disagree") else "")


def _over_baseline(config: dict[str, Any], baseline: float) -> str:
    if not baseline or pd.isna(baseline):
        return "–"
    return f"{config[METRIC] / baseline:.2f}×"


def figures(report) -> list[Section]:
    groups = {"throughput": ("Throughput", "plots-throughput"), "response": ("Response curves", "plots-response"),
              "preemptions": ("Preemptions", "plots-preemptions"), "startup": ("Startup and compile", "plots-startup"),
              "study": ("Studies", "plots-studies")}
    out: dict[str, Section] = {}
    for plot in report.plots:
        kind = plot.name.split("-")[0]
        if kind == "predictions":   # drawn in its own section (harness.report.predictions)
            continue
        title, anchor = groups.get(kind, ("Plots", "plots"))
        out.setdefault(kind, Section(title, anchor)).blocks.append(Figure(plot))
    if "study" in out:
        out["study"].blocks.insert(0, study_table(report))
    return list(out.values())


def study_table(report) -> Table:
    trials = report.frame[report.frame["study"].notna() & report.frame["trial"].notna()]
    rows = []
    for study, group in trials.groupby("study"):
        ok = group[group["status"] == "ok"]
        best = ok.loc[ok[METRIC].idxmax()] if len(ok) else None
        rows.append([str(study), str(len(group)), str(len(ok)), str(len(group) - len(ok)),
                     str(int(best["trial"])) if best is not None else "–",
                     fmt(best[METRIC]) if best is not None else "–",
                     RowLink(best["run_id"]) if best is not None else "–"])
    return Table(["study", "trials", "ok", "failed", "best trial", "best output tok/s", "row"], rows, id="studies")


def planner(report) -> Section | None:
    plan, inputs = report.plan, report.options.planner
    if plan.empty:
        return None
    rows = [[p["cell_label"], p["engine"], p["label"], fmt(p["tokens_per_request"]), fmt(p["backlog_requests"], "int"),
             fmt(p["backlog_tokens"], "int"), f"{fmt(p['rate'])} {p['rate_unit']} ({p['rate_source']})",
             fmt(p["generate_s"] / 3600, "h"),
             fmt(p["startup_s"], "s"), fmt(p["compile_s"], "s"), fmt(p["total_h"], "h"),
             fmt_interval(p["total_low_h"], p["total_high_h"], "h"), fmt(p["window_h"], "h"),
             ("yes" if p["clears"] else "no") + f" ({fmt(p['slack_h'], 'h')} h {'spare' if p['clears'] else 'over'})",
             str(p["gpus"]), fmt(p["cost_usd"], "usd"), fmt(p["usd_per_m_tokens"], "usd")]
            for p in plan.to_dict("records")]
    table = Table(["workload", "engine", "config", "tokens / request", "backlog requests", "backlog tokens", "rate",
                   "generate h", "startup s", "compile s", "total h", "total h, range", "window h", "clears the window",
                   "GPUs", "cost USD", "USD / M tokens"], rows, id="planner")
    lead = (f"Inputs: {inputs.describe()}. total = backlog ÷ rate + startup + compile, with each engine's "
            f"first-ranked config per workload (by the rule's estimate; not a verdict); tokens are prompt + output, "
            f"tokens per request the mean measured in the rows. "
            f"Startup excludes compile where the engine times compile inside startup (vLLM). Cost = total h × GPUs × "
            f"price; on a CPU host read the price as the machine-hour price. Change with --backlog-requests, "
            f"--backlog-tokens, --window-hours and --gpu-hour-usd.")
    lead += (" The range is the total at the ends of the rate's 95% interval over the config's runs (none from "
             "one run).")
    notes = [f"{p['engine']} {p['label']}: {first_line(p['note'], 300)}" for p in plan.to_dict("records")
             if isinstance(p.get("note"), str) and p["note"]]
    blocks = [Paragraph([lead]), table]
    if notes:
        blocks.append(Paragraph(["Where the full-engine rate is not what the runs saw: " + "; ".join(notes) + "."]))
    return Section("Idle-window planner and cost", "planner", blocks)


def failures(report) -> Section:
    failed = report.failed
    if failed.empty:
        return Section("Failures", "failures", [Paragraph(["No failed runs."])])
    labels = dict(zip(report.configs["config_id"], report.configs["label"]))
    rows = [[RowLink(r["run_id"]), str(r["timestamp"])[:19], r["engine"], r["model"], r["cell_label"],
             labels.get(r["config_id"], ""), r["status"], str(r.get("failed_phase") or "–"), first_line(r["error"])]
            for r in failed.to_dict("records")]
    blocks: list[Any] = [Paragraph([f"{len(failed)} failed run(s); each is a row of the results table with its "
                                    f"reason."]),
                         Table(["run", "time", "engine", "model", "workload", "config", "status", "phase", "reason"],
                               rows, id="failures")]
    blocks += [Details(f"{r['run_id']} ({r['status']}): full error", str(r["error"]))
               for r in failed.to_dict("records") if len(str(r["error"]).splitlines()) > 1]
    return Section("Failures", "failures", blocks)


def provenance(report) -> Section:
    frame = report.frame
    blocks: list[Any] = [Paragraph(["Engines"]), _count_table(frame, ["engine", "engine_version", "engine_python"])]
    hardware = [c for c in ["hardware", "host_id", "env.cpu", "env.cpu_count", "env.cpu_flags", "env.gpu",
                            "env.gpu_count", "env.gpu_driver", "env.hostname"] if c in frame]
    blocks += [Paragraph(["Hardware"]), _count_table(frame, hardware)]
    blocks += [Paragraph(["Harness commits"]), _count_table(frame, ["git_commit"], code=("git_commit",))]
    workload = [c for c in ["workload", "workload_fingerprint", "workload_info.requests",
                            "workload_info.input_tokens_requested", "workload_info.output_tokens_requested",
                            "workload_info.images"] if c in frame]
    blocks += [Paragraph(["Workloads"]), _count_table(frame, workload, code=("workload_fingerprint",))]
    rows = []
    for key, group in cells(report.configs):
        for config in group[group["n_passes"] > 0].drop_duplicates("engine").to_dict("records"):
            rows.append([config["cell_label"], config["engine"], config["label"], f"{fmt(config[METRIC])} tok/s",
                         "; ".join(config["commands"]) or "–", _join([RowLink(r) for r in config["run_ids"]])])
    blocks += [Paragraph(["Reproduce each headline number (the rows' own commands):"]),
               Table(["workload", "engine", "config", "number", "command", "runs"], rows, id="reproduce",
                     code_columns=("command",))]
    return Section("Provenance", "provenance", blocks)


def _run_counts(config: dict) -> str:
    """'4 ok / 0 failed', with the ok runs a loop's last look left out named apart: they did not fail."""
    uncounted = config.get("n_uncounted") or 0
    return (f"{config['n_ok']} ok / {config['n_failed']} failed"
            + (f" / {uncounted} ok, not counted (past the loop's last look)" if uncounted else ""))


def all_configs(report) -> Section:
    rows = []
    for key, group in cells(report.configs):
        for c in group.to_dict("records"):
            rows.append([c["cell_label"], c["engine"], c["label"], fmt(c[METRIC]),
                         fmt_interval(c["ci_low"], c["ci_high"]), fmt(c.get("full_engine_tok_s")), runs_cell(c), _cv(c),
                         ", ".join(fmt(p) for p in c["run_values"]) or "–",
                         ", ".join(fmt(p) for p in c["passes"]) or "–", _run_counts(c),
                         *quality_cells(c), report.options.guard.failing(c) or "–",
                         " ".join(f"{k}={v}" for k, v in c["knobs"].items()), c["ordering"]])
    return Section("All configs", "configs", [Paragraph([
        "'full engine' is the config's output tok/s with its engine kept full (median over its runs): a step "
        "model fitted to each run's own steps, its requests replayed through the simulator's scheduler, as a "
        "long backlog keeps the engine; where a run is one draining batch its measured rate reads lower. "
        "Configs are ranked by the measured rate; the planner uses the full-engine rate."]),
        Table(["workload", "engine", "config", "output tok/s", "95% interval", "full engine tok/s",
                                                     "runs × passes", "CV across runs", "per run (tok/s)",
                                                     "passes (tok/s)", "runs", *QUALITY_HEADERS, "quality guard",
                                                     "knobs", "ordering"], rows,
                                                    id="all-configs", code_columns=("knobs",))])


def runs(report) -> Section:
    labels = dict(zip(report.configs["config_id"], report.configs["label"]))
    rows = [[RowLink(r["run_id"]), str(r["timestamp"])[:19], r["status"], r["engine"], r["model"], r["cell_label"],
             labels.get(r["config_id"], ""), fmt(r.get(METRIC)), ", ".join(fmt(p) for p in r["passes"]) or "–",
             str(r.get("command") or "–")] for r in report.frame.to_dict("records")]
    return Section("Runs", "runs", [Table(["run", "time", "status", "engine", "model", "workload", "config",
                                           "output tok/s", "passes", "command"], rows, id="runs-table",
                                          row_ids=[f"run-{r}" for r in report.frame["run_id"]],
                                          code_columns=("command",))])


def _count_table(frame: pd.DataFrame, columns: list[str], code: tuple[str, ...] = ()) -> Table:
    columns = [c for c in columns if c in frame]
    values = frame[columns].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v).astype(str)
    counted = values.groupby(columns, dropna=False).size().reset_index(name="rows")
    rows = [[("–" if v in ("None", "nan") else v) for v in map(str, r)] for r in counted.itertuples(index=False)]
    return Table([*columns, "rows"], rows, code_columns=code)


def _links(label: str, run_ids: Any) -> list:
    if not run_ids:
        return []
    return [f"{label}: ", *_join([RowLink(r) for r in run_ids]), " "]


def _join(links: list) -> list:
    out: list = []
    for i, link in enumerate(links):
        out += ([", "] if i else []) + [link]
    return out
