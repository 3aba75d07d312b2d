"""A large batch job on Ray with the scripted engine, its driver killed (``kill -9``) about half way, then rerun.

``python -m benchmarks.ray_batch_kill N [SHARD_SIZE] [ray|local]`` (from the checkout; starts its own Ray head on
this host with ``tests/ray_head.py``, 4 logical CPUs): N one-line completion requests (2 output tokens each), the
job run by ``troughput-batch batch.scale=ray`` on one engine actor (``local``: one node's one engine), the driver killed once half the shards are committed, the
same command run again to the end. Prints one JSON line: seconds of each invocation, shards committed before the
kill, the rerun's parts from its row (``rerun_scan_s``: its one pass over the input, counting records, finding
repeated ids and hashing the file; ``rerun_startup_s``; ``rerun_generation_s``: first shard to last commit;
``rerun_merge_s``: the shards into ``output.jsonl``; ``rerun_wall_s``: the whole invocation in the driver), the
rerun's peak driver memory (the row's ``peak_driver_rss_bytes``) and whether every custom_id is in the output
exactly once. The killed first invocation writes no row. The figures in docs/guides/batch.md came from it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import FAKE_ENGINE, ROOT
from tests.ray_head import start_head


def main(n: int, shard_size: int = 1000, scale: str = "ray") -> dict:
    work = Path(tempfile.mkdtemp(prefix="raykill"))
    path = work / "batch.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"model": "tiny", "prompt": f"prompt number {i}", "max_tokens": 2}}) + "\n")
    shards = -(-n // shard_size)
    head_gen = start_head(num_cpus=4)
    head = next(head_gen)
    try:
        command = [sys.executable, "-m", "harness.batch.cli", f"engine.name={FAKE_ENGINE}", "batch.sampling=benchmark",
                   f"batch.input={path}", f"batch.output_dir={work / 'out'}", f"batch.shard_size={shard_size}",
                   *(["batch.scale=ray", f"batch.ray.address={head.address}", "batch.ray.actors=1"]
                     if scale == "ray" else ["batch.scale=local"]),
                   f"run.results_dir={work / 'results'}", "run.progress=false", f"hydra.run.dir={work / 'hydra'}"]
        t0 = time.monotonic()
        first = subprocess.Popen(command, cwd=ROOT, env=head.driver_env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        committed = work / "out" / "shards"
        while first.poll() is None and (not committed.exists() or len(list(committed.glob("0*"))) < shards // 2):
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_s = time.monotonic() - t0
        before = len(list(committed.glob("0*")))
        time.sleep(3)
        t1 = time.monotonic()
        rerun = subprocess.run(command, cwd=ROOT, env=head.driver_env, capture_output=True, text=True)
        rerun_s = time.monotonic() - t1
        rows = [json.loads(p.read_text()) for p in (work / "results" / "batch").glob("*.json")]
        seen: dict[str, int] = {}
        with open(work / "out" / "output.jsonl") as f:
            for line in f:
                cid = json.loads(line)["custom_id"]
                seen[cid] = seen.get(cid, 0) + 1
        once = len(seen) == n and set(seen.values()) == {1}
        [row] = rows
        return {"scale": scale, "requests": n, "shards": shards, "killed_after_s": round(killed_s, 1), "shards_before_kill": before,
                "rerun_exit": rerun.returncode, "rerun_s": round(rerun_s, 1),
                # the rerun's own row: its pass over the input, its engines' start, its shards, its merge
                **{f"rerun_{k}": _round(row.get(k)) for k in ("scan_s", "startup_s", "generation_s", "merge_s",
                                                                "wall_s")},
                "status": row["status"],
                "shards_run_by_rerun": row["shards_run"], "peak_driver_rss_mib": round(row["peak_driver_rss_bytes"]
                                                                                        / 2**20, 1),
                "every_custom_id_once": once, "errors_lines": sum(1 for _ in open(work / "out" / "errors.jsonl"))}
    finally:
        try:
            next(head_gen)
        except StopIteration:
            pass
        shutil.rmtree(work, ignore_errors=True)   # 10^6 requests leave about 1 GiB


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1000,
                          sys.argv[3] if len(sys.argv) > 3 else "ray")))
