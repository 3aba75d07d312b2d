"""vLLM's compile seconds from its engine-core log (engines/vllm_log.py), checked against vLLM's own format.

The format strings are taken from the installed vLLM's ``v1/engine/core.py`` (parsed, never imported: the
three ``logger.info_once("init engine ... took ...")`` calls of ``_initialize_kv_caches``), rendered with
numbers as vLLM's logger renders them (its record prefix from ``vllm/logger.py``'s ``_FORMAT``), and read
back. A vLLM that rewords the line fails here before a GPU run loses its compile time.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from engines.vllm_log import StderrSince, compile_seconds

ROOT = Path(__file__).resolve().parents[2]


def vllm_source(relative: str) -> str:
    spec = importlib.util.find_spec("vllm")   # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed here")
    return (Path(list(spec.submodule_search_locations)[0]) / relative).read_text()


def init_engine_formats() -> list[str]:
    tree = ast.parse(vllm_source("v1/engine/core.py"))
    formats = [node.args[0].value for node in ast.walk(tree)
               if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "info_once" and node.args
               and isinstance(node.args[0], ast.Constant) and "init engine" in str(node.args[0].value)]
    assert len(formats) == 3, f"vLLM's core.py has {len(formats)} init-engine log lines, not the 3 read: {formats}"
    return formats


def record_prefix() -> str:
    """vLLM's record prefix, from its logger's format (``_FORMAT`` in vllm/logger.py), for the engine core."""
    source = vllm_source("logger.py")
    assert "(%(vllm_process_name)s " in source and "pid=%(process)d) %(levelname)s %(asctime)s " in source
    return "(EngineCore_DP0 pid=4242) INFO 12-04 21:07:05 [core.py:386] "


def test_each_form_of_vllm_s_line_reads_back():
    by_args = {0: (41.27,), 1: (41.27, 30.5), 3: (41.27, 33.75, 30.5, 3.25)}
    expected = {0: 0.0, 1: 30.5, 3: 33.75}   # no compilation; language model; language model + encoder
    formats = init_engine_formats()
    seen = set()
    for fmt in formats:
        placeholders = fmt.count("%.2f")
        args = by_args[{1: 0, 2: 1, 4: 3}[placeholders]]
        line = record_prefix() + fmt % args
        assert compile_seconds(f"noise\n{line}\nmore noise\n") == expected[{1: 0, 2: 1, 4: 3}[placeholders]], line
        seen.add(placeholders)
    assert seen == {1, 2, 4}


def test_no_line_is_unknown_and_the_last_line_counts():
    assert compile_seconds("INFO loading weights\n") is None
    two = ("init engine (profile, create kv cache, warmup model) took 9.00 s (compilation: 5.00 s)\n"
           "init engine (profile, create kv cache, warmup model) took 8.00 s (compilation: 4.25 s)\n")
    assert compile_seconds(two) == 4.25


def test_what_stderr_received_after_the_mark_is_read_back(tmp_path):
    # a child whose stderr is a file, as the runner starts workers: a line before the mark is not read back,
    # a line a grandchild (the engine core) writes after it is
    log = tmp_path / "run.log"
    script = (
        "import subprocess, sys\n"
        "from engines.vllm_log import StderrSince, compile_seconds\n"
        "print('init engine (profile, create kv cache, warmup model) took 1.00 s (compilation: 9.99 s)',"
        " file=sys.stderr, flush=True)\n"
        "log = StderrSince().mark()\n"
        "subprocess.run([sys.executable, '-c', \"import sys; print('(EngineCore_DP0 pid=1) INFO init engine "
        "(profile, create kv cache, warmup model) took 12.00 s (compilation: 7.50 s)', file=sys.stderr)\"])\n"
        "print(compile_seconds(log.read()))\n")
    with open(log, "w") as err:
        out = subprocess.run([sys.executable, "-c", script], stderr=err, stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.stdout.strip() == "7.5", log.read_text()


def test_stderr_that_is_not_a_file_reads_nothing():
    proc = subprocess.run([sys.executable, "-c", "from engines.vllm_log import StderrSince; "
                           "print(repr(StderrSince().mark().read()))"], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.stdout.strip() == "''"


def test_the_engine_core_s_pid_is_read_from_the_record_prefix():
    from engines.vllm_log import engine_core_pid

    [plain] = [f for f in init_engine_formats() if f.count("%.2f") == 1]   # eager: no compilation part
    line = record_prefix() + plain % (3.0,)

    assert engine_core_pid("noise\n" + line + "\n") == 4242
    assert engine_core_pid("init engine (profile, create kv cache, warmup model) took 3.00 s") is None
