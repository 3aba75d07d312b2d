"""``engine=sim``: a predicted run of a vLLM-style engine, in seconds, with no GPU and no torch.

The scheduler (``engines/sim_scheduler.py``) replays vLLM V1's continuous
batching; each step's time comes from the step model (``engines.stepmodel``,
``calibration.step_model``) fitted from a real engine's step traces on this host
(``harness.steps``), or, uncalibrated, from the roofline model (``engines.perfmodel``)
with a-priori efficiencies (``calibration.efficiency`` may set them). Rows are marked
``predicted``; their ``wall_s`` is the simulated clock. Startup is not predicted
(``startup_s`` = 0). Each simulated step goes into the step trace, like a real engine's.

Knobs are vLLM's native names (the defaults are vLLM 0.32's for the ``LLM``
class on that hardware) plus ``hardware_spec`` (the hardware config's ``spec:``)
and ``calibration``. Standard library only (the performance model is ``engines.perfmodel``).

Public interface, besides the ``Engine`` lifecycle: ``SIM_KNOBS`` (the native names it
takes) and ``SimEngine.schedule`` (a simulated batch's steps, which ``Schedule.seconds``
prices with any step model without simulating again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from engines.base import Completion, Engine, EngineStats, KnobError, Request, StartInfo
from engines.knobs import NativeMapping
from engines.unit import EngineUnit, Environment
from engines.vllm import UNIT as VLLM_UNIT
from engines.sim_scheduler import Scheduler, SchedulerConfig
from engines.perfmodel import Efficiency, HardwareSpec, ModelSpec, Precision, StepCost, kv_budget_bytes
from engines.stepmodel import EXTRAPOLATED, StepModel, StepShape
from engines.steptrace import StepRecorder

VERSION = "sim-1 (vLLM 0.32 V1 scheduler model)"
GiB = 1 << 30
MODELLED = {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
            "block_size", "kv_cache_memory_bytes", "gpu_memory_utilization", "max_model_len", "kv_cache_dtype",
            "quantization", "tensor_parallel_size", "scheduling_policy"}
ACCEPTED_NO_EFFECT = {"enforce_eager"}  # changes real speed only: the step model fitted to such runs has it
SIM_KNOBS = frozenset(MODELLED | ACCEPTED_NO_EFFECT)  # vLLM names the simulator takes (besides its own two)
OWN = {"hardware_spec", "calibration"}
# conf/calibration/vllm/<hardware>-<model>.yaml, or a refit from this host's traces (harness.run.stepmodels)
CALIBRATION_KEYS = {"step_model", "efficiency"}
INT_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_memory_bytes", "max_model_len",
             "tensor_parallel_size")


def batch_defaults(hardware: Mapping[str, Any], devices: int = 1) -> tuple[int, int]:
    """vLLM 0.32's ``LLM``-class defaults ``(max_num_seqs, max_num_batched_tokens)`` for a device."""
    if hardware.get("kind") == "cpu":
        return 256 * devices, 4096 * devices
    memory, name = float(hardware.get("memory_bytes") or 0), str(hardware.get("name", "")).lower()
    if memory >= 70 * GiB and "a100" not in name:
        return 1024, 16384
    return 256, 8192


