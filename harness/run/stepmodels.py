"""Which step model applies on this host, and the prediction every vLLM run gets before it runs.

A step model knows the host id it was fitted on (``env.host_id``: the kind of machine).
On another host it is never applied: ``step_model_for`` refits from the step traces of
this host's own rows of the engine the simulator stands for (vLLM) and the same model; with
none, there is no step model and the simulator says it is uncalibrated (``SimSetup.warning``,
shown in the run's summary). ``predict_run`` replays a vLLM run's requests with the step model
of this host's earlier runs before the run starts; the runner stores it beside what the run
then measured (``prediction.sim.*``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from engines.stepmodel import StepModel
from harness.run.environment import capture
from harness.run.replicas import shard_requests
from harness.run.results import read_rows
from harness.steps.fit import fit_step_model
from harness.steps.predict import full_engine_rate, replay
from harness.steps.store import read_trace

log = logging.getLogger(__name__)

STANDS_FOR = "vllm"   # the engine whose traces the simulator's step model is fitted to
ANY = "*"   # a speed_key value that any run matches
REPLAYABLE = "vllm-v1"   # an engine's ``schedules_like`` (engine_info.scheduler) whose steps the simulator replays
NO_FULL_ENGINE = {"full_engine_tok_s": None, "full_engine_note": None}   # every row has the columns
MAX_RUNS = 40         # the newest runs a refit reads


@functools.cache
def this_host_id() -> str:
    return str(capture().get("env.host_id"))


def speed_key(row: dict[str, Any]) -> dict[str, Any]:
    """What besides the host, engine and model changes what a step costs, as a row has it: the hardware
    config, the engines sharing it (replicas), the KV dtype, tensor parallelism and eager mode."""
    return {"hardware": _plain(row.get("hardware")), "replicas": int(_plain(row.get("replicas")) or 1),
            "kv_cache_dtype": _plain(row.get("canon.kv_cache_dtype")),
            "tensor_parallel": int(_plain(row.get("canon.tensor_parallel")) or 1),
            "enforce_eager": bool(_plain(row.get("knob.enforce_eager")))}


def spec_speed_key(spec: Any) -> dict[str, Any]:
    """``speed_key`` of a run about to start (a vLLM run, or the simulator standing for one)."""
    from engines.knobs import canonical_view

    canon = canonical_view(spec.engine, spec.knobs)
    key = speed_key({"hardware": spec.labels.get("hardware"), "replicas": spec.replicas,
                     "canon.kv_cache_dtype": canon.get("kv_cache_dtype"),
                     "canon.tensor_parallel": canon.get("tensor_parallel"),
                     "knob.enforce_eager": spec.knobs.get("enforce_eager")})
    if spec.engine == "sim":
        key["enforce_eager"] = ANY   # the simulator has no eager mode: it stands for the vLLM runs as they ran
    return key


def host_traces(results_dir: str | os.PathLike, model: str | None, host_id: str, engine: str = STANDS_FOR,
                key: dict[str, Any] | None = None,
                limit: int = MAX_RUNS) -> dict[str, pd.DataFrame]:
    """``{run_id: trace}`` of ok rows of ``engine`` and ``model`` on ``host_id`` that kept a trace (newest first),
    and, given ``key``, whose ``speed_key`` is the same (other hardware, dtypes or engines per core cost
    otherwise)."""
    rows = [r for r in read_rows(results_dir) if r.get("status") == "ok" and r.get("engine") == engine
            and (model is None or r.get("model") == model) and r.get("env.host_id") == host_id
            and _present(r.get("steps.file"))
            and (key is None or _matches(speed_key(r), key))]
    rows.sort(key=lambda r: str(r.get("timestamp")), reverse=True)
    traces = {}
    for row in rows[:limit]:
        trace = read_trace(results_dir, row["run_id"])
        if trace is not None and len(trace):
            traces[row["run_id"]] = trace
    return traces


def step_model_for(results_dir: str | os.PathLike, model: str | None, given: dict[str, Any] | None = None,
                   host_id: str | None = None, key: dict[str, Any] | None = None) -> tuple[StepModel | None, str]:
    """The step model to use here, and how it was chosen (a sentence for the row): refitted from this host's
    own traces where the results folder has any (they were measured on this machine as it runs now; a
    calibration file of the same kind of host, fitted in another session, read 28% fast after a fresh
    clone's ``make run``), else the calibration file where it was fitted on this host for the same hardware
    config, else none. ``key`` (``speed_key``): a refit reads only traces of runs with the same key."""
    host_id = host_id or this_host_id()
    applies = bool(given) and given.get("host_id") == host_id and \
        (key is None or given.get("hardware") in (None, key["hardware"]))
    about_file = None if not given else \
        "this host's own traces win over the calibration file" if applies else _not_applied(given, host_id, key)
    traces = host_traces(results_dir, model, host_id, key=key)
    if traces:
        return (fit_step_model(traces, host_id=host_id, hardware=key["hardware"] if key else None),
                _sentence(f"refitted from {len(traces)} {STANDS_FOR} run(s) of this host ({host_id})", about_file))
    if applies:
        return StepModel.from_dict(given), f"calibration fitted on this host ({host_id}); no trace of its own here"
    where = f" for {key['hardware']} ({', '.join(f'{k}={v}' for k, v in key.items() if k != 'hardware')})" if key else ""
    return None, _sentence(about_file, f"no step trace of this host{where} to fit: uncalibrated")


def _sentence(*parts: str | None) -> str:
    return "; ".join(p for p in parts if p)


def _not_applied(given: dict[str, Any], host_id: str, key: dict[str, Any] | None) -> str:
    """Why a calibration file was not applied here: fitted on another host, or for other hardware."""
    if given.get("host_id") != host_id:
        return f"the calibration file was fitted on host {given.get('host_id')}, not this one ({host_id})"
    wanted = key["hardware"] if key else "?"
    return f"the calibration file was fitted for hardware {given.get('hardware')}, not {wanted} (same host)"


def calibrate_sim_spec(spec: Any) -> Any:
    """A ``RunSpec`` for ``engine=sim`` with the step model that applies here in its ``calibration`` knob."""
    if spec.engine != "sim":
        return spec
    calibration = dict(spec.knobs.get("calibration") or {})
    model, why = step_model_for(spec.results_dir, spec.model.get("name"), calibration.pop("step_model", None),
                                key=spec_speed_key(spec))
    if model is not None:
        calibration["step_model"] = model.to_dict()
    knobs = {**spec.knobs, "calibration": calibration or None}
    labels = {**spec.labels, "engine_info.calibration": why}
    return dataclasses.replace(spec, knobs=knobs, labels=labels)


def _matches(have: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(value == ANY or have.get(name) == value for name, value in want.items())


def _plain(value: Any) -> Any:
    """None for a missing value (None, NaN, "auto": the engine's default)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "auto":
        return None
    return value


def _present(value: Any) -> bool:
    """Whether the row says it kept a trace (the file is looked up under the results folder it is read from)."""
    return bool(value) and not (isinstance(value, float) and math.isnan(value))


@dataclass
class RunPrediction:
    """A real run's output tok/s as predicted before it ran; ``rate`` None where the prediction failed (``note``
    says why, and the row keeps it as ``prediction.sim.note``)."""

    rate: float | None
    interval: float | None
    note: str


def predict_run(spec: Any) -> RunPrediction | None:
    """``spec``'s output tok/s from this host's earlier traces of its engine and model; None where there is nothing
    to predict from (no traces, another engine than the simulator's); a failure of the fit or the replay is logged
    and returned as a prediction without a rate whose note says why."""
    from harness.ordering.policies import apply_ordering

    if spec.engine != STANDS_FOR or not spec.hardware_spec:
        return None
    try:
        model, why = step_model_for(spec.results_dir, spec.model.get("name"), key=spec_speed_key(spec))
        if model is None:
            return None
        requests = apply_ordering(spec.workload.requests, spec.ordering)
        shards = shard_requests(requests, spec.replicas)
        replays = [replay(model, shard, spec.knobs, spec.model, spec.hardware_spec) for shard in shards]
    except Exception as e:  # noqa: BLE001 - a prediction never stops a measured run
        log.warning("no step-model prediction for this run: %s: %s", type(e).__name__, e)
        return RunPrediction(None, None, f"not predicted: {type(e).__name__}: {e}"[:500])
    seconds = max(r.seconds for r in replays)
    beyond = sorted({b for r in replays for b in r.beyond})
    note = why + (f"; extrapolates past the traces in {', '.join(beyond)}" if beyond else "")
    return RunPrediction(sum(r.output_tokens for r in replays) / seconds if seconds > 0 else 0.0, model.interval, note)


def full_engine_columns(spec: Any, row: dict[str, Any]) -> dict[str, Any]:
    """``full_engine_tok_s``: the run's config with its engine kept full, from a step model fitted to this run's own
    steps and its requests cycled (``harness.steps.predict.full_engine_rate``); per replica, summed. Empty where the
    run kept no trace, failed, or was itself a prediction."""
    from harness.ordering.policies import apply_ordering

    if row.get("status") != "ok" or row.get("predicted") or not row.get("steps.file") or not spec.hardware_spec \
            or row.get("engine_info.scheduler") != REPLAYABLE:
        return NO_FULL_ENGINE   # the simulator replays vLLM's scheduling only: other engines' steps mean other things
    trace = read_trace(spec.results_dir, row["run_id"])
    if trace is None or trace.empty:
        return NO_FULL_ENGINE
    limits = {f"engine_{k}": row.get(f"engine_info.{k}")
              for k in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens", "block_size")}
    try:
        model = fit_step_model({row["run_id"]: trace[trace["replica"] == 0]})
        requests = shard_requests(apply_ordering(spec.workload.requests, spec.ordering), spec.replicas)[0]
        rate, replayed = full_engine_rate(model, requests, {**spec.knobs, **{k: v for k, v in limits.items() if v}},
                                          spec.model, spec.hardware_spec)
    except Exception as e:  # noqa: BLE001 - a derived figure never costs the measured row
        log.warning("no full-engine rate for this run: %s: %s", type(e).__name__, e)
        return {"full_engine_tok_s": None, "full_engine_note": f"not computed: {type(e).__name__}: {e}"}
    return {"full_engine_tok_s": rate * spec.replicas,
            "full_engine_note": f"extrapolates past the run's own steps in {', '.join(replayed.beyond)}"
            if replayed.beyond else None}
