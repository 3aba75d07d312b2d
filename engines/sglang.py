"""SGLang adapter: offline ``sglang.Engine``, token-id prompts, counters from each request's ``meta_info``.

Written against SGLang 0.5.23 (PyPI wheel, read here; not run: SGLang needs an
NVIDIA GPU, and its CPU path a CPU build of ``sgl_kernel`` that PyPI lacks):

- ``sglang.Engine(**kwargs)`` builds ``ServerArgs(**kwargs)`` (``srt/entrypoints/engine.py``);
  ``ServerArgs`` is a ``msgspec.Struct`` (``srt/server_args.py``); ``skip_tokenizer_init``
  lets ``generate`` take ``input_ids`` and return ``output_ids``.
- ``Engine.generate(prompt=None, sampling_params=None, input_ids=None, image_data=None, ...)``
  takes a batch (lists, one entry per request; ``image_data`` as a list of lists of
  file names) and returns one dict per request with ``output_ids`` and ``meta_info``.
- ``meta_info`` (``srt/managers/tokenizer_manager.py``): ``prompt_tokens``,
  ``completion_tokens``, ``cached_tokens``, ``num_retractions``, ``e2e_latency``,
  ``finish_reason`` (``{"type": "abort", "message": ...}`` when aborted).
- Sampling keys (``srt/sampling/sampling_params.py``): ``max_new_tokens``,
  ``ignore_eos``, ``temperature`` (0 means greedy), ``top_p``, ``sampling_seed``, ``stop``, and the
  structured-output keys ``json_schema`` (a JSON string) and ``regex`` (a choice list becomes a
  regex; ``json_object`` the schema ``{"type": "object"}``). Grammars and stop strings need the
  tokenizer, so ``skip_tokenizer_init`` is off for such a workload and ``text`` comes back too.
- ``await Engine.async_generate(...)`` takes the same keywords for one request (single
  ``input_ids`` list, one sampling dict) and returns its dict; the batch worker's feeder runs one
  such task per request so that shards overlap (``engines.feeding.AsyncFeeder``).
- ``Engine.get_server_info()`` (``srt/entrypoints/engine.py``): the resolved ``ServerArgs`` plus
  the first scheduler's info; its keys are recorded in the snapshot (``keys.server_info``).
  ``["startup_time"]`` holds ``load_weight``, ``kv_cache_allocation`` and per-phase ``cuda_graph``
  capture seconds (``srt/observability/startup_time.py``; value kinds in ``types.startup_time``).
  Every statistic is read through ``engines.statread.StatReader``: one of another shape is a null
  column and a warning in ``engine_info.stat_warnings``. ``Engine.shutdown()`` stops its subprocesses.
- ``Engine.flush_cache()`` drops the radix cache only when the scheduler is idle and returns a
  ``FlushCacheReqOutput`` (``success``, ``message``; ``srt/managers/io_struct.py``). Right after
  a batch the scheduler may not be idle yet, so ``reset_caches`` retries for up to
  ``FLUSH_TIMEOUT_S``; if the cache never flushes, the next ``generate`` raises instead of timing
  a pass on a warm cache (the row fails with that reason).
- Steps: ``start`` turns on SGLang's per-iteration Forward Pass Metrics (``enable_forward_pass_metrics``,
  published over ZMQ at ``forward_pass_metrics_ipc_name`` in a folder of its own) and subscribes to them
  (``engines.sglang_steps``); each iteration is one step of the step trace, recorded at the end of each
  ``generate``, in ``stats`` and as the feeder's requests finish.

Every name above is recorded in ``engines/snapshots/sglang-0.5.23.json`` (``record.py`` reads
the wheel); the knob check, the model check and the adapter tests' stand-in engine read it.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
import time
from typing import Any

from engines.base import Completion, Engine, EngineStats, Request, StartInfo
from engines.common import RequestCounters, check_names, preflight, shutdown, token_ids_only
from engines.decoding import choice_regex, decoding_of
from engines.feeding import AsyncFeeder
from engines.knobs import UNSET, NativeMapping, inverted, prefixed
from engines.snapshots import load as load_snapshot
from engines.statread import MAPPING, TEXT, StatReader
from engines.snapshots import model_architectures
from engines.sglang_steps import FPM_MODULE, FpmListener, endpoints, fpm_kwargs
from engines.unit import EngineUnit, Environment, dummy_weights_args

LABEL = "SGLang"
FLUSH_TIMEOUT_S = 5.0    # how long reset_caches retries flush_cache before giving up
FLUSH_FIRST_SLEEP_S = 0.05
STEPS_QUIET_S = 0.05     # stats() waits for the last passes' step messages until none came for this long


class CacheNotFlushed(RuntimeError):
    """The radix cache could not be flushed: a pass now would be timed on a warm cache."""


class SglangEngine(Engine):
    """Drives ``sglang.Engine.generate``; each request's sampling dict from ``sampling_params``."""

    name = "sglang"
    label = LABEL
    supports_sampling = True
    supports_constraints = True
    preload_modules = ("sglang.srt.entrypoints.engine",)   # `sglang.Engine` is a lazy import of it
    records_steps = True   # from its Forward Pass Metrics (engines.sglang_steps); off if the knobs turn them off

    def validate(self) -> None:
        """``troughput-env sglang --check``'s checks (``preflight``), then knob names and the architecture."""
        # no free-memory check: SGLang's mem_fraction_static is a share of the memory free before the model loads
        # (sglang 0.5.23 distributed/bootstrap.py, mem_cache/kv_cache_configurator.py), so a GPU partly held by
        # others gives it a smaller KV pool, not a failure
        preflight("sglang", self.knobs)
        self.check_knobs()

    def check_knobs(self) -> None:
        """Knob names against ``ServerArgs``, and that SGLang implements the model's architecture."""
        UNIT.check_reserved(self.knobs)
        fields, source = server_args_fields()
        check_names(self.knobs, fields, LABEL, source)
        load_snapshot("sglang").check_architectures(model_architectures(self.model), LABEL,
                                                    str(self.model.get("name") or self.model.get("path")))

    def _engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model_path": self.model["path"],
            # Token ids in and out; a VLM keeps its tokenizer, which its image processor needs, and so
            # does a workload with grammars or stop strings.
            "skip_tokenizer_init": token_ids_only(self.model),
            **dummy_weights_args(self.model),
        }
        return {**kwargs, **self.knobs}

    def start(self) -> StartInfo:
        import sglang

        self.counters = RequestCounters(preemptions=0)
        self.unflushed: str | None = None
        self.fpm_dir = tempfile.mkdtemp(prefix="troughput-fpm-")
        kwargs = {**self._engine_kwargs(), **fpm_kwargs(self.knobs, self.fpm_dir)}
        t0 = time.perf_counter()
        self.llm = sglang.Engine(**kwargs)
        startup_s = time.perf_counter() - t0
        self.started = True
        self.fpm = self._listen(kwargs)
        compile_s, extra = _startup_breakdown(self.llm, self.stat_reader)
        return StartInfo(startup_s=startup_s, compile_s=compile_s, engine_version=sglang.__version__, extra=extra)

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        self.require_started()
        if self.unflushed:
            raise CacheNotFlushed(self.unflushed)
        images = [list(r.images) for r in requests] if any(r.images for r in requests) else None
        submitted_at = time.perf_counter()
        outputs = self.llm.generate(input_ids=[r.prompt_token_ids for r in requests],
                                    sampling_params=[sampling_params(r) for r in requests], image_data=images)
        if isinstance(outputs, dict):
            outputs = [outputs]
        completions = [to_completion(r, o, submitted_at, self.stat_reader) for r, o in zip(requests, outputs)]
        for completion, output in zip(completions, outputs):
            self._count(completion, output)
        self._drain_steps()
        if on_finish is not None:
            on_finish(len(completions))
        return completions

    def feeder(self) -> AsyncFeeder:
        """Shards fed while earlier ones generate: one ``await llm.async_generate(...)`` task per request.

        All tasks run on the feeder's own event loop (SGLang binds its tokenizer manager's loop
        to the first loop that uses it; the sync ``generate`` must not be mixed in after this).
        """
        self.require_started()
        if self.unflushed:
            raise CacheNotFlushed(self.unflushed)

        async def one(request: Request) -> Completion:
            output = await self.llm.async_generate(input_ids=request.prompt_token_ids,
                                                   sampling_params=sampling_params(request),
                                                   image_data=list(request.images) or None)
            completion = to_completion(request, output, reader=self.stat_reader)
            self._count(completion, output)
            self._drain_steps()
            return completion

        return AsyncFeeder(one)

    def _count(self, completion: Completion, output: dict[str, Any]) -> None:
        """One finished request's tokens and retractions in the run's counters (read defensively)."""
        retractions = self.stat_reader.read(output, "meta_info", "num_retractions", where="generate()")
        self.counters.add(completion.prompt_tokens, completion.cached_tokens,
                          None if retractions is None else int(retractions))
        self.counters.preemptions_unknown |= retractions is None

    def _listen(self, kwargs: dict[str, Any]) -> FpmListener | None:
        """Subscribe to the schedulers' Forward Pass Metrics, unless the knobs turned them off."""
        addresses = endpoints(kwargs)
        if not addresses:
            self.records_steps = False
            self.step_trace_gap = "SGLang: enable_forward_pass_metrics is off in the knobs, so no step is published"
            return None
        try:
            decode = importlib.import_module(FPM_MODULE).decode
            return FpmListener(addresses, self.step_trace, self.stat_reader, decode)
        except (ImportError, AttributeError) as e:   # another SGLang, or no pyzmq: the run goes on without steps
            reason = f"its forward pass metrics cannot be read here ({e}), so no step is read"
            self.records_steps, self.step_trace_gap = False, f"{LABEL}: {reason}"
            self.stat_reader.warn(reason)
            return None

    def _drain_steps(self, quiet_s: float = 0.0) -> None:
        if self.fpm is not None:
            self.fpm.drain(quiet_s)

    def stats(self) -> EngineStats:
        self.require_started()
        self._drain_steps(quiet_s=STEPS_QUIET_S)
        stats = self.counters.stats()
        if self.fpm is not None:
            stats.extra["forward_pass_metrics_lost"] = float(self.fpm.lost)
            if self.fpm.lost:
                self.stat_reader.warn(f"{self.fpm.lost} forward pass metrics messages were lost (ZMQ dropped them "
                                      "past its high-water mark): the step trace misses those steps")
        return stats

    def reset_caches(self) -> None:
        """Flush the radix cache, retrying while the scheduler is busy; remember a failure for ``generate``."""
        self.require_started()
        self.unflushed = flush_radix_cache(self.llm, FLUSH_TIMEOUT_S)

    def stop(self) -> None:
        if getattr(self, "fpm", None) is not None:
            self.fpm.close()
            self.fpm = None
        shutdown(self)
        if getattr(self, "fpm_dir", None):
            shutil.rmtree(self.fpm_dir, ignore_errors=True)


