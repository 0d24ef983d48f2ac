"""Recording what one prepared call launches, so that it can be replayed without Python.

Inside `recording()`, every `BoundLaunch` notes its compiled kernel and its runtime arguments, every prepared
output that is all zeros notes the zero fill, and every per-call temporary a kernel owner makes with
`scratch` is noted as such (the launches still happen: the recorded call computes its result as usual).
`ragdot.native.plan` turns such a record into a launch program that C replays on later calls: ragdot's
eager calls (`ragdot.kernels.replay`) and ragdot.jax's XLA FFI handler. A call that does GPU work no hook
sees (a torch operator, a copy) cannot be replayed, so only prepared calls that declare `replayable = True`
(their calls are `BoundLaunch`es and these hooks alone: `ragged_m.Prepared`, `ragged_k.Prepared`) are turned
into plans; a launch through `configs.run_kernel` inside a record marks it foreign, and the plan builder
refuses a foreign record and one holding a tensor it cannot place. A record belongs to the thread that took
it: launches of other threads meanwhile are not in it, and a second thread's `recording()` waits for the
first to end.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Record", "Launch", "recording", "active", "scratch"]


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the compiled kernel, its grid and its runtime arguments in parameter order."""

    compiled: Any
    grid: tuple[int, int, int]
    args: tuple[Any, ...]
    device: int


@dataclass
class Record:
    """What one call did, in order: `steps` holds `Launch`es and ("zero", tensor) fills; `scratch` the
    temporaries made for the call (their tensors, in the order made)."""

    steps: list[Any] = field(default_factory=list)
    scratch: list[torch.Tensor] = field(default_factory=list)
    thread: int = field(default_factory=threading.get_ident)
    foreign: bool = False  # something launched outside the hooks (configs.run_kernel)
    workspace: int | None = None  # bytes the replay offers the call's scratch (None: sized to the record)


_ACTIVE: Record | None = None  # the launch path reads this global; the thread is compared only when it is set
_LOCK = threading.Lock()


def active() -> Record | None:
    """The record this thread is taking, if any."""
    rec = _ACTIVE
    return rec if rec is not None and rec.thread == threading.get_ident() else None


@contextlib.contextmanager
def recording(workspace: int | None = None) -> Iterator[Record]:
    """Record what this thread's calls inside the block launch (not re-entrant: an inner block is refused).
    `workspace`: the bytes a replay of the record will offer for the call's scratch (ragdot.jax's fixed
    workspace result), so that a kernel owner can choose a form whose scratch fits; None: whatever the call
    makes (ragdot's eager replays allocate the record's own total)."""
    global _ACTIVE
    if active() is not None:
        raise RuntimeError("recording() is already active in this thread")
    with _LOCK:
        _ACTIVE = record = Record(workspace=workspace)
        try:
            yield record
        finally:
            _ACTIVE = None


def scratch(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A per-call temporary written by the call's own launches before they read it (`torch.empty`)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    rec = active()
    if rec is not None:
        rec.scratch.append(t)
    return t
