"""Shared fixtures: a fake model directory (vocabulary only), project paths, and the ``engine`` marker's guard."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_ENGINE = "tests.fake_engine:FakeEngine"
GUARD_DIR = Path(__file__).resolve().parent / "engine_guard"


def _load_guard():
    """``engine_guard/sitecustomize.py`` as a module of its own name (it is not this process's sitecustomize)."""
    spec = importlib.util.spec_from_file_location("troughput_engine_guard", GUARD_DIR / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EngineImportSpy = _load_guard().EngineImportSpy


@pytest.fixture(autouse=True)
def engine_marker_is_honest(request, tmp_path_factory, monkeypatch):
    """Fail a test not marked ``engine`` that imports vLLM, Ray, SGLang or TensorRT-LLM, here or in a child.

    Children (engine workers, ``ray start``, CLI runs) are watched through ``engine_guard/sitecustomize.py``
    on ``PYTHONPATH``; this process through the same finder, plus a check that no Ray client was left
    connected. ``pytest -m "not engine"`` therefore starts no engine: a test that would is failed here.
    """
    if request.node.get_closest_marker("engine") is not None:
        yield
        return
    log = tmp_path_factory.mktemp("engine-guard") / "imports.log"
    monkeypatch.setenv("TROUGHPUT_TEST_ENGINE_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(GUARD_DIR), os.environ.get("PYTHONPATH")])))
    spy = EngineImportSpy(str(log))
    sys.meta_path.insert(0, spy)
    ray_before = _ray_connected()
    try:
        yield
    finally:
        sys.meta_path.remove(spy)
    started = log.read_text(encoding="utf-8") if log.exists() else ""
    if _ray_connected() and not ray_before:
        started += "ray.init() in the test process\n"
    if started:
        pytest.fail(f"{request.node.nodeid} starts an engine but is not marked @pytest.mark.engine:\n{started}",
                    pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test that asks for ``ray_head`` must be marked ``engine`` and ``xdist_group("ray")``; checked before
    the head starts, since ``ray start`` runs without PYTHONPATH (tests/ray_head.py), out of the guard's sight,
    and a second pytest worker outside the group would start a second head."""
    if "ray_head" not in getattr(item, "fixturenames", ()):
        return
    groups = [m.args[0] if m.args else m.kwargs.get("name") for m in item.iter_markers("xdist_group")]
    missing = [what for what, ok in (("@pytest.mark.engine", item.get_closest_marker("engine") is not None),
                                     ('@pytest.mark.xdist_group("ray")', "ray" in groups)) if not ok]
    if missing:
        pytest.fail(f"{item.nodeid} uses the ray_head fixture (a Ray cluster) but is not marked "
                    f"{' and '.join(missing)}", pytrace=False)


def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` every test marked ``xdist_group`` must carry its group in its node id (xdist
    schedules by it); a pytest and pytest-xdist pair that drops it would silently run the Ray tests on every
    worker, each with a Ray head of its own: fail the session instead."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist workers only
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest {pytest.__version__} with this pytest-xdist ignores xdist_group (e.g. "
                                f"{lost[0]}): install the test extra's pins (pyproject.toml)")


def pytest_configure(config):
    """The known bad pair, named before any worker starts (a worker's own error reaches the terminal garbled)."""
    if config.getvalue("dist") == "loadgroup" and not hasattr(config, "workerinput"):
        version = tuple(int(part) for part in pytest.__version__.split(".")[:2] if part.isdigit())
        if version >= (9, 2):
            raise pytest.UsageError(f"pytest {pytest.__version__}: pytest-xdist's xdist_group does not work with "
                                    "pytest>=9.2; install the test extra's pins (`make env`, pyproject.toml)")


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


@pytest.fixture
def vocab_dir(tmp_path: Path) -> Path:
    """A model directory with a 100-token vocabulary, 4 special tokens and an ``<image>`` token."""
    vocab = {f"t{i}": i for i in range(100)}
    added = [{"id": i, "content": c} for i, c in enumerate(["<unk>", "<s>", "</s>", "<pad>"])]
    added.append({"id": 100, "content": "<image>"})
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": added}))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 101}))
    return tmp_path


@pytest.fixture
def python() -> str:
    return sys.executable


def compose(*overrides: str, config_name: str = "config"):
    """The troughput-run (or ``tuning``) config for ``overrides``, composed as Hydra would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides))


@pytest.fixture(scope="session")
def ray_head():
    """The session's one Ray head (tests/ray_head.py); its users are marked ``engine`` and ``xdist_group("ray")``
    (``pytest_runtest_setup`` above fails one that is not)."""
    from tests.ray_head import RAY, start_head

    if not RAY.exists():
        pytest.skip("ray is not installed (the ray extra)")
    yield from start_head()
