"""Every row names its host: CPU model, cores, the ISA flags that change results, GPU, and a stable host id."""

from harness.run import environment
from tests.harness.test_runner import run

AMX = ("flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8\n"
       "bugs\t\t: spectre\n")
AVX2 = "flags\t\t: fpu sse avx avx2 fma\n"


def test_only_the_flags_that_change_results_are_kept_in_a_fixed_order():
    assert environment.cpu_flags(AMX) == ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16",
                                          "amx_int8"]
    assert environment.cpu_flags(AVX2) == ["avx2"]
    assert environment.cpu_flags("no flags line") == []


def test_the_host_id_changes_with_the_facts_that_change_results_and_only_with_them():
    base = {"env.cpu": "AMD EPYC (family 25 model 17)", "env.cpu_count": 2, "env.cpu_flags": "avx2 avx512f",
            "env.gpu": None, "env.gpu_count": 0, "env.gpu_driver": None, "env.hostname": "a"}
    same = environment.host_identity(base)
    assert same == environment.host_identity(base | {"env.hostname": "b", "env.memory_bytes": 1})
    for change in ({"env.cpu_flags": "avx2"}, {"env.cpu_count": 4}, {"env.cpu": "Intel Xeon"},
                   {"env.gpu": "NVIDIA H100", "env.gpu_count": 8, "env.gpu_driver": "550.54"}):
        assert environment.host_identity(base | change)["env.host_id"] != same["env.host_id"], change
    gpu = environment.host_identity(base | {"env.gpu": "NVIDIA H100", "env.gpu_count": 8, "env.gpu_driver": "550.54"})
    assert "8x NVIDIA H100 (driver 550.54)" in gpu["env.host"]
    assert same["env.host"] == "AMD EPYC (family 25 model 17), 2 cores, avx2 avx512f flags, no GPU"


def test_a_row_names_its_host(tmp_path):
    row = run(tmp_path)
    for column in ("env.cpu", "env.cpu_count", "env.cpu_flags", "env.gpu", "env.gpu_driver", "env.host_id",
                   "env.host", "env.machine"):
        assert column in row, column
    assert len(row["env.host_id"]) == 12 and row["env.host_id"] == environment.capture()["env.host_id"]
    assert set(row["env.cpu_flags"].split()) <= set(environment.RESULT_FLAGS)
