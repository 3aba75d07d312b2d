"""What the engine adapters share: environment checks, native-name checks, dtype names, images, request counters.

Worker side: standard library only at import time (PIL and torch are imported
inside the functions that need them).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.base import EngineStats, EngineUnavailable, KnobError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENVS_DIR = PROJECT_ROOT / ".venvs"


def env_python(env: str, envs_dir: Path = ENVS_DIR) -> Path:
    """The interpreter of the environment ``troughput-env ENV`` creates."""
    return envs_dir / env / "bin" / "python"


def python_variable(env: str) -> str:
    """The environment variable ``conf/engine/<env>.yaml`` reads ``engine.python`` from."""
    return f"TROUGHPUT_PYTHON_{env.upper()}"


def require_module(module: str, label: str, env: str) -> None:
    """Raise ``EngineUnavailable`` with the fix when ``module`` is not importable in this interpreter."""
    if importlib.util.find_spec(module) is not None:
        return
    made = env_python(env)
    how = f"engine.python={made} (or export {python_variable(env)}={made})"
    if made.exists() and Path(sys.executable).resolve() != made.resolve():
        fix = f"its environment exists: set {how}"
    else:
        fix = f"create its environment with `troughput-env {env}` and set {how}"
    raise EngineUnavailable(f"{module} is not installed for {sys.executable}, so {label} cannot run here; {fix}")


def require_cuda(label: str) -> None:
    """Raise ``EngineUnavailable`` with the precise reason when ``label`` cannot use a CUDA GPU from here.

    The reasons are ``engines.requirements``'s, the same ``troughput-env ENGINE --check`` prints:
    a torch built for another CUDA than the engine (or a CPU build), and, when torch sees no GPU,
    each unmet host requirement (no driver, a driver too old for the engine's CUDA, GPUs hidden
    by CUDA_VISIBLE_DEVICES, a missing toolkit or library), each with its fix.
    """
    from engines import requirements, units

    try:
        import torch
    except ImportError as e:
        raise EngineUnavailable(f"{label} needs PyTorch with CUDA; torch is not importable in {sys.executable}") from e
    engine = next((u for u in units() if u.label == label), None)
    environment = engine.environment() if engine else None
    problems = requirements.torch_problems(environment, label, torch.__version__, torch.version.cuda,
                                           engine.name, sys.executable) if environment else []
    available = torch.cuda.is_available()
    if available and not problems:
        return
    if not available and environment:
        facts = requirements.probe_host(tuple(name for name, _ in environment.libraries))
        problems += requirements.unmet(environment, facts, label)
    if problems:
        raise EngineUnavailable(f"{label} cannot run here: " + "; ".join(f"({i}) {p}" for i, p in
                                                                     enumerate(problems, 1)))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    raise EngineUnavailable(f"{label} needs an NVIDIA GPU; none is visible (CUDA_VISIBLE_DEVICES={visible}, "
                            f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})")


def check_names(names: Iterable[str], known: Iterable[str], label: str, source: str) -> None:
    """Raise ``KnobError`` naming every name not in ``known``, with close matches as hints."""
    known = set(known)
    unknown = sorted(set(names) - known)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=2)
        if close:
            hints.append(f"{name} -> {' or '.join(close)}?")
    hint = f"; did you mean: {', '.join(hints)}" if hints else ""
    raise KnobError(f"unknown {label} knob(s) {unknown}: not {source}{hint}")


def dtype_name(dtype: Any) -> str:
    """A framework dtype as the plain name rows record: ``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def load_images(paths: Iterable[str]) -> list[Any]:
    """The image files as RGB PIL images."""
    from PIL import Image

    return [Image.open(path).convert("RGB") for path in paths]


@dataclass
class RequestCounters:
    """Engine counters summed from per-request reports, for engines without global counters.

    Prefix-cache queries are prompt tokens and hits are cached prompt tokens, so the
    hit rate is cached / prompt tokens, the same quantity vLLM's counters give.
    """

    preemptions: int | None = None
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, prompt_tokens: int, cached_tokens: int | None, preemptions: int | None = None) -> None:
        self.prefix_cache_queries += prompt_tokens
        self.prefix_cache_hits += cached_tokens or 0
        if preemptions is not None:
            self.preemptions = (self.preemptions or 0) + preemptions

    def stats(self) -> EngineStats:
        return EngineStats(preemptions=self.preemptions, prefix_cache_queries=self.prefix_cache_queries,
                           prefix_cache_hits=self.prefix_cache_hits, extra=dict(self.extra))


def shutdown(engine: Any) -> None:
    """``Engine.stop`` for adapters whose engine object (``engine.llm``) has ``shutdown()``."""
    llm = getattr(engine, "llm", None)
    if llm is not None:
        llm.shutdown()
        del engine.llm
    engine.started = False
