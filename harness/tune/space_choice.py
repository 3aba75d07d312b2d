"""Which search space a study gets when none is named: the one its engine's unit declares.

``conf/tuning.yaml`` selects ``tune: auto``; the engine's unit maps hardware kinds to
``conf/tune/<name>.yaml`` files (``EngineUnit.tune_spaces``; an engine with a config directory of its
own, ``EngineUnit.conf``, may keep them in its ``tune/``), and any kind it does not
list gets the generic space of canonical knobs. So every ``engine=`` × ``hardware=``
pair has a space, and ``tune=<file>`` still picks one by hand. A space file may also
name its ``objective`` (``conf/tune/ray_cpu.yaml``: ``job_time``); ``tune.objective=`` on
the command line still wins.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from engines import unit
from engines.common import PROJECT_ROOT
from harness.core.errors import TroughputError

TUNE_DIR = PROJECT_ROOT / "conf" / "tune"
FILLED = ("space", "seeds", "heuristic")   # ``???`` in conf/tune/auto.yaml: taken from the space file
SPACE_DEFAULTS = ("objective",)   # a space file's value replaces conf/tuning.yaml's, not the command line's


def space_name(cfg: DictConfig) -> str:
    """The ``conf/tune/`` file the engine's unit names for this hardware's kind."""
    kind = (cfg.hardware.get("spec") or {}).get("kind")
    return unit(cfg.engine.name).tune_space(kind)


def with_default_space(cfg: DictConfig) -> DictConfig:
    """``cfg`` with the unit's space filled in under ``tune`` when ``tune: auto`` is selected.

    The settings already in ``cfg.tune`` (``tuning.yaml``'s and the command line's, e.g.
    ``tune.seeds=[]``) win over the space file's.
    """
    if not cfg.tune.get("auto"):
        return cfg
    name = space_name(cfg)
    own = unit(cfg.engine.name).conf
    path = Path(own) / "tune" / f"{name}.yaml" if own and (Path(own) / "tune" / f"{name}.yaml").is_file() \
        else TUNE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise TroughputError(f"engine {cfg.engine.name}'s unit names the search space {name!r}, but {path} "
                             f"does not exist; add it or pick one with tune=<file in {TUNE_DIR}>")
    space = OmegaConf.load(path)
    merged = OmegaConf.merge(OmegaConf.create({"tune": space}), cfg)
    for key in FILLED:
        if OmegaConf.is_missing(merged.tune, key):   # neither the space file nor the user set it
            merged.tune[key] = None
    for key in SPACE_DEFAULTS:
        if key in space and not _on_command_line(f"tune.{key}"):
            merged.tune[key] = space[key]
    merged.tune.auto = name
    return merged


def _on_command_line(path: str) -> bool:
    """Whether this Hydra job's overrides set ``path``."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    return any(o.split("=", 1)[0].lstrip("+~") == path for o in HydraConfig.get().overrides.task)
