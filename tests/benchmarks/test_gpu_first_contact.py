"""benchmarks/gpu_first_contact.py, the device script: its checks can fail, and its CPU rehearsal runs here."""

import json
import subprocess
import sys

import pytest

import benchmarks.gpu_first_contact as fc


def canned(before: str, after: str):
    outputs = {"before": before, "after": after}

    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, 0, stdout=outputs[command[3]] + "\n", stderr="")
    return run


def test_the_fork_check_needs_the_old_check_to_break_the_fork_and_the_new_one_not(monkeypatch):
    broke = "('error', 'RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with ...')"
    monkeypatch.setattr(fc.subprocess, "run", canned(broke, "('ok', 4.0)"))
    status, detail = fc.check_fork()
    assert status == fc.VERIFIED and "Cannot re-initialize" in detail
    monkeypatch.setattr(fc.subprocess, "run", canned(broke, broke))
    assert fc.check_fork()[0] == fc.FAILED, "the fix still poisons the fork"
    monkeypatch.setattr(fc.subprocess, "run", canned("('ok', 4.0)", "('ok', 4.0)"))
    assert fc.check_fork()[0] == fc.FAILED, "a before-case that does not fail shows nothing"


def test_the_fork_child_script_runs_the_pre_run_check_as_it_is_now():
    assert "torch.cuda.is_available()" in fc.FORK_CHILD and "import_report" in fc.FORK_CHILD
    assert 'get_context("fork")' in fc.FORK_CHILD


def test_without_a_gpu_the_gpu_checks_say_not_run_and_the_exit_status_is_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(fc, "cuda_here", lambda: "no CUDA device here")
    assert fc.main(["--out", str(tmp_path)]) == 2
    saved = json.loads((tmp_path / "first_contact.json").read_text())
    assert {v["status"] for k, v in saved.items() if k != "total_seconds"} == {fc.NOT_RUN}
    printed = capsys.readouterr().out
    assert "fork: NOT RUN (0.0 s): no CUDA device here" in printed and "all checks: " in printed
    assert isinstance(saved["total_seconds"], float) and "seconds" in saved["fork"]


def test_the_timeouts_of_every_step_sum_to_under_five_minutes():
    steps = fc.TIMEOUTS
    assert steps["cuda_here"] + 2 * steps["fork"] + steps["holder"] + steps["install"] + steps["run"] < 290


def test_a_failed_check_is_exit_status_1(monkeypatch, tmp_path):
    monkeypatch.setattr(fc, "cuda_here", lambda: None)
    monkeypatch.setattr(fc, "check_fork", lambda: (fc.FAILED, "poisoned"))
    monkeypatch.setattr(fc, "check_meters", lambda: (fc.VERIFIED, "1 GPU"))
    monkeypatch.setattr(fc, "check_free_memory", lambda: (fc.VERIFIED, "refused"))
    monkeypatch.setattr(fc, "check_run", lambda out, wheels, hardware: (fc.VERIFIED, hardware))
    assert fc.main(["--out", str(tmp_path)]) == 1
    saved = json.loads((tmp_path / "first_contact.json").read_text())
    assert saved["troughput-run"]["detail"] == "h200" and saved["fork"]["status"] == fc.FAILED


def test_a_check_that_raises_is_failed_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(fc, "cuda_here", lambda: None)
    for name in ("check_fork", "check_meters", "check_free_memory"):
        monkeypatch.setattr(fc, name, lambda: (_ for _ in ()).throw(ModuleNotFoundError("No module named 'pynvml'")))
    monkeypatch.setattr(fc, "check_run", lambda out, wheels, hardware: (fc.VERIFIED, "ran"))
    assert fc.main(["--out", str(tmp_path)]) == 1
    assert "No module named 'pynvml'" in json.loads((tmp_path / "first_contact.json").read_text())["meters"]["detail"]


def test_the_cpu_rehearsal_runs_troughput_run_engine_hf_for_real(tmp_path):
    # the run check on this CPU (the GPU checks cannot run here): a real troughput-run engine=hf, rows under OUT
    status, detail = fc.check_run(tmp_path, None, "cpu")
    assert status == fc.VERIFIED, detail
    assert "status ok on cpu" in detail and list((tmp_path / "results" / "runs").glob("*.json"))


def test_missing_driver_dependencies_are_named(tmp_path):
    assert fc.install_missing(None, tmp_path) == ([], ""), "this environment has troughput's driver dependencies"
    assert set(fc.DRIVER_MODULES) >= {"hydra", "omegaconf", "pandas"}


@pytest.mark.parametrize("python", ["3.12"])
def test_wheel_lists_cover_the_missing_modules(python):
    names = " ".join(fc.PURE + fc.BINARY)
    for package in ("hydra-core", "omegaconf", "antlr4-python3-runtime", "pandas", "pillow", "pyyaml"):
        assert package in names


def test_wheels_go_into_a_folder_of_their_own_and_a_set_for_another_python_is_refused(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pandas-2.3.3-cp39-cp39-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (wheels / "omegaconf-2.3.0-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setattr(fc.importlib.util, "find_spec", lambda name: None if name == "pandas" else object())
    ran = []

    def pip(command, **kwargs):
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")
    monkeypatch.setattr(fc.subprocess, "run", pip)
    missing, why = fc.install_missing(wheels, tmp_path / "site")
    assert missing == ["pandas"] and "built for cp39" in why and "--fetch-wheels --python" in why and not ran
    mine = f"cp{sys.version_info.major}{sys.version_info.minor}"
    (wheels / "pandas-2.3.3-cp39-cp39-manylinux_2_28_x86_64.whl").rename(
        wheels / f"pandas-2.3.3-{mine}-{mine}-manylinux_2_28_x86_64.whl")
    fc.install_missing(wheels, tmp_path / "site")
    [command] = ran
    assert command[command.index("--target") + 1] == str(tmp_path / "site") and "--no-index" in command
