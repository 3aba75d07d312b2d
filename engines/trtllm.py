"""TensorRT-LLM adapter: the LLM API with token-id prompts, PyTorch backend by default, TensorRT selectable.

Written against the TensorRT-LLM 1.2-line source (``tensorrt_llm/llmapi/llm.py``,
``llm_args.py``, ``llm_utils.py``, ``sampling_params.py``, ``executor/result.py``,
``_tensorrt_engine/__init__.py`` in NVIDIA/TensorRT-LLM); not run: it needs an NVIDIA
GPU, and its wheel cannot be installed here.

- Backend (knob ``backend``): ``pytorch`` is ``tensorrt_llm.LLM`` (``TorchLlmArgs``);
  ``tensorrt`` is ``tensorrt_llm._tensorrt_engine.LLM`` (``_TrtLLM``, ``TrtLlmArgs``),
  which builds a TensorRT engine first; ``LLM`` refuses TrtLlmArgs-only knobs and names
  that import.
- ``LLM.generate_async(inputs, sampling_params=..., cache_salt=...)`` per request with
  ``{"prompt_token_ids": [...]}`` (plus ``multi_modal_data``) and
  ``SamplingParams(max_tokens, ignore_eos, top_k=1, detokenize=False, return_perf_metrics=True)``.
- ``RequestOutput.prompt_token_ids``, ``.outputs[0].token_ids`` and
  ``.outputs[0].request_perf_metrics`` (``kv_cache_metrics.num_reused_blocks``,
  ``timing_metrics.last_token_time`` on the steady clock of ``tensorrt_llm.bindings.steady_clock_now``).
- ``LLM.get_stats(timeout)``: iteration stats, ``kvCacheStats.reusedBlocks`` cumulative.
- ``LLM.llm_build_stats.build_steps_info``: ``(step, seconds)`` of the engine build;
  ``LLM.args.kv_cache_config.tokens_per_block``; ``LLM.shutdown()``.
"""

from __future__ import annotations

import importlib
import json
import time
from datetime import timedelta
from typing import Any

from engines.base import Completion, Engine, EngineStats, KnobError, Request, StartInfo
from engines.common import (
    RequestCounters, check_names, load_field_list, load_images, require_cuda, require_module, shutdown,
)
from engines.knobs import NativeMapping
from engines.unit import EngineUnit, Environment, dummy_weights_args

LABEL = "TensorRT-LLM"
BACKENDS = {"pytorch": "tensorrt_llm:LLM", "tensorrt": "tensorrt_llm._tensorrt_engine:LLM"}
NESTED = ("kv_cache_config", "scheduler_config")


