"""Loaded by every Python process a test starts (``PYTHONPATH``): logs each import of an engine package.

The autouse fixture in ``tests/conftest.py`` puts this folder first on ``PYTHONPATH`` and names a log
file in ``TROUGHPUT_TEST_ENGINE_LOG`` for tests not marked ``engine``; a line in that log fails the test.
Only an import that runs the package counts: looking it up (``importlib.util.find_spec``, as the
environment probes do) does not.
"""

import os
import sys
from importlib.machinery import PathFinder

ENGINE_PACKAGES = ("vllm", "ray", "sglang", "tensorrt_llm")


class _LoggedLoader:
    """The package's own loader, writing one line to the log before it runs the package."""

    def __init__(self, loader, log: str, name: str):
        self._loader, self._log, self._name = loader, log, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with open(self._log, "a", encoding="utf-8") as f:
            f.write(f"{self._name} imported by pid {os.getpid()}: {' '.join(sys.argv)[:300]}\n")
        self._loader.exec_module(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class EngineImportSpy:
    """A meta-path finder that hands out engine packages behind a loader that logs their import."""

    def __init__(self, log: str):
        self.log = log

    def find_spec(self, name, path=None, target=None):
        if name not in ENGINE_PACKAGES:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoggedLoader(spec.loader, self.log, name)
        return spec


if os.environ.get("TROUGHPUT_TEST_ENGINE_LOG"):
    sys.meta_path.insert(0, EngineImportSpy(os.environ["TROUGHPUT_TEST_ENGINE_LOG"]))
