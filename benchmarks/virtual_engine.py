"""The virtual engine: one GPU (an H100; ``HARDWARES`` the others) with Llama-3.1-8B, simulated step by step with
a TRUE step cost of its own.

The in-job tuner (``harness.batch.tune``) fits the simulator's step model (``engines.stepmodel``: a sum of
named parts, linear in each, with hinges on the step's tokens) to a run's step trace and replays requests
through the simulator's scheduler with it. The virtual engine that makes those traces prices its steps with
another form (``Truth``), at the roofline's a-priori efficiencies (``engines.perfmodel``), so the fit is
genuinely an approximation:

- the linear layers: a roofline with a smooth knee, ``(compute^p + weights^p)^(1/p)``, whose compute side runs
  at an efficiency that rises with the step's tokens (``M / (M + gemm_half)``: small GEMMs use the tensor cores
  poorly);
- attention: the same smooth max of its FLOPs and of the KV bytes it reads (every running sequence's context)
  and writes;
- kernel launches: a CUDA graph (``graph_launch_s``) up to ``graph_tokens`` tokens, eager launches past it (a
  step, not a hinge);
- the CPU side (scheduling, sampling, prefix-cache hashing where it is on, preemptions) overlapped with the
  GPU's: ``max(gpu, cpu) + (1 − overlap)·min(gpu, cpu)``;
- and noise: each run's steps share a log-normal factor (a slow node, clocks, thermals) and each step its own
  log-normal jitter of mean 1 (``simulate``).

The trace it reports is what vLLM's engine core reports from a child process (the way it runs on a GPU): the
step's sequences, decode and prefill work, KV cache in use and preemptions, but no context (``-1``), and each
step's seconds with the noise in them. Requests are lengths only (``Backlog``: numpy arrays of prompt and
output tokens), so a job of 10^6 requests is 8 MB; the scheduler (``engines.sim_scheduler``, the same one the
tuner's replay uses) gets each prompt as a ``range`` of its length (every prompt is unique, so prefix caching
never hits and the schedule is the same with it on or off; its hashing is priced in the true cost).

Large runs are aggregated (``Steady``): a config's first ``CAP`` requests of the job are simulated once, step
by step, and a run of more requests takes that run's seconds plus the rest of its output tokens at the steady
rate of its middle half (ramp-up and drain counted once, as in one long run). On ``backlog_long`` at the
engine defaults 10^4 requests are about 40 engine fills. That run is fed as the pool feeds an engine
(``simulate_fed``: shards handed over by ``pool.takes_another``'s rule, 8 shards of 50 at most), and its blocks
(the rate between consecutive shard commits) in the same middle half give the config's block spread: what an
aggregated run's commits past its simulated start draw from (``benchmarks.virtual_job``).
"""

from __future__ import annotations

import math
import random
import zlib
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from engines.perfmodel import HardwareSpec, ModelSpec
from engines.sim import SIM_KNOBS, SimSetup
from engines.sim_scheduler import Scheduler, SchedulerConfig
from engines.stepmodel import StepShape
from engines.steptrace import StepRecorder

ROOT = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-8b"
HARDWARE = "h100"
HARDWARES = ("h100", "a100_80gb", "l40s")   # conf/hardware/<name>.yaml: the GPUs the virtual engine can be
WORKLOAD = "backlog_long"
CAP = 10_000          # requests a run simulates step by step; a larger one is aggregated (``steady``)
STEADY = (0.25, 0.75)  # the steady rate: output tokens finished between these shares of a run's tokens


def hardware_spec(name: str = HARDWARE) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "hardware" / f"{name}.yaml"), resolve=True)["spec"]