def flush_radix_cache(llm: Any, timeout_s: float, sleep=time.sleep, clock=time.monotonic) -> str | None:
    """Call ``llm.flush_cache()`` until it reports ``success``, sleeping 50 ms, 100 ms, ... up to ``timeout_s``.

    Returns ``None`` once flushed, else why not (the last result's ``message``).
    """
    deadline, pause, attempts = clock() + timeout_s, FLUSH_FIRST_SLEEP_S, 0
    while True:
        result = llm.flush_cache()
        attempts += 1
        if result.success:
            return None
        if clock() + pause > deadline:
            return (f"SGLang did not flush its radix cache ({attempts} flush_cache() calls over {timeout_s:g} s, "
                    f"last message: {result.message!r}); a pass now would reuse the previous pass's cached "
                    "prefixes, so it is not timed")
        sleep(pause)
        pause = min(pause * 2, 1.0)


def sampling_params(request: Request) -> dict[str, Any]:
    """One request's sampling dict: a benchmark request is greedy and exactly ``max_tokens`` long."""
    d = decoding_of(request)
    params: dict[str, Any] = {"max_new_tokens": d.max_tokens, "ignore_eos": d.ignore_eos, "temperature": d.temperature}
    params.update(d.extras(seed_key="sampling_seed"))
    if d.constraint_kind in ("json", "json_object"):
        schema = d.constraint_value if d.constraint_kind == "json" else {"type": "object"}
        params["json_schema"] = json.dumps(schema)
    elif d.constraint_kind == "regex":
        params["regex"] = d.constraint_value
    elif d.constraint_kind == "choice":
        params["regex"] = choice_regex(d.constraint_value)
    return params


