"""This host's spec (matmul FLOP/s, copy bandwidth, memory), measured once and cached: the driver side.

A hardware config may leave its rates null (``conf/hardware/cpu.yaml``): then this host
is measured, once per host (cached in ``.cache/troughput/host_spec-v4-<host>.json``), at
the start of a run (``complete_run_spec``, called by the runner before any worker
starts) or explicitly (``python -m harness.run.hostspec [--refresh]``). Writing a row never
measures: the speed of light (``engines.perfmodel.sol_columns``) and the simulator get
the completed spec.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from engines.common import PROJECT_ROOT
from engines.perfmodel import REQUIRED_RATES
from harness.core.errors import TroughputError

log = logging.getLogger(__name__)
CACHE_DIR = PROJECT_ROOT / ".cache" / "troughput"
SIM_SPEC_KNOB = "hardware_spec"  # the simulator's knob that carries the hardware config's spec


def complete_spec(spec: Mapping[str, Any] | None, cache_dir: Path = CACHE_DIR) -> dict[str, Any] | None:
    """``spec`` with null rates (and memory) filled from this host's measurement; unchanged when complete.

    Raises:
        TroughputError: the measurement failed (its reason in the message).
    """
    if not spec or all(spec.get(name) is not None for name in REQUIRED_RATES):
        return dict(spec) if spec else spec
    try:
        host = measure_host(cache_dir)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        raise TroughputError(f"could not measure this host for hardware spec {spec.get('name')!r}: {e}; "
                             "give peak_flops_bf16 and bandwidth_bytes_s in the hardware config's spec:") from e
    return {**spec, **{k: v for k, v in host.items() if spec.get(k) is None}}


def complete_run_spec(run: Any, cache_dir: Path = CACHE_DIR) -> Any:
    """A copy of a ``RunSpec`` whose ``hardware_spec`` (and the simulator's ``hardware_spec`` knob) is complete.

    A failed measurement is logged and leaves the spec as it was: the row still gets written
    (without a speed of light; an ``engine=sim`` run fails as invalid, naming the missing rates).
    """
    try:
        hardware = complete_spec(run.hardware_spec, cache_dir)
        knobs = dict(run.knobs)
        if isinstance(knobs.get(SIM_SPEC_KNOB), Mapping):
            knobs[SIM_SPEC_KNOB] = complete_spec(knobs[SIM_SPEC_KNOB], cache_dir)
    except TroughputError as e:
        log.warning("%s", e)
        return run
    return dataclasses.replace(run, hardware_spec=hardware, knobs=knobs)


_MEASURE = """
import json, os, time, numpy as np
def timed(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t
def best(f, budget_s=1.0, reps=5):
    f()
    times = [timed(f)]
    while len(times) < reps and (len(times) < 2 or sum(times) < budget_s):
        times.append(timed(f))
    return min(times)
def matmul_rate(make):
    n = 256
    while True:  # grow the matrix until one product takes 0.2 s (or n = 2048): bounded on slow hosts
        a = make(n)
        seconds = best(lambda: a @ a)
        if seconds >= 0.2 or n >= 2048:
            return n, 2 * n ** 3 / seconds
        n *= 2
try:
    import torch
except ImportError:
    torch = None
# The fastest matmul this host offers: a CPU engine runs bf16 where the CPU has native bf16 (AMX, AVX512-BF16)
# and float32 kernels where it has not (a bf16 matmul without them is emulated, ~50x slower than float32).
rng = np.random.default_rng(0)
rates = [("numpy float32", matmul_rate(lambda n: rng.standard_normal((n, n), dtype=np.float32)))]
if torch is not None:
    rates += [("torch bfloat16", matmul_rate(lambda n: torch.randn(n, n, dtype=torch.bfloat16))),
              ("torch float32", matmul_rate(lambda n: torch.randn(n, n, dtype=torch.float32)))]
kind, (n, flops) = max(rates, key=lambda r: r[1][1])
def copy_rate(nbytes):
    # bytes read + written per second: numpy copies on one thread, torch on all of them; the faster counts
    src = np.ones(nbytes >> 2, dtype=np.float32); dst = np.empty_like(src)
    rate = 2 * src.nbytes / best(lambda: np.copyto(dst, src))
    if torch is not None:
        a = torch.ones(nbytes >> 2); b = torch.empty_like(a)
        rate = max(rate, 2 * nbytes / best(lambda: b.copy_(a)))
    return rate
def last_level_cache():
    sizes = []
    for index in range(8):
        try:
            text = open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read().strip()
        except OSError:
            break
        sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1) if text[-1] in "KM" else int(text))
    return max(sizes) if sizes else 0
cache = last_level_cache()
out = {"peak_flops_bf16": flops, "bandwidth_bytes_s": copy_rate(64 << 20),
       "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
       "method": f"{kind} matmul {n}x{n} (fastest of {', '.join(r[0] for r in rates)}); 64 MiB copy"}
if cache >= 1 << 20:  # weights that fit in the last-level cache stream at its rate, not DRAM's
    out.update(cache_bytes=cache, cache_bandwidth_bytes_s=copy_rate(cache // 4))
    out["method"] += f"; {cache // 4 >> 20} MiB copy in a {cache >> 20} MiB last-level cache"
print(json.dumps(out))
"""


def measure_host(cache_dir: Path = CACHE_DIR, refresh: bool = False) -> dict[str, Any]:
    """This host's matmul FLOP/s and copy bandwidth on all cores; measured once (a few seconds) and cached.

    FLOP/s: the fastest square matmul of numpy float32 and, where torch is installed,
    torch bf16 and float32: a CPU engine runs whichever kernels the CPU is fast at (bf16 with
    AMX or AVX512-BF16, float32 without: an AVX2-only host emulates bf16 at ~0.5 GFLOP/s, which
    made the speed of light 4-25x too low there). The matrix grows from 256² until one product
    takes 0.2 s or reaches 2048². Bandwidth: the fastest 64 MiB copy (bytes read + written) by
    numpy (one thread) or torch (all threads; numpy alone undershot a multi-core host); and, where
    the last-level cache is known, the copy rate of a quarter of it (``cache_bandwidth_bytes_s``,
    ``cache_bytes``): a small model's weights stream from cache, not DRAM. Runs in a child process with a fixed thread count so
    that the caller's ``OMP_NUM_THREADS`` (the CPU engine sets 1) does not change it.
    """
    key = f"{platform.node()}-{platform.machine()}".replace(os.sep, "_")
    path = cache_dir / f"host_spec-v4-{key}.json"
    if path.is_file() and not refresh:
        return json.loads(path.read_text())
    threads = str(os.cpu_count() or 1)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    out = json.loads(subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True, env=env,
                                    timeout=300, check=True).stdout)
    method = out.pop("method")
    measured = {**out, "name": f"host ({platform.node()})", "source": f"measured: {method}, {threads} threads"}
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(measured))
    os.replace(tmp, path)
    return measured


def main(argv: list[str] | None = None) -> None:
    """Measure this host now (or read the cache) and print the spec as JSON."""
    parser = argparse.ArgumentParser(prog="python -m harness.run.hostspec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--refresh", action="store_true", help="measure again even where a cached spec exists")
    args = parser.parse_args(argv)
    print(json.dumps(measure_host(refresh=args.refresh), indent=2))


if __name__ == "__main__":
    main()
