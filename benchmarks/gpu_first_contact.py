"""GPU first contact: one prepared command for the day a GPU is lent (docs/gpu-acceptance.md).

The lent machine has PyTorch (CUDA), transformers and NVML's Python bindings, but no vLLM and no network, and
takes at most 64 MiB of files per call. Each step runs in child processes with its own time limit
(``STEP_S``, together at most ``TOTAL_S``, under 5 minutes) and prints its elapsed seconds; every check is
printed as VERIFIED, FAILED or NOT RUN (with why):

0. ``install``: troughput's driver dependencies the machine lacks (hydra-core, omegaconf, antlr4), from the
   carried wheels (``--wheels``, made here with ``--fetch-wheels``), after checking them against ``python -V``,
   with ``pip install --no-index --no-deps --target`` into a folder that the children get on ``PYTHONPATH``.
1. ``fork``: CUDA and fork, before and after issue 38's fix. A child calls ``torch.cuda.is_available()`` (the
   old pre-run check), then forks a process that uses CUDA: expected to fail with "Cannot re-initialize CUDA in
   forked subprocess" (what vLLM's forked engine core met). Another does what the worker does in its process
   before the engine starts, the whole pre-run check included (its NVML memory sampler, then
   ``VllmEngine.validate()``, which runs ``engines.common.preflight`` with vLLM's memory share; a stand-in
   ``vllm`` package lets it past the import check, as vLLM is not installed there), then forks the same way:
   expected to work.
2. ``meters``: energy (NVML) and peak memory over a few seconds of bf16 matmuls on the run's GPU, through
   ``EnergyMeter`` and ``GpuMemorySampler`` restricted to a one-GPU run: only that GPU's figures.
3. ``free memory``: a child holds most of GPU 0's free memory; the pre-run check's rule
   (``requirements.memory_problems`` on ``requirements.memory_gpus``: NVML first, as the check reads them;
   vLLM's default ``gpu_memory_utilization=0.9``) must refuse with the numbers; after the child exits it must not.
4. ``troughput-run``: a real ``troughput-run engine=hf`` with the tiny model on the GPU, its rows and log under
   ``OUT/results``.

Usage::

    python benchmarks/gpu_first_contact.py --fetch-wheels .wheels                 # here, with network
    python benchmarks/gpu_first_contact.py --out "$OUT" --wheels .wheels          # on the GPU machine
    python benchmarks/gpu_first_contact.py --out /tmp/x --wheels .wheels --allow-cpu   # the CPU rehearsal

Exit status: 0 when every check ran and was verified; 1 when one failed; 2 when one could not run (no GPU).
Standard library only in this process: torch and pynvml are imported by the children that need them.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import wheel_bundle  # noqa: E402

VERIFIED, FAILED, NOT_RUN = "VERIFIED", "FAILED", "NOT RUN"
# each step's limit in seconds; the script stops starting steps at TOTAL_S, under the 5 minutes it is sized for
STEP_S = {"install": 25, "cuda": 25, "fork": 70, "meters": 30, "free memory": 35, "troughput-run": 100}
TOTAL_S = 290
HOLD_S = 25   # the free-memory check's holder: at most this long to take the memory, and to keep it
# troughput-run's driver modules (module: distribution), and the wheels carried for those the machine lacks
NEEDED = {"hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime", "yaml": "pyyaml",
          "numpy": "numpy", "pandas": "pandas", "PIL": "pillow", "tqdm": "tqdm", "scipy": "scipy",
          "pyarrow": "pyarrow", "matplotlib": "matplotlib"}
BUNDLE = ["hydra-core==1.3.8", "omegaconf==2.3.1", "antlr4-python3-runtime==4.9.3"]

FORK_CHILD = textwrap.dedent("""
    import json, multiprocessing, sys
    import torch
    ran, outcome = [], ""
    if sys.argv[1] == "before":
        torch.cuda.is_available()                      # the old pre-run check, in the worker
        ran.append("torch.cuda.is_available()")
    else:                                              # what the worker does in its process before engine.start()
        from engines import requirements
        from engines.devices import per_replica
        from engines.gpumem import GpuMemorySampler
        from engines.vllm import VllmEngine
        for name in ("probe_host", "import_report", "environment_problems", "memory_gpus", "memory_problems"):
            real = getattr(requirements, name)         # called through, noted: the whole pre-run check ran
            setattr(requirements, name, lambda *a, _real=real, _name=name, **k: (ran.append(_name), _real(*a, **k))[1])
        sampler = GpuMemorySampler(devices=per_replica("vllm", {})).start()
        try:
            VllmEngine({"path": "unused"}, {}).validate()   # engines.common.preflight first, as in the worker
        except Exception as e:                         # refused, or past it at the stand-in vllm: both ran it all
            outcome = f"{type(e).__name__}: {str(e)[:400]}"
    def use_cuda(queue):
        try:
            queue.put(("ok", float(torch.ones(4, device="cuda").sum().item())))
        except Exception as e:
            queue.put(("error", f"{type(e).__name__}: {e}"))
    ctx = multiprocessing.get_context("fork")          # how vLLM starts its engine core on a GPU
    queue = ctx.Queue()
    child = ctx.Process(target=use_cuda, args=(queue,))
    child.start(); child.join(20)
    fork = queue.get(timeout=5) if not queue.empty() else ("error", f"exit {child.exitcode}")
    print(json.dumps({"ran": ran, "outcome": outcome, "fork": list(fork)}))
