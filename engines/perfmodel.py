"""Speed of light: what a model could possibly do on a piece of hardware, and what one engine step costs.

A roofline model. A step that processes ``tokens`` new tokens for ``seqs``
sequences runs the linear layers (``2 · params · tokens`` FLOPs, the weights read
once) and attention (FLOPs per attended token pair, the KV cache read and
written); each takes the longer of FLOPs ÷ peak FLOP/s and bytes ÷ bandwidth,
each divided by an efficiency factor, and the step adds fixed overheads. Attention's
FLOPs run at the peak of the KV cache's precision (the FP8 peak only with an FP8 KV
cache), the linear layers' at the weights'. Under tensor parallelism each layer adds
two all-reduces of the step's activations over the device interconnect (ring all-reduce
time plus a per-call latency), after the layers, not overlapped with them. The speed
of light of a workload is the same bound for the whole job at 100% efficiency,
with linear layers and attention overlapping, and no overhead.

Worker side, standard library only (besides ``engines.knobs``): the simulator (``engines/sim.py``)
prices its steps with it, the runner computes each row's speed of light with it. It never measures
anything: a hardware spec comes in complete (a datasheet's, or this host's as measured once by
``harness.run.hostspec`` at the start of a run).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from engines.common import PROJECT_ROOT
from engines.knobs import canonical_view, lookup

log = logging.getLogger(__name__)
ARCHITECTURES_DIR = PROJECT_ROOT / "conf" / "architectures"
# float32 checkpoints are served in 16 bits (vLLM's dtype="auto" does the same).
DTYPE_BYTES = {"float32": 2, "float": 2, "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "auto": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1}
REQUIRED_RATES = ("peak_flops_bf16", "bandwidth_bytes_s")  # what a spec must give (measured where null)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
# Workload-summary totals that split across data-parallel replicas.
SUMMARY_TOTALS = ("requests", "input_tokens_requested", "output_tokens_requested", "ideal_prefix_hit_tokens")


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder's shape, read from its Hugging Face ``config.json`` (``text_config`` for VLMs).

    Parameters assume a Llama-style block: q/k/v/o projections and a gated MLP
    (three matrices); a VLM's vision tower is not counted.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2
    tied_embeddings: bool = False
    max_len: int = 4096

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "") -> ModelSpec:
        text = config.get("text_config") or config
        heads = int(text["num_attention_heads"])
        dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
        return cls(name=name or str(text.get("model_type", "")), layers=int(text["num_hidden_layers"]),
                   hidden=int(text["hidden_size"]), heads=heads,
                   kv_heads=int(text.get("num_key_value_heads") or heads),
                   head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
                   intermediate=int(text["intermediate_size"]), vocab=int(text["vocab_size"]),
                   dtype_bytes=DTYPE_BYTES.get(dtype, 2),
                   tied_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
                   max_len=int(text.get("max_position_embeddings") or 4096))

    @classmethod
    def load(cls, model_dir: str | os.PathLike | None, name: str = "") -> ModelSpec:
        """From ``<model_dir>/config.json``, else the shipped ``conf/architectures/<name>.json``."""
        candidates = [Path(model_dir) / "config.json"] if model_dir else []
        candidates.append(ARCHITECTURES_DIR / f"{name}.json")
        for path in candidates:
            if path.is_file():
                return cls.from_config(json.loads(path.read_text()), name)
        raise FileNotFoundError(f"no config.json for model {name!r} (looked in {', '.join(map(str, candidates))})")

    @property
    def layer_matmul_params(self) -> int:
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return attention + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * (self.layer_matmul_params + 2 * self.hidden) + embeddings + self.hidden

    @property
    def matmul_params(self) -> int:
        """Parameters each token multiplies through (the embedding lookup is free, the LM head is not)."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    def weight_bytes(self, bytes_per_param: float | None = None) -> float:
        return self.params * (bytes_per_param or self.dtype_bytes)

    def kv_bytes_per_token(self, bytes_per_element: float | None = None) -> float:
        """K and V of every layer: 2 · layers · kv_heads · head_dim · bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * (bytes_per_element or self.dtype_bytes)

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs for one (query token, context token) pair: QKᵀ and AV, 2 FLOPs per multiply-add."""
        return 4 * self.layers * self.heads * self.head_dim


