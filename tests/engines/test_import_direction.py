"""The worker side never imports the driver side: no module under engines/ imports harness/ or sweeps/."""

import ast

from tests.conftest import ROOT

DRIVER_PACKAGES = ("harness", "sweeps")


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


def test_no_module_under_engines_imports_the_driver_side():
    modules = sorted((ROOT / "engines").rglob("*.py"))
    assert len(modules) > 10, "the engines package was found"
    offenders = [hit for path in modules for hit in driver_imports(path)]
    assert offenders == [], "\n".join(offenders)


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from harness.perfmodel import x\n    import sweeps.study\n")
    assert len(driver_imports(module, tmp_path)) == 2
