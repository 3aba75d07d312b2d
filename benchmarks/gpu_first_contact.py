"""GPU first contact: one prepared command for the day a GPU is lent (docs/gpu-acceptance.md).

The lent machine has PyTorch (CUDA), transformers and NVML's Python bindings, but no vLLM and no network, and
takes at most 64 MiB of files per call. Four checks, each printed as VERIFIED, FAILED or NOT RUN (with why):

1. ``fork``: CUDA and fork, before and after issue 38's fix. A child interpreter calls
   ``torch.cuda.is_available()`` (the old pre-run check), then forks a process that uses CUDA: expected to
   fail with "Cannot re-initialize CUDA in forked subprocess" (what vLLM's forked engine core met). Another
   runs the pre-run check as it is now (``engines.requirements.import_report``), then forks the same way:
   expected to work.
2. ``meters``: energy (NVML) and peak memory over a few seconds of bf16 matmuls on the run's GPU, through
   ``EnergyMeter`` and ``GpuMemorySampler`` restricted to a one-GPU run: only that GPU's figures.
3. ``free memory``: a child holds most of GPU 0's free memory; the pre-run check's rule
   (``requirements.memory_problems`` on ``requirements.memory_gpus``: NVML first, as the check reads them;
   vLLM's default ``gpu_memory_utilization=0.9``) must refuse with the numbers; after the child exits it must not.
4. ``troughput-run``: a real ``troughput-run engine=hf`` with the tiny model on the GPU, its rows under
   ``OUT/results``; troughput's driver dependencies that the machine lacks are installed from ``--wheels``
   (made here with ``--fetch-wheels``; no network there).

Usage::

    python benchmarks/gpu_first_contact.py --fetch-wheels .wheels --python 3.12   # here, with network
    python benchmarks/gpu_first_contact.py --out "$OUT" --wheels .wheels          # on the GPU machine
    python benchmarks/gpu_first_contact.py --out /tmp/x --allow-cpu               # the CPU rehearsal

Each check prints its seconds, and the whole its total: every step has a timeout (``TIMEOUTS``), and they sum to
under 5 minutes with the checks' own work. Exit status: 0 when every check ran and was verified; 1 when one
failed; 2 when one could not run (no GPU).
Standard library at import; torch and pynvml are imported by the checks that need them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VERIFIED, FAILED, NOT_RUN = "VERIFIED", "FAILED", "NOT RUN"
DRIVER_MODULES = {"hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime",
                  "pandas": "pandas", "yaml": "pyyaml", "tqdm": "tqdm", "PIL": "pillow", "numpy": "numpy"}
PURE = ["hydra-core==1.3.2", "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3", "packaging", "python-dateutil",
        "pytz", "tzdata", "six", "tqdm"]
BINARY = ["pandas<3", "numpy", "pillow", "pyyaml"]   # pip --target installs every dependency anew
TIMEOUTS = {"cuda_here": 30, "fork": 40, "holder": 40, "install": 30, "run": 100}   # seconds: 280 in all

FORK_CHILD = textwrap.dedent("""
    import multiprocessing, sys
    import torch
    if sys.argv[1] == "before":
        torch.cuda.is_available()                      # the old pre-run check, in the worker
    else:
        sys.path.insert(0, sys.argv[2])
        from engines.base import EngineUnavailable
        from engines.common import preflight
        from engines.requirements import import_report
        try:
            preflight("hf", {})                        # the worker's whole pre-run check now, as before a start
        except EngineUnavailable as e:                 # an unmet requirement is not what this checks: the fork is
            print(("note", str(e)[:300]), file=sys.stderr)
        report = import_report("json")
        assert report["cuda"], report
    def use_cuda(queue):
        try:
            queue.put(("ok", float(torch.ones(4, device="cuda").sum().item())))
        except Exception as e:
            queue.put(("error", f"{type(e).__name__}: {e}"))
    ctx = multiprocessing.get_context("fork")          # how vLLM starts its engine core on a GPU
    queue = ctx.Queue()
    child = ctx.Process(target=use_cuda, args=(queue,))
    child.start(); child.join(120)
    print(queue.get(timeout=5) if not queue.empty() else ("error", f"exit {child.exitcode}"))
