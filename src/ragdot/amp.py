"""ragdot under `torch.autocast`: ragged products follow autocast's rule for matmuls, ragdot's own arithmetic does not.

Inside an autocast region (device type of the operands enabled), `ragged_dot` / `ragged_dot_general` treat their
operands as `torch.matmul` does: floating operands other than float64 are cast to the region's dtype (bfloat16 or
float16) and the product runs on those casts, accumulating in float32 as every 16-bit call does; the output has the
region's dtype unless `preferred_element_type` names one. The casts are ordinary autograd ops, so float32
parameters receive float32 gradients.

Everything ragdot computes past that point runs with autocast off: its backends choose their own accumulation
dtypes (the reference backend's float32 matmuls, the router's float32 logits), and a backward called inside an
autocast region (autocast's state is thread-local: a `.backward()` inside the `with` block runs the backward with
it on) must not turn those matmuls into 16-bit ones. `off()` and `autocast_off` (for backward functions) do that.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

__all__ = ["active", "autocast_dtype", "cast", "off", "off_for", "autocast_off"]

F = TypeVar("F", bound=Callable)

# The device types autocast serves (a constant: torch.amp.is_autocast_available is not traceable by torch.compile
# in torch 2.11); tensors elsewhere (meta) are never cast.
_TYPES = ("cuda", "cpu", "xpu", "mps", "hpu", "mtia")

# Whether autocast is on for any device type in this thread: one C call (0.2 µs on a CPU), the hot paths' first test.
active = _any_enabled = torch._C._is_any_autocast_enabled


def autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast runs matmuls in on t's device type, or None where autocast is off there."""
    if not _any_enabled():
        return None
    device_type = t.device.type
    if device_type not in _TYPES or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype` where autocast would cast it for a matmul (floating, not float64), else t itself."""
    if t.is_floating_point() and t.dtype not in (torch.float64, dtype):
        return t.to(dtype)
    return t


def off_for(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast off for t's device type where it is on, else a null context (both traceable by torch.compile)."""
    if _any_enabled() and t.device.type in _TYPES:
        return torch.autocast(t.device.type, enabled=False)
    return contextlib.nullcontext()


@contextlib.contextmanager
def off() -> Iterator[None]:
    """Autocast off for every device type that has it on (nothing happens where none has)."""
    if not _any_enabled():
        yield
        return
    with contextlib.ExitStack() as stack:
        for device_type in _TYPES:
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def autocast_off(fn: F) -> F:
    """`fn` (a backward) run with autocast off whenever it is on at the call."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _any_enabled():
            return fn(*args, **kwargs)
        with off():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
