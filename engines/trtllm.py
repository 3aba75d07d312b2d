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
  ``SamplingParams(max_tokens, ignore_eos, top_k=1, detokenize=False, return_perf_metrics=True)`` for a
  benchmark request; a request with its own sampling sets ``temperature``/``top_p``/``seed``/``stop``,
  and a constrained one ``guided_decoding=GuidedDecodingParams(json=... | regex=... | json_object=True)``
  (a choice list becomes a regex), which needs ``guided_decoding_backend`` on the LLM: ``xgrammar``
  unless the knobs choose.
- ``RequestOutput.prompt_token_ids``, ``.outputs[0].token_ids`` and
  ``.outputs[0].request_perf_metrics`` (``kv_cache_metrics.num_reused_blocks``,
  ``timing_metrics.last_token_time`` on the steady clock of ``tensorrt_llm.bindings.steady_clock_now``).
- ``LLM.get_stats(timeout)``: the iteration stats gathered since the last call (a bounded
  queue, ``max_stats_len``), as JSON (``cpp/tensorrt_llm/executor/jsonSerialization.cpp``):
  ``kvCacheStats.reusedBlocks`` is cumulative; ``inflightBatchingStats.numPausedRequests`` counts
  the requests the scheduler paused in that iteration. A paused request has its KV blocks freed
  and restarts from prefill (``PyExecutor._pause_requests``: ``req.pause(...)`` then
  ``_terminate_request``), so each count is one preemption, and the preemption count is their
  sum over iterations (non-zero only under ``capacity_scheduler_policy: MAX_UTILIZATION``;
  ``GUARANTEED_NO_EVICT``, the default, never pauses). Stats are drained about once a second
  while results come in; iterations missing from the ``iter`` sequence are reported as ``iteration_stats_lost``.
- ``LLM.llm_build_stats.build_steps_info``: ``(step, seconds)`` of the engine build;
  ``LLM.args.kv_cache_config.tokens_per_block``; ``LLM.shutdown()``.

Rules the adapter applies (each only where the knobs leave it open):

- CUDA graphs follow the batch size: with ``max_batch_size`` set and no ``cuda_graph_config``,
  the PyTorch backend gets ``cuda_graph_config = {max_batch_size: <max_batch_size>,
  enable_padding: true}``, so graphs are captured up to the largest batch (TensorRT-LLM's own
  default stops at 128) and a batch between two captured sizes is padded up to the next one.
  ``cuda_graph_config: null`` turns graphs off; an explicit config is passed through.
- The TensorRT backend builds its engine for the workload: ``max_input_len`` = the longest
  prompt and ``max_seq_len`` = the longest prompt plus its output, from the requests the
  worker holds (``model["workload_max_prompt_tokens"]`` / ``["workload_max_seq_tokens"]``), since
  TensorRT-LLM's build default (1,024) rejects longer prompts.
- Without chunked prefill, a prompt longer than ``max_num_tokens`` (8,192 by default) cannot be
  scheduled (``BaseLLM._check_arguments`` raises ``RequestError`` per request on the PyTorch
  backend; on the TensorRT backend it checks prompt + ``max_tokens`` against ``max_seq_len``):
  ``validate`` refuses such a config before the engine starts.

