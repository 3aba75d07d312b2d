"""The report's figures (matplotlib, Agg, no pyplot state): each a PNG in memory.

Every function returns a list of ``Plot``s, empty when the rows do not allow the figure.
"""

from __future__ import annotations

import io
import json
import math
import re
import textwrap
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness.report.data import METRIC, knob_columns, varying_knobs  # noqa: E402

COLORS = matplotlib.color_sequences["tab10"]
MARKERS = "osD^vP*X<>"
FAILED = dict(marker="x", color="#d62728", s=70, linewidths=2, zorder=5)


@dataclass
class Plot:
    name: str      # file stem, e.g. "throughput"
    title: str
    caption: str
    png: bytes


def _figure(width: float = 9.0, height: float = 4.8) -> Figure:
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _wrapped(label: str, width: int = 26) -> str:
    """A config's label over lines of about ``width`` characters (a tuned config's runs to a hundred and more:
    rotated, it outgrew the figure and matplotlib dropped the layout)."""
    return textwrap.fill(label, width, break_long_words=False, break_on_hyphens=False)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def throughput(configs: pd.DataFrame) -> list[Plot]:
    """Each engine's first-ranked config per workload (by the geometric mean the verdict compares: a rank, not a
    verdict), bars with its t interval."""
    measured = configs[configs["n_passes"] > 0].sort_values(METRIC, ascending=False)
    best = measured.drop_duplicates(["engine", "workload_label", "model", "hardware", "host_id"])  # one bar per host
    if best.empty:
        return []
    best = best.assign(cell=best["cell_label"])
    cells_, engines = sorted(best["cell"].unique()), sorted(best["engine"].unique())
    figure = _figure(max(6.0, 1.8 * len(cells_) * max(1, len(engines)) ** 0.5 + 2))
    axes = figure.add_subplot()
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        rows = best[best["engine"] == engine].set_index("cell").reindex(cells_)
        x = np.arange(len(cells_)) + (i - (len(engines) - 1) / 2) * width
        values = rows[METRIC].to_numpy(float)
        errors = np.vstack([values - rows["ci_low"].to_numpy(float), rows["ci_high"].to_numpy(float) - values])
        axes.bar(x, values, width, color=COLORS[i % 10], label=engine)
        axes.errorbar(x, values, yerr=errors, fmt="none", capsize=4, ecolor="black")
        for xi, (value, label) in enumerate(zip(rows[METRIC], rows["label"])):
            if not math.isnan(value):
                axes.annotate(_wrapped(str(label)), (x[xi], value), xytext=(0, 3), textcoords="offset points",
                              ha="center", va="bottom", fontsize=7)
    axes.set_xticks(np.arange(len(cells_)), cells_)
    axes.set_ylabel("output tok/s (first-ranked config)")
    axes.set_title("Throughput per engine and workload")
    axes.margins(y=0.25)
    axes.legend(title="engine")
    return [Plot("throughput", "Throughput per engine and workload",
                 "Each engine's first-ranked config; bars are the geometric mean of its runs (the verdict's "
                 "estimate; of its passes for a single run), error bars its 95% t interval (zero-width for a single "
                 "pass). A rank, not a verdict: where a cell is too close to call, the recommendation names every "
                 "config the rule cannot tell apart.",
                 _png(figure))]


def response_curves(frame: pd.DataFrame, configs: pd.DataFrame) -> list[Plot]:
    """Throughput against each tuned knob; failed configs marked with a red x on the axis."""
    plots = []
    for knob in varying_knobs(frame):
        figure = _figure()
        axes = figure.add_subplot()
        values = configs["knobs"].map(lambda k: k.get(knob))
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)
        order = sorted({json.dumps(v, default=str) for v in values})
        position = (lambda v: v) if numeric else (lambda v: order.index(json.dumps(v, default=str)))
        drawn = failed_any = False
        for i, ((workload, engine), group) in enumerate(configs.assign(_v=values).groupby(["cell_label", "engine"])):
            group = group[group["_v"].notna()]
            if group["_v"].map(lambda v: json.dumps(v, default=str)).nunique() < 2:
                continue
            drawn = True
            color, marker = COLORS[i % 10], MARKERS[i % len(MARKERS)]
            ok = group[group["n_passes"] > 0]
            x = np.array([position(v) for v in ok["_v"]], dtype=float)
            y = ok[METRIC].to_numpy(float)
            errors = np.vstack([y - ok["ci_low"].to_numpy(float), ok["ci_high"].to_numpy(float) - y])
            axes.errorbar(x, y, yerr=errors, fmt=marker, color=color, capsize=3, label=f"{workload} / {engine}")
            best = ok.assign(_x=x).groupby("_x")[METRIC].max().sort_index()
            axes.plot(best.index, best.values, color=color, alpha=0.6)
            failed = group[group["n_failed"] > 0]
            if len(failed):
                failed_any = True
                axes.scatter([position(v) for v in failed["_v"]], np.zeros(len(failed)), **FAILED)
        if not drawn:
            continue
        if failed_any:
            axes.scatter([], [], label="failed run(s)", **FAILED)
        if numeric and min(v for v in values if v is not None) > 0 and _spread(values) >= 8:
            axes.set_xscale("log", base=2)
        if numeric:
            ticks = sorted({float(v) for v in values if v is not None})
            axes.set_xticks(ticks, [f"{t:g}" for t in ticks])
            axes.minorticks_off()
        if not numeric:
            axes.set_xticks(range(len(order)), [o.strip('"') for o in order])
        axes.set_xlabel(knob)
        axes.set_ylabel("output tok/s")
        axes.set_ylim(bottom=0)
        axes.set_title(f"Response to {knob}")
        axes.legend(fontsize=8)
        plots.append(Plot(f"response-{slug(knob)}", f"Throughput against {knob}",
                          "One point per config (its geometric mean; error bars: its 95% t interval), the line joins "
                          "the highest estimate at each value; a red x on the axis marks a failed run.", _png(figure)))
    return plots


