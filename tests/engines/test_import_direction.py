"""Import direction: the worker side never imports the driver; no import circles; no room imports one above it.

Every ``import``/``from ... import`` counts, at any depth (module level, inside functions, under
``if TYPE_CHECKING``), over engines/, hydra_plugins/, harness/ and benchmarks/.
"""

import ast
from pathlib import Path

from tests.conftest import ROOT

DRIVER_PACKAGES = ("harness",)
PACKAGES = ("engines", "hydra_plugins", "harness", "benchmarks")
# The rooms, lowest first, in the order data flows (docs/design.md#rooms); rooms on one line are siblings.
# A module may import its own room and rooms below it, never a sibling or a room above.
ROOMS = [
    ("engines/",),
    ("hydra_plugins/",),  # finds engine units' conf directories for Hydra
    ("harness/core/",),
    ("harness/workloads/",),
    ("harness/ordering/",),
    ("harness/quality/",),
    ("harness/steps/",),  # step traces: stored, fitted into a step model, replayed for predictions
    ("harness/run/",),
    ("harness/report/",),
    ("harness/calibration/", "harness/tune/"),  # harness/tune/: troughput-tune's Optuna studies
    ("harness/batch/job/",),  # the batch job itself: plan, shards, conversion, output, state, its row
    ("harness/batch/scale/", "harness/batch/tune/"),  # where it runs (batch.scale); in-job tuning
    ("harness/batch/",),  # troughput-batch: one invocation (launch.py) and its CLI, run with a chosen config or tuned
    ("harness/",),  # the top-level CLI modules (harness/cli.py, harness/docs.py)
    ("benchmarks/",),
]