""")
PREFLIGHT = ("probe_host", "import_report", "environment_problems", "memory_gpus", "memory_problems")


def run_child(command: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """``command``'s exit status and output (stderr too); None for a command that outlived ``timeout``, whose
    whole process group is then killed (a child's own children included: no GPU memory left held)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output or ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[0] or ""


def last_json(output: str) -> dict | list | None:
    """The last line of ``output`` that is JSON, or None."""
    for line in reversed(output.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def check_install(wheels: Path | None, site: Path, timeout: float) -> tuple[str, str]:
    """Install the driver modules this Python lacks from ``wheels`` into ``site`` (``--target``)."""
    missing = wheel_bundle.unimportable(list(NEEDED), dict(os.environ), timeout)
    here = f"python -V: Python {sys.version.split()[0]}"
    if not missing:
        return VERIFIED, f"{here}; nothing missing"
    found = {wheel_bundle.distribution(w): w for w in sorted(wheels.glob("*.whl"))} if wheels else {}
    chosen = [found[wheel_bundle.normalise(NEEDED[m])] for m in missing if wheel_bundle.normalise(NEEDED[m]) in found]
    unbundled = [NEEDED[m] for m in missing if wheel_bundle.normalise(NEEDED[m]) not in found]
    if unbundled:
        return NOT_RUN, f"{here}; missing and not among the wheels (--wheels {wheels}): {', '.join(unbundled)}"
    problem = wheel_bundle.tag_problem(chosen)
    if problem:
        return NOT_RUN, problem
    proc = wheel_bundle.install(chosen, site, timeout)
    if proc.returncode != 0:
        return FAILED, f"pip install --target {site} failed: {(proc.stderr or proc.stdout)[-400:]}"
    still = wheel_bundle.unimportable(missing, child_env(site), timeout)
    names = ", ".join(w.name for w in chosen)
    if still:
        return FAILED, f"installed {names} into {site}, but {', '.join(still)} still do not import"
    return VERIFIED, f"{here}; {', '.join(missing)} missing: installed {names} with pip --target {site}; all import"


def child_env(site: Path | None, *more: Path) -> dict[str, str]:
    """The environment of every child: the installed wheels (``site``), then this checkout, on PYTHONPATH."""
    return wheel_bundle.pythonpath(*more, *([site] if site else []), ROOT)


def cuda_here(env: dict[str, str], timeout: float) -> tuple[str | None, str | None]:
    """Why no CUDA check can run here (None: a GPU answers) and the first GPU's name, asked in a child so this
    process stays clean."""
    code, out = run_child([sys.executable, "-c", "import torch; n = torch.cuda.device_count(); "
                           "print(torch.cuda.get_device_name(0) if n else ''); print(n)"], timeout, env)
    lines = out.strip().splitlines() if code == 0 else []
    if code is None:
        return f"the CUDA probe outlived {timeout:.0f} s", None
    if lines and lines[-1].isdigit() and int(lines[-1]) > 0:
        return None, (lines[-2] if len(lines) > 1 else None)
    return f"no CUDA device here ({out.strip()[-200:]})", None


def hardware_for(name: str | None) -> str:
    """troughput's hardware config for a GPU name (``NVIDIA H100 80GB HBM3`` → h100); h100 where none matches."""
    text = (name or "").lower().replace(" ", "")
    for key, config in (("h200", "h200"), ("h100pcie", "h100_pcie"), ("h100", "h100"), ("a100", "a100_80gb"),
                        ("l40s", "l40s")):
        if key in text:
            return config
    return "h100"


def check_fork(env: dict[str, str], timeout: float, standin: Path) -> tuple[str, str]:
    """The fork after the old check (must break) and after the worker's whole pre-run check (must work)."""
    found = {}
    envs = {"before": env, "after": {**env, "PYTHONPATH": os.pathsep.join([str(standin), env["PYTHONPATH"]])}}
    for when in ("before", "after"):
        code, out = run_child([sys.executable, "-c", FORK_CHILD, when], timeout / 2, envs[when])
        found[when] = last_json(out) or {"fork": ["error", f"exit {code}: {out.strip()[-300:]}"], "ran": []}
    before, after = found["before"], found["after"]
    before_failed = "Cannot re-initialize CUDA in forked subprocess" in str(before["fork"])
    whole = all(name in after["ran"] for name in PREFLIGHT)
    ok = before_failed and after["fork"][0] == "ok" and whole
    return (VERIFIED if ok else FAILED), (
        f"before the fix ({', '.join(before['ran'])}), the fork: {before['fork']}; after it (ran in the worker: "
        f"{', '.join(after['ran']) or 'nothing'}; {'the' if whole else 'NOT the'} whole pre-run check; "
        f"validate: {after.get('outcome') or 'passed'}), the fork: {after['fork']}")


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
        f"time.sleep({HOLD_S})")], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([holder.stdout], [], [], HOLD_S)   # a holder that never holds is no refusal
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


