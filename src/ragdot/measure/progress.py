"""Progress of a long run: steps done of a planned total, the time spent, an estimate of the time left
(ETA), and a time budget for the whole run.

`Progress` counts work in units (1 per step, or a step's estimated seconds when steps differ in size) and
prints one line per finished step, e.g. ``[3/8] qwen3-30b-a3b sparse-torch: 4.1 s (elapsed 12 s, about
20 s left)``; `spent()` says when the budget is used up, so that the caller starts no new step. Together with
`ragdot.measure.records.RowWriter`, which writes each row as it finishes, a run cut short by its budget or
by Ctrl-C keeps everything it measured.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar

__all__ = ["Progress", "KeepOnInterrupt", "INTERRUPTED", "request_stop", "clear_stop"]

T = TypeVar("T")

INTERRUPTED = 130  # the exit status of a run stopped by Ctrl-C (128 + SIGINT), as shells report it

_stop = False  # a termination signal arrived (`request_stop`): no new step starts


def request_stop() -> None:
    """Note that the run must stop (the SIGTERM handler calls it before raising KeyboardInterrupt). A signal
    that lands inside a finalizer or a weakref callback has its KeyboardInterrupt swallowed by Python ("Exception
    ignored in ..."); with the note, the next step boundary (`spent`, `until_spent`) raises it again."""
    global _stop
    _stop = True


def clear_stop() -> None:
    global _stop
    _stop = False


def _check_stop() -> None:
    if _stop:
        raise KeyboardInterrupt("stop requested")


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 600 else f"{value / 60:.0f} min"


class Progress:
    """`total` units of work in `steps` steps (default: one unit a step); `budget` seconds, 0 for none.

    `say` prints the progress lines (None: silent, e.g. under --quiet)."""

    def __init__(
        self,
        total: float,
        steps: int | None = None,
        *,
        budget: float = 0.0,
        say: Callable[[str], None] | None = print,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total, self.steps, self.budget = float(total), steps if steps is not None else round(total), budget
        self.say, self.clock = say, clock
        self.start = self.last = clock()
        self.units, self.count = 0.0, 0

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float | None:
        """Seconds left at the pace so far (None before the first step has finished)."""
        if self.units <= 0:
            return None
        return max(0.0, (self.total - self.units) * self.elapsed / self.units)

    def spent(self) -> bool:
        """Whether the budget is used up (never, without one); KeyboardInterrupt once a stop was requested."""
        _check_stop()
        return self.budget > 0 and self.elapsed >= self.budget

    def until_spent(self, items: Iterable[T], what: str, name: Callable[[T], Any] = str) -> Iterator[T]:
        """The items, until the budget is spent; then one line on stderr names the first one left out."""
        for item in items:
            if self.spent():
                print(f"budget spent: {name(item)} and the {what} after it are left out", file=sys.stderr)
                return
            yield item

    def status(self) -> str:
        """``elapsed 12 s of a 60 s budget, about 20 s left``."""
        left = self.left()
        budget = f" of a {self.budget:g} s budget" if self.budget > 0 else ""
        return f"elapsed {_seconds(self.elapsed)}{budget}" + ("" if left is None else f", about {_seconds(left)} left")

    def done(self, label: str, units: float = 1.0) -> str:
        """Count a finished step of `units` and print (and return) its line."""
        now = self.clock()
        took, self.last = now - self.last, now
        self.units += units
        self.count += 1
        line = f"[{self.count}/{self.steps}] {label}: {took:.1f} s ({self.status()})"
        if self.say is not None:
            self.say(line)
        return line


class KeepOnInterrupt:
    """``with KeepOnInterrupt(rows) as run:`` ends the block quietly on Ctrl-C, with one line on stderr saying
    how many finished rows are kept; `run.status` is then INTERRUPTED (else 0)."""

    def __init__(self, rows: Sized) -> None:
        self.rows, self.status = rows, 0

    def __enter__(self) -> KeepOnInterrupt:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        if kind is None or not issubclass(kind, KeyboardInterrupt):
            return False
        self.status = INTERRUPTED
        print(f"interrupted: {len(self.rows)} finished rows kept", file=sys.stderr)
        return True