@dataclass(frozen=True)
class Truth:
    """The virtual engine's true seconds per step (module docstring) for bf16 Llama-3.1-8B on one GPU.

    ``flops`` and ``bandwidth`` are the GPU's datasheet figures as its ``conf/hardware/<name>.yaml`` spec holds
    them (``peak_flops_bf16``: dense bf16 tensor-core FLOP/s; ``bandwidth_bytes_s``): H100 SXM 989.5 TFLOP/s and
    3.35 TB/s, A100 80GB SXM 312 TFLOP/s and 2.039 TB/s, L40S 362.05 TFLOP/s and 864 GB/s. Everything else (the
    efficiencies, the knee, the launches, the CPU side) is the same for every GPU: the form is this class's, not
    the step model the tuner fits, whatever the GPU."""

    flops: float                  # peak dense bf16 FLOP/s
    bandwidth: float              # bytes/s
    weight_bytes: float
    matmul_params: float
    kv_token_bytes: float
    attention_flops_per_pair: float
    # the roofline's a-priori efficiencies (``engines.perfmodel.Efficiency``: compute 0.65, bandwidth 0.85), in
    # another form: GEMMs reach ``gemm_efficiency`` only for large steps (0.65 at about 400 tokens)
    gemm_efficiency: float = 0.75
    gemm_half: float = 64.0       # tokens at which the GEMMs reach half their efficiency
    weight_efficiency: float = 0.85
    attention_bandwidth: float = 0.85
    attention_compute: float = 0.65
    knee_p: float = 4.0           # the smooth max's exponent (large: a sharp knee; 4: 19% over the max where equal)
    graph_tokens: int = 512       # steps up to this many tokens replay a CUDA graph
    graph_launch_s: float = 0.4e-3
    eager_launch_s: float = 1.6e-3
    cpu_step_s: float = 1.1e-3
    cpu_seq_s: float = 6e-6
    cpu_prefill_seq_s: float = 25e-6
    hash_token_s: float = 12e-9   # prefix caching's block hashing, per prompt token computed
    preempt_s: float = 0.3e-3
    overlap: float = 0.7          # share of the smaller of the CPU and GPU times hidden under the larger

    @classmethod
    def llama(cls, model: ModelSpec | None = None, spec: Mapping[str, Any] | None = None) -> Truth:
        """Llama-3.1-8B (``model``) on the GPU of ``spec`` (a ``conf/hardware`` spec block; default the H100's)."""
        model = model or ModelSpec.load(None, MODEL)
        hw = HardwareSpec.from_config(spec or hardware_spec())
        return cls(flops=hw.peak_flops_bf16, bandwidth=hw.bandwidth_bytes_s, weight_bytes=model.weight_bytes(),
                   matmul_params=model.matmul_params, kv_token_bytes=model.kv_bytes_per_token(),
                   attention_flops_per_pair=model.attention_flops_per_pair)

    def seconds(self, s: StepShape, caching: bool = True) -> float:
        p = self.knee_p
        tokens = s.tokens
        efficiency = self.gemm_efficiency * tokens / (tokens + self.gemm_half)
        gemm_c = 2.0 * self.matmul_params * tokens / (self.flops * efficiency)
        gemm_m = self.weight_bytes / (self.bandwidth * self.weight_efficiency)
        context = s.context if s.context >= 0 else s.kv_tokens
        attn_m = self.kv_token_bytes * (context + tokens) / (self.bandwidth * self.attention_bandwidth)
        attn_c = self.attention_flops_per_pair * s.pairs / (self.flops * self.attention_compute)
        gpu = ((gemm_c ** p + gemm_m ** p) ** (1 / p) + (attn_c ** p + attn_m ** p) ** (1 / p)
               + (self.graph_launch_s if tokens <= self.graph_tokens else self.eager_launch_s))
        cpu = (self.cpu_step_s + self.cpu_seq_s * s.seqs + self.cpu_prefill_seq_s * (s.seqs - s.decode)
               + (self.hash_token_s * s.prefill if caching else 0.0) + self.preempt_s * s.preempted)
        return max(gpu, cpu) + (1 - self.overlap) * min(gpu, cpu)


