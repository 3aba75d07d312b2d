"""The step model: seconds of one engine step from what it holds, in named parts fitted from step traces.

Like Vidur's execution-time predictor, a step's time is a sum of named parts, each
fitted from measurements (``harness.steps.fit``); unlike it, the measurements are whole
steps of the real engine (``engines.steptrace``), not operators:

- ``step``: fixed per step (scheduling, launching, streaming the weights once);
- ``sequences``: per sequence in the step (CPU-side: preparing inputs, sampling, processing outputs);
- ``linear``: the linear layers over the step's tokens (prefill + decode): a convex, increasing
  curve, ``token_s`` per token plus ``Σ slope·max(0, tokens − knee)`` (flat-then-rising on a GPU,
  growing with the batch on a CPU);
- ``prefill``: extra per prompt token computed (attention over the prompt);
- ``prefill_attention``: per (prompt token, context token) pair of the step's prefill chunks
  (``StepShape.prefill_pairs``: quadratic in the prompt's length);
- ``attention``: per context token the decoding sequences attend over (``StepShape.attended``);
- ``kv_cache``: per token of KV cache in use (a prefix shared by many sequences counts once: on a
  CPU its blocks stay in cache while every sequence reads them);
- ``vision``: per vision-encoder output token (images);
- ``preemption``: per request preempted in the step (the scheduler frees its blocks and the model
  runner drops its state; its recomputation later counts as prefill).

Every parameter is ≥ 0 (a fit that ends on a bound lists it in ``at_bound``). ``seen`` holds
the largest step the traces showed, so a prediction beyond it can say it extrapolates.
Standard library only (the simulator imports it on the worker side).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, NamedTuple

EXTRAPOLATED = ("tokens", "seqs", "context", "preemptions", "encoder_tokens")  # what ``beyond`` can name
PARTS = ("step", "sequences", "linear", "prefill", "prefill_attention", "attention", "kv_cache", "vision",
         "preemption")


class StepShape(NamedTuple):
    """What one step holds (the simulator's trace is a list of these)."""

    tokens: int               # prefill tokens + decode tokens
    seqs: int                 # sequences in the step
    pairs: float = 0.0        # (query, context) token pairs attended over (the roofline's attention FLOPs)
    kv_tokens: float = 0.0    # tokens of KV cache held (blocks in use × block size)
    prefill: int = 0          # prompt tokens computed
    decode: int = 0           # sequences generating a token
    encoder_tokens: int = 0   # vision-encoder output tokens computed
    context: float = -1.0     # the sequences' context tokens, summed (-1: unknown; then ``kv_tokens`` stands in)
    decode_context: float = -1.0  # the decoding sequences' part of ``context`` (-1: unknown)
    preempted: int = 0        # requests preempted in the step

    @property
    def attended(self) -> float:
        """What decode attention reads: the decoding sequences' context where known, else all the step's
        context, else the KV cache in use."""
        if self.decode_context >= 0:
            return self.decode_context
        return self.context if self.context >= 0 else max(self.kv_tokens, 0.0)

    @property
    def prefill_pairs(self) -> float:
        """Prefill attention's (query, context) pairs, about: prefill tokens × the prefilling sequences' mean
        context (0 where the split of context is unknown)."""
        if self.decode_context < 0 or self.context < 0 or self.prefill <= 0:
            return 0.0
        return self.prefill * max(self.context - self.decode_context, 0.0) / max(self.seqs - self.decode, 1)


@dataclass(frozen=True)
class StepModel:
    """Fitted seconds per step; see the module docstring for the parts."""

    step_s: float = 0.0
    seq_s: float = 0.0
    token_s: float = 0.0
    knees: tuple[tuple[float, float], ...] = ()   # (tokens, added seconds per token beyond)
    prefill_token_s: float = 0.0
    prefill_pair_s: float = 0.0   # per prefill attention pair
    kv_token_s: float = 0.0       # per context token attended
    kv_held_s: float = 0.0        # per token of KV cache in use
    encoder_token_s: float = 0.0
    preempt_s: float = 0.0        # per request preempted
    seen: dict[str, float] = field(default_factory=dict)   # largest of each of EXTRAPOLATED in the traces
    interval: float | None = None   # relative half-width of a run-total prediction (from the fit's residuals)
    at_bound: tuple[str, ...] = ()  # parameters the fit left on their bound, 0
    host_id: str | None = None      # the host whose traces it was fitted on
    hardware: str | None = None     # the hardware config of the runs it was fitted on (a simulated H100 is another)
    source: str = ""                # what it was fitted from (runs, engine, date)

    def parts(self, s: StepShape) -> dict[str, float]:
        """Seconds of each named part of step ``s``."""
        linear = self.token_s * s.tokens + sum(slope * max(0.0, s.tokens - knee) for knee, slope in self.knees)
        return {"step": self.step_s, "sequences": self.seq_s * s.seqs, "linear": linear,
                "prefill": self.prefill_token_s * s.prefill, "prefill_attention": self.prefill_pair_s * s.prefill_pairs,
                "attention": self.kv_token_s * s.attended,
                "kv_cache": self.kv_held_s * max(s.kv_tokens, 0.0),
                "vision": self.encoder_token_s * s.encoder_tokens, "preemption": self.preempt_s * s.preempted}

    def seconds(self, s: StepShape) -> float:
        return sum(self.parts(s).values())

    def beyond(self, s: StepShape) -> list[str]:
        """What of ``s`` lies past the traces (``seen``), one of ``EXTRAPOLATED``: the prediction extrapolates
        there (a step larger than any traced; a preemption or an image where the traces had none, so that its
        part was never fitted and prices it at 0)."""
        larger = [name for name, value in (("tokens", s.tokens), ("seqs", s.seqs), ("context", s.attended))
                  if self.seen.get(name) is not None and value > self.seen[name] * 1.001]
        unfitted = [name for name, value in (("preemptions", s.preempted), ("encoder_tokens", s.encoder_tokens))
                    if self.seen.get(name) == 0 and value > 0]
        return larger + unfitted

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["knees"] = [list(k) for k in self.knees]
        data["at_bound"] = list(self.at_bound)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepModel:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown step-model key(s) {unknown}; known: {', '.join(sorted(known))}")
        values = dict(data)
        values["knees"] = tuple((float(k), float(v)) for k, v in values.get("knees") or ())
        values["at_bound"] = tuple(values.get("at_bound") or ())
        values["seen"] = {k: float(v) for k, v in (values.get("seen") or {}).items()}
        for name in ("step_s", "seq_s", "token_s", "prefill_token_s", "prefill_pair_s", "kv_token_s", "kv_held_s",
                     "encoder_token_s", "preempt_s"):
            if float(values.get(name) or 0.0) < 0:
                raise ValueError(f"step-model {name} = {values[name]} is negative; every part is >= 0")
        if any(slope < 0 for _, slope in values["knees"]):
            raise ValueError("step-model knee slopes must be >= 0 (the linear part is convex and increasing)")
        return cls(**values)


__all__ = ["EXTRAPOLATED", "PARTS", "StepModel", "StepShape"]
