"""``troughput-calibrate``: fit the simulator's efficiency factors to real rows of one (engine, hardware, model).

Each ok, measured row of that cell that carries its workload config (``workload_cfg.*``,
written by the runner) is re-simulated once: its workload and ordering are rebuilt,
its knobs given to the simulator, and the step trace kept. Since an offline batch's
schedule does not depend on time, the predicted wall time for any efficiency
factors is a sum over that fixed trace, so the fit (Nelder–Mead on log factors,
least squares of log(predicted ÷ measured) wall time) takes a fraction of a second.
The result goes to ``conf/calibration/<engine>/<hardware>-<model>.yaml``, which
``engine=sim`` loads for that hardware and model.

Usage: ``troughput-calibrate engine=vllm hardware=cpu model=tiny [run.results_dir=results] [--dry-run]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import yaml

from engines.base import KnobError
from engines.common import PROJECT_ROOT
from engines.perfmodel import Efficiency, StepCost
from engines.sim import SIM_KNOBS, SimEngine
from harness.core.errors import TroughputError
from harness.ordering.policies import apply_ordering
from harness.run.hostspec import complete_spec
from harness.run.results import read_rows

PARAMS = [f.name for f in fields(Efficiency)]


@dataclass
class RowTrace:
    """One measured row and its simulated schedule, reduced to what the fit needs."""

    run_id: str
    label: str
    measured_s: float
    cost: StepCost
    steps: np.ndarray       # per step: tokens, seqs, attention pairs, KV tokens
    preemptions: int        # simulated
    measured_preemptions: int | None

    def predict(self, eff: Efficiency) -> float:
        """Predicted wall seconds of the run with ``eff``."""
        tokens, seqs, pairs, kv = self.steps.T
        return float(np.sum(self.cost.step_seconds(tokens, seqs, pairs, kv, eff)))


@dataclass
class Fit:
    efficiency: Efficiency
    errors: list[float]     # predicted ÷ measured − 1, per row

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(e) for e in self.errors)


def unflatten(row: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Dotted columns ``prefix.a.b`` back to nested dicts; NaN (absent in this row) dropped."""
    nested: dict[str, Any] = {}
    for key, value in row.items():
        if not key.startswith(prefix + ".") or value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        node = nested
        *parents, leaf = key[len(prefix) + 1:].split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def measured_seconds(row: Mapping[str, Any], passes: str = "median") -> float:
    """The row's wall seconds: its reported (median) pass, or its fastest pass (``passes="best"``).

    On a shared machine other tenants only ever slow a pass down, so the fastest
    pass is the steadier estimate of what the engine does.
    """
    if passes == "best" and row.get("output_tok_s_passes") and row.get("output_tokens"):
        return float(row["output_tokens"]) / max(row["output_tok_s_passes"])
    return float(row["wall_s"])


def simulate_row(row: Mapping[str, Any], model: Mapping[str, Any], hardware_spec: Mapping[str, Any],
                 image_dir: Path = PROJECT_ROOT / ".cache" / "troughput" / "images", passes: str = "median") -> RowTrace:
    """Rebuild the row's workload, ordering and knobs; simulate (``SimEngine.schedule``); return the step trace.

    Args:
        hardware_spec: a complete spec (``harness.run.hostspec.complete_spec`` fills a host's null rates).

    Raises:
        TroughputError: the row cannot be re-simulated (no workload config, images, unknown model).
    """
    from harness.workloads import build_workload

    workload_cfg = unflatten(row, "workload_cfg")
    if not workload_cfg:
        raise TroughputError("no workload_cfg.* columns (written by troughput since the simulator was added)")
    workload = build_workload(workload_cfg, model, image_dir)
    if any(r.images for r in workload.requests):
        raise TroughputError("multimodal rows are not simulated (image tokens are expanded inside the engine)")
    if workload.fingerprint != row.get("workload_fingerprint"):
        raise TroughputError("the rebuilt workload's fingerprint differs from the row's")
    requests = apply_ordering(workload.requests, unflatten(row, "ordering_cfg") or {"name": row.get("ordering")})
    knobs = {k: v for k, v in unflatten(row, "knob").items() if k in SIM_KNOBS}
    sim = SimEngine(model, {**knobs, "hardware_spec": dict(hardware_spec)})
    try:
        sim.validate()
        sim.start()
    except (KnobError, MemoryError) as e:
        raise TroughputError(f"cannot simulate these knobs: {e}") from e
    schedule = sim.schedule(requests)
    sim.stop()
    shown = {k: knobs[k] for k in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes",
                                   "enable_chunked_prefill", "enable_prefix_caching") if k in knobs}
    return RowTrace(str(row.get("run_id")), f"{row.get('workload')} {shown}", measured_seconds(row, passes),
                    schedule.cost, np.asarray(schedule.steps, dtype=float).reshape(-1, 4), schedule.preemptions,
                    _int_or_none(row.get("preemptions")))


