"""The API-snapshot recorder (``engines/snapshots/record.py``) and the recorded files it writes.

The recorder runs here on small packages written by the tests in the layout of the real
ones (a wheel for SGLang, a source tree for TensorRT-LLM), so every extraction rule is
exercised; the committed SGLang snapshot is re-recorded from the real wheel when one is
at hand (``SGLANG_WHEEL``, or /tmp/wheels).
"""

import json
import os
import zipfile
from pathlib import Path

import pytest

from engines import snapshots
from engines.base import KnobError
from engines.snapshots import record

SGLANG_FILES = {
    "sglang/_version.py": "__version__ = version = '9.9.9'\n",
    "sglang/srt/server_args.py": (
        "from sglang.srt.arg_groups.fields.schedule import Schedule\n"
        "from sglang.srt.arg_groups.fields.model import Model\n"
        "class ServerArgs:\n    _hidden: bool = False\n    def resolve_once(self): pass\n"
        "_INPUT_NAMESPACES = [Model, Schedule]\n"),
    "sglang/srt/arg_groups/fields/model.py": "class Model(Struct):\n    _NS_PATH = 'model'\n    model_path: str = ''\n",
    "sglang/srt/arg_groups/fields/schedule.py": (
        "class Base(Struct):\n    page_size: int = 1\n"
        "class Schedule(Base):\n    max_running_requests: Optional[int] = None\n    k: ClassVar[int] = 1\n"),
    "sglang/srt/entrypoints/engine.py": (
        "class EngineBase: \n    def shutdown(self): pass\n"
        "class Engine(EngineBase):\n    def __init__(self, **kwargs): pass\n"
        "    def generate(self, prompt=None, *, input_ids=None): pass\n    def _private(self): pass\n"
        "    def flush_cache(self): pass\n"
        "    def get_server_info(self):\n"
        "        return {**self.args.resolved_dict(), 'launch_command': 1, **self.infos[0], 'version': 2}\n"),
    "sglang/srt/managers/scheduler.py": (
        "class Scheduler:\n    def get_init_info(self):\n        result_dict = {'status': 'ready', 'max_total_num_tokens': 1}\n"
        "        result_dict['hicache_object_layout'] = 2\n        other = {'not_info': 3}\n        return result_dict\n"),
    "sglang/srt/managers/data_parallel_controller.py": (
        "class DataParallelController:\n    def get_init_info(self):\n        init_info = {'max_req_input_len': 1}\n"
        "        return init_info\n"),
    "sglang/srt/usage.py": "def empty() -> dict[str, float]:\n    return {}\n",
    "sglang/srt/managers/io_struct.py": "class BaseReq:\n    rid: str = ''\nclass FlushCacheReqOutput(BaseReq):\n    success: bool\n",
    "sglang/srt/sampling/sampling_params.py": "class SamplingParams(Struct):\n    max_new_tokens: int = 128\n",
    "sglang/srt/managers/tokenizer_manager.py": (
        "def f(meta_info, x):\n    meta_info = {'id': 1, 'prompt_tokens': 2}\n    meta_info['e2e_latency'] = 3\n"
        "    meta_info.update({'cached_tokens': 4}, )\n    other = {'not_meta': 5}\n"),
    "sglang/srt/observability/startup_time.py": (
        "from sglang.srt.usage import empty\n"
        "def g(load: float):\n    result = {'load_weight': load, 'cuda_graph': empty(), 'scheduler_e2e': 0.0}\n"
        "    result['tokenizer_e2e'] = load\n    return result\n"
        "def h(graphs):\n    return {'cuda_graph': graphs}\n"),
    "sglang/srt/observability/forward_pass_metrics.py": (
        "class ScheduledRequestMetrics(msgspec.Struct, frozen=True):\n    num_decode_requests: int = 0\n"
        "class QueuedRequestMetrics(msgspec.Struct, frozen=True):\n    num_prefill_requests: int = 0\n"
        "class ForwardPassMetrics(msgspec.Struct, frozen=True):\n    wall_time: float = 0.0\n"
        "    scheduled_requests: ScheduledRequestMetrics = ScheduledRequestMetrics()\n"),
    "sglang/srt/models/llama.py": "class LlamaForCausalLM: pass\nEntryClass = LlamaForCausalLM\n",
    "sglang/srt/models/qwen.py": "EntryClass = [Qwen2ForCausalLM, m.Qwen2VLForConditionalGeneration]\n",
    "sglang/srt/models/helper.py": "x = 1\n",
}