@dataclass
class Backlog:
    """A job's requests as lengths: prompt and output tokens per request, in the job's order."""

    prompt: np.ndarray
    output: np.ndarray

    @classmethod
    def draw(cls, count: int, workload: str = WORKLOAD, seed: int = 0, max_len: int = 8192) -> Backlog:
        """``conf/workload/<workload>.yaml``'s ``input_len`` and ``output_len``, ``count`` of each; a prompt is cut
        so that prompt + output fits ``max_len`` (backlog_long's tails could pass 8,192 together). The lengths of
        a job's first ``n`` requests do not depend on ``count``."""
        from omegaconf import OmegaConf

        from harness.workloads.distributions import sample_lengths

        spec = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "workload" / f"{workload}.yaml"), resolve=True)
        # a stream each, so that a job's first n requests are the n-request job's (the sizes share ``steady``)
        prompt = sample_lengths(spec["input_len"], count, np.random.default_rng([seed, 0]))
        output = sample_lengths(spec["output_len"], count, np.random.default_rng([seed, 1]))
        return cls(np.minimum(prompt, max_len - output).astype(np.int32), output.astype(np.int32))

    def __len__(self) -> int:
        return len(self.prompt)

    def indices(self, shards: Sequence[int], size: int) -> np.ndarray:
        """The requests of ``shards`` (shard ``i``: requests ``[i·size, (i+1)·size)``), in order."""
        parts = [np.arange(i * size, min((i + 1) * size, len(self))) for i in shards]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def of(self, shards: Sequence[int], size: int) -> tuple[np.ndarray, np.ndarray]:
        """The prompt and output lengths of ``shards``, in order."""
        index = self.indices(shards, size)
        return self.prompt[index], self.output[index]


def scheduler_config(knobs: Mapping[str, Any], model: ModelSpec,
                     spec: Mapping[str, Any]) -> tuple[SchedulerConfig, bool]:
    """The scheduler a vLLM started with ``knobs`` runs (``engines.sim.SimSetup``: vLLM 0.32's defaults, its KV budget),
    with prefix caching off (unique prompts never hit: the schedule is the same), and whether caching was on.
    Raises ``MemoryError`` or ``engines.base.KnobError`` where vLLM would refuse to start."""
    sim_knobs = {k: v for k, v in knobs.items() if k in SIM_KNOBS and v is not None}
    setup = SimSetup(model, {**sim_knobs, "hardware_spec": dict(spec)}, {"name": MODEL})
    config = setup.scheduler_config()
    return replace(config, prefix_caching=False), setup.prefix_caching


@dataclass
class Simulated:
    """One simulated run under one price: its seconds, steps, output tokens and each request's finish (seconds)."""

    seconds: float
    steps: int
    output_tokens: int
    finished: np.ndarray
    step_end: np.ndarray | None = None      # each step's end (seconds from the run's start)
    step_decode: np.ndarray | None = None   # decode tokens up to each step, cumulative
    step_full: np.ndarray | None = None     # each step: requests still waiting behind it (``SoFar.full_*``)


def limits(config: SchedulerConfig) -> dict[str, Any]:
    """What the engine says of itself at its start (as ``engines.sim``'s and vLLM's adapters do)."""
    return {"max_num_seqs": config.max_seqs, "kv_cache_tokens": config.num_blocks * config.block_size,
            "block_size": config.block_size, "max_num_batched_tokens": config.max_tokens_per_step,
            "scheduler": "vllm-v1"}


def simulate(config: SchedulerConfig, prompt: np.ndarray, output: np.ndarray,
             prices: Sequence[Callable[[StepShape], float]], factor: float = 1.0, step_sigma: float = 0.0,
             seed: int = 0, recorder: StepRecorder | None = None) -> list[Simulated]:
    """``prompt``/``output`` through the scheduler once, priced by each of ``prices`` (an offline batch's schedule
    does not depend on time, so one schedule serves every price), each step × ``factor`` × a log-normal jitter of
    mean 1 (``step_sigma``; one draw a step, the same for every price). The first price's steps go into
    ``recorder`` as a vLLM engine core in a child process reports them (no context)."""
    gauss, shift = random.Random(seed).gauss, step_sigma * step_sigma / 2
    steps: list[list[float]] = [[] for _ in prices]
    decode: list[int] = []
    clock = [0.0]

    def on_step(shape: StepShape, _: float, preempted: int) -> None:
        decode.append(shape.decode)
        noise = factor * math.exp(step_sigma * gauss(0.0, 1.0) - shift) if step_sigma else factor
        for price, out in zip(prices, steps):
            out.append(price(shape) * noise)
        if recorder is not None:
            clock[0] += steps[0][-1]
            recorder.record(running=shape.seqs, decode=shape.decode, prefill=shape.prefill,
                            prefill_seqs=shape.seqs - shape.decode, kv_tokens=shape.kv_tokens, preempted=preempted,
                            dt=steps[0][-1], end=clock[0])
    # every step costs 1 on the scheduler's own clock, so a request's finish is the number of its last step
    result = Scheduler(config).run([range(int(p)) for p in prompt], [int(o) for o in output], lambda _: 1.0,
                                   on_step=on_step)
    last = np.fromiter((round(r.finished_at or 1.0) - 1 for r in result.requests), dtype=np.int64,
                       count=len(result.requests))
    runs = []
    cum_decode = np.cumsum(np.asarray(decode, dtype=np.int64)) if decode else np.zeros(1, dtype=np.int64)
    for out in steps:
        elapsed = np.cumsum(out) if out else np.zeros(1)
        runs.append(Simulated(float(elapsed[-1]), result.steps, int(output.sum()), elapsed[last], elapsed, cum_decode))
    return runs


