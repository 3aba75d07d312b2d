"""Builds the embedded default models locally: ``python -m engines.build_tiny KIND OUT_DIR``.

KIND is ``tiny`` (the Llama of ``engines.tiny_model``) or ``tiny_vlm`` (the Idefics3 of
``engines.tiny_vlm``). Runs under an engine's interpreter (it needs torch, transformers
and tokenizers); the harness calls it when a model directory is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from engines.tiny_model import build_tiny
from engines.tiny_vlm import build_tiny_vlm

BUILDERS = {"tiny": build_tiny, "tiny_vlm": build_tiny_vlm}


def build(kind: str, out_dir: str | os.PathLike) -> Path:
    """Build ``kind`` into ``out_dir`` atomically (a half-built model never appears there)."""
    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    if kind not in BUILDERS:
        raise SystemExit(f"unknown tiny model kind {kind!r}; known: {', '.join(BUILDERS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        BUILDERS[kind](tmp)
        (tmp / "troughput_build.json").write_text(json.dumps({"kind": kind}))
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():  # lost a race with another builder: theirs is as good
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m engines.build_tiny KIND OUT_DIR")
    print(build(sys.argv[1], sys.argv[2]))
