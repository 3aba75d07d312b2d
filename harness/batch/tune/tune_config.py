"""``batch.tune``, read from the Hydra config: the in-job tuning settings and a plan for each config tried.

The search space is the one ``troughput-tune`` would take for this engine and hardware
(``tune: auto``, ``harness.tune.space_choice``; ``tune=<file>`` picks another), with its seed
trials and sizing heuristic. Everything here runs before any engine starts, so a space
that names a knob the engine lacks, or an output-changing knob without the quality guard,
fails first.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from engines.knobs import TABLE, canonical_view
from harness.batch.job.job import job_id
from harness.batch.job.plan import Plan
from harness.core.errors import TroughputError
from harness.run.spec import layered_knobs

OUTPUT_CHANGING = ("dtype", "kv_cache_dtype", "quantization")  # knobs that change outputs by design
SAMPLER_KEYS = ("sampler", "seed", "n_startup_trials", "startup", "multivariate", "grid_points")
RESTARTS = ("in_process", "new_worker")


def tune_settings(cfg: DictConfig) -> dict[str, Any]:
    """``plan.tune``: ``batch.tune`` with the space, seeds and heuristic; ``{}`` without a tuning phase."""
    tune = OmegaConf.to_container(cfg.batch.tune, resolve=True)
    trials = tune.get("trials") or 0
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise TroughputError(f"batch.tune.trials={trials!r}: must be an integer >= 0 (0: no tuning phase)")
    if not trials:
        return {}
    from harness.tune.space import SearchSpace  # the tuner (Optuna) only for a job that tunes
    from harness.tune.space_choice import with_default_space

    if cfg.batch.scale != "local":
        raise TroughputError(f"batch.tune.trials with batch.scale={cfg.batch.scale}: in-job tuning runs on one node "
                             "(its confirmation looks at each shard as it commits, which a Ray pipeline or a SLURM "
                             "array does not report); tune first (troughput-tune, or a local job's tuning phase) and "
                             "run the job there with batch.engine_file=")
    if trials < 2:
        raise TroughputError("batch.tune.trials=1 would only run the engine defaults: use 2 or more")
    share = float(tune["max_share"])
    if not 0 < share < 1:
        raise TroughputError(f"batch.tune.max_share={share}: must be a fraction in (0, 1)")
    if tune.get("restart") not in RESTARTS:
        raise TroughputError(f"batch.tune.restart={tune.get('restart')!r}: use one of {', '.join(RESTARTS)}")
    from harness.batch.tune.tune_prune import check_settings, positive_int   # Optuna: only for a job that tunes

    positive_int(tune, "confirm_looks", None, "the looks the main phase's confirmation makes, from the candidate's "
                 "third block on")
    positive_int(tune, "block_steps", 128, "the full engine steps a block of the confirmation spans")
    for key, what in (("run_spread", "the log-rate spread of two runs of one config, beyond what their blocks show"),
                      ("alternate_share", "the most of the rest of the job alternating runs may cost; 0: never")):
        value = tune.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                not 0 <= value < 1:
            raise TroughputError(f"batch.tune.{key}={value!r}: must be a number in [0, 1) ({what})")
    check_settings(tune)
    full = with_default_space(cfg)
    space = OmegaConf.to_container(full.tune.space, resolve=True)
    SearchSpace(space)  # checks the space's shape
    check_sampler(tune, space)
    changing = output_changing(space["params"])
    if changing:
        raise TroughputError(f"the search space holds {', '.join(changing)}, which change outputs by design: in-job "
                             "tuning commits every trial's outputs, so it does not take them. Tune them with "
                             "troughput-tune and its quality guard (tune.min_agreement), then run the job with "
                             "batch.engine_file=, or drop them from the space")
    return {**tune, "space": space, "seeds": _plain(full.tune.get("seeds")),
            "heuristic": _plain(full.tune.get("heuristic")), "space_name": _space_name(full)}


def check_sampler(tune: dict[str, Any], space: dict[str, Any]) -> None:
    """The in-job study's sampler built once now (``batch.tune.sampler``, ``startup``, ``n_startup_trials``,
    ``seed``...), so that a bad setting is refused before any worker starts, not when the study is set up."""
    from harness.tune.study import make_sampler

    try:
        make_sampler(sampler_config({**tune, "space": space}, ""))
    except (TroughputError, ValueError, TypeError) as e:
        text = str(e)   # make_sampler's own refusals name tune.sampler or tune.startup
        raise TroughputError(f"batch.{text}" if text.startswith("tune.") else
                             f"one of {', '.join('batch.tune.' + k for k in SAMPLER_KEYS)}: {type(e).__name__}: "
                             f"{text}") from e


def output_changing(paths: Any) -> list[str]:
    """The param paths among ``paths`` that set a knob changing outputs by design (``OUTPUT_CHANGING``)."""
    from harness.tune.seeds import knob_key

    return [p for p in paths if knob_key(p).split(".")[-1] in OUTPUT_CHANGING]


def phase_planner(cfg: DictConfig, plan: Plan) -> Callable[[dict[str, Any], dict[str, Any]], Plan]:
    """``plan_for(values, phase)``: the job's plan with a config's values applied (its knobs, replicas, ordering).

    Each param path is applied as ``troughput-tune`` applies it (``harness.tune.study.apply_values``);
    the resulting knobs go through the same layering and canonical mapping as the job's own.
    """
    from harness.tune.study import apply_values

    base = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))

    def plan_for(values: dict[str, Any], phase: dict[str, Any]) -> Plan:
        trial = apply_values(base, values)
        knobs = layered_knobs(trial)
        return replace(plan, knobs=knobs, ordering=_plain(trial.ordering),
                       replicas=int(trial.engine.get("replicas", 1)),
                       max_model_len=canonical_view(plan.engine, knobs).get("context_length"),
                       phase=phase, job=job_id(plan))  # the job's id: read when the input has been scanned
    return plan_for


def replica_slots(plan: Plan) -> int:
    """The most replicas a tuned job's runs can ask for: the search space's ``engine.replicas`` high bound (or its
    largest choice), and the job's own replicas (the engine defaults' runs)."""
    param = plan.tune["space"]["params"].get("engine.replicas") or {}
    bounds = param.get("choices") or [param.get("high")]
    return max([plan.replicas, *(int(b) for b in bounds if b is not None)])


def check_space(plan_for: Callable[..., Plan], space: dict[str, Any]) -> None:
    """Every param's extreme values mapped to engine knobs now, so that an unknown canonical knob, or one the
    engine lacks, fails before any engine starts (a native ``engine.knobs.*`` name is checked by the engine
    itself when the first run that sets it starts: a failed trial with the engine's reason)."""
    for path, param in space["params"].items():
        if not path.startswith(("engine.", "model.", "ordering")):
            raise TroughputError(f"search space param {path!r}: in-job tuning sets engine.*, model.* or ordering")
        if path.startswith("engine.canonical.") and path.removeprefix("engine.canonical.") not in TABLE:
            raise TroughputError(f"search space param {path!r}: no canonical knob of that name (docs/knobs.md: "
                                 f"{', '.join(TABLE)})")
        values = param.get("choices") or [param.get("low"), param.get("high")]
        for value in values:
            plan_for({path: value}, {})


def sampler_config(tune: dict[str, Any], storage: str) -> DictConfig:
    """The ``tune`` node ``harness.tune.study``'s sampler and budget read, for the in-job study."""
    return OmegaConf.create({"tune": {**{k: tune.get(k) for k in SAMPLER_KEYS}, "space": tune["space"],
                                      "n_trials": tune["trials"], "storage": storage}})


def _space_name(cfg: DictConfig) -> str:
    """The ``conf/tune/`` file the space came from: the unit's choice (``tune: auto``) or ``tune=<file>``."""
    if cfg.tune.get("auto"):
        return str(cfg.tune.auto)
    from hydra.core.hydra_config import HydraConfig

    return str(HydraConfig.get().runtime.choices.get("tune")) if HydraConfig.initialized() else "given"


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else None