""")


def cuda_here() -> str | None:
    """Why no CUDA check can run here (None: a GPU answers), asked in a child so this process stays clean."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True, timeout=TIMEOUTS["cuda_here"])
    count = probe.stdout.strip().splitlines()[-1:] or ["0"]
    return None if count[0].isdigit() and int(count[0]) > 0 else "no CUDA device here"


def check_fork() -> tuple[str, str]:
    out = {}
    for when in ("before", "after"):
        proc = subprocess.run([sys.executable, "-c", FORK_CHILD, when, str(ROOT)], capture_output=True, text=True,
                              timeout=TIMEOUTS["fork"])
        out[when] = (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-300:]])[-1]
    before_failed = "Cannot re-initialize CUDA in forked subprocess" in out["before"]
    after_ok = out["after"].startswith("('ok'")
    status = VERIFIED if before_failed and after_ok else FAILED
    return status, f"before the fix: {out['before']}; after: {out['after']}"


def check_meters() -> tuple[str, str]:
    import pynvml
    import torch

    from engines.energy import EnergyMeter
    from engines.gpumem import GpuMemorySampler

    pynvml.nvmlInit()
    node = pynvml.nvmlDeviceGetCount()
    sampler = GpuMemorySampler(devices=1, interval_s=0.2).start()
    meter = EnergyMeter(devices=1).start()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    hold = torch.empty(2 * 1024 ** 3, dtype=torch.uint8, device="cuda")   # 2 GiB the sampler must see
    end = time.perf_counter() + 5
    while time.perf_counter() < end:
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    joules, memory = meter.stop(), sampler.stop() or {}
    del a, hold
    torch.cuda.empty_cache()
    devices = sorted(joules.get("energy_j_by_device") or {})
    peaks = memory.get("peak_gpu_bytes_by_device") or {}
    ok = (joules.get("energy_source") == "nvml" and len(devices) == 1 and (joules["energy_j"] or 0) > 0
          and sorted(peaks) == devices and (memory.get("peak_gpu_bytes") or 0) >= 2 * 1024 ** 3)
    note = (f"node has {node} GPU(s){' (one: the restriction is trivial here)' if node == 1 else ''}; energy "
            f"{joules.get('energy_j')} J on {devices} ({joules.get('energy_source')}; {joules.get('energy_reason')}); "
            f"peak memory {memory.get('peak_gpu_bytes')} B on {sorted(peaks)}")
    return (VERIFIED if ok else FAILED), note


def check_free_memory() -> tuple[str, str]:
    from engines import requirements
    from engines.devices import run_gpus

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, torch; free, total = torch.cuda.mem_get_info(0); "
        "x = torch.empty(int(free * 0.8), dtype=torch.uint8, device='cuda'); print('held', flush=True); "
        f"time.sleep({TIMEOUTS['holder']})")], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([holder.stdout], [], [], TIMEOUTS["holder"])
        held = bool(ready) and holder.stdout.readline().strip() == "held"
        refused = _memory_check(requirements, run_gpus)
    finally:
        holder.kill()
        holder.wait()
    time.sleep(2)
    after = _memory_check(requirements, run_gpus)
    ok = held and len(refused) == 1 and "GiB free of" in refused[0] and not after
    return (VERIFIED if ok else FAILED), (f"with 80% of GPU 0's free memory held: {refused or 'no refusal'}; "
                                          f"after it was freed: {after or 'no refusal'}")


def _memory_check(requirements, run_gpus) -> list[str]:
    gpus = requirements.memory_gpus(requirements.probe_host())   # NVML first, as the pre-run check reads them
    mine = run_gpus(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), 1)
    return [str(p) for p in requirements.memory_problems(mine, "vLLM", "gpu_memory_utilization", 0.9)]


def wheel_pythons(wheels: Path) -> set[str]:
    """The CPython tags (``cp312``) of the compiled wheels in ``wheels``; pure wheels (``py3``) fit any."""
    return {m.group(1) for p in wheels.glob("*.whl") if (m := re.search(r"-(cp\d+)-", p.name))}