def preemptions(configs: pd.DataFrame) -> list[Plot]:
    measured = configs[(configs["n_passes"] > 0) & configs.get("preemptions", pd.Series(dtype=float)).notna()]
    if measured.empty:
        return []
    figure = _figure(8, 4.5)
    axes = figure.add_subplot()
    engines = sorted(measured["engine"].unique())
    for i, (workload, group) in enumerate(measured.groupby("cell_label")):
        for engine, rows in group.groupby("engine"):
            axes.scatter(rows[METRIC], rows["preemptions"], color=COLORS[i % 10],
                         marker=MARKERS[engines.index(engine) % len(MARKERS)], label=f"{workload} / {engine}")
    top = max(1.0, float(measured["preemptions"].max())) * 1.1
    axes.set_ylim(-0.05 * top, top)
    axes.set_xlabel("output tok/s")
    axes.set_ylabel("preemptions (median pass)")
    axes.set_title("Preemptions against throughput")
    axes.legend(fontsize=8)
    return [Plot("preemptions", "Preemptions against throughput",
                 "One point per config; preemptions are vLLM's counter over the reported pass.", _png(figure))]


def startup(frame: pd.DataFrame) -> list[Plot]:
    ok = frame[frame["status"] == "ok"]
    if ok.empty or "startup_s" not in ok or ok["startup_s"].notna().sum() == 0:
        return []
    compile_s = pd.to_numeric(ok.get("compile_s"), errors="coerce").fillna(0.0)
    startup_s = pd.to_numeric(ok["startup_s"], errors="coerce")
    table = pd.DataFrame({"who": ok["engine"] + "\n" + ok["model"].astype(str) + "\n" + ok["hardware"].astype(str),
                          "startup": (startup_s - compile_s).clip(lower=0),  # compile is inside startup
                          "compile": compile_s}).groupby("who").median()
    figure = _figure(max(5.0, 1.6 * len(table) + 2), 4.2)
    axes = figure.add_subplot()
    x = np.arange(len(table))
    axes.bar(x, table["startup"], 0.6, label="startup (excl. compile)", color=COLORS[0])
    axes.bar(x, table["compile"], 0.6, bottom=table["startup"], label="compile", color=COLORS[1])
    axes.set_xticks(x, table.index, fontsize=8)
    axes.set_ylabel("seconds (median over runs)")
    axes.set_title("Startup and compile time per engine")
    axes.legend()
    return [Plot("startup", "Startup and compile time per engine",
                 "Median over successful runs per engine, model and hardware.", _png(figure))]


def studies(frame: pd.DataFrame) -> list[Plot]:
    """Optimisation history and knob importance per study (only rows with ``study`` and ``trial``)."""
    if "study" not in frame or "trial" not in frame:
        return []
    trials = frame[frame["study"].notna() & frame["trial"].notna()]
    plots = []
    for study, rows in trials.groupby("study"):
        rows = rows.sort_values("trial")
        ok = rows[rows["status"] == "ok"]
        figure = _figure(8, 4.2)
        axes = figure.add_subplot()
        axes.scatter(ok["trial"], ok[METRIC], color=COLORS[0], label="trial")
        if len(ok):
            axes.step(ok["trial"], ok[METRIC].cummax(), where="post", color=COLORS[1], label="best so far")
        failed = rows[rows["status"] != "ok"]
        if len(failed):
            axes.scatter(failed["trial"], np.zeros(len(failed)), label="failed trial", **FAILED)
        axes.set_xlabel("trial")
        axes.set_ylabel("output tok/s")
        axes.set_ylim(bottom=0)
        axes.set_title(f"Optimisation history: {study}")
        axes.legend()
        plots.append(Plot(f"study-{slug(str(study))}-history", f"Optimisation history of study {study}",
                          "Output tok/s per trial as recorded in its row; failed trials on the axis.", _png(figure)))
        importance = knob_importance(ok)
        if importance:
            figure = _figure(7, 0.5 * len(importance) + 1.5)
            axes = figure.add_subplot()
            names = list(importance)[::-1]
            axes.barh(names, [importance[n] for n in names], color=COLORS[2])
            axes.set_xlabel("share of explained variance (η², normalised)")
            axes.set_title(f"Knob importance: {study}")
            plots.append(Plot(f"study-{slug(str(study))}-importance", f"Knob importance in study {study}",
                              "Correlation ratio η² of output tok/s by each knob's value (continuous knobs in "
                              "quartile bins) over successful trials, normalised to sum to 1; a quick stand-in "
                              "for Optuna's fANOVA computed from the rows alone.", _png(figure)))
    return plots


