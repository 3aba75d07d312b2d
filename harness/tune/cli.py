"""``troughput-tune``: an Optuna study over engine knobs for one (engine, model, workload, hardware) cell."""

from __future__ import annotations

import logging
import sys
from functools import partial

import hydra
from omegaconf import DictConfig, OmegaConf

from engines.base import KnobError
from engines.common import PROJECT_ROOT
from harness.core.errors import TroughputError
from harness.report.verdict import MIN_RUNS
from harness.run.environment import capture
from harness.run.spec import build_inputs, build_spec
from harness.tune.best import best_trials, confirm, leaders, rejected_faster, write_engine_file
from harness.tune.objective import Objective
from harness.tune.seeds import enqueue_seeds
from harness.tune.space import SearchSpace
from harness.tune.space_choice import with_default_space
from harness.tune.study import check_one_host, fail_stale_trials, finished_trials, open_study, run_trials

log = logging.getLogger("troughput.tune")


def tune(cfg: DictConfig) -> dict:
    """Run (or resume) the study, then write and confirm its best config. Returns a summary."""
    cfg = with_default_space(cfg)
    objective = Objective(OmegaConf.to_container(cfg.tune, resolve=True))
    if objective.needs_reference and not cfg.quality.reference:
        cfg.quality.reference = "default"   # the quality guard compares every trial with the default config
    space = SearchSpace(OmegaConf.to_container(cfg.tune.space, resolve=True))
    study = open_study(cfg, objective)
    check_one_host(study, capture()["env.host_id"], bool(cfg.tune.get("mixed_hosts", False)))
    base = OmegaConf.to_container(cfg, resolve=True)
    inputs = build_inputs(cfg)  # once per study: every trial and confirmation run reuses model and workload
    make_spec = partial(build_spec, inputs=inputs)
    seeds = enqueue_seeds(study, base["tune"], space, base, inputs.workload.summary(), inputs.model["local_dir"])
    stale = fail_stale_trials(study, stale_after_s=2 * float(cfg.run.time_limit_s) + 120)
    print(f"study {study.study_name!r} in {cfg.tune.storage}: {finished_trials(study)} finished trials"
          f"{f', {stale} stale marked failed' if stale else ''}; budget {cfg.tune.n_trials}; "
          f"first trials: {', '.join(seeds) or 'none'}", flush=True)
    run_trials(cfg, study, space, objective, make_spec)
    best = best_trials(study)
    summary = {"study": study.study_name, "finished": finished_trials(study), "best": best}
    if not best:
        print("no trial succeeded: see the failed rows' errors (troughput-report, or results/runs/)")
        return summary
    for trial in best:
        print(f"best trial {trial.number}: values {trial.values}, params {trial.params or 'engine defaults'}, "
              f"run {trial.user_attrs.get('run_id')}")
    for trial in rejected_faster(study, best[0]):
        gain = trial.values[0] / best[0].values[0] if best[0].values[0] else float("nan")
        print(f"rejected trial {trial.number}: {gain:.3f}x the best's {objective.name}, but "
              f"{trial.user_attrs['infeasible']}; params {trial.params}")
    chosen, confirmed = best[0], None
    candidates = [t for t in leaders(study, int(cfg.tune.confirm_top)) if t.params]  # the default runs anyway
    if not candidates:
        print("the engine's default config measured best: nothing to gain on this cell; keeping the default, "
              "no tuned config written")
        return summary | {"chosen": None}
    rounds = int(cfg.tune.confirm_rounds)
    if 0 < rounds < MIN_RUNS:
        print(f"tune.confirm_rounds={rounds}: the rule (docs/verdicts.md) needs {MIN_RUNS} runs a side, so this "
              f"confirmation cannot decide and the default will be kept; use tune.confirm_rounds={MIN_RUNS} or more")
    if rounds > 0:
        print(f"confirming: the default config vs trials {', '.join(str(t.number) for t in candidates)}, "
              f"{cfg.tune.confirm_rounds} rounds side by side")
        result = confirm(cfg, candidates, objective, int(cfg.tune.confirm_rounds), make_spec,
                         study.study_name, min_effect=float(cfg.tune.min_effect))
        summary["confirm"] = result
        verdict = result["verdict"]
        if verdict is None:
            print("no candidate and default both measured in the confirmation: keeping the default, no tuned "
                  "config written")
            return summary | {"chosen": None}
        runs = len(result["measured"][result["best"]]), len(result["measured"]["default"])
        confirmed = (f"{result['best']} ÷ default {objective.name}: {verdict.interval_text()} "
                     f"({runs[0]} vs {runs[1]} runs): {verdict.verdict}{' for the default' * (verdict.winner == 'b')}")
        if result["winner"] is None:
            print(f"no candidate beat the default config by the rule (docs/verdicts.md): {confirmed}; "
                  f"{verdict.reason}. Keeping the default on this cell: no tuned config written")
            return summary | {"chosen": None}
        chosen = result["winner"]
        print(f"measured gain of the best config (trial {chosen.number}) over the default: {confirmed}")
    elif not cfg.tune.get("write_unconfirmed", False):
        print("tune.confirm_rounds=0: no side-by-side runs against the default, so no verdict: keeping the default, "
              "no tuned config written (tune.write_unconfirmed=true writes the best trial anyway, marked UNCONFIRMED)")
        return summary | {"chosen": None}
    else:
        print("tune.confirm_rounds=0 and tune.write_unconfirmed=true: the best trial is written UNCONFIRMED (no "
              "side-by-side runs against the default, so no verdict that it beats it)")
    summary["chosen"] = chosen
    path = write_engine_file(cfg, chosen, PROJECT_ROOT / cfg.tune.output_dir, study.study_name, confirmed)
    print(f"best config written to {path}")
    return summary


@hydra.main(config_path=str(PROJECT_ROOT / "conf"), config_name="tuning", version_base="1.3")
def main(cfg: DictConfig) -> None:
    logging.getLogger("troughput").setLevel(logging.INFO)
    try:
        tune(cfg)
    except (TroughputError, KnobError) as e:
        print(f"troughput-tune: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
