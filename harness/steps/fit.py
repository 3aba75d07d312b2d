"""Fit the step model (``engines.stepmodel``) to step traces: bounded least squares over named parts.

Each step of each trace is one observation (an aggregated line counts ``weight`` times):
its seconds against the step's features, one column per part (a constant, sequences,
tokens and hinges on tokens at a few knees, prefill tokens, KV tokens, encoder tokens,
requests preempted).
``scipy.optimize.lsq_linear`` keeps every coefficient ≥ 0 (the hinges ≥ 0 make the
linear-layer curve convex and increasing: flat-then-rising on a GPU, growing on a CPU);
a part the traces never exercise (no images) is left out and stays 0. So are the context parts
(``kv_token_s``, ``prefill_pair_s``) where no step of the traces knows its context (``context`` and
``decode_context`` all -1: vLLM's engine core in a child process does not say it): there the
attended context would fall back to the KV cache in use, the very column of ``kv_held_s``, and
the two would split one effect between them at random; the KV cache in use (``kv_held_s``) then
carries attention alone, which the simulator's replay knows as well (``seen["context"]`` is then the
largest KV cache in use, what the fit saw of attention). No step is dropped as
an outlier: a slow step (the first large batch of a process, a pause of the host) is part of
what a run costs, and small batches, rare in a trace, are exactly where a prediction of a
draining run needs them. The interval of
a run-total prediction is taken from the fit's residuals over whole runs: twice the
root-mean-square relative error of each training run's summed step seconds, each run predicted by a fit
without it (k-fold over runs; at least 2%); from fewer than 3 runs there is none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from engines.stepmodel import StepModel, StepShape

KNEE_FRACTIONS = (0.125, 0.25, 0.5, 0.75)  # knees at these fractions of the largest step's tokens
MIN_INTERVAL = 0.02
CONTEXT_PARTS = ("kv_token_s", "prefill_pair_s")   # priced by the steps' context: fitted only where it is known


@dataclass
class Design:
    """The features of a set of steps, and which coefficient each column feeds."""

    matrix: np.ndarray
    names: list[str]
    knees: list[float]


def features(frame: pd.DataFrame, knees: list[float]) -> Design:
    tokens = (frame["prefill"] + frame["decode"]).to_numpy(float)
    columns = {"step_s": np.ones(len(frame)), "seq_s": frame["running"].to_numpy(float), "token_s": tokens}
    for i, knee in enumerate(knees):
        columns[f"knee{i}"] = np.maximum(0.0, tokens - knee)
    columns["prefill_token_s"] = frame["prefill"].to_numpy(float)
    shapes = [StepShape(tokens=0, seqs=int(r.running), kv_tokens=float(r.kv_tokens), prefill=int(r.prefill),
                        decode=int(r.decode), context=float(getattr(r, "context", -1.0)),
                        decode_context=float(getattr(r, "decode_context", -1.0)))
              for r in frame.itertuples(index=False)]
    columns["prefill_pair_s"] = np.array([s.prefill_pairs for s in shapes])
    columns["kv_token_s"] = np.array([s.attended for s in shapes])
    columns["kv_held_s"] = np.clip(frame["kv_tokens"].to_numpy(float), 0, None)
    columns["encoder_token_s"] = frame["encoder_tokens"].to_numpy(float)
    columns["preempt_s"] = frame["preempted"].to_numpy(float) if "preempted" in frame else np.zeros(len(frame))
    return Design(np.column_stack(list(columns.values())), list(columns), knees)


def coefficients(model: StepModel, names: list[str]) -> np.ndarray:
    """The model's parameters in the order of a design's columns (``knee<i>``: the i-th knee's slope)."""
    slopes = [slope for _, slope in model.knees]
    return np.array([slopes[int(n[4:])] if n.startswith("knee") else getattr(model, n) for n in names])


def fit_step_model(traces: dict[str, pd.DataFrame], host_id: str | None = None, source: str = "",
                   hardware: str | None = None) -> StepModel:
    """A step model from ``{run_id: trace}`` (``harness.steps.store`` frames); raises ``ValueError`` on none."""
    frame = pd.concat([t.assign(run=run) for run, t in traces.items() if t is not None and len(t)], ignore_index=True) \
        if traces else pd.DataFrame()
    if frame.empty:
        raise ValueError("no steps to fit: run the real engine first (its rows keep their step traces)")
    frame = frame[frame["dt"] > 0]
    tokens = frame["prefill"] + frame["decode"]
    top = float(tokens.max())
    knees = sorted({round(top * f) for f in KNEE_FRACTIONS if top * f >= 2})
    design = features(frame, knees)
    used = [i for i in range(design.matrix.shape[1]) if np.any(design.matrix[:, i] != design.matrix[0, i]) or i == 0]
    if not _knows_context(frame):   # kv_token_s would be kv_held_s's column again: left out, stays 0
        used = [i for i in used if design.names[i] not in CONTEXT_PARTS]
    weight = frame["weight"].to_numpy(float)
    y = frame["dt"].to_numpy(float)
    coef = _solve(design.matrix, y, weight, used)
    values = {name: max(0.0, float(v)) for name, v in zip(design.names, coef)}  # BVLS can end a hair below 0
    # on its bound: 0, or so near it that the part adds under a millionth of the mean step (BVLS ends a hair off)
    share = coef * np.abs(design.matrix).mean(axis=0) / max(float(y.mean()), 1e-12)
    at_bound = [name for i, name in enumerate(design.names) if i in used and share[i] < 1e-6
                and not name.startswith("knee")]
    interval = _interval(frame["run"].to_numpy(), design.matrix, y, weight, used, coef)
    return StepModel(
        step_s=values["step_s"], seq_s=values["seq_s"], token_s=values["token_s"],
        knees=tuple((k, values[f"knee{i}"]) for i, k in enumerate(knees) if values[f"knee{i}"] > 0),
        prefill_token_s=values["prefill_token_s"], prefill_pair_s=values["prefill_pair_s"],
        kv_token_s=values["kv_token_s"], kv_held_s=values["kv_held_s"],
        encoder_token_s=values["encoder_token_s"], preempt_s=values["preempt_s"],
        seen={"tokens": top, "seqs": float(frame["running"].max()),
              "context": float(design.matrix[:, design.names.index("kv_token_s")].max()),
              "preemptions": float(frame["preempted"].max()) if "preempted" in frame else 0.0,
              "encoder_tokens": float(frame["encoder_tokens"].max())},
        interval=interval, at_bound=tuple(at_bound), host_id=host_id, hardware=hardware,
        source=source or f"{len(traces)} run(s), {int(weight.sum())} steps, fitted "
                         f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")


def _knows_context(frame: pd.DataFrame) -> bool:
    """Whether any step says its context (``context`` or ``decode_context`` ≥ 0)."""
    return any(name in frame and bool((frame[name] >= 0).any()) for name in ("context", "decode_context"))


def _solve(matrix: np.ndarray, y: np.ndarray, weight: np.ndarray, used: list[int]) -> np.ndarray:
    """Weighted least squares with every coefficient ≥ 0 (bounded-variable least squares)."""
    from scipy.optimize import lsq_linear   # here: a run that fits nothing needs no scipy

    w = np.sqrt(weight)
    coef = np.zeros(matrix.shape[1])
    coef[used] = lsq_linear(matrix[:, used] * w[:, None], y * w, bounds=(0.0, np.inf), method="bvls").x
    return coef


def _interval(runs: np.ndarray, matrix: np.ndarray, y: np.ndarray, weight: np.ndarray, used: list[int],
              coef: np.ndarray) -> float | None:
    """Relative half-width of a run-total prediction: twice the root-mean-square error of each run's summed
    step seconds, each run predicted by a fit without it (up to 5 folds), at least ``MIN_INTERVAL``; ``None``
    from fewer than 3 runs (no out-of-sample error to take it from: an in-sample one would be too narrow)."""
    names = sorted(set(runs))
    if len(names) < 3:
        return None
    folds = [names[i::min(len(names), 5)] for i in range(min(len(names), 5))]
    errors = []
    for fold in folds:
        out = np.isin(runs, fold)
        fitted = _solve(matrix[~out], y[~out], weight[~out], used)
        for run in fold:
            mine = runs == run
            errors.append(float(np.sum(matrix[mine] @ fitted * weight[mine]) / np.sum(y[mine] * weight[mine]) - 1))
    return max(MIN_INTERVAL, 2 * float(np.sqrt(np.mean(np.square(errors)))))


def run_errors(model: StepModel, traces: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Per run: the model's summed step seconds over the trace's ÷ measured − 1 (same steps, model vs clock)."""
    out = {}
    for run, trace in traces.items():
        design = features(trace, [k for k, _ in model.knees])
        coef = coefficients(model, design.names)
        predicted = float(np.sum(design.matrix @ coef * trace["weight"].to_numpy(float)))
        out[run] = predicted / float(np.sum(trace["dt"] * trace["weight"])) - 1
    return out
