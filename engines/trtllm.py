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
  on a timer thread while the pass runs (``StatsDrainer``); iterations missing from the ``iter``
  sequence are reported as ``iteration_stats_lost`` and as a warning in ``engine_info.stat_warnings``.
  Each iteration is one step of the step trace (``engines.trtllm_stats.iteration_step``: ``iterLatencyMS``,
  ``inflightBatchingStats.numScheduledRequests``/``numGenRequests``/``numContextRequests``/``numCtxTokens``/
  ``numPausedRequests``, ``numQueuedRequests``, ``numActiveRequests``, ``kvCacheStats.usedNumBlocks`` ×
  ``tokensPerBlock``); they count no vision-encoder work, so ``encoder_tokens`` stays 0.
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
import time
from datetime import timedelta
from typing import Any

from engines.base import Completion, Engine, EngineStats, KnobError, Request, StartInfo
from engines.common import (RequestCounters, check_names, load_images, model_eos_ids, model_pad_id, preflight, shutdown,
                            token_ids_only)
from engines.decoding import choice_regex, decoding_of
from engines.feeding import AsyncFeeder
from engines.knobs import NativeMapping
from engines.snapshots import load as load_snapshot
from engines.snapshots import model_architectures
from engines.statread import ANY, StatReader
from engines.trtllm_stats import IterationTally, StatsDrainer
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
    label = LABEL
    supports_sampling = True
    supports_constraints = True
    preload_modules = ("tensorrt_llm",)
    records_steps = True   # one step per iteration of its iteration stats (IterationTally)

    @property
    def backend(self) -> str:
        return str(self.knobs.get("backend") or "pytorch")

    def validate(self) -> None:
        """``troughput-env trtllm --check``'s checks (``preflight``), then knob names and the backend."""
        preflight("trtllm")
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

    def token_ids(self) -> tuple[int, int] | None:
        """``(end_id, pad_id)`` when the engine runs without a tokenizer: token-id prompts and an EOS id in the
        model's local config (``pad_token_id``, else the EOS id, pads); None: the tokenizer is loaded."""
        eos = model_eos_ids(self.model) if token_ids_only(self.model) else []
        if not eos or self.knobs.get("skip_tokenizer_init") is False:
            return None
        pad = model_pad_id(self.model)
        return eos[0], eos[0] if pad is None else pad

    def _engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model["path"], "return_perf_metrics": True}
        if self.token_ids() is not None:   # no tokenizer to load, so none can break the run
            kwargs["skip_tokenizer_init"] = True
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
        self.iterations = IterationTally(self.stat_reader, self.step_trace)
        self.salt: str | None = None
        self.ids = self.token_ids()
        t0 = time.perf_counter()
        self.llm = llm_class(**self._engine_kwargs())
        startup_s = time.perf_counter() - t0
        self.started = True
        reader = self.stat_reader   # a stat of another shape is a null column and a warning, never a failed start
        block = reader.read(self.llm, "args", "kv_cache_config", "tokens_per_block", where="LLM")
        self.tokens_per_block = None if block is None else int(block)   # None: cached tokens unknown
        build = reader.read(self.llm, "llm_build_stats", kind=ANY, where="LLM", required=False)
        steps_info = reader.read(build, "build_steps_info", kind=ANY, where="llm_build_stats", required=False)
        steps = []
        for step, value in _pairs(steps_info, reader):
            seconds = reader.number(value, f"llm_build_stats.build_steps_info[{step!r}]")
            if seconds is not None:
                steps.append((str(step), float(seconds)))
        extra: dict[str, Any] = {"backend": self.backend, "tokens_per_block": self.tokens_per_block,
                                 "grammar_backend": self._engine_kwargs().get("guided_decoding_backend"),
                                 "build_steps": steps, "build_cache_hit": reader.read(
                                     build, "cache_hitted", kind=ANY, where="llm_build_stats", required=False)}
        return StartInfo(startup_s=startup_s, compile_s=sum(s for _, s in steps) or None,
                         engine_version=tensorrt_llm.__version__, extra=extra)

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        self.require_started()
        clock_at_submit, submitted_at = _steady_now(), time.perf_counter()
        salt = {"cache_salt": self.salt} if self.salt else {}
        # iteration stats drained on a timer while the pass runs, before the bounded stats queue drops any
        with StatsDrainer(self.llm, self.iterations, DRAIN_EVERY_S):
            futures = [self.llm.generate_async(prompt(r), sampling_params=sampling_params(r, self.ids), **salt)
                       for r in requests]
            completions = []
            for request, future in zip(requests, futures):
                completion = to_completion(request, future.result(), self.tokens_per_block, submitted_at,
                                           clock_at_submit, self.stat_reader)
                self.counters.add(completion.prompt_tokens, completion.cached_tokens)
                completions.append(completion)
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
            future = self.llm.generate_async(prompt(request), sampling_params=sampling_params(request, self.ids), **salt)
            completion = to_completion(request, await future.aresult(), self.tokens_per_block,
                                       reader=self.stat_reader)
            self.counters.add(completion.prompt_tokens, completion.cached_tokens)
            if time.perf_counter() - drained_at[0] > DRAIN_EVERY_S:   # before the bounded stats queue drops any
                self.iterations.add(self.llm.get_stats(timeout=0.01))
                drained_at[0] = time.perf_counter()
            return completion

        return AsyncFeeder(one)

    def stats(self) -> EngineStats:
        """Prefix reuse summed from per-request metrics; preemptions and ``kv_reused_blocks`` from iteration stats."""
        self.require_started()
        self.iterations.drain(self.llm, timeout=0.5)
        if self.iterations.lost:
            self.stat_reader.warn(f"{self.iterations.lost} iteration stats were lost past get_stats()'s bounded "
                                  "queue (max_stats_len) before they were drained: preemptions may be undercounted")
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