@dataclass(frozen=True)
class HardwareSpec:
    """Peak dense FLOP/s (bf16/fp16 and fp8), memory bandwidth and size of one device."""

    name: str
    peak_flops_bf16: float
    bandwidth_bytes_s: float
    memory_bytes: float | None = None
    peak_flops_fp8: float | None = None
    source: str = "datasheet"
    cache_bytes: float | None = None              # a CPU's last-level cache (measured hosts)
    cache_bandwidth_bytes_s: float | None = None  # the copy rate within it
    # GPU-to-GPU link, per device and per direction (NVLink 4: "900 GB/s" is both directions, 450 each way)
    interconnect_bandwidth_bytes_s: float | None = None
    interconnect_latency_s: float | None = None   # one small all-reduce's time over it (a measured figure)

    def weight_bandwidth(self, weight_bytes: float) -> float:
        """The rate weights stream at: the cache's where they fit in it (a small model on a CPU), else memory's."""
        if self.cache_bytes and self.cache_bandwidth_bytes_s and weight_bytes <= self.cache_bytes:
            return max(self.cache_bandwidth_bytes_s, self.bandwidth_bytes_s)
        return self.bandwidth_bytes_s

    @classmethod
    def from_config(cls, spec: Mapping[str, Any]) -> HardwareSpec:
        """From a complete hardware ``spec:`` block (peak bf16 FLOP/s and bandwidth given).

        Raises:
            ValueError: a rate is missing (a ``cpu`` config leaves them null until
                ``harness.run.hostspec.complete_spec`` fills them from this host's measurement).
        """
        values = {f.name: spec.get(f.name) for f in fields(cls) if spec.get(f.name) is not None}
        missing = [name for name in REQUIRED_RATES if name not in values]
        if missing:
            raise ValueError(f"hardware spec {spec.get('name', '')!r} lacks {', '.join(missing)}: give them, or let "
                             "the runner measure this host at the start of a run (harness.run.hostspec)")
        values.setdefault("name", "host")
        return cls(**{k: (float(v) if k not in ("name", "source") else str(v)) for k, v in values.items()})

    def with_rates_of(self, other: HardwareSpec) -> HardwareSpec:
        """This device's memory with ``other``'s FLOP/s and bandwidth (a calibration's fitted host)."""
        return replace(self, peak_flops_bf16=other.peak_flops_bf16, peak_flops_fp8=other.peak_flops_fp8,
                       bandwidth_bytes_s=other.bandwidth_bytes_s, source=f"calibration host: {other.source}")

    def peak_flops(self, bytes_per_param: float) -> float:
        """fp8 peak for 1-byte weights where the device has one, else the bf16 peak."""
        return self.peak_flops_fp8 if bytes_per_param <= 1 and self.peak_flops_fp8 else self.peak_flops_bf16