def fit(traces: Sequence[RowTrace], fixed: Mapping[str, float] | None = None) -> Fit:
    """Efficiency factors minimising Σ log²(predicted ÷ measured) over the rows (multi-start Nelder–Mead).

    Args:
        fixed: factors held at a value instead of fitted (e.g. ``{"seq_overhead_s": 0}``).
    """
    if not traces:
        raise TroughputError("no rows to fit")
    fixed = dict(fixed or {})
    free = [p for p in PARAMS if p not in fixed]
    measured = np.array([t.measured_s for t in traces])

    def efficiency(x: np.ndarray) -> Efficiency:
        return Efficiency(**fixed, **{p: float(math.exp(v)) for p, v in zip(free, x)})

    def loss(x: np.ndarray) -> float:
        predicted = np.array([t.predict(efficiency(x)) for t in traces])
        return float(np.sum(np.log(predicted / measured) ** 2))

    mean_steps = float(np.mean([len(t.steps) for t in traces]))
    scale = float(np.median(measured)) / max(mean_steps, 1.0)   # seconds per step, order of magnitude
    starts = {"compute": [0.5, 0.05], "bandwidth": [0.5, 0.05], "step_overhead_s": [scale * 0.5, scale * 0.05],
              "seq_overhead_s": [scale * 0.01, scale * 0.001]}
    best = None
    for i in range(2 ** len(free)):
        x0 = np.log([starts[p][(i >> k) & 1] for k, p in enumerate(free)])
        x, value = nelder_mead(loss, x0)
        if best is None or value < best[1]:
            best = (x, value)
    eff = efficiency(best[0])
    return Fit(eff, [t.predict(eff) / t.measured_s - 1 for t in traces])


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 1.0, iterations: int = 600,
                tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` with the Nelder–Mead simplex (standard coefficients)."""
    n = len(x0)
    simplex = [np.array(x0, dtype=float)] + [np.array(x0, dtype=float) + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    best = int(np.argmin(values))
    return simplex[best], values[best]


def write_calibration(path: Path, result: Fit, traces: Sequence[RowTrace], source: str) -> Path:
    """The calibration file ``engine=sim`` loads: ``efficiency:``, the ``host:`` spec the factors are relative
    to (``engine=sim`` predicts with it and warns where the current host differs), and the fit per row in comments."""
    lines = [f"# Fitted by troughput-calibrate on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from "
             f"{len(traces)} row(s): {source}.",
             f"# Median absolute error of the predicted wall time over these rows: {result.median_abs_error:.1%}.",
             f"# Factors are relative to the hardware spec used: {_spec_line(traces[0].cost.hardware)}.",
             "# run_id, measured s, predicted s, error:"]
    lines += [f"#   {t.run_id}  {t.measured_s:.3f}  {t.predict(result.efficiency):.3f}  {e:+.1%}"
              for t, e in zip(traces, result.errors)]
    body = yaml.safe_dump({"efficiency": {k: float(f"{v:.6g}") for k, v in result.efficiency.to_dict().items()},
                           "host": fitted_host(traces)}, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + body)
    return path


def fitted_host(traces: Sequence[RowTrace]) -> dict[str, Any]:
    """The hardware spec every trace was simulated with, as data (the rates the factors are relative to)."""
    specs = {(t.cost.hardware.peak_flops_bf16, t.cost.hardware.peak_flops_fp8, t.cost.hardware.bandwidth_bytes_s)
             for t in traces}
    if len(specs) != 1:
        raise TroughputError(f"the rows were simulated against {len(specs)} different hardware specs; fit one at a time")
    hardware = traces[0].cost.hardware
    return {"name": hardware.name, "peak_flops_bf16": float(f"{hardware.peak_flops_bf16:.6g}"),
            "peak_flops_fp8": float(f"{hardware.peak_flops_fp8:.6g}") if hardware.peak_flops_fp8 else None,
            "bandwidth_bytes_s": float(f"{hardware.bandwidth_bytes_s:.6g}"), "source": hardware.source}


def cell_rows(results_dir: Path, engine: str, hardware: str, model: str) -> list[dict[str, Any]]:
    """Measured ok rows of one (engine, hardware, model) cell, one engine each (the simulator models one)."""
    return [r for r in read_rows(results_dir) if r.get("status") == "ok" and not r.get("predicted")
            and (r.get("replicas") or 1) == 1
            and r.get("engine") == engine and r.get("hardware") == hardware and r.get("model") == model]


def calibrate(overrides: Sequence[str], dry_run: bool = False, out_dir: Path | None = None,
              passes: str = "median") -> tuple[Fit, Path | None]:
    """Compose the cell from ``overrides``, fit its rows, print the errors, write the file (unless ``dry_run``)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.core.models import resolve_model

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    if not cfg.hardware.get("spec"):
        raise TroughputError(f"hardware {cfg.hardware.name!r} has no spec: block to simulate with")
    choices = cfg.hydra.runtime.choices
    model = resolve_model(OmegaConf.to_container(cfg.model, resolve=True), cfg.engine.python or sys.executable)
    spec = complete_spec(OmegaConf.to_container(cfg.hardware.spec, resolve=True))  # this host's rates where null
    rows = cell_rows(Path(cfg.run.results_dir), cfg.engine.name, cfg.hardware.name, cfg.model.name)
    traces = []
    for row in rows:
        try:
            traces.append(simulate_row(row, model, spec, Path(cfg.run.image_dir), passes))
        except TroughputError as e:
            print(f"  skipped {row.get('run_id')}: {e}")
    cell = f"engine={cfg.engine.name} hardware={cfg.hardware.name} model={cfg.model.name}"
    if not traces:
        raise TroughputError(f"no usable rows for {cell} in {cfg.run.results_dir}/runs; run some first")
    result = fit(traces)
    print(f"{len(traces)} row(s) of {cell}; fitted {result.efficiency.to_dict()}")
    for t, e in zip(traces, result.errors):
        print(f"  {t.run_id}  measured {t.measured_s:8.3f} s  predicted {t.predict(result.efficiency):8.3f} s  "
              f"{e:+6.1%}  preemptions {t.measured_preemptions} real / {t.preemptions} sim  {t.label}")
    print(f"median absolute error: {result.median_abs_error:.1%}")
    if dry_run:
        return result, None
    target = (out_dir or PROJECT_ROOT / "conf" / "calibration") / cfg.engine.name / f"{choices.hardware}-{choices.model}.yaml"
    path = write_calibration(target, result, traces, f"{cell} in {cfg.run.results_dir}, {passes} passes")
    print(f"written to {path}")
    return result, path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="troughput-calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides naming the cell, e.g. engine=vllm hardware=cpu model=tiny")
    parser.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    parser.add_argument("--out-dir", type=Path, default=None, help="instead of conf/calibration")
    parser.add_argument("--passes", choices=["median", "best"], default="median",
                        help="fit each row's reported median pass, or its fastest (steadier on a shared machine)")
    args = parser.parse_args(argv)
    try:
        calibrate(args.overrides, args.dry_run, args.out_dir, args.passes)
    except TroughputError as e:
        print(f"troughput-calibrate: error: {e}", file=sys.stderr)
        sys.exit(2)


def _spec_line(hardware: Any) -> str:
    return (f"{hardware.name}, {hardware.peak_flops_bf16:.4g} FLOP/s, {hardware.bandwidth_bytes_s:.4g} B/s "
            f"({hardware.source})")


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)
    except (TypeError, ValueError):
        return None


if __name__ == "__main__":
    main()
