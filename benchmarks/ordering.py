"""Offline reordering, measured: each policy against the arrival order (``as_given``) and ``shuffled``, side by side.

    .venv/bin/python benchmarks/ordering.py [--rounds 3] [--policies as_given,shuffled,prefix_grouped,blended]
                                            [--baselines as_given,shuffled] [--results-dir DIR] [HYDRA_OVERRIDES ...]

The config is composed as ``troughput-run`` would compose it, on top of this benchmark's defaults:
``COMMON_DEFAULTS`` and, unless the command line names another workload, ``PREFIX_DEFAULTS`` (the
prefix_heavy workload with long shared prefixes, short suffixes and short outputs, so that prefill
dominates, and a KV cache of a few MiB: room for one group's prefix and its running requests, far
too little for all groups' prefixes, so eviction matters). The workload keeps its default arrival,
``interleaved`` (one request of each group in turn, as mixed real files arrive), so ``as_given``
is what a user who does not reorder gets; ``workload.arrival=grouped`` shows the strawman where the
file is already grouped. Overrides on the command line win.
One workload is built; each round runs every policy once (the order of the policies rotates from
round to round), each run a normal ``harness.run.runner.execute``: its own worker process, warm-up,
then ``run.repeats`` timed passes with the caches reset before each (the median pass counts),
with the policy's parameters from ``conf/ordering/<name>.yaml``.

It prints each run, then per policy the medians over rounds: vLLM's measured prefix-cache hits and
hit rate beside the ideal from the workload's prefix tree (at the engine's block size), preemptions,
output tok/s, and for each baseline the throughput ratio against it, taken within each round and
then the median. Always exits 0; failed runs are printed with their reason.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Used unless the command line names another workload: prefill-heavy groups and a cache that holds one group.
PREFIX_DEFAULTS = [
    "workload=prefix_heavy",
    "workload.num_groups=16",
    "workload.prompts_per_group=8",
    "workload.prefix_len={kind: fixed, value: 1536}",
    "workload.suffix_len={kind: uniform, low: 16, high: 48}",
    "workload.output_len={kind: fixed, value: 4}",
    "hardware.canonical.kv_memory_bytes=2621440",  # 2.5 MiB: 80 blocks of 32 tokens on the tiny model
]
COMMON_DEFAULTS = ["engine.knobs.max_num_seqs=8", "run.warmup_requests=4", "run.repeats=3"]


def _row_summary(row: dict[str, Any]) -> dict[str, Any]:
    """What the benchmark prints of a row; the ideal is the tree's at the engine's block size."""
    block = row.get("engine_info.block_size")
    ideal = row.get(f"workload_info.ideal_prefix_hit_rate_block{block}", row.get("workload_info.ideal_prefix_hit_rate"))
    return {"ok": row["status"] == "ok", "hits": row.get("prefix_cache_hits"),
            "hit_rate": row.get("prefix_cache_hit_rate"), "ideal": ideal, "tok_s": row.get("output_tok_s"),
            "preemptions": row.get("preemptions"), "wall_s": row.get("wall_s"),
            "error": next(iter((row.get("error") or "").splitlines()), ""), "log": row.get("log_path")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", default="as_given,shuffled,prefix_grouped,blended",
                        help="comma-separated ordering names")
    parser.add_argument("--baselines", default="as_given,shuffled",
                        help="comma-separated policies (among --policies) that ratios are taken against")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="where the rows go (default: a new temporary directory)")
    args, overrides = parser.parse_known_args()
    policies, baselines = args.policies.split(","), args.baselines.split(",")
    if not set(baselines) <= set(policies):
        raise SystemExit(f"--baselines {baselines} must be among --policies {policies}")

    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.run.spec import build_spec
    from harness.run.runner import execute

    named_workload = any(o.lstrip("+~").startswith("workload=") for o in overrides)
    overrides = [*COMMON_DEFAULTS, *([] if named_workload else PREFIX_DEFAULTS), *overrides]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        spec = build_spec(compose("config", overrides=overrides))
        orderings = {name: OmegaConf.to_container(compose("config", overrides=[f"ordering={name}"]).ordering,
                                                  resolve=True) for name in policies}
    spec.results_dir = args.results_dir or Path(tempfile.mkdtemp(prefix="troughput-ordering-"))
    spec.labels.update(command=" ".join(["benchmarks/ordering.py", *overrides]), benchmark="ordering")
    info = spec.workload.summary()
    print(f"workload {spec.workload.name} (arrival {info.get('arrival', '-')}, fingerprint "
          f"{spec.workload.fingerprint}): {info['requests']} requests, {info['input_tokens_requested']:,} prompt "
          f"tokens, {info['output_tokens_requested']:,} output tokens; ideal prefix hit rate "
          f"{info['ideal_prefix_hit_rate']:.3f} (tokens), "
          f"{info['ideal_prefix_hit_rate_block32']:.3f} (32-token blocks)")
    print(f"knobs {spec.knobs}; rows and logs in {spec.results_dir}", flush=True)

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
    ratios: dict[tuple[str, str], list[float]] = {(name, base): [] for name in policies for base in baselines}
    for r in range(args.rounds):
        rotation = policies[r % len(policies):] + policies[:r % len(policies)]
        got: dict[str, dict[str, Any]] = {}
        for name in rotation:
            spec.ordering = orderings[name]
            spec.labels["ordering_round"] = r + 1
            got[name] = s = _row_summary(execute(spec, progress=False))
            runs[name].append(s)
            if s["ok"]:
                print(f"round {r + 1}/{args.rounds} {name:>15}: hit rate {s['hit_rate']:.3f} ({s['hits']:,} tokens; "
                      f"ideal {s['ideal']:.3f})  preemptions {s['preemptions']}  {s['tok_s']:8.1f} out tok/s  "
                      f"wall {s['wall_s']:.2f} s", flush=True)
            else:
                print(f"round {r + 1}/{args.rounds} {name:>15}: FAILED {s['error']} (log {s['log']})", flush=True)
        for name, base in ratios:
            if got[base]["ok"] and got[name]["ok"]:
                ratios[(name, base)].append(got[name]["tok_s"] / got[base]["tok_s"])
    print_table(policies, baselines, runs, ratios, args.rounds)


def print_table(policies: list[str], baselines: list[str], runs: dict[str, list[dict[str, Any]]],
                ratios: dict[tuple[str, str], list[float]], rounds: int) -> None:
    """Per policy, medians over the rounds; ratios of output tok/s against each baseline in the same round."""
    print(f"\nmedians over {rounds} round(s); ratio = output tok/s against the baseline in the same round")
    heads = "".join(f" {'vs ' + base:>12}" for base in baselines)
    print(f"{'ordering':>15} {'hits':>9} {'hit rate':>9} {'ideal':>7} {'preempt':>8} {'out tok/s':>10}{heads}")
    for name in policies:
        ok = [s for s in runs[name] if s["ok"]]
        if not ok:
            print(f"{name:>15}  no run completed")
            continue
        cells = "".join(f" {statistics.median(ratios[(name, b)]):12.3f}" if ratios[(name, b)] else f" {'-':>12}"
                        for b in baselines)
        print(f"{name:>15} {statistics.median(s['hits'] for s in ok):9,.0f} "
              f"{statistics.median(s['hit_rate'] for s in ok):9.3f} {ok[0]['ideal']:7.3f} "
              f"{statistics.median(s['preemptions'] or 0 for s in ok):8.0f} "
              f"{statistics.median(s['tok_s'] for s in ok):10.1f}{cells}")
    from harness.report.verdict import compare

    for (name, base), values in ratios.items():
        if values and name != base:
            print(f"{name}/{base} per round: " + " ".join(f"{v:.3f}" for v in values))
            ours, theirs = ([s["tok_s"] for s in runs[n] if s["ok"]] for n in (name, base))
            verdict = compare(ours, theirs)
            print(f"  verdict (docs/verdicts.md), {name} ÷ {base}: {verdict.named(name, base)}; {verdict.reason}")


if __name__ == "__main__":
    main()
