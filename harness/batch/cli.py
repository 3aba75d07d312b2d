"""``troughput-batch``: the Hydra app that runs a batch file with a chosen config."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from engines.base import KnobError
from engines.common import PROJECT_ROOT
from engines.knobs import canonical_view
from harness.batch.job.plan import Plan, model_revision
from harness.batch.job.source import apply_source
from harness.batch.launch import run_job
from harness.batch.tune.tune_config import check_space, phase_planner, tune_settings
from harness.core.errors import TroughputError
from harness.core.models import resolve_model
from harness.run.spec import command_line, layered_knobs, worker_env
from harness.workloads.files import source


def build_plan(cfg: DictConfig, origin: dict[str, Any]) -> Plan:
    """The job ``cfg`` asks for; ``cfg`` and ``origin`` as ``apply_source`` gives them (its config from a
    decision, a tuned file or the overrides)."""
    python = cfg.engine.python or sys.executable
    model = resolve_model(_plain(cfg.model), python)
    knobs = layered_knobs(cfg)
    path, fmt = source({"name": "batch", "path": cfg.batch.input, "format": cfg.batch.format,
                         "format_setting": "batch.format"})
    labels = {"command": command_line().replace("troughput-run", "troughput-batch", 1), **_plain(cfg.run.labels)}
    return Plan(
        input=str(path.resolve()), format=fmt, output_dir=str(Path(cfg.batch.output_dir).resolve()),
        shard_size=_positive(cfg.batch.shard_size, "batch.shard_size"), engine=cfg.engine.name, model=model,
        knobs=knobs, ordering=_plain(cfg.ordering), python=python,
        env=worker_env(cfg),
        replicas=_positive(cfg.engine.get("replicas", 1), "engine.replicas"),
        device_kind=str((cfg.hardware.get("spec") or {}).get("kind", "cpu")),
        in_flight=_positive(cfg.batch.in_flight, "batch.in_flight"), sampling=cfg.batch.sampling,
        stall_timeout_s=_stall_timeout(cfg.batch.get("stall_timeout_s", 1800)),
        default_max_tokens=cfg.batch.default_max_tokens, allow_remote_images=bool(cfg.batch.allow_remote_images),
        served_model_names=_names(cfg.batch.get("served_model_names"), "batch.served_model_names"),
        max_model_len=canonical_view(cfg.engine.name, knobs).get("context_length"),   # the engine's own name for it
        results_dir=str(Path(cfg.run.results_dir).resolve()),
        source=origin, labels=labels, model_revision=model_revision(model), scale=cfg.batch.scale,
        ray=_plain(cfg.batch.ray), slurm=_plain(cfg.batch.slurm), tune=tune_settings(cfg))


@hydra.main(config_path=str(PROJECT_ROOT / "conf"), config_name="batch", version_base="1.3")
def main(cfg: DictConfig) -> str:
    """One batch job (or what is left of it); prints its summary. User errors print one line and exit 2."""
    try:
        cfg, origin = apply_source(cfg)
        plan = build_plan(cfg, origin)
        tuning = None
        if plan.tune:  # every config the tuner may try is mapped to engine knobs now, before any engine starts
            tuning = (phase_planner(cfg, plan), OmegaConf.to_container(cfg, resolve=True))
            check_space(tuning[0], plan.tune["space"])
        row = run_job(plan, progress=bool(cfg.run.progress), tuning=tuning)
    except (TroughputError, KnobError) as e:
        print(f"troughput-batch: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(summary(row))
    if row["status"] != "ok":
        sys.exit(1)
    return row["status"]


def summary(row: dict[str, Any]) -> str:
    """A few lines: counts, rates measured and predicted, where the outputs are."""
    lines = [f"troughput-batch {row['status']}: {row['requests_ok']:,} ok, {row['requests_failed']:,} failed this run; "
             f"{row['shards_committed']} of {row['shards']} shards committed ({row['shards_before']} before this run)"]
    if row["status"] == "failed":
        lines[0] = f"troughput-batch FAILED: no request succeeded. {lines[0].split(': ', 1)[1]}"
    if row.get("requests_other_model"):
        lines.append(f"  {row['requests_other_model']:,} requests named a model this job does not serve: error lines "
                     f"(404 model_not_found), not answered by {row['model']!r}; if a name is this model's, add it to "
                     f"batch.served_model_names")
    if row["output_tok_s"]:
        lines.append(f"  measured {row['output_tok_s']:,.1f} output tok/s, {row['req_s']:,.1f} req/s over "
                     f"{row['generation_s']:,.1f} s (engine start {row['startup_s'] or 0:,.1f} s excluded)")
    if row.get("predicted_output_tok_s"):
        lines.append(f"  predicted {row['predicted_output_tok_s']:,.1f} output tok/s by the {row['config_source.kind']}"
                     f" (job {row['predicted_job_s']:,.1f} s predicted, {row['generation_s']:,.1f} s measured)")
        if row.get("predicted_other_host"):
            lines.append(f"  NOT COMPARABLE: the prediction was measured on host "
                         f"{row.get('config_source.predicted_host_id') or 'not recorded'}, this job ran on host "
                         f"{row.get('env.host_id')} ({row.get('env.host')})")
    if row.get("tune.runs") is not None:
        lines += tuning_summary(row)
    lines.append(f"  output: {row['output.output'] or row['output_dir'] + '/shards (incomplete)'}; "
                 f"errors: {row['output.errors'] or '-'}")
    if row["error"]:
        lines.append(f"  {row['error']}")
    return "\n".join(lines)


def _pruned(row: dict[str, Any]) -> str:
    """The trials the pruner stopped (``batch.tune.prune``), for the tuning line."""
    if row.get("tune.prune") in (None, "none"):
        return " (none pruned: batch.tune.prune=none)"
    parts = [f"{row['tune.pruned_trials']} pruned (batch.tune.prune={row['tune.prune']})"]
    if row.get("tune.pruned_share") is not None:
        parts.append(f"{row['tune.pruned_share']:.0%} of the trials that ran")
    if row.get("tune.pruned_shards_left"):
        parts.append(f"{row['tune.pruned_shards_left']} of their shards left to later runs")
    return f" ({', '.join(parts)})"


def tuning_summary(row: dict[str, Any]) -> list[str]:
    """The in-job tuning's lines: its runs and cost, the config it chose and why, the prediction beside the rest."""
    share = row.get("tune.phase_share")
    pruned = row.get("tune.pruned_trials")
    lines = [f"  tuning: {row['tune.trials']} trials{_pruned(row) if pruned is not None else ''} on "
             f"{row['tune.phase_requests']:,} requests ({row['tune.shards_per_run']} shards a trial), "
             f"{row['tune.phase_s']:,.1f} s{f' ({share:.1%} of the job)' if share is not None else ''}; "
             f"{row.get('tune.engine_starts')} engine starts for {row.get('tune.distinct_configs')} distinct configs; "
             f"overhead {row['tune.overhead_s']:,.1f} s ({row['tune.restarts']} restarts "
             f"{row['tune.restart_s']:,.1f} s, "
             f"of which engine start {row['tune.engine_start_s']:,.1f} s; configs slower than the chosen one "
             f"{row['tune.shortfall_s']:,.1f} s)"]
    candidate, why = row.get("tune.candidate"), row.get("tune.verdict") or row.get("tune.confirm.reason")
    if isinstance(row["tune.chosen"], dict):
        confirmed = row.get("tune.confirm.action") == "keep the candidate"
        lines.append(f"  chosen: {row['tune.chosen']} over the job's own config, "
                     f"{'confirmed in the main phase' if confirmed else 'unconfirmed'} ({why})")
    elif candidate and row.get("tune.switched"):
        lines.append(f"  chosen: the job's own config; trial {row.get('tune.candidate_trial')} ({candidate}) ran the "
                     f"main phase's first shards, then the rest switched back ({why})")
    else:
        lines.append(f"  chosen: the job's own config ({why})")
    if row.get("tune.predicted_rest_s") and row.get("tune.measured_rest_s"):
        lines.append(f"  rest of the job: predicted {row['tune.predicted_rest_s']:,.1f} s of generation, measured "
                     f"{row['tune.measured_rest_s']:,.1f} s "
                     f"({row['tune.measured_rest_s'] / row['tune.predicted_rest_s']:.2f} of the prediction)")
    predicted, measured = row.get("prediction.rest_in_main.predicted"), row.get("prediction.rest_in_main.measured")
    if predicted and measured:
        lines.append(f"  the same, predicted again {row['tune.in_main_prediction_at_s']:,.0f} s into the main phase "
                     f"from its own steps: {predicted:,.1f} s, measured {measured:,.1f} s "
                     f"({measured / predicted:.2f} of the prediction)")
    return lines


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TroughputError(f"{name}={value!r}: must be an integer >= 1")
    return value


def _names(value: Any, name: str) -> list[str]:
    names = _plain(value) if value is not None else []
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise TroughputError(f"{name}={names!r}: must be a list of model names, e.g. {name}=[gpt-4o-mini]")
    return names


def _stall_timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TroughputError(f"batch.stall_timeout_s={value!r}: must be seconds > 0, or null (never)")
    return float(value)


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


if __name__ == "__main__":
    main()