def knob_importance(ok: pd.DataFrame) -> dict[str, float]:
    if len(ok) < 3:
        return {}
    y = ok[METRIC].astype(float)
    total = ((y - y.mean()) ** 2).sum()
    if total <= 0:
        return {}
    scores = {}
    for column in knob_columns(ok):
        values = ok[column]
        if values.map(lambda v: json.dumps(v, default=str)).nunique() < 2:
            continue
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.notna().all() and numeric.nunique() > 4:
            keys = pd.qcut(numeric, 4, duplicates="drop").astype(str)
        else:
            keys = values.map(lambda v: json.dumps(v, default=str))
        between = sum(len(g) * (g.mean() - y.mean()) ** 2 for _, g in y.groupby(keys.values))
        scores[column.removeprefix("knob.")] = between / total
    norm = sum(scores.values())
    return dict(sorted(((k, v / norm) for k, v in scores.items()), key=lambda kv: -kv[1])) if norm else {}


def _spread(values: pd.Series) -> float:
    numbers = [float(v) for v in values if v is not None]
    return max(numbers) / min(numbers) if numbers and min(numbers) > 0 else 0.0


def predictions(records: pd.DataFrame) -> list[Plot]:
    """Predicted against measured, log-log, one panel per predictor (``harness.report.predictions.records``)."""
    shown = records[(records["measured"].astype(float) > 0) & (records["predicted"].astype(float) > 0)] \
        if len(records) else records
    names = sorted(shown["predictor"].unique()) if len(shown) else []
    if not names:
        return []
    figure = _figure(max(5.0, 4.4 * len(names)), 4.4)
    for panel, name in enumerate(names):
        axes = figure.add_subplot(1, len(names), panel + 1)
        _prediction_panel(axes, shown[shown["predictor"] == name], name)
    return [Plot("predictions", "Predicted against measured",
                 "One point per prediction that has a measurement, one panel per predictor; the solid line is "
                 "measured = predicted, dotted lines ±10%, and a vertical bar at a point is the prediction's "
                 "interval (the point lies inside it when the measurement fell within).", _png(figure))]


def _prediction_panel(axes, rows: pd.DataFrame, name: str) -> None:
    engines = sorted(rows["engine"].unique())
    for i, engine in enumerate(engines):
        mine = rows[rows["engine"] == engine]
        x, y = mine["predicted"].to_numpy(float), mine["measured"].to_numpy(float)
        bounded = mine["lo"].notna() & mine["hi"].notna()
        axes.vlines(x[bounded.to_numpy()], mine.loc[bounded, "lo"].to_numpy(float),
                    mine.loc[bounded, "hi"].to_numpy(float), color=COLORS[i % 10], alpha=0.35, linewidth=3)
        axes.scatter(x, y, color=COLORS[i % 10], marker=MARKERS[i % len(MARKERS)], label=engine, zorder=3)
    values = pd.concat([rows["predicted"], rows["measured"], rows["lo"], rows["hi"]]).astype(float)
    values = values[values > 0]
    low, high = float(values.min()) / 1.3, float(values.max()) * 1.3
    line = np.array([low, high])
    axes.plot(line, line, color="black", linewidth=1)
    for factor in (0.9, 1.1):
        axes.plot(line, line * factor, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xscale("log")
    axes.set_yscale("log")
    ticks = _log_ticks(low, high)   # plain numbers: matplotlib's minor log labels collided
    labels = [f"{t:,.0f}" if t >= 10 else f"{t:g}" for t in ticks]
    axes.set_xticks(ticks, labels)
    axes.set_yticks(ticks, labels)
    axes.minorticks_off()
    axes.set_xlim(low, high)
    axes.set_ylim(low, high)
    units = ", ".join(sorted({u for u in rows["unit"] if u})) or "as recorded"
    axes.set_xlabel(f"predicted ({units})")
    axes.set_ylabel(f"measured ({units})")
    axes.set_title(f"{name}: {len(rows)} prediction(s)")
    axes.legend(title="engine", fontsize=8)


def _log_ticks(low: float, high: float) -> list[float]:
    """At least three round ticks between ``low`` and ``high`` (1, else 1-2-5, else finer, per decade)."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    ticks: list[float] = []
    for subs in ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)):
        ticks = [s * 10.0 ** d for d in decades for s in subs if low <= s * 10.0 ** d <= high]
        if len(ticks) >= 3:
            break
    return ticks


def all_plots(frame: pd.DataFrame, configs: pd.DataFrame) -> list[Plot]:
    return [*throughput(configs), *response_curves(frame, configs), *preemptions(configs), *startup(frame),
            *studies(frame)]