IN_CHILD = {"meters": check_meters, "free memory": check_free_memory}


def check_in_child(name: str, env: dict[str, str], timeout: float) -> tuple[str, str]:
    """``IN_CHILD[name]`` in a child interpreter (``--step``), so its CUDA stays out of this process."""
    code, out = run_child([sys.executable, str(Path(__file__).resolve()), "--step", name], timeout, env)
    found = last_json(out)
    if code is None:
        return FAILED, f"outlived its {timeout:.0f} s: {out.strip()[-300:]}"
    return tuple(found) if isinstance(found, list) else (FAILED, f"exit {code}: {out.strip()[-600:]}")


def check_run(out: Path, work: Path, env: dict[str, str], hardware: str, timeout: float) -> tuple[str, str]:
    """A real ``troughput-run engine=hf``; its rows and engine logs are copied to ``out/results``."""
    results = work / "results"
    code, text = run_child([sys.executable, "-m", "harness.cli", "engine=hf", "workload=unique",
                            "workload.num_requests=64", "run.repeats=2", f"hardware={hardware}",
                            f"run.results_dir={results}", "run.progress=false", f"run.image_dir={work / 'images'}"],
                           timeout, env)
    for kind, pattern in (("runs", "*.json"), ("logs", "*.log")):
        for path in sorted((results / kind).glob(pattern)):
            (out / "results" / kind).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, out / "results" / kind / path.name)
    rows = [json.loads(p.read_text()) for p in sorted((out / "results" / "runs").glob("*.json"))]
    if code != 0 or not rows:
        return FAILED, f"exit {'timeout' if code is None else code} after {timeout:.0f} s limit: {text[-600:]}"
    row = rows[-1]
    device = str(row.get("engine_info.device"))
    ok = row.get("status") == "ok" and device.startswith("cuda" if hardware != "cpu" else "cpu")
    return (VERIFIED if ok else FAILED), (f"status {row.get('status')} on {device}: {row.get('output_tok_s')} output "
                                          f"tok/s, energy {row.get('energy_j')} J ({row.get('energy_source')}), "
                                          f"peak GPU memory {row.get('peak_gpu_bytes')} B; row {row.get('run_id')} "
                                          f"under {out / 'results'}")