@dataclass(frozen=True)
class Steady:
    """A config's first ``count`` requests of the job, simulated once: what a longer run extrapolates from."""

    count: int
    seconds: float
    output_tokens: int
    rate: float   # output tok/s between the STEADY shares of the tokens finished
    steps: int
    # its blocks (``tune_confirm.Blocks``: each BLOCK_STEPS full steps, requests waiting behind them): the mean and
    # the spread of their log decode rates (``None``: fewer than 3 blocks, or no steps kept), and the decode tokens
    # of a full step on average (what a longer run's blocks are drawn with)
    block_log_mean: float | None = None
    block_log_sd: float | None = None
    blocks: int = 0
    decode_per_step: float | None = None

    def seconds_for(self, output_tokens: int) -> float:
        """A run of the same mix with ``output_tokens`` (≥ this one's): this run plus the rest at the steady rate."""
        return self.seconds + max(0, output_tokens - self.output_tokens) / self.rate


def steady_of(sim: Simulated, output: np.ndarray) -> Steady:
    order = np.argsort(sim.finished, kind="stable")
    done, tokens = sim.finished[order], np.cumsum(output[order])
    lo, hi = (int(np.searchsorted(tokens, share * tokens[-1])) for share in STEADY)
    span = done[hi] - done[lo]
    rate = (tokens[hi] - tokens[lo]) / span if span > 0 else tokens[-1] / sim.seconds
    steady = Steady(len(output), sim.seconds, int(tokens[-1]), float(rate), sim.steps)
    if sim.step_end is None or sim.step_full is None or not sim.step_full.any():
        return steady
    from harness.batch.tune.tune_confirm import BLOCK_STEPS

    dt = np.diff(sim.step_end, prepend=0.0)[sim.step_full]
    dk = np.diff(sim.step_decode, prepend=0)[sim.step_full].astype(float)
    k = len(dt) // BLOCK_STEPS
    steady = replace(steady, decode_per_step=float(dk.mean()))
    if k < 3:
        return steady
    logs = np.log(dk[:k * BLOCK_STEPS].reshape(k, -1).sum(1) / dt[:k * BLOCK_STEPS].reshape(k, -1).sum(1))
    return replace(steady, block_log_mean=float(logs.mean()), block_log_sd=float(logs.std(ddof=1)), blocks=k)


def config_seed(key: str, salt: int = 0) -> int:
    return zlib.crc32(f"{salt}:{key}".encode())


@dataclass(frozen=True)
class Feed:
    """How the pool hands shards to one engine (``harness.batch.job.feeding.takes_another``): another shard while it
    holds fewer than ``in_flight``, or fewer than ``most`` while its unfinished requests are under ``below``."""

    in_flight: int
    most: int
    below: int

    @classmethod
    def pool(cls, in_flight: int, shard_size: int, capacity: int | None = None) -> Feed:
        """The pool's rule for an engine of ``capacity`` sequences (its ``max_num_seqs``; ``None``: unsaid)."""
        from harness.batch.job.feeding import feed_below, most_held

        in_flight = max(in_flight, 1)
        return cls(in_flight, most_held(shard_size, in_flight, capacity), feed_below(shard_size, capacity))

    def takes_another(self, shards: int, unfinished: int) -> bool:
        return shards < self.in_flight or (shards < self.most and unfinished < self.below)


# on_commit(position, clock, decode tokens so far, step seconds so far, shards left to hand over,
#           (decode tokens, seconds, count) of the full steps so far) -> stop?
CommitFn = Callable[[int, float, float, float, int, tuple[float, float, int]], bool]


