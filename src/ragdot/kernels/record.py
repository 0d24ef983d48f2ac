"""Recording what one prepared call launches, so that it can be replayed without Python.

Inside `recording()`, every `BoundLaunch` notes its compiled kernel and its runtime arguments, every prepared
output that is all zeros notes the zero fill, and every per-call temporary a kernel owner makes with
`scratch` is noted as such (the launches still happen: the recorded call computes its result as usual).
`ragdot.jax` turns such a record into a launch plan that its XLA FFI handler replays in C on later calls
(`ragdot.jax._plan`). A call that does GPU work no hook sees (a torch operator, a copy) cannot be replayed:
the owners that record are the Triton kernels' prepared calls, and the plan builder refuses a record holding
a tensor it cannot place (so nothing is replayed that was not recorded).
"""

from __future__ import annotations

import contextlib
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


_ACTIVE: Record | None = None


def active() -> Record | None:
    """The record being taken, if any (the hooks' one global read on the launch path)."""
    return _ACTIVE


@contextlib.contextmanager
def recording() -> Iterator[Record]:
    """Record what the calls made inside the block launch (not re-entrant: an inner block is refused)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("recording() is already active")
    _ACTIVE = record = Record()
    try:
        yield record
    finally:
        _ACTIVE = None


def scratch(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A per-call temporary written by the call's own launches before they read it (`torch.empty`)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if _ACTIVE is not None:
        _ACTIVE.scratch.append(t)
    return t
