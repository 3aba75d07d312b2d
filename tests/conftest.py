"""Shared fixtures: a fake model directory (vocabulary only) and project paths."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_ENGINE = "tests.fake_engine:FakeEngine"


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
