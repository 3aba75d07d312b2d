"""Predictions from a fitted step model: requests replayed through the simulator's scheduler.

- ``replay``: the seconds, tokens and preemptions of a list of requests on one engine with
  given knobs (vLLM's names), ramp-up, mixing of prefill and decode, preemptions and drain included;
- ``full_engine_rate``: the steady output rate with the engine kept full, prefill and decode
  mixed as the requests mix them: the marginal rate between replaying the requests cycled to
  ``n`` and to ``2n`` (ramp-up and drain cancel);
- ``prediction_columns``: a prediction beside what was then measured, as row columns
  (``harness.run.stepmodels.predict_run`` fills ``prediction.sim.*`` for every vLLM run).

Every prediction carries an interval (the step model's ``interval``) and says where it
extrapolates past what the traces showed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from engines.base import Request
from engines.stepmodel import StepModel

CYCLE_MIN_FILLS = 6   # full_engine_rate replays at least this many engine fills
CYCLE_SHIFT = 1 << 24  # token ids of each further pass over cycled requests (the simulator only hashes them)


@dataclass
class Replay:
    seconds: float
    output_tokens: int
    preemptions: int
    steps: int
    beyond: list[str]   # what of the replayed steps lay past the traces (engines.stepmodel.EXTRAPOLATED)
    max_seqs: int

    @property
    def rate(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


def sim_engine(model: StepModel | None, knobs: dict[str, Any], model_cfg: dict[str, Any],
               hardware_spec: dict[str, Any]) -> Any:
    """A started simulator for an engine's knobs (those the simulator models), priced by ``model``.

    ``knobs`` may also give what the real engine reported at its start, which wins over what the
    simulator would derive: ``engine_max_num_seqs``, ``engine_max_num_batched_tokens``,
    ``engine_kv_cache_tokens``, ``engine_block_size``.
    """
    from engines.sim import SIM_KNOBS, SimEngine   # here: the driver imports no engine module until it predicts

    sim_knobs = {k: v for k, v in knobs.items() if k in SIM_KNOBS and v is not None}
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if knobs.get(f"engine_{name}"):
            sim_knobs[name] = int(knobs[f"engine_{name}"])
    if model is not None:   # priced by the step model: the roofline's rates are not read, so unmeasured ones do
        hardware_spec = {**hardware_spec, "peak_flops_bf16": hardware_spec.get("peak_flops_bf16") or 1.0,
                         "bandwidth_bytes_s": hardware_spec.get("bandwidth_bytes_s") or 1.0}
    sim_knobs["hardware_spec"] = hardware_spec
    sim_knobs["calibration"] = {"step_model": model.to_dict()} if model is not None else None
    sim = SimEngine(model_cfg, sim_knobs)
    if knobs.get("engine_kv_cache_tokens"):  # the real engine's KV cache (its blocks, the null one included, as
        sim.validate()                        # vLLM counts them), in the simulator's bytes per token
        sim_knobs["kv_cache_memory_bytes"] = int(int(knobs["engine_kv_cache_tokens"]) * sim.setup.cost.kv_token_bytes)
        sim = SimEngine(model_cfg, sim_knobs)
    sim.start()
    return sim


def replay(model: StepModel | None, requests: Sequence[Request], knobs: dict[str, Any], model_cfg: dict[str, Any],
           hardware_spec: dict[str, Any]) -> Replay:
    """Run ``requests`` through the simulator with ``model``'s step times."""
    sim = sim_engine(model, knobs, model_cfg, hardware_spec)
    completions = sim.generate(list(requests))
    stats = sim.stats()
    return Replay(sim.simulated_seconds() or 0.0, sum(len(c.output_token_ids) for c in completions),
                  stats.preemptions or 0, sim.steps, sorted(k for k, n in sim.beyond.items() if n), sim.setup.max_seqs)


def full_engine_rate(model: StepModel | None, requests: Sequence[Request], knobs: dict[str, Any],
                     model_cfg: dict[str, Any], hardware_spec: dict[str, Any]) -> tuple[float, Replay]:
    """Output tok/s with the engine kept full: (tokens(2n) − tokens(n)) ÷ (seconds(2n) − seconds(n))."""
    probe = sim_engine(model, knobs, model_cfg, hardware_spec)
    n = max(len(requests), CYCLE_MIN_FILLS * probe.setup.max_seqs)
    keep = probe.setup.image_token_id()
    first = replay(model, cycled(requests, n, keep=keep), knobs, model_cfg, hardware_spec)
    second = replay(model, cycled(requests, 2 * n, keep=keep), knobs, model_cfg, hardware_spec)
    span = second.seconds - first.seconds
    rate = (second.output_tokens - first.output_tokens) / span if span > 0 else second.rate
    return rate, second


def cycled(requests: Sequence[Request], n: int, prefix: str = "c", keep: int | None = None) -> list[Request]:
    """``n`` requests, cycling through ``requests``. Each pass over them is a new set of prompts (token ids
    shifted per pass, but the image placeholder ``keep``, and images renamed), so that a prompt never hits the
    prefix cache, nor an image the encoder cache, on its own earlier copy; prompts that share a prefix within
    one pass still share it, as a new group would in the rest of a job."""
    size = len(requests)

    def shifted(r: Request, k: int) -> Request:
        return replace(r, prompt_token_ids=[t if t == keep else t + k * CYCLE_SHIFT for t in r.prompt_token_ids],
                       images=[f"{path}#{k}" for path in r.images])

    return [replace(shifted(requests[i % size], i // size) if i >= size else requests[i], id=f"{prefix}{i}")
            for i in range(n)]


def prediction_columns(name: str, predicted: float | None, measured: float | None, unit: str,
                       interval: float | None = None, note: str | None = None) -> dict[str, Any]:
    """``prediction.<name>.*``: what was predicted before, what was then measured, the error and interval.

    ``error`` is measured ÷ predicted − 1; ``lo``/``hi`` the predicted value's interval.
    """
    p = f"prediction.{name}."
    error = measured / predicted - 1 if predicted and measured is not None else None
    return {p + "predicted": predicted, p + "measured": measured, p + "unit": unit, p + "error": error,
            p + "lo": max(0.0, predicted * (1 - interval)) if predicted and interval else None,
            p + "hi": predicted * (1 + interval) if predicted and interval else None, p + "note": note}