class TrtllmEngine(Engine):
    """Drives ``LLM.generate_async`` per request and reads per-request perf metrics and iteration stats."""

    name = "trtllm"

    @property
    def backend(self) -> str:
        return str(self.knobs.get("backend") or "pytorch")

    def validate(self) -> None:
        """The package, then a GPU, then knob names and the backend; raise ``KnobError``."""
        require_module("tensorrt_llm", LABEL, "trtllm")
        require_cuda(LABEL)
        self.check_knobs()

    def check_knobs(self) -> None:
        if self.backend not in BACKENDS:
            raise KnobError(f"TensorRT-LLM backend {self.backend!r} is unknown; use one of {', '.join(BACKENDS)}")
        UNIT.check_reserved(self.knobs)
        fields, source = native_fields(self.backend)
        check_names(self.knobs, fields[""], LABEL, source)
        for section in NESTED:
            value = self.knobs.get(section)
            if isinstance(value, dict):
                check_names([f"{section}.{k}" for k in value], {f"{section}.{k}" for k in fields[section]},
                            LABEL, source)
        dtype = (self.knobs.get("kv_cache_config") or {}).get("dtype", "auto")
        if self.backend == "tensorrt" and dtype != "auto":
            raise KnobError("kv_cache_config.dtype (kv_cache_dtype) is PyTorch-backend only: TrtLlmArgs "
                            "rejects it; quantize the KV cache through the engine build (quant_config) instead")

    def _engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model["path"], "return_perf_metrics": True}
        if self.backend == "pytorch":
            kwargs["enable_iter_perf_stats"] = True
        kwargs.update(dummy_weights_args(self.model))
        knobs = {k: v for k, v in self.knobs.items() if k != "backend"}
        return {**kwargs, **knobs}

    def start(self) -> StartInfo:
        import tensorrt_llm

        module_name, class_name = BACKENDS[self.backend].split(":")
        llm_class = getattr(importlib.import_module(module_name), class_name)
        self.counters = RequestCounters()
        self.salt: str | None = None
        t0 = time.perf_counter()
        self.llm = llm_class(**self._engine_kwargs())
        startup_s = time.perf_counter() - t0
        self.started = True
        self.tokens_per_block = int(self.llm.args.kv_cache_config.tokens_per_block)
        build = getattr(self.llm, "llm_build_stats", None)
        steps = [(str(name), float(seconds)) for name, seconds in (getattr(build, "build_steps_info", None) or [])]
        extra: dict[str, Any] = {"backend": self.backend, "tokens_per_block": self.tokens_per_block,
                                 "build_steps": steps, "build_cache_hit": getattr(build, "cache_hitted", None)}
        return StartInfo(startup_s=startup_s, compile_s=sum(s for _, s in steps) or None,
                         engine_version=tensorrt_llm.__version__, extra=extra)

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        from tensorrt_llm import SamplingParams

        self.require_started()
        clock_at_submit, submitted_at = _steady_now(), time.perf_counter()
        salt = {"cache_salt": self.salt} if self.salt else {}
        futures = [self.llm.generate_async(prompt(r), sampling_params=SamplingParams(**sampling_kwargs(r)), **salt)
                   for r in requests]
        completions = []
        for request, future in zip(requests, futures):
            completion = to_completion(request, future.result(), self.tokens_per_block, submitted_at, clock_at_submit)
            self.counters.add(completion.prompt_tokens, completion.cached_tokens)
            completions.append(completion)
            if on_finish is not None:
                on_finish(1)
        return completions

    def stats(self) -> EngineStats:
        """Prefix reuse summed from per-request metrics; ``kv_reused_blocks`` from iteration stats."""
        self.require_started()
        reused = latest_reused_blocks(self.llm.get_stats(timeout=0.5))
        if reused is not None:
            self.counters.extra["kv_reused_blocks"] = reused
        return self.counters.stats()

    def reset_caches(self) -> None:
        """The LLM API has no cache flush; a new ``cache_salt`` keeps later requests off earlier blocks."""
        self.require_started()
        self.salt = f"troughput-{time.monotonic_ns()}"

    def stop(self) -> None:
        shutdown(self)


def prompt(request: Request) -> dict[str, Any]:
    """A token-id prompt, with images as ``multi_modal_data``."""
    inputs: dict[str, Any] = {"prompt_token_ids": request.prompt_token_ids}
    if request.images:
        inputs["multi_modal_data"] = {"image": load_images(request.images)}
    return inputs


def sampling_kwargs(request: Request) -> dict[str, Any]:
    """Greedy (``top_k=1``) decoding of exactly ``max_tokens`` tokens, with per-request perf metrics."""
    return {"max_tokens": request.max_tokens, "ignore_eos": True, "top_k": 1, "detokenize": False,
            "return_perf_metrics": True}


def to_completion(request: Request, output: Any, tokens_per_block: int, submitted_at: float | None = None,
                  clock_at_submit: Any = None) -> Completion:
    """One ``RequestOutput`` as a ``Completion``.

    Cached tokens are reused KV blocks times the block size, capped at the prompt
    length (as trtllm-serve reports them). ``finished_at`` maps the request's last
    token time from the engine's steady clock onto ``perf_counter``.
    """
    sequence = output.outputs[0]
    prompt_tokens = len(output.prompt_token_ids)
    metrics = getattr(sequence, "request_perf_metrics", None)
    cached = finished_at = None
    if metrics is not None:
        cached = min(prompt_tokens, int(metrics.kv_cache_metrics.num_reused_blocks) * tokens_per_block)
        if submitted_at is not None and clock_at_submit is not None:
            finished_at = submitted_at + _seconds(metrics.timing_metrics.last_token_time) - _seconds(clock_at_submit)
    return Completion(id=request.id, prompt_tokens=prompt_tokens, output_token_ids=[int(t) for t in sequence.token_ids],
                      cached_tokens=cached, finished_at=finished_at)


def latest_reused_blocks(iteration_stats: list[Any]) -> float | None:
    """The last cumulative ``kvCacheStats.reusedBlocks`` in ``LLM.get_stats()`` (dicts or JSON strings)."""
    reused = None
    for entry in iteration_stats or []:
        entry = json.loads(entry) if isinstance(entry, str) else entry
        value = (entry.get("kvCacheStats") or {}).get("reusedBlocks")
        if value is not None:
            reused = float(value)
    return reused