def test_sglang_snapshot_from_a_wheel(tmp_path):
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in SGLANG_FILES.items():
            z.writestr(path, text)
    snap = record.record_sglang(wheel)
    assert snap["version"] == "9.9.9" and snap["source"]["file"] == wheel.name and len(snap["source"]["sha256"]) == 64
    classes = snap["classes"]
    assert classes["ServerArgs"]["fields"] == ["model_path", "page_size", "max_running_requests", "_hidden"]
    assert classes["Engine"]["methods"] == {
        "__init__": {"params": [], "var_keyword": True}, "generate": {"params": ["prompt", "input_ids"], "var_keyword": False},
        "flush_cache": {"params": [], "var_keyword": False}, "shutdown": {"params": [], "var_keyword": False},
        "get_server_info": {"params": [], "var_keyword": False}}
    assert classes["FlushCacheReqOutput"]["fields"] == ["rid", "success"]
    assert classes["ForwardPassMetrics"]["fields"] == ["wall_time", "scheduled_requests"]
    assert classes["ScheduledRequestMetrics"]["fields"] == ["num_decode_requests"]
    assert classes["QueuedRequestMetrics"]["fields"] == ["num_prefill_requests"]
    assert snap["keys"]["meta_info"] == ["cached_tokens", "e2e_latency", "id", "prompt_tokens"]
    assert snap["keys"]["startup_time"] == ["cuda_graph", "load_weight", "scheduler_e2e", "tokenizer_e2e"]
    # kinds where the source shows them: a constant, an annotated parameter, a function's return annotation
    assert snap["types"]["startup_time"] == {"cuda_graph": "mapping", "load_weight": "number",
                                             "scheduler_e2e": "number", "tokenizer_e2e": "number"}
    assert snap["keys"]["server_info"] == sorted(["model_path", "page_size", "max_running_requests", "_hidden",
                                                  "launch_command", "version", "status", "max_total_num_tokens",
                                                  "hicache_object_layout", "max_req_input_len"])
    assert snap["models"]["architectures"] == ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen2VLForConditionalGeneration"]


TRTLLM_FILES = {
    "tensorrt_llm/version.py": "__version__ = '8.8.8'\n",
    "tensorrt_llm/llmapi/llm_args.py": (
        "class StrictBaseModel(BaseModel):\n    pass\n"
        "class BaseLlmArgs(StrictBaseModel):\n    model: str = Field()\n    max_batch_size: int = 2048\n"
        "    _private: int = PrivateAttr(0)\n    model_config = ConfigDict()\n"
        "class TorchLlmArgs(BaseLlmArgs):\n    cuda_graph_config: Optional[CudaGraphConfig] = None\n"
        "class TrtLlmArgs(BaseLlmArgs):\n    build_config: object = None\n"
        "class KvCacheConfig(StrictBaseModel):\n    enable_block_reuse: bool = True\n"
        "class SchedulerConfig(StrictBaseModel):\n    capacity_scheduler_policy: str = 'x'\n"
        "class CudaGraphConfig(StrictBaseModel):\n    max_batch_size: int = 0\n    enable_padding: bool = False\n"),
    "tensorrt_llm/llmapi/llm.py": (
        "class BaseLLM:\n    def __init__(self, model, **kwargs):\n        self.args = 1\n"
        "    def generate_async(self, inputs, sampling_params=None, cache_salt=None): pass\n"
        "    def get_stats(self, timeout=2): pass\n"
        "class LLM(BaseLLM):\n    def shutdown(self): pass\n    @property\n    def llm_build_stats(self): pass\n"),
    "tensorrt_llm/sampling_params.py": "@dataclass\nclass SamplingParams:\n    max_tokens: int = 32\n    _hidden: int = 0\n",
    "tensorrt_llm/executor/result.py": (
        "@dataclass\nclass CompletionOutput:\n    index: int\n    token_ids: list = None\n"
        "class RequestOutput:\n    def __init__(self):\n        self.outputs = []\n"
        "    @property\n    def prompt_token_ids(self): pass\n"),
    "cpp/tensorrt_llm/executor/jsonSerialization.cpp": (
        "NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(KvCacheStats, maxNumBlocks,\n    reusedBlocks);\n"
        "NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(InflightBatchingStats, numPausedRequests);\n"
        "NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(IterationStats, iter, kvCacheStats, inflightBatchingStats);\n"),
    "tensorrt_llm/_torch/models/modeling_llama.py": (
        "@register_auto_model('LlamaForCausalLM')\nclass LlamaForCausalLM: pass\n"
        "@support_pp\n@register_auto_model('Llama4ForConditionalGeneration')\nclass Llama4: pass\n"),
    "tensorrt_llm/_torch/models/modeling_utils.py": "def register_auto_model(name): pass\n",
}


