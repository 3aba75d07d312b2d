"""``report.md``: GitHub-flavoured markdown, plots as PNG files beside it, row links to the results files."""

from __future__ import annotations

import os
from pathlib import Path

from harness.report.document import Details, Figure, Paragraph, RowLink, Table


def write(report, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    for plot in report.plots:
        (out_dir / f"{plot.name}.png").write_bytes(plot.png)
    target = out_dir / "report.md"
    target.write_text(render(report, out_dir), encoding="utf-8")
    return target


def render(report, out_dir: Path) -> str:
    lines = [f"# troughput report: {_text(report.name)}", "",
             " · ".join(f"[{s.title}](#{_anchor(s.title)})" for s in report.sections), ""]
    for section in report.sections:
        lines += [f"{'#' * section.level} {_text(section.title)}", ""]
        for block in section.blocks:
            lines += [*_block(block, report, out_dir), ""]
    return "\n".join(lines).rstrip() + "\n"


def _block(block, report, out_dir: Path) -> list[str]:
    if isinstance(block, Paragraph):
        return [_cell(block.parts, report, out_dir)]
    if isinstance(block, Table):
        return table_lines(block, report, out_dir)
    if isinstance(block, Figure):
        return [f"![{_text(block.plot.title)}]({block.plot.name}.png)", "",
                f"*{_text(block.plot.title)}.* {_text(block.plot.caption)}"]
    if isinstance(block, Details):
        return [f"<details><summary>{_text(block.summary)}</summary>", "", "~~~~text",
                block.text.replace("~~~~", "~~~"), "~~~~", "", "</details>"]
    raise TypeError(f"unknown block {block!r}")


def table_lines(table: Table, report, out_dir: Path) -> list[str]:
    """A GFM table: header, separator, one line per row, every line with the same number of cells."""
    header = "| " + " | ".join(_text(c).replace("|", "\\|") for c in table.columns) + " |"
    lines = [header, "|" + "|".join("---" for _ in table.columns) + "|"]
    for row in table.rows:
        cells = []
        for column, cell in zip(table.columns, row):
            text = _cell(cell, report, out_dir, code=column in table.code_columns)
            cells.append(text.replace("|", "\\|").replace("\n", "<br>") or " ")
        cells += [" "] * (len(table.columns) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cell(cell, report, out_dir: Path, code: bool = False) -> str:
    if isinstance(cell, list):
        return "".join(_cell(c, report, out_dir) for c in cell)
    if isinstance(cell, RowLink):
        path = os.path.relpath(report.results_dir.resolve() / cell.kind / f"{cell.id}.json", out_dir.resolve())
        return f"[{_text(cell.label)}]({Path(path).as_posix()})"
    text = str(cell)
    if code and text not in ("", "–"):
        fence = "``" if "`" in text else "`"
        return f"{fence}{text}{fence}"
    return _text(text)


def _text(text: str) -> str:
    """Plain text safe for markdown: no raw HTML, no accidental emphasis or links."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "\\*[]`":
        text = text.replace(char, "\\" + char)
    return text


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")
