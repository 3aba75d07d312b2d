"""``troughput-calibrate``: fit the simulator's step model to this host's step traces of one (engine, model).

Every ok row of the engine (vLLM by default: the engine the simulator stands for) and model
that ran on this host (``env.host_id``) keeps its step trace (``results/steps/<run_id>.parquet``).
The step model (``engines.stepmodel``: named parts, each ≥ 0) is fitted to every step of them
(``harness.steps.fit``), then each row is replayed through the simulator's scheduler with the
fitted model (its workload, ordering and knobs rebuilt from the row), and the replayed output
tok/s is printed beside the measured one. The file goes to
``conf/calibration/<engine>/<hardware>-<model>.yaml`` with the host id it was fitted on;
``engine=sim`` applies it only on that host (``harness.run.stepmodels``).

Usage: ``troughput-calibrate [engine=vllm] [hardware=cpu] [model=tiny] [run.results_dir=results] [--dry-run]
[--out-dir DIR]`` (``DIR/vllm/<hardware>-<model>.yaml`` instead of ``conf/calibration``)
(with no argument: the default config's cell).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from engines.common import PROJECT_ROOT
from engines.stepmodel import StepModel
from harness.core.errors import TroughputError
from harness.ordering.policies import apply_ordering
from harness.run.hostspec import complete_spec
from harness.run.results import read_rows
from harness.run.spec import build_spec
from harness.run.stepmodels import host_traces, spec_speed_key, this_host_id
from harness.steps.fit import fit_step_model, run_errors
from harness.steps.predict import replay


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


def row_requests(row: Mapping[str, Any], model: Mapping[str, Any],
                 image_dir: Path = PROJECT_ROOT / ".cache" / "troughput" / "images") -> list:
    """The row's requests in the order it ran them, rebuilt from its ``workload_cfg.*`` and ``ordering_cfg.*``.

    Raises:
        TroughputError: no workload config in the row, or the rebuilt workload is not the row's.
    """
    from harness.workloads import build_workload

    workload_cfg = unflatten(row, "workload_cfg")
    if not workload_cfg:
        raise TroughputError("no workload_cfg.* columns (written by troughput since the simulator was added)")
    workload = build_workload(workload_cfg, model, image_dir)
    if workload.fingerprint != row.get("workload_fingerprint"):
        raise TroughputError("the rebuilt workload's fingerprint differs from the row's")
    return apply_ordering(workload.requests, unflatten(row, "ordering_cfg") or {"name": row.get("ordering")})


def replay_row(row: Mapping[str, Any], step_model: StepModel | None, model: Mapping[str, Any],
               hardware_spec: Mapping[str, Any], image_dir: Path | None = None) -> float:
    """The row's output tok/s as the simulator replays it with ``step_model``."""
    requests = row_requests(row, model, *([image_dir] if image_dir else []))
    return replay(step_model, requests, unflatten(row, "knob"), dict(model), dict(hardware_spec)).rate


def write_calibration(path: Path, step_model: StepModel, lines: Sequence[str]) -> Path:
    """The file ``engine=sim`` loads (``step_model:``), with how it was fitted in comments."""
    body = yaml.safe_dump({"step_model": _rounded(step_model.to_dict())}, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"# {line}\n" for line in lines) + body)
    return path


def calibrate(overrides: Sequence[str], dry_run: bool = False, out_dir: Path | None = None) -> tuple[StepModel, Path | None]:
    """Compose the cell from ``overrides``, fit this host's traces, print each row's replay, write the file."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.core.models import resolve_model

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
        if cfg.engine.name not in ("vllm", "sim"):
            raise TroughputError(f"the simulator replays vLLM's scheduler: its step model is fitted to vLLM's "
                                 f"steps, not {cfg.engine.name}'s (use engine=vllm, the default)")
        vllm_cfg = compose("config", overrides=[*overrides, "engine=vllm"])   # the runs it stands for
    choices = cfg.hydra.runtime.choices
    engine = "vllm"
    results = Path(cfg.run.results_dir)
    host = this_host_id()
    key = spec_speed_key(build_spec(vllm_cfg))
    traces = host_traces(results, cfg.model.name, host, engine=engine, key=key)
    cell = f"engine={engine} model={cfg.model.name} host {host} " + " ".join(f"{k}={v}" for k, v in key.items())
    if not traces:
        raise TroughputError(f"no step trace of {cell} in {results}/steps: run the engine here first (make run)")
    step_model = fit_step_model(traces, host_id=host, hardware=key["hardware"],
                                source=f"troughput-calibrate, {len(traces)} {engine} run(s) of host {host}, "
                                       f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    lines = [f"Fitted by troughput-calibrate on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from the step traces of "
             f"{len(traces)} run(s) of {cell} in {results}.", "Applied only on this host (step_model.host_id).",
             "Parts at their bound (0): " + (", ".join(step_model.at_bound) or "none") + ".",
             "run_id, summed step seconds (model ÷ clock − 1), output tok/s measured, replayed, error:"]
    print(f"{len(traces)} run(s) of {cell}; parts at their bound: {', '.join(step_model.at_bound) or 'none'}")
    model = resolve_model(OmegaConf.to_container(cfg.model, resolve=True), cfg.engine.python or sys.executable)
    spec = complete_spec(OmegaConf.to_container(cfg.hardware.spec, resolve=True))
    rows = {r["run_id"]: r for r in read_rows(results) if r.get("run_id") in traces}
    steps_error = run_errors(step_model, traces)
    replay_errors = []
    for run_id, row in rows.items():
        try:
            replayed = replay_row(row, step_model, model, spec, Path(cfg.run.image_dir))
            error = row["output_tok_s"] / replayed - 1
            replay_errors.append(abs(error))
            line = (f"  {run_id}  {steps_error[run_id]:+6.1%}  {row['output_tok_s']:9,.0f}  {replayed:9,.0f}  "
                    f"{error:+6.1%}  {row.get('workload')}")
        except (TroughputError, MemoryError, ValueError) as e:
            line = f"  {run_id}  {steps_error[run_id]:+6.1%}  not replayed: {e}"
        print(line)
        lines.append(line.strip())
    if replay_errors:
        lines.append(f"Median absolute replay error (in-sample): {statistics.median(replay_errors):.1%}.")
        print(lines[-1])
    if dry_run:
        return step_model, None
    target = (out_dir or PROJECT_ROOT / "conf" / "calibration") / "vllm" / f"{choices.hardware}-{choices.model}.yaml"
    path = write_calibration(target, step_model, lines)
    print(f"written to {path}")
    return step_model, path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="troughput-calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides naming the cell, e.g. model=tiny_vlm")
    parser.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    parser.add_argument("--out-dir", type=Path, default=None, help="instead of conf/calibration")
    args = parser.parse_args(argv)
    try:
        calibrate(args.overrides, args.dry_run, args.out_dir)
    except TroughputError as e:
        print(f"troughput-calibrate: error: {e}", file=sys.stderr)
        sys.exit(2)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


if __name__ == "__main__":
    main()
