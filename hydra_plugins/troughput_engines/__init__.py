"""Hydra finds each registered engine's own config directory (``EngineUnit.conf``) through this plugin.

Hydra imports every module under the ``hydra_plugins`` namespace package when it builds a
config search path (``troughput-run``, ``troughput-tune``, ``troughput-batch``, the compose
API in tests and benchmarks alike), so an engine installed as a separate package, with an
entry point in ``troughput.engines``, brings its ``engine/<name>.yaml`` with no edit to
troughput's ``conf/``. Built-in engines keep theirs in ``conf/engine/`` and name no directory.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class EngineConfSearchPath(SearchPathPlugin):
    """Appends ``file://<EngineUnit.conf>`` for every registered unit that names a config directory."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from engines import units

        for unit in units():
            if unit.conf:
                search_path.append(provider=f"troughput-engine-{unit.name}", path=f"file://{unit.conf}")
