"""Zero the output rows that belong to no group: rows >= group_ends[-1] of c[Bt, M, N].

Vendor grouped GEMMs leave those rows uninitialised. One launch of a small persistent grid; each program
reads group_ends[-1] on the device and loops over the tail only, so when the groups cover every row the
launch does no work beyond that one load (no host sync, CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot._memo import remember
from ragdot.kernels.configs import num_sms
from ragdot.kernels.launch import BoundLaunch


@triton.jit
def _zero_tail_kernel(
    c_ptr,  # [Bt, M, N] contiguous output
    ends_ptr,  # [G] int32/int64 inclusive group ends (only the last is read)
    G,  # scalar: number of groups
    MN,  # scalar: M * N, elements per batch entry
    N,  # scalar: row length
    BLOCK: tl.constexpr,  # elements zeroed per step
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    bt = tl.program_id(1).to(tl.int64)
    end = tl.load(ends_ptr + G - 1).to(tl.int64)
    end = tl.minimum(tl.maximum(end, 0), MN // N)
    first = end * N  # first element of the tail
    base = c_ptr + bt * MN
    offs = tl.arange(0, BLOCK)
    zeros = tl.zeros((BLOCK,), dtype=c_ptr.dtype.element_ty)
    # blocks aligned to BLOCK, starting at the one that holds `first`
    for blk in tl.range((first // BLOCK) + pid, tl.cdiv(MN, BLOCK), nprog):
        idx = blk * BLOCK + offs
        tl.store(base + idx, zeros, mask=(idx >= first) & (idx < MN))


_BLOCK = 4096


class ZeroTail:
    """`zero_tail_rows_` bound to one output signature: a call is one launch."""

    __slots__ = ("mn", "n", "g", "launch")

    def __init__(self, shape: tuple[int, int, int], g: int, device: torch.device):
        bt, m, n = shape
        self.mn, self.n, self.g = m * n, n, g
        programs = max(1, min(triton.cdiv(m * n, _BLOCK), 2 * num_sms(device)))
        self.launch = BoundLaunch(_zero_tail_kernel, (programs, bt), {"BLOCK": _BLOCK}, {"num_warps": 4}, device)

    def __call__(self, c: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        """c: [Bt, M, N] contiguous of the bound signature; group_ends: int32/int64 [G] on c's device."""
        self.launch(c, group_ends, self.g, self.mn, self.n)
        return c


_BOUND: dict[tuple, ZeroTail] = {}


def zero_tail_rows_(c: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
    """Write zeros into rows >= group_ends[-1] of c [Bt, M, N] (contiguous), in place; returns c.

    group_ends is an int32/int64 [G] tensor on c's device; only its last element is read, on the device.
    With G == 0 every row is zeroed.
    """
    if not isinstance(c, torch.Tensor) or c.dim() != 3 or not c.is_contiguous():
        raise ValueError(f"c: expected a contiguous [Bt, M, N] tensor, got {getattr(c, 'shape', type(c))}")
    if not isinstance(group_ends, torch.Tensor) or group_ends.dim() != 1:
        raise ValueError("group_ends: expected a 1-D integer tensor [G]")
    if group_ends.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"group_ends: expected dtype int32 or int64, got {group_ends.dtype}")
    if group_ends.device != c.device:
        raise ValueError(f"group_ends: expected device {c.device}, got {group_ends.device}")
    bt, m, n = c.shape
    if c.numel() == 0:
        return c
    if group_ends.shape[0] == 0:
        return c.zero_()
    if bt > 65535:
        raise ValueError(f"c: batch size {bt} exceeds the 65535 the grid allows")
    key = (bt, m, n, group_ends.shape[0], c.dtype, group_ends.dtype, c.device)
    bound = _BOUND.get(key)
    if bound is None:
        bound = remember(_BOUND, key, ZeroTail((bt, m, n), group_ends.shape[0], c.device), 4096)
    return bound(c, group_ends)
