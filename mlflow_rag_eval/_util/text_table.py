"""Fixed-width text tables for the terminal: the one printer behind ``compare``, the gate's
decision table and calibration's figures.

Cells are given already formatted (the caller knows the precision a figure deserves); None is
shown as ``-``. Each column is as wide as its widest cell or header, columns are two spaces
apart, and a rule of dashes goes under the header.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MISSING", "text_table"]

#: what an empty cell (None) shows
MISSING = "-"
_GAP = "  "


def text_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, align: str | None = None,
               indent: str = "") -> str:
    """``rows`` under ``header`` as aligned text.

    Args:
        align: one character per column, ``<`` (left) or ``>`` (right); default: the first
            column left, the others right.
        indent: put before every line.

    Raises:
        ValueError: a row's length or ``align`` does not match the header.
    """
    n = len(header)
    align = align if align is not None else "<" + ">" * (n - 1)
    if len(align) != n or set(align) - {"<", ">"}:
        raise ValueError(f"align must be {n} of '<' or '>', got {align!r}")
    cells = [[MISSING if c is None else str(c) for c in row] for row in rows]
    for i, row in enumerate(cells):
        if len(row) != n:
            raise ValueError(f"row {i} has {len(row)} cells, the header {n}")
    widths = [max([len(h), *(len(row[j]) for row in cells)]) for j, h in enumerate(header)]

    def line(row: Sequence[str]) -> str:
        text = _GAP.join(f"{c:{a}{w}}" for c, a, w in zip(row, align, widths))
        return indent + text.rstrip()

    head = line(list(header))
    return "\n".join([head, indent + "-" * (len(head) - len(indent)), *(line(row) for row in cells)])
