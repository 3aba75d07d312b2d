"""Hydra finds each registered engine's own config directory (``EngineUnit.conf``) through this plugin.

Hydra imports every module under the ``hydra_plugins`` namespace package when it builds a
config search path (``troughput-run``, ``troughput-tune``, ``troughput-batch``, the compose
API in tests and benchmarks alike), so an engine installed as a separate package, with an
entry point in ``troughput.engines``, brings its ``engine/<name>.yaml`` with no edit to
troughput's ``conf/``. Built-in engines keep theirs in ``conf/engine/`` and name no directory.
"""

from __future__ import annotations

import warnings

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class EngineConfSearchPath(SearchPathPlugin):
    """Appends ``file://<EngineUnit.conf>`` for every registered unit that names a config directory."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Hydra runs this for every Hydra app in the environment, not only troughput's: never fail one.
        try:
            from engines import units

            found = [unit for unit in units() if getattr(unit, "conf", None)]
        except Exception as error:  # noqa: BLE001 - another project's ``engines``, an old checkout
            warnings.warn(f"troughput's engine config search path is not added: {type(error).__name__}: {error}",
                          stacklevel=2)
            return
        for unit in found:
            search_path.append(provider=f"troughput-engine-{unit.name}", path=f"file://{unit.conf}")