def to_completion(request: Request, output: dict[str, Any], submitted_at: float | None = None,
                  reader: StatReader | None = None) -> Completion:
    """One ``Engine.generate`` result as a ``Completion``; an aborted request raises ``RuntimeError``.

    ``finished_at`` is ``submitted_at + meta_info["e2e_latency"]``: the whole batch
    is submitted at once, so that is when the request finished on our clock. The statistics
    (cached tokens, latency) are read through ``reader``: of another shape, they are null with a warning.
    """
    reader = reader or StatReader(LABEL)
    meta = output["meta_info"]
    reason = meta.get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise RuntimeError(f"SGLang aborted request {request.id}: {reason.get('message', '')}")
    latency = reader.read(meta, "e2e_latency", where="meta_info", required=False)
    cached = reader.read(meta, "cached_tokens", where="meta_info")
    prompt_tokens = reader.read(meta, "prompt_tokens", where="meta_info")
    return Completion(
        id=request.id,
        prompt_tokens=len(request.prompt_token_ids) if prompt_tokens is None else int(prompt_tokens),
        output_token_ids=[int(t) for t in output["output_ids"]],
        cached_tokens=None if cached is None else int(cached),
        finished_at=None if latency is None or submitted_at is None else submitted_at + float(latency),
        finish_reason=reason.get("type") if isinstance(reason, dict) else None,
        text=output.get("text"),
    )


