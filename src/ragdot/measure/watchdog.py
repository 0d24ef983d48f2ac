"""A watchdog for benchmark runs whose GPU work may hang.

A hung kernel blocks the host thread inside a CUDA call, where no Python timeout reaches it. The watchdog's
daemon thread watches one deadline at a time (`arm` / `disarm`, or `with dog.cell(label, seconds):`); once a
deadline passes it prints which piece of work did not finish and where the rows written so far are, then ends
the process with exit status `EXIT_HUNG` (the rows a `RowWriter` wrote as they finished stay on disk).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["EXIT_HUNG", "Watchdog"]

#: exit status of a process the watchdog ended
EXIT_HUNG = 3
_POLL_S = 0.05


class Watchdog:
    """One deadline at a time for the named run; `files`: where its rows are (named in the message)."""

    def __init__(self, name: str, files: Sequence[Path] = ()) -> None:
        self.name, self.files = name, tuple(files)
        self._lock = threading.Lock()
        self._armed: tuple[str, float, float] | None = None  # (label, seconds, deadline on the monotonic clock)
        self._thread: threading.Thread | None = None

    def arm(self, label: str, seconds: float) -> None:
        """Watch `label`: it must end (`disarm`) within `seconds`."""
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds!r}")
        with self._lock:
            self._armed = (label, seconds, time.monotonic() + seconds)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
                self._thread.start()

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    @contextmanager
    def cell(self, label: str, seconds: float) -> Iterator[None]:
        self.arm(label, seconds)
        try:
            yield
        finally:
            self.disarm()

    def _watch(self) -> None:
        while True:
            time.sleep(_POLL_S)
            with self._lock:
                armed = self._armed
            if armed is not None and time.monotonic() > armed[2]:
                label, seconds, _ = armed
                where = f"; rows so far are in {', '.join(map(str, self.files))}" if self.files else ""
                print(f"{self.name}: {label} did not finish within {seconds:g} s (a hung kernel?){where}",
                      file=sys.stderr, flush=True)
                os._exit(EXIT_HUNG)
