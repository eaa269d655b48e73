"""Markdown tables, built one way: every results file, report and CLI table goes through `markdown_table`.

Hand-written headers (`"| a | b |"` next to `"|---|---:|"`) drift apart when a column is added to one and not
the other; here the rule is derived from the header, and a row of the wrong length is an error, not a
silently shifted column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_RULES = {"l": "---|", "r": "---:|"}


def markdown_row(cells: Iterable[object]) -> str:
    """One table line: `| a | b |` (cells through `str`, so format numbers first)."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]] = (), align: str = "") -> list[str]:
    """A GitHub markdown table as lines: the header, its rule, then one line per row.

    `align` has one letter a column: `l` (text; `---`) or `r` (numbers; `---:`); empty means every column `l`.
    Callers that write rows in a loop of their own pass no rows and append `markdown_row(...)` lines.
    """
    align = align or "l" * len(header)
    if len(align) != len(header) or set(align) - set(_RULES):
        raise ValueError(f"align={align!r} needs one of 'l'/'r' for each of the {len(header)} columns {header}")
    lines = [markdown_row(header), "|" + "".join(_RULES[letter] for letter in align)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {row} has {len(row)} cells; the header {header} has {len(header)}")
        lines.append(markdown_row(row))
    return lines


__all__ = ["markdown_row", "markdown_table"]
