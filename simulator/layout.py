"""Tables that never cut a value: a box when every cell fits the console, stacked blocks when not.

rich shrinks a table that is wider than the console by cutting cells (``runti…``, ``91.…``),
and a pipe is 80 columns unless ``COLUMNS`` says otherwise. Here a table is plain data
(:class:`Grid`: headers and rows of strings) and :func:`render` measures it first: if the
boxed table needs more columns than the console has, each row is printed as a block of
``header: value`` lines instead, a value moved to its own indented line when the pair does
not fit, and nothing is ever folded or elided (a single word wider than the console is
printed whole and left to the terminal to wrap).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table
from rich.text import Text

INDENT = "  "


@dataclass(frozen=True)
class Grid:
    """One table: ``headers[0]`` names what a row is (its block title when stacked)."""

    title: str
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)
    left: int = 1  # the first ``left`` columns are text (left-aligned), the rest numbers

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.headers)} columns")
        self.rows.append(tuple(str(c) for c in cells))

    def widths(self) -> list[int]:
        return [max([len(h)] + [len(r[i]) for r in self.rows])
                for i, h in enumerate(self.headers)]

    def boxed_width(self) -> int:
        """Columns a rich table with the default box and padding needs for every cell whole:
        each cell plus one space either side, and a rule before, between and after."""
        return sum(w + 2 for w in self.widths()) + len(self.headers) + 1


def render(console: Console, grid: Grid) -> None:
    """Print ``grid`` boxed if it fits ``console.width``, else stacked (see the module)."""
    if grid.boxed_width() <= console.width and len(grid.title) <= console.width:
        console.print(_table(grid))
    else:
        for line in stacked(grid, console.width):
            console.print(Text(line), soft_wrap=True, highlight=False)


def _table(grid: Grid) -> Table:
    table = Table(title=Text(grid.title), title_justify="left")
    justify = ["left" if i < grid.left else "right" for i in range(len(grid.headers))]
    for header, width, side in zip(grid.headers, grid.widths(), justify, strict=True):
        table.add_column(Text(header), justify=side,  # type: ignore[arg-type]
                         no_wrap=True, min_width=width, overflow="fold")
    for row in grid.rows:
        table.add_row(*(Text(c, justify=side)  # type: ignore[arg-type]
                        for c, side in zip(row, justify, strict=True)))
    return table


def stacked(grid: Grid, width: int) -> list[str]:
    """The stacked form: the title, then per row a block of ``header: value`` lines (the
    first one less indented: what the row is), empty cells left out."""
    lines = [grid.title]
    for row in grid.rows:
        for i, (header, cell) in enumerate(zip(grid.headers, row, strict=True)):
            if not cell:
                continue
            indent = INDENT if i == 0 else INDENT * 2
            pair = f"{indent}{header}: {cell}"
            if len(pair) <= width:
                lines.append(pair)
            else:
                lines.append(f"{indent}{header}:")
                lines.append(f"{indent}{INDENT}{cell}")
    return lines


def render_all(console: Console, grids: Sequence[Grid]) -> None:
    for grid in grids:
        render(console, grid)
