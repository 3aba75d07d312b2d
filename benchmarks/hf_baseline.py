"""The Hugging Face baseline beside vLLM: output tok/s of four engine set-ups on one workload, side by side.

    .venv/bin/python benchmarks/hf_baseline.py [--rounds 3] [--dtype bfloat16] [--results-dir DIR]
                                               [--hf OVERRIDE ...] [OVERRIDES ...]

Set-ups: ``hf`` static without early stop (finished rows idle as padding), ``hf`` static with
early stop, ``hf`` continuous (transformers' own continuous batching), and ``vllm``. Each is
composed as ``troughput-run`` would compose it (default ``workload=unique``: varied prompt and
output lengths) and run through ``harness.run.runner.execute`` (its own worker process, warm-up,
one timed pass), so every number is a results row. OVERRIDES (Hydra) apply to all four;
``--hf`` overrides (e.g. ``--hf engine.knobs.batch_size=16``) to the three hf set-ups only.

All four run at one dtype, ``--dtype`` (``engine.knobs.dtype`` for both engines): left alone,
``hf`` loads the tiny model's float32 checkpoint as float32 while vLLM's ``dtype=auto`` runs it
in bfloat16 on CPU, and the ratios would mix engine and arithmetic. The default is bfloat16,
what vLLM picks for itself. Each row records the dtype that actually ran
(``engine_info.dtype``, read from the started engine); a set-up whose dtype differs from
``--dtype`` is marked ``DTYPE MISMATCH`` and left out of the ratios.

The order of the set-ups rotates each round. Each round prints output tok/s and dtype, the
padded decode slots of the static set-ups, continuous batching's preemptions, and the ratios;
the end prints the median of each ratio and the verdict of ``harness.report.verdict`` on the two
sides' per-round rates. Always exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETUPS: dict[str, list[str]] = {
    "static": ["engine=hf", "engine.knobs.mode=static", "engine.knobs.early_stop=false"],
    "static+early_stop": ["engine=hf", "engine.knobs.mode=static", "engine.knobs.early_stop=true"],
    "continuous": ["engine=hf", "engine.knobs.mode=continuous"],
    "vllm": ["engine=vllm"],
}
RATIOS = [("static+early_stop", "static"), ("continuous", "static"), ("continuous", "static+early_stop"),
          ("vllm", "static"), ("vllm", "static+early_stop"), ("vllm", "continuous")]


def compose_specs(overrides: list[str], hf_overrides: list[str], results_dir: Path, dtype: str) -> dict[str, Any]:
    """One ``RunSpec`` per set-up, all at ``dtype``; all must hold the same workload."""
    from hydra import compose, initialize_config_dir

    from harness.run.spec import build_spec

    specs = {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for name, setup in SETUPS.items():
            extra = [f"++engine.knobs.dtype={dtype}", *(hf_overrides if name != "vllm" else [])]
            spec = build_spec(compose("config", overrides=[*overrides, *setup, *extra]))
            spec.repeats = 1
            spec.results_dir = results_dir
            spec.labels.update(command=" ".join(["benchmarks/hf_baseline.py", *overrides, *setup, *extra]),
                               hf_baseline=name)
            specs[name] = spec
    fingerprints = {spec.workload.fingerprint for spec in specs.values()}
    if len(fingerprints) != 1:
        raise SystemExit(f"the set-ups composed different workloads: {fingerprints}")
    return specs


def run_round(specs: dict[str, Any], index: int) -> dict[str, dict[str, Any]]:
    """Every set-up once, starting at a different one each round; the rows by set-up."""
    from harness.run.runner import execute

    names = list(specs)
    order = names[index % len(names):] + names[:index % len(names)]
    rows = {}
    for name in order:
        specs[name].labels["hf_baseline_round"] = index + 1
        rows[name] = execute(specs[name], progress=False)
    return rows


def ran_as_asked(row: dict[str, Any], dtype: str) -> bool:
    """The run succeeded and the engine reports that it ran at ``dtype``."""
    return row["status"] == "ok" and bool(row["output_tok_s"]) and row.get("engine_info.dtype") == dtype


def describe(name: str, row: dict[str, Any], dtype: str) -> str:
    """One set-up's part of a round line."""
    if row["status"] != "ok":
        return f"{name} FAILED ({row['status']}: {str(row['error']).splitlines()[0][:120]}; log {row['log_path']})"
    ran = row.get("engine_info.dtype")
    text = f"{name} {row['output_tok_s']:7.1f} tok/s {ran}"
    if ran != dtype:
        text += f" DTYPE MISMATCH (asked {dtype})"
    if row.get("stat.padded_decode_slots") is not None:
        text += (f" (padded decode slots {int(row['stat.padded_decode_slots'])}, "
                 f"padding waste {row['stat.padding_waste']:.3f})")
    elif name == "continuous":
        text += f" (preemptions {row['preemptions']})"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="where the rows go (default: a new temporary directory)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"],
                        help="the dtype every set-up runs at (default: bfloat16, vLLM's own choice on CPU)")
    parser.add_argument("--hf", action="append", default=[], metavar="OVERRIDE",
                        help="a Hydra override for the hf set-ups only (repeatable)")
    args, overrides = parser.parse_known_args()
    if not any(o.lstrip("+~").startswith("workload=") for o in overrides):
        overrides = ["workload=unique", *overrides]
    sys.path.insert(0, str(ROOT))
    results_dir = args.results_dir or Path(tempfile.mkdtemp(prefix="troughput-hf-baseline-"))
    specs = compose_specs(overrides, args.hf, results_dir, args.dtype)
    from harness.report.verdict import compare
    workload = specs["vllm"].workload
    print(f"workload {workload.name} ({len(workload.requests)} requests, "
          f"{sum(r.max_tokens for r in workload.requests)} output tokens, "
          f"output lengths {min(r.max_tokens for r in workload.requests)}-"
          f"{max(r.max_tokens for r in workload.requests)}), warm-up {specs['vllm'].warmup_requests}, "
          f"dtype {args.dtype}; "
          f"hf knobs {specs['static'].knobs}; rows and logs in {results_dir}", flush=True)

    ratios: dict[tuple[str, str], list[float]] = {pair: [] for pair in RATIOS}
    sides: dict[tuple[str, str], tuple[list[float], list[float]]] = {pair: ([], []) for pair in RATIOS}
    for index in range(args.rounds):
        rows = run_round(specs, index)
        print(f"round {index + 1}/{args.rounds}: " + "  ".join(describe(n, rows[n], args.dtype) for n in SETUPS),
              flush=True)
        got = {n: r["output_tok_s"] for n, r in rows.items() if ran_as_asked(r, args.dtype)}
        shown = []
        for top, bottom in RATIOS:
            if top in got and bottom in got:
                ratios[(top, bottom)].append(got[top] / got[bottom])
                sides[(top, bottom)][0].append(got[top])
                sides[(top, bottom)][1].append(got[bottom])
                shown.append(f"{top}/{bottom} {ratios[(top, bottom)][-1]:.2f}")
        print("  ratios: " + ", ".join(shown), flush=True)
    for (top, bottom), values in ratios.items():
        if values:
            print(f"median {top}/{bottom}: {statistics.median(values):.2f} "
                  f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} rounds)")
            verdict = compare(*sides[(top, bottom)])
            print(f"  verdict (docs/verdicts.md), {top} ÷ {bottom}: {verdict.named(top, bottom)}; {verdict.reason}")


if __name__ == "__main__":
    main()
