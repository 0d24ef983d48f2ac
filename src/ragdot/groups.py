"""Group sizes: validation and the clamped prefix sums (group ends) every ragged problem starts from."""

from __future__ import annotations

import os

import torch

__all__ = ["group_ends_from_sizes", "validate_requested", "validate_sizes"]

_ENV_DATA = getattr(os.environ, "_data", None)  # os.environ's own store, which os.environ[...] = ... updates
_VALIDATE_KEY = os.environ.encodekey("RAGDOT_VALIDATE") if hasattr(os.environ, "encodekey") else None


def validate_requested() -> bool:
    """Whether RAGDOT_VALIDATE is set to anything but "" or "0". Read on every eager call (setting it at run
    time counts), from os.environ's underlying dict: ~40 ns a call instead of the mapping's ~0.6 µs. Under
    torch.compile it is read as the call is traced."""
    if torch.compiler.is_compiling() or _ENV_DATA is None or _VALIDATE_KEY is None:
        # traced: dynamo guards this one key of os.environ (reading the underlying dict would guard all of it:
        # every variable, and a recompile whenever any of them changes); tested first, so that the module's
        # handles on that dict are not traced (each would add guards to every compiled call's check)
        return os.environ.get("RAGDOT_VALIDATE", "") not in ("", "0")
    value = _ENV_DATA.get(_VALIDATE_KEY)
    return value is not None and os.environ.decodevalue(value) not in ("", "0")


def validate_sizes(group_sizes: torch.Tensor, extent: int) -> None:
    """Host-side check used with validate=True (a synchronisation): names the first offending group."""
    total = 0
    for i, size in enumerate(group_sizes.tolist()):
        if size < 0:
            raise ValueError(f"group_sizes[{i}] = {size} is negative; group sizes must be >= 0")
        total += size
        if total > extent:
            raise ValueError(f"group_sizes sum to {total} by group {i}, beyond the ragged dimension's size {extent}")


def _fused_kernel_ok(group_sizes: torch.Tensor) -> bool:
    if not group_sizes.is_cuda or torch.compiler.is_compiling() or not group_sizes.is_contiguous():
        return False
    from ragdot.kernels.ends import MAX_GROUPS

    return 0 < group_sizes.shape[0] <= MAX_GROUPS


def group_ends_from_sizes(group_sizes: torch.Tensor, extent: int, scale: int = 1) -> torch.Tensor:
    """Inclusive prefix sums of the sizes (negatives count as 0), times `scale`, clamped to `extent`; int32.

    Stays on the device of `group_sizes`: no host synchronisation. On CUDA with Triton this is one launch
    (`ragdot.kernels.ends`); elsewhere three small torch ops. Each size is first clamped to the unscaled
    extent (which leaves every clamped end unchanged), so the running sum stays below G * extent.
    """
    if _fused_kernel_ok(group_sizes):
        try:
            from ragdot.kernels.ends import group_ends
        except ImportError:  # no Triton: the torch ops below
            pass
        else:
            return group_ends(group_sizes, extent, scale)
    rows = extent // scale
    narrow = group_sizes.shape[0] * max(extent, 1) < 2**31
    acc = torch.int32 if narrow else torch.int64
    if group_sizes.dtype not in (torch.int32, torch.int64):  # narrow ints cannot hold the clamp bound
        group_sizes = group_sizes.to(torch.int64)
    ends = torch.cumsum(group_sizes.clamp(0, rows), 0, dtype=acc)
    if scale != 1:
        ends = ends * scale
    ends = ends.clamp_(max=extent)
    return ends if narrow else ends.to(torch.int32)