class SimSetup:
    """Knobs resolved against the model and hardware: scheduler config, step cost, efficiency."""

    def __init__(self, model: ModelSpec, knobs: Mapping[str, Any], model_cfg: Mapping[str, Any] | None = None):
        unknown = sorted(set(knobs) - SIM_KNOBS - OWN)
        if unknown:
            raise KnobError(f"unknown sim knob(s) {unknown}; the simulator takes vLLM's names "
                            f"{', '.join(sorted(SIM_KNOBS))} plus hardware_spec and calibration")
        spec = knobs.get("hardware_spec")
        if not isinstance(spec, Mapping) or not spec:
            raise KnobError("engine=sim needs knob hardware_spec: the hardware config's spec block "
                            "(conf/engine/sim.yaml passes ${hardware.spec}; add a spec: to your hardware config)")
        for name in INT_KNOBS:
            if knobs.get(name) is not None and (not isinstance(knobs[name], int) or knobs[name] <= 0):
                raise KnobError(f"sim knob {name}={knobs[name]!r} must be an integer > 0")
        if knobs.get("scheduling_policy", "fcfs") != "fcfs":
            raise KnobError("the simulator models scheduling_policy=fcfs only")
        calibration = knobs.get("calibration") or {}
        try:
            if not isinstance(calibration, Mapping) or set(calibration) - CALIBRATION_KEYS:
                raise ValueError(f"expected a mapping with {sorted(CALIBRATION_KEYS)}, got {calibration!r} "
                                 "(an older calibration file? refit it with troughput-calibrate)")
            self.efficiency = Efficiency.from_dict(calibration.get("efficiency"))
            fitted = calibration.get("step_model")
            self.step_model = StepModel.from_dict(fitted) if fitted else None
        except (ValueError, TypeError, AttributeError) as e:
            raise KnobError(f"sim knob calibration: {e}") from e
        self.model, self.knobs, self.spec = model, dict(knobs), dict(spec)
        self.model_cfg = dict(model_cfg or {})
        try:
            self.hardware = HardwareSpec.from_config(spec)
        except ValueError as e:
            raise KnobError(f"sim knob hardware_spec: {e}") from e
        self.precision = Precision.from_knobs(model, knobs, "sim")
        self.cost = StepCost(model, self.hardware, self.precision)
        default_seqs, default_tokens = batch_defaults(spec, self.precision.devices)
        self.chunked = bool(knobs.get("enable_chunked_prefill", True) is not False)
        self.max_model_len = int(knobs.get("max_model_len") or model.max_len)
        tokens = knobs.get("max_num_batched_tokens")
        if tokens is None and not self.chunked:
            tokens = max(self.max_model_len, default_tokens)
        self.max_seqs = int(knobs.get("max_num_seqs") or default_seqs)
        self.max_tokens_per_step = int(tokens or default_tokens)
        if self.max_tokens_per_step < self.max_seqs:
            raise KnobError(f"max_num_batched_tokens ({self.max_tokens_per_step}) must be >= max_num_seqs "
                            f"({self.max_seqs}), as vLLM requires")
        if not self.chunked and self.max_tokens_per_step < self.max_model_len:
            raise KnobError(f"max_num_batched_tokens ({self.max_tokens_per_step}) is smaller than max_model_len "
                            f"({self.max_model_len}) with chunked prefill off, which vLLM rejects")
        self.block_size = int(knobs.get("block_size") or (128 if spec.get("kind") == "cpu" else 16))
        self.prefix_caching = knobs.get("enable_prefix_caching", True) is not False

    def scheduler_config(self) -> SchedulerConfig:
        """Blocks from the KV budget; raises ``MemoryError`` where vLLM would fail to start for memory."""
        reserve = 0.0 if self.knobs.get("kv_cache_memory_bytes") else self.activation_reserve_bytes()
        budget = kv_budget_bytes(self.model, self.hardware, self.knobs, "sim") - reserve
        num_blocks = int(budget // (self.block_size * self.cost.kv_token_bytes)) if budget > 0 else 0
        if num_blocks * self.block_size < self.max_model_len:
            raise MemoryError(f"insufficient memory for the KV cache: {max(budget, 0) / GiB:.2f} GiB holds "
                              f"{num_blocks * self.block_size} tokens, fewer than max_model_len {self.max_model_len}")
        return SchedulerConfig(self.max_seqs, self.max_tokens_per_step, self.chunked, self.prefix_caching,
                               self.block_size, num_blocks, self.max_model_len)

    def prompt(self, request: Request, encoded: set[str]) -> tuple[list[int], int]:
        """The prompt as the engine schedules it, and its vision-encoder output tokens.

        Each image placeholder expands to the model's image run (``image_prompt_tokens``, e.g. 67 for
        the tiny Idefics3), whose tokens stand for the image's content (the same image hashes the same,
        as vLLM's prefix cache hashes images). The encoder computes ``image_encoder_tokens`` per image
        not in ``encoded`` (vLLM caches an image's encoder output by its content), which it joins.
        """
        if not request.images:
            return list(request.prompt_token_ids), 0
        run = int(self.model_cfg.get("image_prompt_tokens") or 1)
        placeholder = self.image_token_id()
        images = iter(request.images)
        prompt: list[int] = []
        for token in request.prompt_token_ids:   # each placeholder becomes its image's run, in place
            path = next(images, None) if token == placeholder else None
            prompt += [token] if path is None else [token] + [-(1 + abs(hash(path)) % (1 << 30))] * (run - 1)
        new = [path for path in dict.fromkeys(request.images) if path not in encoded]
        encoded.update(new)
        return prompt, int(self.model_cfg.get("image_encoder_tokens") or 0) * len(new)

    def image_token_id(self) -> int | None:
        """The image placeholder's token id, from the model's ``config.json`` (``image_token_id``)."""
        if not hasattr(self, "_image_token_id"):
            import json
            import os

            path = os.path.join(str(self.model_cfg.get("local_dir") or self.model_cfg.get("path") or ""), "config.json")
            try:
                with open(path) as f:
                    config = json.load(f)
            except (OSError, ValueError):
                config = {}
            self._image_token_id = config.get("image_token_id", config.get("image_token_index"))
        return self._image_token_id

    def activation_reserve_bytes(self) -> float:
        """Memory vLLM's profiling run keeps out of the KV cache: activations of a full step plus ~1 GiB."""
        m = self.model
        return self.max_tokens_per_step * (2 * m.intermediate + 4 * m.hidden) * 2 + self.max_seqs * m.vocab * 4 + GiB

    def warning(self) -> str | None:
        """A sentence for the row when no step model is applied (the roofline's a-priori guess)."""
        if self.step_model is not None:
            return None
        return ("uncalibrated: no step model fitted from this host's traces, so step times are the roofline's "
                "a-priori guess from the hardware spec; run the real engine here once (make run), then "
                "troughput-calibrate")

    def step_seconds(self, step: StepShape) -> float:
        if self.step_model is not None:
            return self.step_model.seconds(step)
        return self.cost.step_seconds(step.tokens, step.seqs, step.pairs, step.kv_tokens, self.efficiency)


@dataclass(frozen=True)
class Schedule:
    """A simulated batch: each step's ``StepShape`` and preemptions.

    An offline batch's schedule does not depend on time, so ``seconds`` prices it with any
    step model without simulating again.
    """

    steps: list[StepShape]
    preempted: list[int]

    @property
    def preemptions(self) -> int:
        return sum(self.preempted)

    def seconds(self, model: StepModel) -> float:
        return sum(model.seconds(step) for step in self.steps)


class SimEngine(Engine):
    """Simulates ``generate`` with a vLLM-style scheduler; reports the predicted clock."""

    name = "sim"
    records_steps = True
    schedules_like = "vllm-v1"

    def validate(self) -> None:
        """Knob names and values, and that the model's architecture is known; no simulation yet."""
        self.setup = SimSetup(_model_spec(self.model), self.knobs, self.model)

    def start(self) -> StartInfo:
        if not hasattr(self, "setup"):
            self.validate()
        config = self.setup.scheduler_config()
        self.scheduler = Scheduler(config)
        self.encoded: set[str] = set()  # images whose encoder output is cached
        self.steps = 0
        self.host_s = 0.0
        self.last_seconds: float | None = None
        self.beyond = dict.fromkeys(EXTRAPOLATED, 0)  # steps past the step model's traces, by what (stat.beyond.*)
        self.started = True
        return StartInfo(startup_s=0.0, engine_version=VERSION, extra={
            "block_size": config.block_size, "num_blocks": config.num_blocks,
            "kv_cache_tokens": config.num_blocks * config.block_size, "max_num_seqs": config.max_seqs,
            "max_num_batched_tokens": config.max_tokens_per_step, "chunked_prefill": config.chunked_prefill,
            "prefix_caching": config.prefix_caching, "calibrated": self.setup.step_model is not None,
            "startup_predicted": False,
            **({"step_model.host_id": self.setup.step_model.host_id, "step_model.source": self.setup.step_model.source,
                "step_model.at_bound": ",".join(self.setup.step_model.at_bound) or None}
               if self.setup.step_model else {f"efficiency.{k}": v for k, v in self.setup.efficiency.to_dict().items()}),
            "sim_warning": self.setup.warning()})

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        result = self._run(requests, on_finish=on_finish)
        # Token ids are placeholders; their count is what the scheduler generated for each request.
        return [Completion(id=r.id, prompt_tokens=len(r.prompt_token_ids), output_token_ids=[0] * s.generated,
                           cached_tokens=s.cached_tokens, finished_at=s.finished_at)
                for r, s in zip(requests, result.requests)]

    def schedule(self, requests: Sequence[Request]) -> Schedule:
        """Simulate ``requests`` like ``generate`` and return its steps (to price with any step model)."""
        result = self._run(requests, trace=True)
        return Schedule(result.trace, result.preempted)

    def _run(self, requests: Sequence[Request], trace: bool = False, on_finish=None):
        self.require_started()
        t0 = time.perf_counter()
        self.step_trace = StepRecorder(clock=lambda: 0.0)  # the simulated clock: every generate starts at 0

        def on_step(step: StepShape, seconds: float, preempted: int) -> None:
            for name in self.setup.step_model.beyond(step) if self.setup.step_model else ():
                self.beyond[name] += 1
            self.step_trace.record(running=step.seqs, decode=step.decode, prefill=step.prefill,
                                   prefill_seqs=step.seqs - step.decode, kv_tokens=step.kv_tokens,
                                   context=step.context, decode_context=step.decode_context,
                                   encoder_tokens=step.encoder_tokens, preempted=preempted, dt=seconds,
                                   end=(self.step_trace.last_end or 0.0) + seconds)

        prompts, encoder = zip(*(self.setup.prompt(r, self.encoded) for r in requests)) if requests else ((), ())
        result = self.scheduler.run(list(prompts), [r.max_tokens for r in requests], self.setup.step_seconds,
                                    trace=trace, on_finish=on_finish, encoder_tokens=list(encoder), on_step=on_step)
        self.host_s += time.perf_counter() - t0
        self.steps += result.steps
        self.last_seconds = result.seconds
        return result

    def simulated_seconds(self) -> float | None:
        return self.last_seconds

    def stats(self) -> EngineStats:
        self.require_started()
        c = self.scheduler.counters
        return EngineStats(preemptions=c.preemptions, prefix_cache_queries=c.prefix_cache_queries,
                           prefix_cache_hits=c.prefix_cache_hits,
                           extra={"sim_steps": float(self.steps), "sim_host_s": self.host_s,
                                  **{f"beyond.{k}": float(v) for k, v in self.beyond.items()}})

    def reset_caches(self) -> None:
        self.require_started()
        self.scheduler.pool.reset()
        self.encoded.clear()

    def stop(self) -> None:
        self.scheduler = None  # type: ignore[assignment]
        self.started = False


def _model_spec(model: Mapping[str, Any]) -> ModelSpec:
    try:
        return ModelSpec.load(model.get("local_dir") or model.get("path"), str(model.get("name", "")))
    except (OSError, KeyError, ValueError) as e:
        raise KnobError(f"the simulator needs the model's architecture: {e}") from e


# The simulator takes vLLM's native names: its canonical knobs are vLLM's, less what it does not model.
_FROM_VLLM = ("max_seqs", "max_tokens_per_step", "kv_memory_fraction", "prefix_caching", "chunked_prefill",
              "context_length", "kv_memory_bytes", "kv_block_size")

UNIT = EngineUnit(
    name="sim", label="simulator (vLLM-style)", adapter="engines.sim:SimEngine",
    knobs={
        **{name: VLLM_UNIT.knobs[name] for name in _FROM_VLLM},
        "tensor_parallel": NativeMapping(("tensor_parallel_size",),
                                         note="split devices; 2 all-reduces a layer over the spec's interconnect"),
        "kv_cache_dtype": NativeMapping(("kv_cache_dtype",), choices=("auto", "bfloat16", "float16", "fp8",
                                                                       "fp8_e4m3", "fp8_e5m2")),
        "schedule_policy": NativeMapping(("scheduling_policy",), choices=("fcfs",)),
    },
    # pure Python on troughput's own environment: nothing to build
    environments={"default": Environment("engines.sim", needs_gpu=False)},
    tune_spaces={"cpu": "sim_cpu", "gpu": "sim_h100"},
    # conf/engine/sim.yaml reads the model and hardware defaults into its own knobs (as vLLM would get them)
    takes_defaults=frozenset(),
    quantization="quantization",
)
