"""The idle-window planner and cost: how long each engine's best config needs for a backlog.

time = backlog ÷ rate + startup (compile included)

- backlog: ``backlog_requests`` (default 1,000,000) at the workload's mean tokens per
  request (prompt + output, measured in the rows), or ``backlog_tokens`` directly;
- rate: the config's req/s for a backlog in requests, its total tok/s for one in tokens: its
  full-engine rate where its rows have one (``full_engine_tok_s``: the step model fitted to its own
  steps, requests replayed with the engine kept full, as a backlog keeps it), else its measured
  rate, which includes each measured run's ramp-up and drain (``rate_source`` says which);
- the range: ``total_low_h`` to ``total_high_h``, the time at the ends of the rate's interval (the full-engine
  rate's over the config's runs, or the measured rate's); none where the rate has no interval (one run of a
  full-engine rate). ``note`` says where the full-engine rate extrapolated past the runs' own steps
  (a batch larger than any step recorded, a context longer) or why a config has none;
- startup and compile: the config's measured seconds. Every adapter times the engine's
  constructor, which compiles (vLLM's torch.compile, SGLang's CUDA graphs, TensorRT-LLM's
  engine build) before it returns, so the startup shown is the measured startup minus
  compile and nothing is counted twice.

Cost = total hours × GPUs × price per GPU-hour (on a CPU host read it as the machine-hour
price); per million tokens it is that cost over the backlog's tokens. GPUs per config are
replicas × tensor parallel × pipeline parallel, and job time is computed, both in
``harness.run.cost`` (shared with the tuner's ``job_time`` objective).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.report.data import CELL, METRIC, cells
from harness.run.cost import as_number, devices, job_seconds


@dataclass(frozen=True)
class PlannerInputs:
    backlog_requests: float = 1_000_000
    backlog_tokens: float | None = None   # when set, the backlog is this many tokens (prompt + output)
    window_h: float = 8.0
    usd_per_gpu_hour: float = 2.50

    def describe(self) -> str:
        backlog = (f"{self.backlog_tokens:,.0f} tokens" if self.backlog_tokens
                   else f"{self.backlog_requests:,.0f} requests")
        return (f"backlog {backlog}, idle window {self.window_h:g} h, "
                f"price {self.usd_per_gpu_hour:.2f} USD per GPU-hour")


def tokens_per_request(frame: pd.DataFrame, key: tuple) -> float | None:
    """Mean prompt + output tokens per request over the cell's successful rows."""
    rows = frame[frame["status"] == "ok"]
    for column, value in zip(CELL, key):
        rows = rows[rows[column] == value]
    if not {"input_tokens", "output_tokens", "requests_done"} <= set(rows.columns):
        return None
    rows = rows.dropna(subset=["input_tokens", "output_tokens", "requests_done"])
    requests = rows["requests_done"].sum()
    return float((rows["input_tokens"] + rows["output_tokens"]).sum() / requests) if requests else None


def best_per_engine(group: pd.DataFrame) -> pd.DataFrame:
    measured = group[group["n_passes"] > 0].sort_values(METRIC, ascending=False)
    return measured.drop_duplicates("engine")


def plan(frame: pd.DataFrame, configs: pd.DataFrame, inputs: PlannerInputs) -> pd.DataFrame:
    """One line per cell and engine (its best config) with every input of the sum next to the result."""
    lines = []
    for key, group in cells(configs):
        per_request = tokens_per_request(frame, key)
        for config in best_per_engine(group).to_dict("records"):
            lines.append(plan_line(config, per_request, inputs))
    return pd.DataFrame.from_records(lines)


def plan_line(config: dict[str, Any], per_request: float | None, inputs: PlannerInputs) -> dict[str, Any]:
    compile_s = as_number(config.get("compile_s"))
    startup = max(as_number(config.get("startup_s")) - compile_s, 0.0)
    full, measured = as_number(config.get("full_engine_tok_s"), math.nan), as_number(config.get("output_tok_s"), math.nan)
    scale, source = (full / measured, "full engine (step model)") if full > 0 and measured > 0 else (1.0, "measured")
    low, high = _rate_range(config, full if source != "measured" else measured, source)
    if inputs.backlog_tokens:
        tokens = float(inputs.backlog_tokens)
        requests = tokens / per_request if per_request else math.nan
        rate, unit, backlog = as_number(config.get("total_tok_s"), math.nan) * scale, "tok/s", tokens
    else:
        requests = float(inputs.backlog_requests)
        tokens = requests * per_request if per_request else math.nan
        rate, unit, backlog = as_number(config.get("req_s"), math.nan) * scale, "req/s", requests
    total_s = job_seconds(config.get("startup_s"), backlog, rate)
    slow_s, fast_s = (job_seconds(config.get("startup_s"), backlog, rate * f) if f == f else math.nan
                      for f in (low, high))
    generate_s = job_seconds(0, backlog, rate)
    gpus = devices(config["engine"], config.get("knobs") or {})
    cost = total_s / 3600 * gpus * inputs.usd_per_gpu_hour
    return {
        "cell_label": config["cell_label"], "model": config["model"], "hardware": config["hardware"],
        "engine": config["engine"], "label": config["label"], "config_id": config["config_id"],
        "tokens_per_request": per_request, "backlog_requests": requests, "backlog_tokens": tokens,
        "rate": rate, "rate_unit": unit, "rate_source": source, "generate_s": generate_s, "startup_s": startup, "compile_s": compile_s,
        "total_s": total_s, "total_h": total_s / 3600, "window_h": inputs.window_h,
        "total_low_h": fast_s / 3600, "total_high_h": slow_s / 3600,
        "note": config.get("full_engine_note") if isinstance(config.get("full_engine_note"), str) else None,
        "clears": bool(total_s <= inputs.window_h * 3600), "slack_h": inputs.window_h - total_s / 3600,
        "gpus": gpus, "cost_usd": cost, "usd_per_m_tokens": cost / tokens * 1e6 if tokens else math.nan,
    }


def _rate_range(config: dict[str, Any], centre: float, source: str) -> tuple[float, float]:
    """The rate's interval as factors of the rate used (low, high); NaN where it has none."""
    if source == "measured" and as_number(config.get("n_samples")) < 2:   # one sample: no interval
        return math.nan, math.nan
    low, high = ((config.get("full_engine_low"), config.get("full_engine_high")) if source != "measured"
                 else (config.get("ci_low"), config.get("ci_high")))
    low, high = as_number(low, math.nan), as_number(high, math.nan)
    if not (centre > 0 and low > 0 and high > 0):
        return math.nan, math.nan
    return low / centre, high / centre
