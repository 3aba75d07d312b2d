"""No CUDA call in a worker before its engine starts (issue 38, item 1).

vLLM forks its engine core on a GPU unless CUDA is already initialised in the parent; a CUDA
call in the worker's pre-run check (``preflight``) before ``LLM(...)`` makes that fork fail with
"Cannot re-initialize CUDA in forked subprocess". This machine's torch is a CPU build, where
``torch.cuda.is_available()`` returns False without touching any device count, so the test makes
torch believe it is CUDA-built (``torch.version.cuda`` set, and ``torch._C._cuda_getDeviceCount``,
the entry point ``is_available``/``device_count`` reach, replaced by a recording stand-in) in a
fresh interpreter, runs the real pre-run check there and asserts the stand-in was never called.
On the code before the fix (``torch.cuda.is_available()`` in ``import_report``) it records one call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engines import requirements as req
from engines import unit

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import json, sys
    import torch

    calls = []

    def recording(name, value):
        def stand_in(*args, **kwargs):
            calls.append(name)
            return value
        return stand_in

    # torch.cuda.is_available() and device_count() call this when torch is CUDA-built; cuInit follows.
    torch._C._cuda_getDeviceCount = recording("torch._C._cuda_getDeviceCount", 1)
    torch._C._cuda_init = recording("torch._C._cuda_init", None)
    torch.version.cuda = "13.0"
    assert torch.cuda._is_compiled(), "the stand-in must make torch look CUDA-built"

    from engines.base import EngineUnavailable
    from engines.common import preflight
    from engines.requirements import import_report

    if sys.argv[3:] == ["control"]:   # the positive control: a CUDA call made here must be recorded
        torch.cuda.is_available()
        torch.cuda.device_count()
    report = import_report(sys.argv[2])
    try:
        preflight(sys.argv[1])
        outcome = "passed"
    except EngineUnavailable as e:
        outcome = str(e)
    print(json.dumps({"calls": calls, "report": report, "preflight": outcome}))
""")


def run_probe(engine: str, module: str, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, engine, module, *extra], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("engine,module", [pytest.param("vllm", "vllm", marks=pytest.mark.engine),
                                           ("hf", "transformers")])
def test_the_pre_run_check_makes_no_cuda_call_in_the_worker(engine, module):
    pytest.importorskip(module)
    found = run_probe(engine, module)
    assert found["calls"] == [], f"the pre-run check called CUDA in the worker: {found['calls']}"
    # The question was still asked, in a child interpreter (a real CPU torch there: no GPU).
    assert found["report"]["torch_cuda"] == "13.0"
    assert found["report"]["cuda_devices"] == 0 and found["report"]["cuda"] is False


def test_the_stand_in_records_a_cuda_call_made_in_the_worker():
    """The positive control: the same probe, with the worker itself asking torch.cuda first, records the calls;
    so an empty record above means no call was made, not a stand-in that never fires."""
    pytest.importorskip("transformers")
    found = run_probe("hf", "transformers", "control")
    assert "torch._C._cuda_getDeviceCount" in found["calls"], found["calls"]


def test_a_gpu_torch_is_asked_in_a_child_and_its_answer_kept(monkeypatch):
    import torch

    seen = []

    def child(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="some warning\n2\n", stderr="")

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(subprocess, "run", child)
    report = req.import_report("json")
    assert report["cuda"] is True and report["cuda_devices"] == 2
    assert seen and seen[0][0] == sys.executable and "torch.cuda" in seen[0][-1]


def test_a_child_that_fails_gives_no_gpu_with_its_reason(monkeypatch):
    import torch

    def child(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="Traceback\nRuntimeError: driver too old\n")

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(subprocess, "run", child)
    report = req.import_report("json")
    assert report["cuda"] is False and "driver too old" in report["cuda_error"]
    spec = unit("sglang").environment()
    report.update(python="3.12.3", engine="x", troughput="ok", torch="2.14.1+cu130")
    facts = req.HostFacts(python="3.12.3", glibc="2.39", driver="580.95.05", driver_cuda="13.0",
                          gpus=(req.Gpu(0, "GPU-0", "H100"),))
    problems = req.environment_problems("sglang", "SGLang", spec, facts, report, "python")
    assert any("no usable NVIDIA GPU" in p.what and "driver too old" in p.what for p in problems)


def test_a_cpu_torch_needs_no_child(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no child for a CPU build of torch"))
    assert req.import_report("json")["cuda"] is False
