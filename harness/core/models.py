"""Resolving a model config to a local directory, building the embedded tiny models on first use."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any, Mapping

from engines.common import PROJECT_ROOT
from harness.core.errors import TroughputError

log = logging.getLogger(__name__)
# What the harness reads itself; weights stay with the engine.
METADATA_FILES = ["config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json",
                  "chat_template*", "preprocessor_config.json", "processor_config.json"]


def resolve_model(cfg: Mapping[str, Any], python: str) -> dict[str, Any]:
    """The model config plus ``local_dir``: a local directory holding at least its metadata.

    ``path`` stays what the engine loads (a directory or a hub id).

    A model with ``build`` set is built there by ``engines.build_tiny`` under the
    engine's interpreter ``python`` if missing. A hub id is looked up in the local
    Hugging Face cache (downloading its metadata only if the user's network allows).
    """
    model = dict(cfg)
    path = Path(str(model["path"])).expanduser()
    if model.get("build"):
        path = path if path.is_absolute() else PROJECT_ROOT / path
        if not (path / "config.json").exists():
            log.info("building model %r into %s (first use)", model["build"], path)
            proc = subprocess.run([python, "-m", "engines.build_tiny", model["build"], str(path)],
                                  cwd=PROJECT_ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise TroughputError(f"building model {model['build']!r} failed:\n{proc.stderr[-3000:]}")
        model["path"] = model["local_dir"] = str(path)
    elif path.is_dir():
        model["path"] = model["local_dir"] = str(path.resolve())
    else:
        model["local_dir"] = _hub_metadata(str(model["path"]))
    return model


def _hub_metadata(repo_id: str) -> str:
    """A local snapshot of a hub model's config and tokenizer files."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, allow_patterns=METADATA_FILES)
    except Exception as e:  # noqa: BLE001 - any failure here means the same fix
        raise TroughputError(f"model {repo_id!r} is neither a local directory nor a reachable hub id ({e}); "
                             "set model.path to a local copy") from e