Every name above is recorded in ``engines/snapshots/tensorrt_llm-1.2.1.json``; the knob check
and the adapter tests' stand-in ``LLM`` read it.
"""

from __future__ import annotations

import importlib
import json
import time
from datetime import timedelta
from typing import Any

from engines.base import Completion, Engine, EngineStats, KnobError, Request, StartInfo
from engines.common import RequestCounters, check_names, load_images, require_cuda, require_module, shutdown
from engines.decoding import choice_regex, decoding_of
from engines.feeding import AsyncFeeder
from engines.knobs import NativeMapping
from engines.snapshots import load as load_snapshot
from engines.snapshots import model_architectures
from engines.unit import EngineUnit, Environment, dummy_weights_args

LABEL = "TensorRT-LLM"
BACKENDS = {"pytorch": "tensorrt_llm:LLM", "tensorrt": "tensorrt_llm._tensorrt_engine:LLM"}
NESTED = {"kv_cache_config": "KvCacheConfig", "scheduler_config": "SchedulerConfig",
          "cuda_graph_config": "CudaGraphConfig"}
DEFAULT_MAX_NUM_TOKENS = 8192   # BaseLlmArgs.max_num_tokens
DEFAULT_GRAMMAR_BACKEND = "xgrammar"   # for a constrained workload when the knobs name none
GRAMMAR_BACKENDS = ("xgrammar", "llguidance")   # BaseLlmArgs.guided_decoding_backend
DRAIN_EVERY_S = 1.0             # get_stats() holds max_stats_len (1,000) iterations; drain well before


class TrtllmEngine(Engine):
    """Drives ``LLM.generate_async`` per request and reads per-request perf metrics and iteration stats."""

    name = "trtllm"
    supports_sampling = True
    supports_constraints = True

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
        self._check_token_budget()
        load_snapshot("trtllm").check_architectures(model_architectures(self.model), LABEL,
                                                    str(self.model.get("name") or self.model.get("path")))

    def _check_token_budget(self) -> None:
        """Without chunked prefill, every prompt must fit in one step's token budget."""
        longest = self.model.get("workload_max_prompt_tokens")
        if longest is None or self.knobs.get("enable_chunked_prefill"):
            return
        budget = int(self.knobs.get("max_num_tokens") or DEFAULT_MAX_NUM_TOKENS)
        if budget < int(longest):
            raise KnobError(f"TensorRT-LLM max_num_tokens={budget} (max_tokens_per_step) is below the longest "
                            f"prompt ({longest} tokens) with chunked prefill off: raise max_num_tokens to at "
                            f"least {longest} or set enable_chunked_prefill (chunked_prefill) true")

    def _engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model["path"], "return_perf_metrics": True}
        if self.backend == "pytorch":
            kwargs["enable_iter_perf_stats"] = True
        kwargs.update(dummy_weights_args(self.model))
        knobs = {k: v for k, v in self.knobs.items() if k != "backend"}
        if self.model.get("workload_constrained") and "guided_decoding_backend" not in knobs:
            kwargs["guided_decoding_backend"] = DEFAULT_GRAMMAR_BACKEND
        if self.backend == "pytorch" and "max_batch_size" in knobs and "cuda_graph_config" not in knobs:
            kwargs["cuda_graph_config"] = {"max_batch_size": int(knobs["max_batch_size"]), "enable_padding": True}
        if self.backend == "tensorrt":
            build = knobs.get("build_config") or {}
            for name, key in (("max_input_len", "workload_max_prompt_tokens"),
                              ("max_seq_len", "workload_max_seq_tokens")):
                if self.model.get(key) is not None and name not in knobs and name not in build:
                    kwargs[name] = int(self.model[key])
        return {**kwargs, **knobs}

    def start(self) -> StartInfo:
        import tensorrt_llm

        module_name, class_name = BACKENDS[self.backend].split(":")
        llm_class = getattr(importlib.import_module(module_name), class_name)
        self.counters = RequestCounters()
        self.iterations = IterationTally()
        self.salt: str | None = None
        t0 = time.perf_counter()
        self.llm = llm_class(**self._engine_kwargs())
        startup_s = time.perf_counter() - t0
        self.started = True
        self.tokens_per_block = int(self.llm.args.kv_cache_config.tokens_per_block)
        build = getattr(self.llm, "llm_build_stats", None)
        steps = [(str(name), float(seconds)) for name, seconds in (getattr(build, "build_steps_info", None) or [])]
        extra: dict[str, Any] = {"backend": self.backend, "tokens_per_block": self.tokens_per_block,
                                 "grammar_backend": self._engine_kwargs().get("guided_decoding_backend"),
                                 "build_steps": steps, "build_cache_hit": getattr(build, "cache_hitted", None)}
        return StartInfo(startup_s=startup_s, compile_s=sum(s for _, s in steps) or None,
                         engine_version=tensorrt_llm.__version__, extra=extra)

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        self.require_started()
        clock_at_submit, submitted_at = _steady_now(), time.perf_counter()
        salt = {"cache_salt": self.salt} if self.salt else {}
        futures = [self.llm.generate_async(prompt(r), sampling_params=sampling_params(r), **salt) for r in requests]
        completions, drained_at = [], submitted_at
        for request, future in zip(requests, futures):
            completion = to_completion(request, future.result(), self.tokens_per_block, submitted_at, clock_at_submit)
            self.counters.add(completion.prompt_tokens, completion.cached_tokens)
            completions.append(completion)
            if time.perf_counter() - drained_at > DRAIN_EVERY_S:   # before the bounded stats queue drops any
                self.iterations.add(self.llm.get_stats(timeout=0.01))
                drained_at = time.perf_counter()
            if on_finish is not None:
                on_finish(1)
        return completions

    def feeder(self) -> AsyncFeeder:
        """Shards fed while earlier ones generate: per request ``generate_async`` then ``await result.aresult()``.

        ``generate_async`` is called inside the feeder's running event loop, so each result gets
        the asyncio queue ``aresult`` waits on (``executor/result.py``).
        """
        self.require_started()
        drained_at = [time.perf_counter()]

        async def one(request: Request) -> Completion:
            salt = {"cache_salt": self.salt} if self.salt else {}
            future = self.llm.generate_async(prompt(request), sampling_params=sampling_params(request), **salt)
            completion = to_completion(request, await future.aresult(), self.tokens_per_block)
            self.counters.add(completion.prompt_tokens, completion.cached_tokens)
            if time.perf_counter() - drained_at[0] > DRAIN_EVERY_S:   # before the bounded stats queue drops any
                self.iterations.add(self.llm.get_stats(timeout=0.01))
                drained_at[0] = time.perf_counter()
            return completion

        return AsyncFeeder(one)

    def stats(self) -> EngineStats:
        """Prefix reuse summed from per-request metrics; preemptions and ``kv_reused_blocks`` from iteration stats."""
        self.require_started()
        self.iterations.add(self.llm.get_stats(timeout=0.5))
        stats = self.counters.stats()
        stats.preemptions = self.iterations.paused
        stats.extra.update(self.iterations.extra())
        return stats

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
    """``SamplingParams`` keywords, with per-request perf metrics: a benchmark request is greedy (``top_k=1``)
    and exactly ``max_tokens`` long; ``guided_decoding`` holds ``GuidedDecodingParams``' keywords."""
    d = decoding_of(request)
    kwargs: dict[str, Any] = {"max_tokens": d.max_tokens, "ignore_eos": d.ignore_eos,
                              "detokenize": bool(d.stop), "return_perf_metrics": True}
    if d.temperature == 0:
        kwargs["top_k"] = 1
    else:
        kwargs["temperature"] = d.temperature
    kwargs.update(d.extras())
    if d.constraint_kind == "json":
        kwargs["guided_decoding"] = {"json": d.constraint_value}
    elif d.constraint_kind == "json_object":
        kwargs["guided_decoding"] = {"json_object": True}
    elif d.constraint_kind in ("regex", "choice"):
        pattern = d.constraint_value if d.constraint_kind == "regex" else choice_regex(d.constraint_value)
        kwargs["guided_decoding"] = {"regex": pattern}
    return kwargs


