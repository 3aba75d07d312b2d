"""Where a batch job's config comes from, and what it predicted: a decision, a tuned engine file, or overrides.

- ``batch.decision=<id>``: the recorded decision's chosen engine, native knobs, replicas and ordering
  (``<results_dir>/decisions/<id>.json``; ``knob.replicas`` becomes ``engine.replicas``, never an
  engine argument); predicted: its chosen config's measured rates.
- ``batch.engine_file=<path>``: an engine file written by ``troughput-tune`` (``harness.tune.best``);
  predicted: the rates of the run its header names (``<results_dir>/runs/<run_id>.json``).
- neither: the composed config as it is (plain overrides); nothing predicted.

The prediction is the benchmark config's full-engine rate (``full_engine_tok_s``: its step model
with the engine kept full, as a long job keeps it) where the benchmark has one, else its measured
rate, on the benchmark's workload (``predicted_method`` says which); the job's own rate is measured
and the row puts the two side by side (``prediction.batch_rate.*``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.core.errors import TroughputError
from harness.run.results import DECISIONS_DIR, RUNS_DIR

TUNED_HEADER = re.compile(r"^# Tuned by troughput-tune, study (?P<study>.+), trial (?P<trial>\d+), run (?P<run>\S+)")
ALSO_SET = "# also set: "


def apply_source(cfg: DictConfig) -> tuple[DictConfig, dict[str, Any]]:
    """The config to run and ``{kind, id or path, predicted_output_tok_s, predicted_req_s, ...}``."""
    decision, engine_file = cfg.batch.get("decision"), cfg.batch.get("engine_file")
    if decision and engine_file:
        raise TroughputError("give batch.decision or batch.engine_file, not both")
    results = Path(cfg.run.results_dir)
    if decision:
        return _from_decision(cfg, results, str(decision))
    if engine_file:
        return _from_engine_file(cfg, results, Path(str(engine_file)).expanduser())
    return cfg, {"kind": "overrides"}


def _from_decision(cfg: DictConfig, results: Path, decision_id: str) -> tuple[DictConfig, dict[str, Any]]:
    from harness.report.decisions import chosen_knobs  # pandas: only when a decision is asked for

    decision = _read(results / DECISIONS_DIR / f"{decision_id}.json", f"decision {decision_id!r}")
    engine, ordering = decision.get("chosen.engine"), decision.get("chosen.ordering")
    if not engine:
        raise TroughputError(f"decision {decision_id!r} chose no config ({decision.get('verdict')}: "
                             f"{decision.get('reason')})")
    if decision.get("model") != cfg.model.name:
        raise TroughputError(f"decision {decision_id!r} was made for model {decision.get('model')!r}; "
                             f"this job runs {cfg.model.name!r}: set model={decision.get('model')}")
    overrides = _task_overrides()
    fixed = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in ("engine", "ordering")]
    if fixed:
        raise TroughputError(f"batch.decision fixes the engine and ordering; drop {' '.join(fixed)}")
    composed = hydra.compose(config_name="batch", overrides=[f"engine={engine}", f"ordering={ordering or 'as_given'}",
                                                             *overrides])
    knobs = chosen_knobs(decision)
    replicas = knobs.pop("replicas", 1)  # the runs' rows record engine.replicas > 1 as knob.replicas: no engine knob
    with open_dict(composed):
        composed.engine.knobs = knobs
        composed.engine.canonical = {}
        composed.engine.replicas = int(replicas)
    return composed, {"kind": "decision", "id": decision_id, "verdict": decision.get("verdict"),
                      "workload": decision.get("workload"), "rests_on": decision.get("chosen.run_ids"),
                      **_predicted(decision.get("chosen.full_engine_tok_s"), decision.get("chosen.output_tok_s"),
                                   decision.get("chosen.req_s")), "predicted_host_id": decision.get("host_id")}


def _from_engine_file(cfg: DictConfig, results: Path, path: Path) -> tuple[DictConfig, dict[str, Any]]:
    if not path.is_file():
        raise TroughputError(f"batch.engine_file {path} not found")
    text = path.read_text()
    engine = yaml.safe_load(text)
    if not isinstance(engine, dict) or "name" not in engine:
        raise TroughputError(f"batch.engine_file {path} is no engine config (a mapping with a name)")
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.engine = OmegaConf.create(engine)
        for line in text.splitlines():
            if line.startswith(ALSO_SET):
                for pair in line.removeprefix(ALSO_SET).split():
                    key, _, value = pair.partition("=")
                    OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
    source: dict[str, Any] = {"kind": "engine_file", "path": str(path)}
    header = TUNED_HEADER.match(text)
    if header:
        run = _read(results / RUNS_DIR / f"{header['run']}.json", f"run {header['run']!r} (named in {path})",
                    required=False)
        source |= {"study": header["study"].strip("'\""), "trial": int(header["trial"]), "run_id": header["run"],
                   "workload": run.get("workload"),
                   **_predicted(run.get("full_engine_tok_s"), run.get("output_tok_s"), run.get("req_s")),
                   "predicted_host_id": run.get("env.host_id")}
    return cfg, source


def _read(path: Path, what: str, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise TroughputError(f"{what} not found: no {path}; check run.results_dir")
        return {}
    return json.loads(path.read_text())


def _task_overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _predicted(full: Any, measured: Any, req_s: Any) -> dict[str, Any]:
    """The rates a source predicts: its full-engine rate where it has one (req/s scaled alike), else its measured."""
    if isinstance(full, (int, float)) and full > 0 and isinstance(measured, (int, float)) and measured > 0:
        scale = full / measured
        return {"predicted_output_tok_s": full, "predicted_req_s": req_s * scale if req_s else None,
                "predicted_method": "full engine (step model)"}
    return {"predicted_output_tok_s": measured, "predicted_req_s": req_s, "predicted_method": "measured rate"}
