"""``index.html``: one self-contained file (styles inline, plots as data: URIs, no script, no network)."""

from __future__ import annotations

import base64
import os
from html import escape
from pathlib import Path

from harness.report.document import Details, Figure, Paragraph, RowLink, Table

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1600px;
       padding: 0 24px; color: #1b1f24; }
h1 { font-size: 24px; } h2 { font-size: 19px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 12.5px; }
th, td { border: 1px solid #d0d7de; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } tr:nth-child(even) td { background: #fbfcfd; }
.scroll { overflow-x: auto; } code { font-size: 11.5px; background: #f6f8fa; padding: 0 3px; }
figure { margin: 12px 0 24px; } figure img { max-width: 100%; border: 1px solid #eaeef2; }
figcaption { color: #57606a; font-size: 12.5px; max-width: 900px; }
nav a { margin-right: 14px; } pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 11.5px; }
td.v-clear-winner { background: #dafbe1 !important; } td.v-too-close-to-call { background: #fff8c5 !important; }
td.v-insufficient-data { background: #ffebe9 !important; }
"""


def write(report, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "index.html"
    target.write_text(render(report, out_dir), encoding="utf-8")
    return target


def render(report, out_dir: Path) -> str:
    nav = " ".join(f'<a href="#{s.id}">{escape(s.title)}</a>' for s in report.sections)
    body = [f"<h1>troughput report: {escape(report.name)}</h1>", f"<nav>{nav}</nav>"]
    for section in report.sections:
        body.append(f'<section id="{escape(section.id)}"><h{section.level}>{escape(section.title)}</h{section.level}>')
        body += [_block(block, report, out_dir) for block in section.blocks]
        body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>troughput report: {escape(report.name)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _block(block, report, out_dir: Path) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_cell(block.parts, report, out_dir)}</p>"
    if isinstance(block, Table):
        return _table(block, report, out_dir)
    if isinstance(block, Figure):
        data = base64.b64encode(block.plot.png).decode("ascii")
        return (f'<figure id="plot-{escape(block.plot.name)}"><img src="data:image/png;base64,{data}" '
                f'alt="{escape(block.plot.title)}"><figcaption><b>{escape(block.plot.title)}.</b> '
                f"{escape(block.plot.caption)}</figcaption></figure>")
    if isinstance(block, Details):
        return f"<details><summary>{escape(block.summary)}</summary><pre>{escape(block.text)}</pre></details>"
    raise TypeError(f"unknown block {block!r}")


def _table(table: Table, report, out_dir: Path) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    lines = []
    for i, row in enumerate(table.rows):
        row_id = f' id="{escape(table.row_ids[i])}"' if table.row_ids else ""
        cells = []
        for column, cell in zip(table.columns, row):
            text = _cell(cell, report, out_dir)
            if column in table.code_columns and text not in ("", "–"):
                text = f"<code>{text}</code>"
            css = f' class="v-{str(cell).split(" (")[0].replace(" ", "-")}"' if column == "verdict" and cell else ""
            cells.append(f"<td{css}>{text}</td>")
        lines.append(f"<tr{row_id}>{''.join(cells)}</tr>")
    table_id = f' id="{escape(table.id)}"' if table.id else ""
    return (f'<div class="scroll"><table{table_id}><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(lines)}</tbody></table></div>')


def _cell(cell, report, out_dir: Path) -> str:
    if isinstance(cell, list):
        return "".join(_cell(c, report, out_dir) for c in cell)
    if isinstance(cell, RowLink):
        if cell.kind == "runs":
            href = f"#run-{cell.id}"
        else:
            href = Path(os.path.relpath(report.results_dir.resolve() / cell.kind / f"{cell.id}.json",
                                        out_dir.resolve())).as_posix()
        return f'<a href="{escape(href)}">{escape(cell.label)}</a>'
    return escape(str(cell))