def install_missing(wheels: Path | None, site: Path) -> tuple[list[str], str]:
    """Install the driver's missing dependencies from ``wheels`` into ``site`` (``pip --target``: never into the
    machine's own Python, which may be externally managed) and put it on ``sys.path``; return those still
    missing and why. A wheel set built for another Python is refused before pip runs, naming both."""
    missing = [m for m in DRIVER_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return [], ""
    if not (wheels and wheels.is_dir()):
        return missing, "no --wheels folder"
    mine, built = f"cp{sys.version_info.major}{sys.version_info.minor}", wheel_pythons(wheels)
    if built and mine not in built:
        return missing, (f"the wheels are built for {', '.join(sorted(built))} and this is Python "
                         f"{sys.version.split()[0]} ({mine}): make them with --fetch-wheels --python "
                         f"{sys.version_info.major}.{sys.version_info.minor}")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
                           "--target", str(site), *(DRIVER_MODULES[m] for m in missing)], capture_output=True,
                          text=True, timeout=TIMEOUTS["install"])
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    missing = [m for m in missing if importlib.util.find_spec(m) is None]
    return missing, (proc.stderr or proc.stdout)[-300:] if missing else ""


def check_run(out: Path, wheels: Path | None, hardware: str) -> tuple[str, str]:
    site = out / "site"
    missing, why = install_missing(wheels, site)
    if missing:
        return NOT_RUN, (f"troughput's driver needs {', '.join(DRIVER_MODULES[m] for m in missing)} (--wheels): "
                         f"{why}")
    results = out / "results"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "engine=hf", "workload=unique",
                           "workload.num_requests=64", "run.repeats=2", f"hardware={hardware}",
                           f"run.results_dir={results}", "run.progress=false", f"run.image_dir={out / 'images'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUTS["run"],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])})
    rows = [json.loads(p.read_text()) for p in sorted((results / "runs").glob("*.json"))] if results.is_dir() else []
    if proc.returncode != 0 or not rows:
        return FAILED, f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}"
    row = rows[-1]
    device = str(row.get("engine_info.device"))
    want = "cuda" if hardware != "cpu" else "cpu"
    ok = row.get("status") == "ok" and device.startswith(want)
    return (VERIFIED if ok else FAILED), (f"status {row.get('status')} on {device}: {row.get('output_tok_s')} output "
                                          f"tok/s, energy {row.get('energy_j')} J ({row.get('energy_source')}), "
                                          f"peak GPU memory {row.get('peak_gpu_bytes')} B; row {row.get('run_id')} "
                                          f"under {results}")


def fetch_wheels(dest: Path, python: str) -> None:
    """Here (with network): the wheels ``check_run`` installs there, for that machine's Python ``python``."""
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(dest), *PURE], check=True)
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest), "--python-version",
                    python, "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                    *BINARY], check=True)
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"{len(list(dest.iterdir()))} wheels, {size / 2 ** 20:.1f} MiB in {dest} (a device call carries 64 MiB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-first-contact")))
    parser.add_argument("--wheels", type=Path, default=None)
    parser.add_argument("--hardware", default="h200", help="troughput's hardware config for the run (default h200)")
    parser.add_argument("--allow-cpu", action="store_true", help="run the troughput-run check on the CPU")
    parser.add_argument("--fetch-wheels", type=Path, default=None)
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python, for --fetch-wheels")
    args = parser.parse_args(argv)
    if args.fetch_wheels:
        fetch_wheels(args.fetch_wheels, args.python)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    why_not = cuda_here()
    results: dict[str, tuple[str, str, float]] = {}
    checks = [("fork", check_fork), ("meters", check_meters), ("free memory", check_free_memory),
              ("troughput-run", lambda: check_run(args.out, args.wheels, "cpu" if why_not else args.hardware))]
    for name, check in checks:
        t0 = time.perf_counter()
        skip = why_not and not (name == "troughput-run" and args.allow_cpu)
        status, detail = (NOT_RUN, why_not) if skip else _guarded(check)
        results[name] = (status, detail, time.perf_counter() - t0)
        print(f"{name}: {status} ({results[name][2]:.1f} s): {detail}", flush=True)
    total = time.perf_counter() - start
    print(f"all checks: {total:.1f} s", flush=True)
    (args.out / "first_contact.json").write_text(json.dumps(
        {**{k: {"status": s, "detail": d, "seconds": round(t, 1)} for k, (s, d, t) in results.items()},
         "total_seconds": round(total, 1)}, indent=1))
    statuses = {s for s, _, _ in results.values()}
    return 1 if FAILED in statuses else 2 if NOT_RUN in statuses else 0


def _guarded(check) -> tuple[str, str]:
    try:
        return check()
    except Exception as e:  # noqa: BLE001 - a check that breaks is a failed check, with its reason
        return FAILED, f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    sys.exit(main())
