"""The documentation: MkDocs' strict build, repository paths the pages name, and the README's size."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.docs import missing_references
from tests.conftest import ROOT

README_MAX_LINES = 250


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config`` into ``site``, as a user runs it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's end-of-life banner, not a build warning
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, timeout=300)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_strict_build_passes(tmp_path):
    out = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "guides" / "run" / "index.html").is_file()


def test_the_strict_build_fails_on_a_broken_link_a_bad_anchor_and_a_page_outside_nav(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md) and [here](knobs.md#no-such-heading)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in nav\n")
    out = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0
    log = out.stdout + out.stderr
    assert "no-such-page.md" in log and "no-such-heading" in log and "orphan.md" in log, log


def test_pages_and_the_readme_name_only_files_that_exist():
    problems = [p for page in pages() for p in missing_references(page)]
    assert problems == []


def test_missing_references_names_the_file_and_line(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "real.py").write_text("")
    (tmp_path / "there.md").write_text("# There\n\n## A `code` heading\n")
    page = tmp_path / "page.md"
    page.write_text("`harness/real.py` and [ok](there.md#a-code-heading), vllm's `vllm/benchmarks/gone.py`\n"
                    "`harness/gone.py` and [bad](missing.md#x), [web](https://example.com), `engines/<name>.py`\n"
                    "[no such heading](there.md#elsewhere)\n")
    assert missing_references(page, root=tmp_path) == [
        "page.md:2: names harness/gone.py, which does not exist",
        "page.md:2: links to missing.md, which does not exist",
        "page.md:3: links to there.md#elsewhere, a heading that does not exist"]


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def workflow_commands() -> list[str]:
    """The command lines in the README's workflow section, in order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The workflow in four commands", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_workflow_composes_and_getting_started_shows_the_same_commands():
    """Every workflow command's overrides exist in its config (as Hydra composes them), and the site repeats them."""
    from tests.conftest import compose

    configs = {"troughput-run": "config", "troughput-tune": "tuning", "troughput-batch": "batch"}
    commands = workflow_commands()
    assert [c.split()[0] for c in commands] == ["troughput-run", "troughput-tune", "troughput-report", "python",
                                                "troughput-batch"]
    for command in commands:
        program, *args = command.split()
        if program in configs:
            multirun = "-m" in args
            overrides = [a.split("=", 1)[0] + "=" + a.split("=", 1)[1].split(",")[0] if multirun else a
                         for a in args if a != "-m"]
            assert compose(*overrides, config_name=configs[program]) is not None, command
    started = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert [c for c in commands if c not in started] == []