def sampling_kwargs(request: Request, ids: tuple[int, int] | None = None) -> dict[str, Any]:
    """``SamplingParams`` keywords, with per-request perf metrics: a benchmark request is greedy (``top_k=1``)
    and exactly ``max_tokens`` long; ``guided_decoding`` holds ``GuidedDecodingParams``' keywords.
    ``ids``: ``(end_id, pad_id)`` when the LLM runs without a tokenizer (it refuses a request without
    ``end_id`` then: "tokenizer is required to reset end_id")."""
    d = decoding_of(request)
    kwargs: dict[str, Any] = {"max_tokens": d.max_tokens, "ignore_eos": d.ignore_eos,
                              "detokenize": bool(d.stop), "return_perf_metrics": True}
    if ids is not None:
        kwargs["end_id"], kwargs["pad_id"] = ids
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


def sampling_params(request: Request, ids: tuple[int, int] | None = None) -> Any:
    """The ``tensorrt_llm.SamplingParams`` of one request (``sampling_kwargs``)."""
    from tensorrt_llm import SamplingParams
    from tensorrt_llm.llmapi import GuidedDecodingParams

    kwargs = sampling_kwargs(request, ids)
    if "guided_decoding" in kwargs:
        kwargs["guided_decoding"] = GuidedDecodingParams(**kwargs["guided_decoding"])
    return SamplingParams(**kwargs)


def to_completion(request: Request, output: Any, tokens_per_block: int | None, submitted_at: float | None = None,
                  clock_at_submit: Any = None, reader: StatReader | None = None) -> Completion:
    """One ``RequestOutput`` as a ``Completion``.

    Cached tokens are reused KV blocks times the block size, capped at the prompt
    length (as trtllm-serve reports them). ``finished_at`` maps the request's last
    token time from the engine's steady clock onto ``perf_counter``.
    """
    reader = reader or StatReader(LABEL)
    sequence = output.outputs[0]
    prompt_tokens = len(output.prompt_token_ids)
    metrics = reader.read(sequence, "request_perf_metrics", kind=ANY, where="CompletionOutput")
    cached = finished_at = None
    if metrics is not None:
        reused = reader.read(metrics, "kv_cache_metrics", "num_reused_blocks", where="request_perf_metrics")
        cached = None if reused is None or tokens_per_block is None else min(prompt_tokens,
                                                                             int(reused) * tokens_per_block)
        last = reader.read(metrics, "timing_metrics", "last_token_time", kind=ANY, where="request_perf_metrics")
        if last is not None and submitted_at is not None and clock_at_submit is not None:
            try:
                finished_at = submitted_at + _seconds(last) - _seconds(clock_at_submit)
            except (TypeError, ValueError):
                reader.warn(f"request_perf_metrics.timing_metrics.last_token_time is {type(last).__name__}, "
                            "not a time; finish times left empty")
    return Completion(id=request.id, prompt_tokens=prompt_tokens, output_token_ids=[int(t) for t in sequence.token_ids],
                      cached_tokens=cached, finished_at=finished_at, finish_reason=sequence.finish_reason,
                      text=sequence.text or None)


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


def _pairs(value: Any, reader: StatReader) -> list[tuple[Any, Any]]:
    """``build_steps_info`` as ``(step, seconds)`` pairs; of another shape: none, with a warning."""
    if value is None:
        return []
    try:
        pairs = [tuple(item) for item in value]
    except TypeError:
        pairs = None
    if pairs is None or any(len(p) != 2 for p in pairs):
        reader.warn(f"llm_build_stats.build_steps_info is not (step, seconds) pairs ({value!r:.60}); "
                    "build steps left empty")
        return []
    return pairs


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
        "context_length": NativeMapping(("max_seq_len",)),
        "kv_block_size": NativeMapping(("kv_cache_config.tokens_per_block",)),
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
    # the model and hardware configs' defaults are vLLM's sizes: TensorRT-LLM sizes max_seq_len from the
    # workload itself (see the module docstring)
    takes_defaults=frozenset(),
    quantization="quant_config.quant_algo", snapshot="tensorrt_llm-1.2.1.json", acceptance=True,
    reserved=frozenset({"model"}),   # set by the adapter from the model config
)
