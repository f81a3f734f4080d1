"""Aligned text columns exactly as Go's ``text/tabwriter`` lays them out.

Aliyun's tool prints through ``tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)``; to keep its
layout column for column we follow the same rule: a cell is text ending in a tab, the
text after a line's last tab is not a cell, and a column's width is set per *block* of
consecutive lines that all have a cell in that column (widest cell + padding).
"""

from __future__ import annotations


def tabulate(text: str, padding: int = 2, minwidth: int = 0) -> str:
    """Lay out ``text`` (tab-separated cells, newline-separated lines) like Go's tabwriter."""
    lines = [line.split("\t") for line in text.split("\n")]
    # Go terminates an empty trailing cell only at a newline: in a last line without
    # one, text ending in a tab has no empty cell after it.
    if len(lines[-1]) > 1 and lines[-1][-1] == "":
        lines[-1].pop()
    out: list[str] = []
    _format(lines, 0, len(lines), [], padding, minwidth, out)
    return "\n".join(out)


def _format(
    lines: list[list[str]],
    line0: int,
    line1: int,
    widths: list[int],
    padding: int,
    minwidth: int,
    out: list[str],
) -> None:
    column = len(widths)
    this = line0
    while this < line1:
        if column >= len(lines[this]) - 1:
            this += 1
            continue
        # A block of lines that all have a cell in this column starts here.
        _write(lines, line0, this, widths, out)
        line0 = this
        width = minwidth
        while this < line1 and column < len(lines[this]) - 1:
            width = max(width, len(lines[this][column]) + padding)
            this += 1
        _format(lines, line0, this, [*widths, width], padding, minwidth, out)
        line0 = this
    _write(lines, line0, line1, widths, out)


def _write(lines: list[list[str]], line0: int, line1: int, widths: list[int], out: list[str]) -> None:
    for cells in lines[line0:line1]:
        parts = []
        for j, cell in enumerate(cells):
            parts.append(cell.ljust(widths[j]) if j < len(widths) and j < len(cells) - 1 else cell)
        out.append("".join(parts))
