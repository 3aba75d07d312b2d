"""``troughput-run``: the Hydra app that turns one composed config into one measured run."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from engines.base import KnobError
from engines.common import PROJECT_ROOT
from harness.core.errors import TroughputError
from harness.run.runner import execute
from harness.run.spec import build_spec
from harness.run.summary import print_summary

log = logging.getLogger("troughput")


@hydra.main(config_path=str(PROJECT_ROOT / "conf"), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> str:
    """One run; prints its row's headline. User errors print one line and exit 2."""
    try:
        row = execute(build_spec(cfg), progress=bool(cfg.run.progress))
    except (TroughputError, KnobError) as e:
        print(f"troughput: error: {e}", file=sys.stderr)
        sys.exit(2)
    if not (HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN"):
        print_summary([row], Path(cfg.run.results_dir))
    elif row["status"] != "ok":
        print(f"troughput: run {row['run_id']} {row['status']}: {row['error'].splitlines()[0] if row['error'] else ''}",
              file=sys.stderr)
    return row["status"]


class SummaryCallback(Callback):
    """At the end of a multirun, print the summary table of the rows it wrote."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.run.results import read_rows

        results_dir = Path(config.run.results_dir)
        rows = [r for r in read_rows(results_dir) if r.get("sweep_id") == config.hydra.sweep.dir]
        print_summary(rows, results_dir)


if __name__ == "__main__":
    main()