def server_args_fields() -> tuple[frozenset[str], str]:
    """``ServerArgs`` field names: the installed class's, else the recorded snapshot's."""
    try:
        import msgspec
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        snapshot = load_snapshot("sglang")
        return snapshot.fields("ServerArgs"), f"fields of ServerArgs in {snapshot.label}"
    import sglang

    names = frozenset(f.name for f in msgspec.structs.fields(ServerArgs))
    return names, f"fields of ServerArgs in the installed sglang {sglang.__version__}"


def _startup_breakdown(llm: Any, reader: StatReader) -> tuple[float | None, dict[str, Any]]:
    """CUDA-graph capture seconds (the compile column), the other startup phases and the grammar backend.

    ``get_server_info()`` holds the server args with the rest, so ``grammar_backend`` is the resolved one.
    Every value goes through ``reader``: one of another shape is a null column and a warning.
    """
    try:
        info = llm.get_server_info()
    except Exception as e:  # noqa: BLE001 - informational only; the run goes on without it
        reader.warn(f"get_server_info() raised {type(e).__name__}: {e}; startup breakdown left empty")
        return None, {}
    where = "get_server_info()"
    startup = reader.read(info, "startup_time", kind=MAPPING, where=where)
    graphs = reader.read(startup, "cuda_graph", kind=MAPPING, where=f"{where}['startup_time']") if startup else None
    seconds = [reader.number(v, f"{where}['startup_time']['cuda_graph'][{k!r}]") for k, v in (graphs or {}).items()]
    compile_s = sum(v for v in seconds if v is not None) or None
    extra: dict[str, Any] = {}
    for phase in ("load_weight", "kv_cache_allocation"):
        value = reader.read(startup, phase, where=f"{where}['startup_time']") if startup else None
        if value is not None:
            extra[f"{phase}_s"] = float(value)
    backend = reader.read(info, "grammar_backend", kind=TEXT, where=where, required=False)
    if backend is not None:
        extra["grammar_backend"] = backend
    return compile_s, extra


