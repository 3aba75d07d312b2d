"""The documentation's generated part and the checks MkDocs' strict build cannot make.

``python -m harness.docs`` rewrites the knob table in ``docs/knobs.md`` from the engine units
(``engines.knobs.knob_table_markdown``); ``python -m harness.docs --check`` exits 1 when it is stale.
``missing_references`` lists the repository paths a page names that do not exist: MkDocs checks
links between pages inside ``docs/`` only, while pages and the README also name source files
(``harness/run/runner.py``) and the README links into ``docs/``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KNOBS_PAGE = ROOT / "docs" / "knobs.md"
TABLE_START, TABLE_END = "<!-- knob-table:start -->\n", "\n<!-- knob-table:end -->"

# A repository path in prose, a code span or a command: one of the tracked top-level folders, then
# path characters. Not preceded by a path character, so another project's `vllm/benchmarks/x.py`
# is not read as ours; a placeholder (`engines/<name>.py`) ends the path before the `<`.
_TOP = r"(?:harness|engines|sweeps|conf|benchmarks|tests)"
_REPO_PATH = re.compile(rf"(?<![\w/.$~-]){_TOP}/[\w./-]*\w")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def embed_knob_table(page: str, source: str = "docs/knobs.md") -> str:
    """``page`` with the text between the knob-table markers replaced by the table the code renders."""
    from engines.knobs import knob_table_markdown

    if TABLE_START not in page or TABLE_END not in page:
        raise ValueError(f"{source}: the markers {TABLE_START.strip()} and {TABLE_END.strip()} are missing")
    head, rest = page.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    return head + TABLE_START + knob_table_markdown() + TABLE_END + tail


def missing_references(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for each repository path or relative link in ``path`` that does not exist.

    Links are resolved from the file's folder, with their anchor where they name a Markdown page;
    links to a web address or to an anchor of the same page are left to MkDocs (which also checks
    every link between pages of ``docs/``).
    """
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for match in _REPO_PATH.finditer(line):
            name = match.group(0).rstrip(".")
            if not (root / name).exists():
                problems.append(f"{path.relative_to(root)}:{number}: names {name}, which does not exist")
        for match in _LINK.finditer(line):
            target = match.group(1).split("#", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            if not (path.parent / target).exists():
                problems.append(f"{path.relative_to(root)}:{number}: links to {target}, which does not exist")
            elif "#" in match.group(1) and target.endswith(".md"):
                anchor = match.group(1).split("#", 1)[1]
                if anchor not in heading_anchors(path.parent / target):
                    problems.append(f"{path.relative_to(root)}:{number}: links to {target}#{anchor}, "
                                    f"a heading that does not exist")
    return problems


def heading_anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives the headings of ``page`` (Python-Markdown's ``toc`` slugs)."""
    from markdown.extensions.toc import slugify  # MkDocs' own dependency: the test extra installs it

    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slugify(re.sub(r"[`*]", "", m.group(1)), "-") for m in re.finditer(r"^#{1,6} +(.+?) *$", text, re.M)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    page = KNOBS_PAGE.read_text(encoding="utf-8")
    fresh = embed_knob_table(page)
    if "--check" in args:
        if fresh != page:
            print(f"{KNOBS_PAGE.relative_to(ROOT)}: the knob table is stale; run: python -m harness.docs")
            return 1
        return 0
    KNOBS_PAGE.write_text(fresh, encoding="utf-8")
    print(f"wrote the knob table into {KNOBS_PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