def test_trtllm_snapshot_from_a_source_tree(tmp_path):
    for path, text in TRTLLM_FILES.items():
        (tmp_path / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / path).write_text(text)
    assert record.main(["--out-dir", str(tmp_path), "trtllm", "--source-dir", str(tmp_path / "src"),
                        "--commit", "abc123", "--tag", "v8.8.8"]) == 0
    snap = json.loads((tmp_path / "tensorrt_llm-8.8.8.json").read_text())
    assert snap["source"] == {"kind": "git", "repository": "NVIDIA/TensorRT-LLM", "commit": "abc123", "tag": "v8.8.8",
                              "files": {path: "abc123" for path in sorted(TRTLLM_FILES)}}   # every file it read
    classes = snap["classes"]
    assert classes["TorchLlmArgs"]["fields"] == ["model", "max_batch_size", "cuda_graph_config"]
    assert classes["TrtLlmArgs"]["fields"] == ["model", "max_batch_size", "build_config"]
    assert classes["CudaGraphConfig"]["fields"] == ["max_batch_size", "enable_padding"]
    assert classes["LLM"]["methods"]["generate_async"]["params"] == ["inputs", "sampling_params", "cache_salt"]
    assert set(classes["LLM"]["methods"]) == {"__init__", "generate_async", "get_stats", "shutdown"}
    assert classes["LLM"]["attributes"] == ["args", "llm_build_stats"]
    assert classes["SamplingParams"]["fields"] == ["max_tokens"]
    assert classes["RequestOutput"]["attributes"] == ["outputs", "prompt_token_ids"]
    assert snap["keys"]["InflightBatchingStats"] == ["numPausedRequests"]
    assert snap["keys"]["KvCacheStats"] == ["maxNumBlocks", "reusedBlocks"]
    assert snap["models"]["architectures"] == ["Llama4ForConditionalGeneration", "LlamaForCausalLM"]


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def test_a_tree_assembled_file_by_file_records_each_files_commit(tmp_path):
    """``--sources`` names the commit of every file (a tree read from a code index, one file at a time)."""
    _write_tree(tmp_path / "src", TRTLLM_FILES)
    commits = {path: ("c2" if "models/" in path else "c1") for path in TRTLLM_FILES}
    (tmp_path / "sources.json").write_text(json.dumps({"repository": "NVIDIA/TensorRT-LLM", "files": commits}))
    assert record.main(["--out-dir", str(tmp_path), "trtllm", "--source-dir", str(tmp_path / "src"),
                        "--sources", str(tmp_path / "sources.json")]) == 0
    source = json.loads((tmp_path / "tensorrt_llm-8.8.8.json").read_text())["source"]
    assert source["commit"] is None and source["commits"] == ["c1", "c2"]
    assert source["files"]["tensorrt_llm/llmapi/llm_args.py"] == "c1"
    assert source["files"]["tensorrt_llm/_torch/models/modeling_llama.py"] == "c2"
    del commits["tensorrt_llm/sampling_params.py"]
    (tmp_path / "sources.json").write_text(json.dumps({"files": commits}))
    with pytest.raises(KeyError, match="sampling_params.py was read but --sources names no commit"):
        record.main(["--out-dir", str(tmp_path), "trtllm", "--source-dir", str(tmp_path / "src"),
                     "--sources", str(tmp_path / "sources.json")])