def rate_mismatch(fitted: HardwareSpec, current: HardwareSpec) -> dict[str, float]:
    """``current ÷ fitted − 1`` for the rates a calibration depends on (peak FLOP/s, bandwidth)."""
    names = ["peak_flops_bf16", "bandwidth_bytes_s"]
    if fitted.peak_flops_fp8 and current.peak_flops_fp8:
        names.append("peak_flops_fp8")
    return {name: getattr(current, name) / getattr(fitted, name) - 1 for name in names}


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak reached and fixed costs per step; fitted by ``troughput-calibrate``.

    Uncalibrated defaults are a-priori guesses for a GPU engine: large bf16 GEMMs
    reach about two thirds of peak, weight streaming about 85% of bandwidth, an
    all-reduce's ring about 82% of the interconnect's line rate (NCCL's published figure).
    """

    compute: float = 0.65
    bandwidth: float = 0.85
    # NCCL's maintainers: NVLink 4's line rate is 450 GB/s a direction; with protocol overhead (~20%) NCCL's
    # ring reaches ~370 GB/s (nccl-tests issue #212; nccl issue #1455 measures 365-370 GB/s on 2-8 H100 SXM)
    interconnect: float = 0.82
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> Efficiency:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values or {}) - known)
        if unknown:
            raise ValueError(f"unknown efficiency factor(s) {unknown}; known: {', '.join(sorted(known))}")
        return cls(**{k: float(v) for k, v in (values or {}).items() if v is not None})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def weight_quantization_knob(engine: str) -> str:
    """Where ``engine`` takes its weight quantization (its unit's ``quantization``; no canonical knob exists)."""
    from engines import find_unit

    found = find_unit(engine)
    return (found.quantization if found else None) or "quantization"


@dataclass(frozen=True)
class Precision:
    """Bytes per weight and per KV element, and the devices one model instance spans, from engine knobs."""

    weight_bytes: float
    kv_bytes: float
    devices: int = 1
    tensor_parallel: int = 1  # the devices each layer is split over (its all-reduce group)

    @classmethod
    def from_knobs(cls, model: ModelSpec, knobs: Mapping[str, Any] | None = None, engine: str = "vllm") -> Precision:
        """Read through the canonical mapping (``engines.knobs.canonical_view``), so every engine's names count.

        KV dtype: canonical ``kv_cache_dtype`` (vLLM/SGLang ``kv_cache_dtype``, TensorRT-LLM
        ``kv_cache_config.dtype``). Devices: canonical ``tensor_parallel`` × ``pipeline_parallel``
        (vLLM ``tensor_parallel_size``, SGLang ``tp_size``/``pp_size``, ...). Weights: fp8 where the
        engine's quantization knob says so (``weight_quantization_knob``), else the checkpoint's dtype.
        """
        knobs = dict(knobs or {})
        view = canonical_view(engine, knobs)
        quant = str(lookup(knobs, weight_quantization_knob(engine)) or "").lower()
        kv_dtype = str(view.get("kv_cache_dtype") or "auto").lower()
        weight = 1 if quant.startswith("fp8") else model.dtype_bytes
        kv = 1 if kv_dtype.startswith("fp8") else DTYPE_BYTES.get(kv_dtype, model.dtype_bytes)
        tensor = _positive(view.get("tensor_parallel"))
        return cls(weight, kv, tensor * _positive(view.get("pipeline_parallel")), tensor)


def _positive(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


class StepCost:
    """Seconds of one engine step for a model on a device, at a precision."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, precision: Precision):
        self.model, self.hardware, self.precision = model, hardware, precision
        n = precision.devices
        self.peak = hardware.peak_flops(precision.weight_bytes) * n
        # attention multiplies Q, K and V: FP8 only where the KV cache is (vLLM documents FP8 attention with an
        # FP8 KV cache on FlashAttention 3: the queries are quantized too); else the 16-bit peak
        self.attention_peak = hardware.peak_flops(precision.kv_bytes) * n
        self.bandwidth = hardware.bandwidth_bytes_s * n
        self.weight_bytes = model.weight_bytes(precision.weight_bytes)
        self.kv_token_bytes = model.kv_bytes_per_token(precision.kv_bytes)
        self.token_flops = 2.0 * model.matmul_params
        self.pair_flops = float(model.attention_flops_per_pair)
        p = precision.tensor_parallel
        # Megatron-style tensor parallelism: after attention's output projection and after the MLP's down
        # projection each device holds a partial sum of the hidden state of every token in the step, so each
        # layer all-reduces tokens × hidden activations (16-bit: the checkpoint's dtype, FP8 weights or not)
        # twice. A ring sends 2(p − 1)/p of the buffer per device. The embedding's and LM head's collectives
        # (one each per step, not per layer) are left out.
        self.allreduces = 2 * model.layers if p > 1 else 0
        self.allreduce_token_bytes = 2.0 * (p - 1) / p * model.hidden * model.dtype_bytes if p > 1 else 0.0
        self.interconnect = hardware.interconnect_bandwidth_bytes_s
        if p > 1 and not self.interconnect:
            log.warning("hardware %r gives no interconnect_bandwidth_bytes_s: tensor parallelism's all-reduces "
                        "(tensor_parallel %d) are not priced", hardware.name, p)

    def allreduce_seconds(self, tokens: Any, eff: Efficiency) -> Any:
        """Seconds of a step's tensor-parallel all-reduces: 2 per layer of ``tokens`` × hidden activations.

        Each is a ring all-reduce, 2(p − 1)/p × bytes ÷ (link bandwidth × ``eff.interconnect``), plus the
        interconnect's per-call latency. Zero on one device, and where the hardware gives no interconnect.
        Elementwise on numpy arrays too.
        """
        if not self.allreduces or not self.interconnect:
            return 0.0 * tokens
        per_call = (self.allreduce_token_bytes * tokens / (self.interconnect * eff.interconnect)
                    + (self.hardware.interconnect_latency_s or 0.0))
        return self.allreduces * per_call

    def step_seconds(self, tokens: Any, seqs: Any, attention_pairs: Any, kv_tokens: Any, eff: Efficiency) -> Any:
        """Seconds of a step: a roofline for the linear layers plus one for attention, plus tensor
        parallelism's all-reduces (``allreduce_seconds``), plus overheads.

        Works elementwise on numpy arrays of steps too (for calibration), without importing numpy.

        Args:
            tokens: new tokens processed (prefill chunks and one per decoding sequence).
            seqs: sequences in the step.
            attention_pairs: (query, context) token pairs attended over.
            kv_tokens: context tokens whose KV is read, plus the new tokens written.
        """
        compute, bandwidth = self.peak * eff.compute, self.bandwidth * eff.bandwidth
        linear = _maximum(self.token_flops * tokens / compute, self.weight_bytes / bandwidth)
        attention = _maximum(self.pair_flops * attention_pairs / (self.attention_peak * eff.compute),
                             self.kv_token_bytes * kv_tokens / bandwidth)
        return (linear + attention + self.allreduce_seconds(tokens, eff) + eff.step_overhead_s
                + eff.seq_overhead_s * seqs)


def _maximum(a: Any, b: Any) -> Any:
    """``max(a, b)``, elementwise for arrays too."""
    return (a + b + abs(a - b)) / 2


@dataclass(frozen=True)
class SpeedOfLight:
    """The bound for a workload: output tok/s, and which resource binds."""

    tok_s: float
    seconds: float
    bound: str
    compute_s: float
    memory_s: float
    max_seqs: int


def kv_budget_bytes(model: ModelSpec, hardware: HardwareSpec, knobs: Mapping[str, Any] | None = None,
                    engine: str = "vllm") -> float:
    """KV-cache bytes as vLLM sizes them: ``kv_cache_memory_bytes``, else utilization × memory − weights."""
    knobs = knobs or {}
    precision = Precision.from_knobs(model, knobs, engine)
    if knobs.get("kv_cache_memory_bytes"):
        return float(knobs["kv_cache_memory_bytes"])
    if not hardware.memory_bytes:
        raise ValueError(f"hardware {hardware.name!r} has no memory_bytes and no kv_cache_memory_bytes is set")
    utilization = float(knobs.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    return hardware.memory_bytes * utilization * precision.devices - model.weight_bytes(precision.weight_bytes)


def max_resident_seqs(model: ModelSpec, kv_bytes: float, seq_tokens: float, kv_element_bytes: float | None = None) -> int:
    """How many sequences of ``seq_tokens`` tokens the KV cache holds at once (at least 0)."""
    return max(0, int(kv_bytes // (model.kv_bytes_per_token(kv_element_bytes) * max(seq_tokens, 1.0))))


def speed_of_light(model: ModelSpec, hardware: HardwareSpec, summary: Mapping[str, Any],
                   knobs: Mapping[str, Any] | None = None, engine: str = "vllm") -> SpeedOfLight:
    """The fastest a workload could run: total FLOPs ÷ peak vs. total bytes ÷ bandwidth, whichever binds.

    Prefill is compute-bound and decode bandwidth-bound; both share one bound because a
    continuous-batching engine overlaps them. FLOPs: the layers on every token not served from the
    prefix cache, the LM head only on generated ones (engines compute logits at sampling positions only:
    counting it on prompt tokens made a large-vocabulary model's bound too low). Bytes: the weights once
    per decode step
    (steps ≥ output tokens ÷ the most sequences the KV cache holds, and ≥ the output
    length), plus every KV read and write. Prefix-cache hits (``ideal_prefix_hit_tokens``)
    cost no prefill FLOPs. Attention FLOPs at the KV cache precision's peak, as in ``StepCost``;
    tensor parallelism's all-reduces are not in the bound (an engine could overlap them).

    Args:
        summary: a workload summary (``requests``, ``input_tokens_requested``,
            ``output_tokens_requested``, optional ``ideal_prefix_hit_tokens``).
        knobs: engine knobs that change precision or the KV budget (``engine``'s native names;
            the KV budget reads vLLM's ``kv_cache_memory_bytes``/``gpu_memory_utilization``).
        engine: whose names ``knobs`` are in.
    """
    precision = Precision.from_knobs(model, knobs, engine)
    cost = StepCost(model, hardware, precision)
    n = float(summary["requests"])
    inputs, outputs = float(summary["input_tokens_requested"]), float(summary["output_tokens_requested"])
    hits = float(summary.get("ideal_prefix_hit_tokens") or 0)
    isl, osl = inputs / n, outputs / n
    seqs = min(int(n), max_resident_seqs(model, kv_budget_bytes(model, hardware, knobs, engine), isl + osl,
                                                 precision.kv_bytes))
    if seqs < 1:
        raise ValueError(f"the KV cache cannot hold one sequence of {isl + osl:.0f} tokens")
    steps = max(outputs / seqs, osl)
    pairs = n * (isl + osl) ** 2 / 2
    kv_tokens = n * (osl * isl + osl * osl / 2) + inputs + outputs
    # the LM head runs once per generated token (logits at sampling positions only), the layers on every token
    head_flops = 2.0 * model.vocab * model.hidden
    compute_s = (((cost.token_flops - head_flops) * (inputs - hits + outputs) + head_flops * outputs) / cost.peak
                 + cost.pair_flops * pairs / cost.attention_peak)
    weights_s = steps * cost.weight_bytes / (hardware.weight_bandwidth(cost.weight_bytes / precision.devices)
                                             * precision.devices)
    memory_s = weights_s + cost.kv_token_bytes * kv_tokens / cost.bandwidth
    seconds = max(compute_s, memory_s)
    return SpeedOfLight(outputs / seconds, seconds, "compute" if compute_s >= memory_s else "bandwidth",
                        compute_s, memory_s, seqs)


def sol_columns(model_dir: str | None, model_name: str, hardware_spec: Mapping[str, Any] | None,
                summary: Mapping[str, Any], knobs: Mapping[str, Any], output_tok_s: float | None,
                engine: str = "vllm", replicas: int = 1) -> dict[str, Any]:
    """Row columns ``sol_tok_s``, ``sol_fraction``, ``sol_exceeded``, ``sol_bound`` and the ``hw.*`` spec used;
    None where unknown.

    Args:
        knobs: the run's native knobs, in ``engine``'s names (precision and parallelism are read
            through the canonical mapping).
        replicas: data-parallel engine instances, each with its own devices and an equal share of
            the workload: the bound is ``replicas`` × that of one share.
    """
    columns: dict[str, Any] = {"sol_tok_s": None, "sol_fraction": None, "sol_exceeded": None}
    if not hardware_spec:
        return columns
    replicas = max(int(replicas or 1), 1)
    share = {k: (float(v) / replicas if k in SUMMARY_TOTALS and v is not None else v) for k, v in summary.items()}
    try:
        hardware = HardwareSpec.from_config(hardware_spec)
        sol = speed_of_light(ModelSpec.load(model_dir, model_name), hardware, share, knobs, engine)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        log.warning("no speed of light for this row: %s", e)
        return columns
    tok_s = sol.tok_s * replicas
    columns.update({f"hw.{k}": v for k, v in asdict(hardware).items()})
    fraction = (output_tok_s / tok_s) if output_tok_s else None
    # above 1: the measured rate beat the bound, so the hardware spec undershoots what the engine reaches;
    # reports show the flag, not the fraction
    columns.update(sol_tok_s=tok_s, sol_bound=sol.bound, sol_fraction=fraction,
                   sol_exceeded=None if fraction is None else fraction > 1)
    return columns


__all__ = ["Efficiency", "HardwareSpec", "ModelSpec", "Precision", "SpeedOfLight", "StepCost", "kv_budget_bytes",
           "max_resident_seqs", "rate_mismatch", "sol_columns", "speed_of_light"]
