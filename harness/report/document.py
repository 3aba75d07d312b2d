"""The report as a small document tree that both writers render: sections of paragraphs, tables,
figures, code and collapsible details. Cells are plain text or links to rows of the results table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Union

from harness.report.plots import Plot


@dataclass
class RowLink:
    """A link to one row of the results table: ``kind`` is ``runs`` or ``decisions``."""

    id: str
    kind: str = "runs"
    text: str | None = None

    @property
    def label(self) -> str:
        return self.text or self.id


Cell = Union[str, RowLink, list]   # a list holds strings and RowLinks shown one after the other


@dataclass
class Paragraph:
    parts: list[Cell]


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Cell]]
    id: str | None = None
    row_ids: list[str] | None = None   # HTML ids of the rows (anchors for RowLinks)
    code_columns: tuple[str, ...] = ()  # columns shown as code (commands, fingerprints)


@dataclass
class Figure:
    plot: Plot


@dataclass
class Details:
    summary: str
    text: str


@dataclass
class Section:
    title: str
    id: str
    blocks: list = field(default_factory=list)
    level: int = 2



SOL_EXCEEDED = "above SoL (hardware spec too low)"


def fmt(value: Any, kind: str = "num") -> str:
    """Numbers as the report shows them; missing values as an en dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if kind == "pct":
        return f"{value:+.1%}"
    if kind == "share":
        return f"{value:.1%}"
    if kind == "sol":   # a fraction of the speed of light; above 1 the bound itself is wrong, so say that instead
        return f"{value:.1%}" if value <= 1 else SOL_EXCEEDED
    if kind == "j":
        return f"{value:.3g}"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "s":
        return f"{value:,.1f}"
    if kind == "h":
        return f"{value:,.2f}"
    if kind == "usd":
        return f"{value:,.2f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def fmt_interval(low: Any, high: Any, kind: str = "num") -> str:
    if low is None or high is None or (isinstance(low, float) and math.isnan(low)):
        return "–"
    return f"[{fmt(low, kind)}, {fmt(high, kind)}]"


def first_line(text: Any, limit: int = 160) -> str:
    line = (str(text or "").strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"