def sampling_params(request: Request) -> Any:
    """The ``tensorrt_llm.SamplingParams`` of one request (``sampling_kwargs``)."""
    from tensorrt_llm import SamplingParams
    from tensorrt_llm.llmapi import GuidedDecodingParams

    kwargs = sampling_kwargs(request)
    if "guided_decoding" in kwargs:
        kwargs["guided_decoding"] = GuidedDecodingParams(**kwargs["guided_decoding"])
    return SamplingParams(**kwargs)


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
                      cached_tokens=cached, finished_at=finished_at, finish_reason=sequence.finish_reason,
                      text=sequence.text or None)


class IterationTally:
    """What troughput keeps from ``LLM.get_stats()`` batches (dicts or JSON strings), fed as they are drained.

    ``paused`` sums ``inflightBatchingStats.numPausedRequests`` (one per preemption; ``None``
    until an iteration reports it); ``reused_blocks`` is the last cumulative
    ``kvCacheStats.reusedBlocks``; ``lost`` counts iterations missing between the first and
    last ``iter`` seen (dropped by the bounded stats queue), which would undercount ``paused``.
    """

    def __init__(self) -> None:
        self.paused: int | None = None
        self.reused_blocks: float | None = None
        self.seen: set[int] = set()

    def add(self, iteration_stats: list[Any] | None) -> None:
        for entry in iteration_stats or []:
            entry = json.loads(entry) if isinstance(entry, str) else entry
            if entry.get("iter") is not None:
                self.seen.add(int(entry["iter"]))
            paused = (entry.get("inflightBatchingStats") or {}).get("numPausedRequests")
            if paused is not None:
                self.paused = (self.paused or 0) + int(paused)
            reused = (entry.get("kvCacheStats") or {}).get("reusedBlocks")
            if reused is not None:
                self.reused_blocks = float(reused)

    @property
    def lost(self) -> int:
        return (max(self.seen) - min(self.seen) + 1 - len(self.seen)) if self.seen else 0

    def extra(self) -> dict[str, float]:
        out = {"iterations": float(len(self.seen)), "iteration_stats_lost": float(self.lost)}
        if self.reused_blocks is not None:
            out["kv_reused_blocks"] = self.reused_blocks
        return out


def native_fields(backend: str) -> tuple[dict[str, frozenset[str]], str]:
    """Argument names by section ("" top level, then each of ``NESTED``) for ``backend``."""
    try:
        fields = _installed_fields(backend)
    except ImportError:
        snapshot = load_snapshot("trtllm")
        fields = {"": snapshot.fields(_ARGS_CLASS[backend]) | {"backend"},
                  **{section: snapshot.fields(cls) for section, cls in NESTED.items()}}
        return fields, f"{_ARGS_CLASS[backend]} fields in {snapshot.label}"
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
            **{section: frozenset(getattr(llm_args, cls).model_fields) for section, cls in NESTED.items()}}


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
        "grammar_backend": NativeMapping(("guided_decoding_backend",), choices=GRAMMAR_BACKENDS),
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
