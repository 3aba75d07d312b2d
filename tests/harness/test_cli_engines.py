"""All three engines through ``troughput-run``: canonical knobs in the config, and a multirun across engines."""

import json

import pytest

from engines.base import KnobError
from harness.run.results import read_rows
from harness.run.spec import build_spec
from tests.conftest import compose
from tests.harness.test_cli import batch_line, troughput_run


def spec(tmp_path, *overrides):
    return build_spec(compose("workload=unique", "workload.num_requests=2", f"run.image_dir={tmp_path}",
                                    *overrides))


def test_canonical_knobs_in_the_engine_config_reach_each_engine_natively(tmp_path):
    sglang = spec(tmp_path, "engine=sglang", "engine.canonical.max_seqs=16", "engine.canonical.prefix_caching=false")
    assert sglang.knobs == {"max_running_requests": 16, "disable_radix_cache": True}
    trtllm = spec(tmp_path, "engine=trtllm", "engine.canonical.kv_memory_fraction=0.8",
                  "engine.knobs.kv_cache_config.tokens_per_block=64")
    assert trtllm.knobs == {"backend": "pytorch",
                            "kv_cache_config": {"tokens_per_block": 64, "free_gpu_memory_fraction": 0.8}}


def test_a_canonical_knob_replaces_the_hardware_twin_but_not_a_native_twin_beside_it(tmp_path):
    vllm = spec(tmp_path, "engine.canonical.kv_memory_fraction=0.4")
    assert vllm.knobs["gpu_memory_utilization"] == 0.4 and vllm.knobs["enforce_eager"] is True
    with pytest.raises(KnobError, match="max_seqs=8 and its vLLM twin"):
        spec(tmp_path, "engine.canonical.max_seqs=8", "engine.knobs.max_num_seqs=16")
    with pytest.raises(KnobError, match="out of range for TensorRT-LLM"):
        spec(tmp_path, "engine=trtllm", "engine.canonical.kv_memory_fraction=1.5")


def test_a_bad_canonical_value_stops_the_cli_with_one_line(tmp_path):
    proc = troughput_run(tmp_path, "engine=sglang", "workload=unique", "workload.num_requests=2",
                         "engine.canonical.max_seqs=0", timeout=120)
    assert proc.returncode == 2 and "max_seqs=0 is out of range for SGLang" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.engine
def test_multirun_over_three_engines_gives_one_ok_row_and_two_clear_invalid_rows(tmp_path):
    """Also a good OpenAI Batch file on the real engine (one vLLM start serves both: the file is the workload)."""
    path = tmp_path / "batch.jsonl"
    lines = [batch_line(f"req-{i}", f"tell me about the number {i}") for i in range(6)]
    lines.append(batch_line("plain", "once upon a time", url="/v1/completions"))
    path.write_text("\n".join(lines) + "\n")
    proc = troughput_run(tmp_path, "-m", "engine=vllm,sglang,trtllm", "workload=file", f"workload.path={path}",
                         "run.save_outputs=true")
    assert proc.returncode == 0, proc.stderr
    rows = {row["engine"]: row for row in read_rows(tmp_path / "results")}
    assert set(rows) == {"vllm", "sglang", "trtllm"}
    assert rows["vllm"]["status"] == "ok", rows["vllm"]["error"]
    assert rows["vllm"]["requests_done"] == 7 and rows["vllm"]["canon.kv_memory_fraction"] == 0.5
    for engine, package in (("sglang", "sglang"), ("trtllm", "tensorrt_llm")):
        row = rows[engine]
        assert row["status"] == "invalid" and row["failed_phase"] == "validate"
        assert f"{package} is not installed" in row["error"] and f"troughput-env {engine}" in row["error"]
        assert "Traceback" not in row["error"]
    assert rows["trtllm"]["knob.backend"] == "pytorch"
    assert "3 row(s)" in proc.stdout   # the statuses: the rows above

    row = rows["vllm"]   # the batch file on the real engine
    assert row["output_tokens"] == 6 * 5 + 7 and row["workload_info.source_format"] == "openai_batch"
    outputs = [json.loads(line) for line in open(tmp_path / "results" / "outputs" / f"{row['run_id']}.jsonl")]
    assert [o["id"] for o in outputs] == [f"req-{i}" for i in range(6)] + ["plain"]
