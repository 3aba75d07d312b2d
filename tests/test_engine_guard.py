"""The ``engine`` marker's guard (tests/conftest.py) catches an unmarked test that starts an engine or a Ray head."""

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

UNMARKED = '''
import subprocess, sys

def test_imports_ray_in_a_child():
    subprocess.run([sys.executable, "-c", "import ray"], check=True)

def test_stays_engine_free():
    subprocess.run([sys.executable, "-c", "import json"], check=True)

def test_asks_for_the_ray_head(ray_head):
    pass
'''


def test_an_unmarked_test_that_imports_an_engine_in_a_child_fails(tmp_path):
    test_file = ROOT / "tests" / f"test_guard_probe_{tmp_path.name}.py"
    test_file.write_text(textwrap.dedent(UNMARKED))
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                               str(test_file)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        test_file.unlink()
    # the errors: the child's import at its teardown; the Ray head's user at its setup, before the head starts
    assert proc.returncode == 1 and "2 passed, 2 errors" in proc.stdout, proc.stdout[-3000:]
    assert "test_imports_ray_in_a_child starts an engine but is not marked @pytest.mark.engine" in proc.stdout
    assert "ray imported by pid" in proc.stdout
    assert ('test_asks_for_the_ray_head uses the ray_head fixture (a Ray cluster) but is not marked '
            '@pytest.mark.engine and @pytest.mark.xdist_group("ray")') in proc.stdout