def native_fields(backend: str) -> tuple[dict[str, frozenset[str]], str]:
    """Argument names by section ("" top level, ``kv_cache_config``, ``scheduler_config``) for ``backend``."""
    try:
        fields = _installed_fields(backend)
    except ImportError:
        recorded = load_field_list("trtllm")
        top = recorded["base"] | recorded[backend]
        fields = {"": top, **{section: recorded[section] for section in NESTED}}
        return fields, f"TensorRT-LLM 1.2-line {_ARGS_CLASS[backend]} fields (engines/native_fields/trtllm.txt)"
    import tensorrt_llm

    return fields, f"{_ARGS_CLASS[backend]} fields of the installed tensorrt_llm {tensorrt_llm.__version__}"


_ARGS_CLASS = {"pytorch": "TorchLlmArgs", "tensorrt": "TrtLlmArgs"}


def _installed_fields(backend: str) -> dict[str, frozenset[str]]:
    from tensorrt_llm.llmapi import llm_args

    if backend == "pytorch":
        args_class = llm_args.TorchLlmArgs
    elif hasattr(llm_args, "TrtLlmArgs"):
        args_class = llm_args.TrtLlmArgs
    else:  # newer releases moved it next to the TensorRT LLM class
        args_class = importlib.import_module("tensorrt_llm._tensorrt_engine.llm_args").TrtLlmArgs
    return {"": frozenset(args_class.model_fields) | {"backend"},
            "kv_cache_config": frozenset(llm_args.KvCacheConfig.model_fields),
            "scheduler_config": frozenset(llm_args.SchedulerConfig.model_fields)}


def _steady_now() -> Any:
    try:
        from tensorrt_llm.bindings import steady_clock_now
    except ImportError:
        return None
    return steady_clock_now()


def _seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


# Enum values checked before any engine starts: KvCacheConfig.dtype validator and WaitingQueuePolicy
# of llmapi/llm_args.py (1.2 line).
KV_DTYPES = ("auto", "fp8", "nvfp4", "float16", "bfloat16", "float32")

UNIT = EngineUnit(
    name="trtllm", label=LABEL, adapter="engines.trtllm:TrtllmEngine",
    knobs={
        "max_seqs": NativeMapping(("max_batch_size",)),
        "max_tokens_per_step": NativeMapping(("max_num_tokens",)),
        "kv_memory_fraction": NativeMapping(("kv_cache_config.free_gpu_memory_fraction",)),
        "prefix_caching": NativeMapping(("kv_cache_config.enable_block_reuse",)),
        "chunked_prefill": NativeMapping(("enable_chunked_prefill",)),
        "tensor_parallel": NativeMapping(("tensor_parallel_size",)),
        "pipeline_parallel": NativeMapping(("pipeline_parallel_size",)),
        "kv_cache_dtype": NativeMapping(("kv_cache_config.dtype",), note="PyTorch backend only", choices=KV_DTYPES),
        "speculative": NativeMapping(("speculative_config",)),
        "schedule_policy": NativeMapping(("scheduler_config.waiting_queue_policy",), choices=("fcfs",)),
    },
    # PyPI's tensorrt_llm is a stub that fetches the wheel from NVIDIA's index; Python 3.10 or 3.12.
    # NVIDIA's Linux pip guide (docs/source/installation/linux.md, 1.2 line): CUDA toolkit 13.1 with
    # CUDA_HOME set, the CUDA 13.0 build of torch 2.9.1 first (1.2.1 requires torch>=2.9.1,<=2.10.0a0;
    # without this step pip resolves the CUDA 12.8 torch), held by a constraints file while
    # tensorrt_llm installs, and MPI. Python 3.10 and 3.12 only.
    environments={"default": Environment(
        "tensorrt_llm", ("python3.12", "python3.10"), ("tensorrt_llm==1.2.1",),
        pip_args=("--extra-index-url", "https://pypi.nvidia.com"),
        pre_install=(("torch==2.9.1", "torchvision==0.24.1", "--index-url", "https://download.pytorch.org/whl/cu130"),),
        constraints=("torch==2.9.1+cu130", "torchvision==0.24.1+cu130"),
        cuda="13.0", cuda_toolkit="13.1", python="==3.10,==3.12",
        libraries=(("mpi", "`sudo apt-get install -y libopenmpi-dev` (TensorRT-LLM links against MPI)"),),
        notes=("TensorRT-LLM links against MPI: install it first (Ubuntu: `apt-get install -y libopenmpi-dev`)",
               "CUDA toolkit 13.1 with CUDA_HOME set (e.g. `export CUDA_HOME=/usr/local/cuda-13.1`)"))},
    tune_spaces={"gpu": "trtllm_h100"},
    reserved=frozenset({"model"}),   # set by the adapter from the model config
)