def test_trtllm_args_found_where_the_class_lives(tmp_path):
    """After 1.2, TrtLlmArgs moved to ``_tensorrt_engine/llm_args.py``: the recorder follows the class, not the file."""
    files = dict(TRTLLM_FILES)
    files["tensorrt_llm/llmapi/llm_args.py"] = files["tensorrt_llm/llmapi/llm_args.py"].replace(
        "class TrtLlmArgs(BaseLlmArgs):\n    build_config: object = None\n", "")
    files["tensorrt_llm/_tensorrt_engine/llm_args.py"] = "class TrtLlmArgs(BaseLlmArgs):\n    workspace: str = None\n"
    _write_tree(tmp_path / "src", files)
    record.main(["--out-dir", str(tmp_path), "trtllm", "--source-dir", str(tmp_path / "src"), "--commit", "abc"])
    snap = json.loads((tmp_path / "tensorrt_llm-8.8.8.json").read_text())
    assert snap["classes"]["TrtLlmArgs"] == {"file": "tensorrt_llm/_tensorrt_engine/llm_args.py",
                                             "fields": ["workspace"]}
    assert "tensorrt_llm/_tensorrt_engine/llm_args.py" in snap["source"]["files"]


def test_the_recorder_lists_the_files_it_reads(capsys):
    assert record.main(["trtllm", "--list-files"]) == 0
    listed = capsys.readouterr().out
    for path in ("tensorrt_llm/llmapi/llm_args.py", "tensorrt_llm/executor/result.py",
                 "cpp/tensorrt_llm/executor/jsonSerialization.cpp", "tensorrt_llm/_torch/models/*.py"):
        assert path in listed


def _real_wheel() -> Path | None:
    given = os.environ.get("SGLANG_WHEEL")
    found = sorted(Path("/tmp/wheels").glob("sglang-0.5.23-*.whl")) if Path("/tmp/wheels").is_dir() else []
    path = Path(given) if given else (found[0] if found else None)
    return path if path and path.is_file() else None


@pytest.mark.skipif(_real_wheel() is None, reason="no sglang 0.5.23 wheel at hand (SGLANG_WHEEL)")
def test_the_committed_sglang_snapshot_is_what_the_wheel_records():
    assert record.record_sglang(_real_wheel()) == snapshots.load("sglang").data


def test_the_committed_snapshots_name_their_version_and_source():
    sglang, trtllm = snapshots.load("sglang"), snapshots.load("trtllm")
    assert (sglang.data["version"], trtllm.data["version"]) == ("0.5.23", "1.2.1")
    assert sglang.data["source"]["file"].startswith("sglang-0.5.23-") and len(sglang.data["source"]["sha256"]) == 64
    assert trtllm.data["source"]["tag"] == "v1.2.1" and len(trtllm.data["source"]["commit"]) == 40
    assert len(sglang.fields("ServerArgs")) == 546 and "LlamaForCausalLM" in sglang.architectures
    assert trtllm.architectures is None, "TensorRT-LLM's registry needs its source tree (see the snapshot's note)"


def test_model_architectures_and_the_refusal(tmp_path):
    assert snapshots.model_architectures({"name": "llama-3.1-8b", "path": "meta-llama/x"}) == ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text('{"architectures": ["FooForCausalLM"]}')
    assert snapshots.model_architectures({"path": str(tmp_path)}) == ["FooForCausalLM"]
    assert snapshots.model_architectures({"architectures": ["Bar"], "path": str(tmp_path)}) == ["Bar"]
    assert snapshots.model_architectures({"name": "nothing", "path": "hub/id"}) == []
    sglang = snapshots.load("sglang")
    with pytest.raises(KnobError, match=r"model 'foo' \(FooForCausalLM\) is not implemented by SGLang 0.5.23; "
                                        r"it implements: .*Qwen2ForCausalLM"):
        sglang.check_architectures(["FooForCausalLM"], "SGLang", "foo")
    sglang.check_architectures(["FooForCausalLM", "LlamaForCausalLM"], "SGLang", "foo")
    snapshots.load("trtllm").check_architectures(["FooForCausalLM"], "TensorRT-LLM", "foo")   # registry not recorded