def stand_in_vllm(folder: Path) -> Path:
    """A ``vllm`` package that imports and does nothing: vLLM is not installed on the GPU machine."""
    (folder / "vllm").mkdir(parents=True, exist_ok=True)
    (folder / "vllm" / "__init__.py").write_text('__version__ = "0+stand-in"  # gpu_first_contact.py\n')
    return folder


class Steps:
    """Runs each step under its limit (``STEP_S``, cut to what is left of ``TOTAL_S``) and prints its seconds."""

    def __init__(self, total: float = TOTAL_S):
        self.start, self.total, self.results = time.monotonic(), total, {}

    def run(self, name: str, check, why_not: str | None = None) -> tuple[str, str]:
        limit = min(STEP_S[name], self.total - (time.monotonic() - self.start))
        began = time.monotonic()
        if why_not or limit <= 1:
            status, detail = NOT_RUN, why_not or f"no time left of the script's {self.total} s"
        else:
            status, detail = _guarded(lambda: check(limit))
        elapsed = time.monotonic() - began
        self.results[name] = {"status": status, "detail": detail, "elapsed_s": round(elapsed, 1),
                              "limit_s": round(max(limit, 0), 1)}
        print(f"{name}: {status} ({elapsed:.1f} s of {max(limit, 0):.0f} s): {detail}", flush=True)
        return status, detail

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-first-contact")))
    parser.add_argument("--wheels", type=Path, default=None)
    parser.add_argument("--hardware", default=None,
                        help="troughput's hardware config for the run (default: from the GPU's name, h100 if unknown)")
    parser.add_argument("--allow-cpu", action="store_true", help="run the troughput-run check on the CPU")
    parser.add_argument("--fetch-wheels", type=Path, default=None)
    parser.add_argument("--step", choices=sorted(IN_CHILD), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        print(json.dumps(_guarded(IN_CHILD[args.step])))
        return 0
    if args.fetch_wheels:
        print(wheel_bundle.fetch(args.fetch_wheels, BUNDLE))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="first-contact-"))
    site = work / "site"
    steps = Steps()
    steps.run("install", lambda limit: check_install(args.wheels, site, limit))
    env = child_env(site if site.is_dir() else None)
    probe: dict[str, str | None] = {}
    steps.run("cuda", lambda limit: _probe(probe, env, limit))
    why_not = probe.get("why_not", "the CUDA probe did not run")
    steps.run("fork", lambda limit: check_fork(env, limit, stand_in_vllm(work / "stand-in")), why_not)
    for name in IN_CHILD:
        steps.run(name, lambda limit, name=name: check_in_child(name, env, limit), why_not)
    cpu = why_not is not None
    hardware = "cpu" if cpu else args.hardware or hardware_for(probe.get("gpu"))
    steps.run("troughput-run", lambda limit: check_run(args.out, work, env, hardware, limit),
              why_not if cpu and not args.allow_cpu else None)
    print(f"total: {steps.elapsed():.1f} s (limit {TOTAL_S} s)", flush=True)
    results = {k: v for k, v in steps.results.items() if k != "cuda"}
    (args.out / "first_contact.json").write_text(json.dumps({**results, "cuda": steps.results.get("cuda"),
                                                             "total_s": round(steps.elapsed(), 1)}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    statuses = {v["status"] for v in results.values()}
    return 1 if FAILED in statuses else 2 if NOT_RUN in statuses else 0


def _probe(probe: dict, env: dict[str, str], limit: float) -> tuple[str, str]:
    probe["why_not"], probe["gpu"] = cuda_here(env, limit)
    return (NOT_RUN, probe["why_not"]) if probe["why_not"] else (VERIFIED, "torch sees a CUDA device")


def _guarded(check) -> tuple[str, str]:
    try:
        return check()
    except Exception as e:  # noqa: BLE001 - a check that breaks is a failed check, with its reason
        return FAILED, f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    sys.exit(main())