def driver_imports(path, root=ROOT) -> list[str]:
    """Every ``import``/``from ... import`` of a driver package in one module, at any depth (functions too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno} imports {name}" for name in names
                  if name.split(".")[0] in DRIVER_PACKAGES]
    return found


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of troughput's packages under ``root``."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def import_graph(root: Path, packages: bool = False) -> dict[str, dict[str, int]]:
    """Module -> {imported troughput module: first line}; ``from pkg import sub`` points at the submodule.

    ``importlib.import_module("a.b")`` with a literal name counts like ``import a.b``. With ``packages``,
    importing ``a.b.c`` also counts ``a`` and ``a.b``, whose ``__init__.py`` that import runs (for circles),
    except the importer's own enclosing packages (already being imported when it runs).
    """
    known = modules(root)
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges = graph.setdefault(name, {})
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            elif _literal_import(node):
                targets = [node.args[0].value]
            else:
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                parts = target.split(".") if target else []
                if target and target != name:
                    edges.setdefault(target, node.lineno)
                for enclosing in (".".join(parts[:n]) for n in range(1, len(parts)) if packages):
                    if enclosing in known and not name.startswith(enclosing + "."):
                        edges.setdefault(enclosing, node.lineno)
    return graph


def _literal_import(node: ast.AST) -> bool:
    """``importlib.import_module("a.b")`` or ``__import__("a.b")`` with a string literal."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant) \
            or not isinstance(node.args[0].value, str):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import circles: strongly connected sets of two or more modules (Tarjan), each as one path round it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(_round(graph, set(members)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _round(graph: dict[str, dict[str, int]], members: set[str]) -> list[str]:
    """One path from the first member back to itself inside ``members`` (breadth first)."""
    start = min(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                return paths[v] + [start]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(members)


def describe(graph: dict[str, dict[str, int]], path: list[str], known: dict[str, Path], root: Path) -> str:
    return " -> ".join(f"{a} ({known[a].relative_to(root)}:{graph[a][b]})" for a, b in zip(path, path[1:])) \
        + f" -> {path[-1]}"


def room_of(path: Path, root: Path) -> tuple[int, str]:
    """The rank and room of one file: the room whose folder holds it most closely."""
    rel = path.relative_to(root).as_posix()
    rooms = [(len(prefix), rank, prefix) for rank, line in enumerate(ROOMS) for prefix in line
             if rel.startswith(prefix)]
    _, rank, prefix = max(rooms)
    return rank, prefix


def upward_imports(root: Path) -> list[str]:
    known = modules(root)
    graph = import_graph(root)
    found = []
    for name, edges in graph.items():
        rank, room = room_of(known[name], root)
        for target, line in edges.items():
            their_rank, their_room = room_of(known[target], root)
            if their_room != room and their_rank >= rank:
                why = "a sibling room" if their_rank == rank else "a room above"
                found.append(f"{known[name].relative_to(root)}:{line} ({room}) imports {target} ({their_room}): {why}")
    return found


def test_no_module_under_engines_imports_the_driver_side():
    modules_ = sorted((ROOT / "engines").rglob("*.py"))
    assert len(modules_) > 10, "the engines package was found"
    offenders = [hit for path in modules_ for hit in driver_imports(path)]
    assert offenders == [], "\n".join(offenders)


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from harness.perfmodel import x\n    import harness.tune.study\n")
    assert len(driver_imports(module, tmp_path)) == 2


def test_no_import_circles():
    graph = import_graph(ROOT, packages=True)
    assert len(graph) > 100, "troughput's modules were found"
    found = circles(graph)
    known = modules(ROOT)
    assert found == [], "import circles:\n" + "\n".join(describe(graph, c, known, ROOT) for c in found)


def test_no_import_runs_back_up_the_rooms():
    found = upward_imports(ROOT)
    assert found == [], "imports against the room order (tests/engines/test_import_direction.py ROOMS):\n" \
        + "\n".join(found)


def test_every_room_exists_and_says_what_it_is_for():
    for line in ROOMS:
        for prefix in line:
            init = ROOT / prefix / "__init__.py"
            # benchmarks/ holds scripts; hydra_plugins/ must be a namespace package for Hydra to merge it
            assert init.is_file() or prefix in ("benchmarks/", "hydra_plugins/"), f"room {prefix} is a package"
            if init.is_file() and prefix.startswith("harness/"):
                doc = ast.get_docstring(ast.parse(init.read_text()))
                assert doc and doc.strip(), f"{init.relative_to(ROOT)} has a one-line purpose docstring"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_circle_check_sees_circles_through_function_imports_and_packages(tmp_path):
    root = _package(tmp_path, {
        "harness/__init__.py": "",
        "harness/run/__init__.py": "from harness.run import runner\n",
        "harness/run/runner.py": "def f():\n    from harness.quality import assess\n",
        "harness/quality/__init__.py": "from .reference import compute\nassess = compute\n",
        "harness/quality/reference.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from harness.run.runner import RunSpec\ndef compute(): ...\n",
    })
    found = circles(import_graph(root))
    assert found == [["harness.quality", "harness.quality.reference", "harness.run.runner", "harness.quality"]]


def test_the_circle_check_sees_circles_through_a_package_init_and_import_module(tmp_path):
    """``harness.run`` runs ``harness.quality``'s ``__init__`` by importing a submodule of it; ``harness.report.x``
    is imported by name."""
    through_init = _package(tmp_path / "a", {
        "harness/__init__.py": "",
        "harness/run/__init__.py": "from harness.quality.subject import X\n",
        "harness/run/spec.py": "",
        "harness/quality/__init__.py": "from harness.run.spec import Y\n",
        "harness/quality/subject.py": "X = 1\n",
    })
    assert circles(import_graph(through_init, packages=True)) == [["harness.quality", "harness.run", "harness.quality"]]
    assert circles(import_graph(through_init)) == [], "without packages, only the named modules count"
    by_name = _package(tmp_path / "b", {
        "harness/__init__.py": "",
        "harness/run/__init__.py": "",
        "harness/run/spec.py": "import importlib\nreport = importlib.import_module('harness.report.x')\n",
        "harness/report/__init__.py": "",
        "harness/report/x.py": "import harness.run.spec as spec\n",
    })
    assert circles(import_graph(by_name)) == [["harness.report.x", "harness.run.spec", "harness.report.x"]]


def test_the_room_check_sees_an_import_up_and_one_across(tmp_path):
    root = _package(tmp_path, {
        "harness/__init__.py": "",
        "harness/workloads/__init__.py": "def f():\n    import harness.run.spec\n",
        "harness/run/__init__.py": "",
        "harness/run/spec.py": "from harness.workloads import f\n",
        "harness/calibration/__init__.py": "from harness.tune import fit\n",
        "harness/tune/__init__.py": "fit = 1\n",
    })
    found = sorted(upward_imports(root))
    assert [f.split(":")[0] for f in found] == ["harness/calibration/__init__.py", "harness/workloads/__init__.py"]
    assert "a sibling room" in found[0] and "a room above" in found[1]