def simulate_fed(config: SchedulerConfig, prompt: np.ndarray, output: np.ndarray, sizes: Sequence[int],
                 price: Callable[[StepShape], float], feed: Feed, factor: float = 1.0, step_sigma: float = 0.0,
                 seed: int = 0, recorder: StepRecorder | None = None, on_commit: CommitFn | None = None,
                 hand_over: int | None = None) -> tuple[Simulated, int]:
    """One engine fed shard by shard, as the pool feeds it: shards (consecutive runs of ``sizes`` requests) are
    handed over in order by ``feed``'s rule (checked after every step), each committed at the step its last request
    finishes (shards finishing in one step: in index order), ``on_commit`` told then (after the stop too: it
    commits them); a true return stops the handover (the shards handed over finish, the rest never run). ``hand_over``: hand over at most this many shards
    (a prefix of a longer run); the simulation stops at the first commit after the last of them is handed over, as
    the engine would have been handed more. Steps are priced as ``simulate``'s (× ``factor`` × jitter). Returns the
    run (``finished``: NaN for a request not run) and the shards it committed."""
    from engines.sim_scheduler import SimRequest

    sched = Scheduler(config)
    gauss, shift = random.Random(seed).gauss, step_sigma * step_sigma / 2
    bounds = np.cumsum([0, *sizes])
    n = len(sizes)
    limit = n if hand_over is None else min(n, hand_over)
    requests = [SimRequest(i, range(int(p)), int(o)) for i, (p, o) in enumerate(zip(prompt, output))]
    shard_of = np.repeat(np.arange(n), sizes)
    remaining = list(sizes)
    waiting: deque = deque()
    running: list = []
    handed = committed = unfinished = in_flight = 0
    stopped = False
    clock, steps, step_s, decode = 0.0, 0, 0.0, 0
    full = [0.0, 0.0, 0]   # the full steps' decode tokens, seconds and count (requests waiting behind the step)
    ends: list[float] = []
    cum: list[int] = []
    fulls: list[bool] = []
    def feed_more() -> None:
        nonlocal handed, unfinished, in_flight
        while not stopped and handed < limit and feed.takes_another(in_flight, unfinished):
            waiting.extend(requests[bounds[handed]:bounds[handed + 1]])
            unfinished += sizes[handed]
            in_flight += 1
            handed += 1

    feed_more()
    while waiting or running:
        before = sched.counters.preemptions
        scheduled = sched._schedule(waiting, running)
        if not scheduled:
            raise RuntimeError("simulator stalled: no request fits the KV cache (raise its size)")
        preempted = sched.counters.preemptions - before
        shape = sched._shape(scheduled, preempted)
        noise = factor * math.exp(step_sigma * gauss(0.0, 1.0) - shift) if step_sigma else factor
        seconds = price(shape) * noise
        clock += seconds
        steps += 1
        step_s += seconds
        decode += shape.decode
        ends.append(clock)
        cum.append(decode)
        fulls.append(bool(waiting))
        if waiting:
            full[0] += shape.decode
            full[1] += seconds
            full[2] += 1
        if recorder is not None:
            recorder.record(running=shape.seqs, decode=shape.decode, prefill=shape.prefill,
                            prefill_seqs=shape.seqs - shape.decode, kv_tokens=shape.kv_tokens, preempted=preempted,
                            waiting=len(waiting), dt=seconds, end=clock)
        sched._advance(scheduled, running, clock, None)
        shards_done = []
        for r, _ in scheduled:
            if r.finished_at == clock:   # finished in this step
                unfinished -= 1
                s = int(shard_of[r.index])
                remaining[s] -= 1
                if remaining[s] == 0:
                    shards_done.append(s)
        cut = False
        for s in sorted(shards_done):
            committed += 1
            in_flight -= 1
            if on_commit is not None and on_commit(s, clock, float(decode), step_s, n - handed, tuple(full)):
                stopped = True   # told after every commit (the shards in flight too); a true return is kept
            if handed >= limit and limit < n and not stopped:   # a prefix: the engine would have been handed more
                cut = True
        if cut:
            break
        feed_more()
    finished = np.array([r.finished_at if r.finished_at is not None else np.nan for r in requests], dtype=float)
    sim = Simulated(clock, steps, int(output.sum()), finished, np.asarray(ends or [0.0]),
                    np.asarray(cum or [0], dtype=np.int64), np.asarray(fulls or [False]))
    return sim, committed
