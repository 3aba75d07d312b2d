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
  ``ignore_eos``, ``temperature`` (0 means greedy).
- ``Engine.get_server_info()["startup_time"]`` holds ``load_weight``,
  ``kv_cache_allocation`` and per-phase ``cuda_graph`` capture seconds
  (``srt/observability/startup_time.py``); ``Engine.flush_cache()`` drops the radix cache;
  ``Engine.shutdown()`` stops its subprocesses.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from engines.base import Completion, Engine, EngineStats, KnobError, Request, StartInfo
from engines.common import (
    RequestCounters, check_names, load_field_list, require_cuda, require_module, shutdown,
)

LABEL = "SGLang"
# Set by the adapter from the model config; a user setting it would point the engine elsewhere.
RESERVED_KNOBS = {"model_path"}


class SglangEngine(Engine):
    """Drives ``sglang.Engine.generate`` with ``{max_new_tokens, ignore_eos: true, temperature: 0}``."""

    name = "sglang"

    def validate(self) -> None:
        """The package, then a GPU, then knob names against ``ServerArgs``; raise ``KnobError``."""
        require_module("sglang", LABEL, "sglang")
        require_cuda(LABEL)
        self.check_knobs()

    def check_knobs(self) -> None:
        reserved = sorted(RESERVED_KNOBS & set(self.knobs))
        if reserved:
            raise KnobError(f"SGLang knobs {reserved} are set by troughput itself; remove them")
        fields, source = server_args_fields()
        check_names(self.knobs, fields, LABEL, source)

    def _engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model_path": self.model["path"],
            # Token ids in and out; a VLM keeps its tokenizer, which its image processor needs.
            "skip_tokenizer_init": not self.model.get("image_token"),
        }
        if self.model.get("dummy_weights"):
            kwargs["load_format"] = "dummy"
        return {**kwargs, **self.knobs}

    def start(self) -> StartInfo:
        import sglang

        self.counters = RequestCounters(preemptions=0)
        t0 = time.perf_counter()
        self.llm = sglang.Engine(**self._engine_kwargs())
        startup_s = time.perf_counter() - t0
        self.started = True
        compile_s, extra = _startup_breakdown(self.llm)
        return StartInfo(startup_s=startup_s, compile_s=compile_s, engine_version=sglang.__version__, extra=extra)

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        self.require_started()
        images = [list(r.images) for r in requests] if any(r.images for r in requests) else None
        submitted_at = time.perf_counter()
        outputs = self.llm.generate(input_ids=[r.prompt_token_ids for r in requests],
                                    sampling_params=[sampling_params(r) for r in requests], image_data=images)
        if isinstance(outputs, dict):
            outputs = [outputs]
        completions = [to_completion(r, o, submitted_at) for r, o in zip(requests, outputs)]
        for completion, output in zip(completions, outputs):
            self.counters.add(completion.prompt_tokens, completion.cached_tokens,
                              int(output["meta_info"].get("num_retractions") or 0))
        if on_finish is not None:
            on_finish(len(completions))
        return completions

    def stats(self) -> EngineStats:
        self.require_started()
        return self.counters.stats()

    def reset_caches(self) -> None:
        self.require_started()
        self.llm.flush_cache()

    def stop(self) -> None:
        shutdown(self)


def sampling_params(request: Request) -> dict[str, Any]:
    """Greedy decoding of exactly ``max_tokens`` tokens."""
    return {"max_new_tokens": request.max_tokens, "ignore_eos": True, "temperature": 0.0}


def to_completion(request: Request, output: dict[str, Any], submitted_at: float | None = None) -> Completion:
    """One ``Engine.generate`` result as a ``Completion``; an aborted request raises ``RuntimeError``.

    ``finished_at`` is ``submitted_at + meta_info["e2e_latency"]``: the whole batch
    is submitted at once, so that is when the request finished on our clock.
    """
    meta = output["meta_info"]
    reason = meta.get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise RuntimeError(f"SGLang aborted request {request.id}: {reason.get('message', '')}")
    latency = meta.get("e2e_latency")
    cached = meta.get("cached_tokens")
    return Completion(
        id=request.id,
        prompt_tokens=int(meta["prompt_tokens"]),
        output_token_ids=[int(t) for t in output["output_ids"]],
        cached_tokens=None if cached is None else int(cached),
        finished_at=None if latency is None or submitted_at is None else submitted_at + float(latency),
    )


def server_args_fields() -> tuple[frozenset[str], str]:
    """``ServerArgs`` field names: the installed class's, else the recorded 0.5.23 list."""
    try:
        import msgspec
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        return load_field_list("sglang")[""], "fields of sglang 0.5.23 ServerArgs (engines/native_fields/sglang.txt)"
    import sglang

    names = frozenset(f.name for f in msgspec.structs.fields(ServerArgs))
    return names, f"fields of ServerArgs in the installed sglang {sglang.__version__}"


def _startup_breakdown(llm: Any) -> tuple[float | None, dict[str, Any]]:
    """CUDA-graph capture seconds (the compile column) and the other startup phases, where reported."""
    try:
        startup = llm.get_server_info().get("startup_time") or {}
    except Exception as e:  # noqa: BLE001 - informational only; the run goes on without it
        print(f"troughput: SGLang startup breakdown unavailable: {e}", file=sys.stderr)
        return None, {}
    graphs = startup.get("cuda_graph") or {}
    compile_s = sum(float(v) for v in graphs.values()) or None
    extra = {f"{phase}_s": float(startup[phase]) for phase in ("load_weight", "kv_cache_allocation")
             if startup.get(phase) is not None}
    return compile_s, extra