def _token_budget() -> NativeMapping:
    def backward(flat: dict[str, Any]) -> Any:
        chunk = flat.get("chunked_prefill_size")
        if isinstance(chunk, int) and chunk > 0:
            return chunk
        return flat.get("max_prefill_tokens", UNSET)

    return NativeMapping(("chunked_prefill_size", "max_prefill_tokens"), note="both set", backward=backward)


def _chunked_prefill() -> NativeMapping:
    def backward(flat: dict[str, Any]) -> Any:
        chunk = flat.get("chunked_prefill_size")
        return UNSET if chunk is None else chunk != -1

    return NativeMapping(("chunked_prefill_size",), note="off = -1; on = SGLang's default size",
                         forward=lambda v: {} if v else {"chunked_prefill_size": -1}, backward=backward)


# Enum values checked before any engine starts: ServerArgs choices in 0.5.23.
KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
GRAMMAR_BACKENDS = ("xgrammar", "outlines", "llguidance", "none")   # srt/arg_groups/choices.py
POLICIES = ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key", "hrrn",
            "shortest-prefill-first")

UNIT = EngineUnit(
    name="sglang", label=LABEL, adapter="engines.sglang:SglangEngine",
    knobs={
        "max_seqs": NativeMapping(("max_running_requests",)),
        "max_tokens_per_step": _token_budget(),
        "kv_memory_fraction": NativeMapping(("mem_fraction_static",)),
        "prefix_caching": inverted("disable_radix_cache"),
        "chunked_prefill": _chunked_prefill(),
        "tensor_parallel": NativeMapping(("tp_size",)),
        "pipeline_parallel": NativeMapping(("pp_size",)),
        "kv_cache_dtype": NativeMapping(("kv_cache_dtype",), choices=KV_DTYPES),
        "speculative": prefixed("speculative_"),
        "schedule_policy": NativeMapping(("schedule_policy",), choices=POLICIES),
        "grammar_backend": NativeMapping(("grammar_backend",), choices=GRAMMAR_BACKENDS),
        "json_any_whitespace": inverted("constrained_json_disable_any_whitespace"),
        "context_length": NativeMapping(("context_length",)),
        "eager": NativeMapping(("disable_cuda_graph",)),
        "kv_block_size": NativeMapping(("page_size",)),
    },
    # sglang 0.5.23 requires Python >= 3.11 and brings the whole CUDA stack (torch 2.14.1,
    # sglang-kernel, flashinfer) as plain dependencies; its extras are optional features.
    # The 0.5.23 wheel (manylinux_2_34, Requires-Python >=3.11) pins torch 2.14.1, cuda-python>=13,
    # flashinfer_python[cu13] and sglang-kernel 0.4.10: a CUDA 13 stack.
    environments={"default": Environment("sglang", ("python3.12", "python3.11"), ("sglang==0.5.23",),
                                         cuda="13.0", glibc="2.34", python=">=3.11")},
    tune_spaces={"gpu": "sglang_h100"},
    # the model and hardware configs' defaults are vLLM's sizes (context, CPU KV budget): SGLang keeps its own
    takes_defaults=frozenset(),
    quantization="quantization", snapshot="sglang-0.5.23.json", acceptance=True,
    # set by the adapter from the model config; a user setting it would point the engine elsewhere
    reserved=frozenset({"model_path"}),
)
