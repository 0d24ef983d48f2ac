"""Terminal output for the benchmarks: rich where it is installed, plain text where it is not.

`Console`, `Table` and `Progress` have the small part of rich's interface the benchmark uses (print with
markup, tables with columns and rows, a progress bar with tasks); without rich they print plain text, with
markup such as ``[yellow]...[/]`` removed, so a missing optional dependency never stops a run.
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["Console", "Table", "Progress", "HAVE_RICH", "progress_columns", "track"]

try:
    from rich.console import Console
    from rich.progress import Progress, track
    from rich.table import Table

    HAVE_RICH = True
except ImportError:  # plain-text stand-ins below
    HAVE_RICH = False

_MARKUP = re.compile(r"\[/?[a-z #0-9_.,=-]*\]")


def _plain(text: object) -> str:
    return _MARKUP.sub("", str(text))


class _PlainTable:
    """Columns and rows rendered as aligned plain text."""

    def __init__(self, title: str | None = None, **_: Any) -> None:
        self.title = title
        self.columns: list[tuple[str, str]] = []
        self.rows: list[list[str]] = []

    def add_column(self, header: str, justify: str = "left", **_: Any) -> None:
        self.columns.append((_plain(header), justify))

    def add_row(self, *cells: object, **_: Any) -> None:
        self.rows.append([_plain(c) for c in cells])

    def __str__(self) -> str:
        widths = [max([len(h), *(len(r[i]) for r in self.rows if i < len(r))]) for i, (h, _) in
                  enumerate(self.columns)]

        def line(cells: list[str]) -> str:
            out = []
            for (_, justify), width, cell in zip(self.columns, widths, cells):
                out.append(cell.rjust(width) if justify == "right" else cell.ljust(width))
            return "  ".join(out).rstrip()

        lines = [_plain(self.title)] if self.title else []
        lines.append(line([h for h, _ in self.columns]))
        lines.append("  ".join("-" * w for w in widths))
        lines += [line(r) for r in self.rows]
        return "\n".join(lines)


class _PlainConsole:
    """print() with rich markup stripped; `quiet` silences it."""

    is_terminal = False

    def __init__(self, quiet: bool = False, width: int | None = None, **_: Any) -> None:
        self.quiet = quiet
        self.width = width or 120

    def print(self, *objects: object, **_: Any) -> None:
        if not self.quiet:
            print(*(_plain(o) for o in objects), flush=True)

    def rule(self, title: str = "", **_: Any) -> None:
        self.print(f"-- {title} --")


class _PlainProgress:
    """rich's Progress without a display: it counts; the caller's own `console.print` lines (one per shape,
    with the time left) are the progress shown."""

    def __init__(self, *_: Any, console: Any = None, **__: Any) -> None:
        self.console = console or _PlainConsole()
        self._tasks: dict[int, list[Any]] = {}

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        self._tasks[len(self._tasks)] = [description, 0, total]
        return len(self._tasks) - 1

    def update(self, task: int, description: str | None = None, **_: Any) -> None:
        if description is not None:
            self._tasks[task][0] = description

    def advance(self, task: int, amount: float = 1) -> None:
        self._tasks[task][1] += amount


def _plain_track(sequence: Any, description: str = "", console: Any = None, **_: Any) -> Any:
    """rich's `track` without a display: the items, unchanged."""
    yield from sequence


if not HAVE_RICH:
    track = _plain_track  # type: ignore[assignment]
    Console = _PlainConsole  # type: ignore[misc,assignment]
    Table = _PlainTable  # type: ignore[misc,assignment]
    Progress = _PlainProgress  # type: ignore[misc,assignment]


def progress_columns() -> tuple[Any, ...]:
    """rich's progress columns of the benchmark (none without rich)."""
    if not HAVE_RICH:
        return ()
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    return (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn())


if __name__ == "__main__":  # pragma: no cover - a look at the plain table
    t = _PlainTable(title="demo")
    t.add_column("a")
    t.add_column("b", justify="right")
    t.add_row("x", "1")
    sys.stdout.write(str(t) + "\n")
