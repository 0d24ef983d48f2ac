"""Per-group column sums of rows sorted by group: out[g, :] = sum of x's rows of group g (a bias gradient).

x [R, N] holds the rows of group 0, then group 1, ... (sizes[g] rows each, the group sizes of a permute);
rows past the last group are not read. One program per (group, column block) finds its group's first row
from the sizes on the device (no prefix-sum launch, no host sync) and adds its rows in float32 in row order:
no atomics, the same bits on every run. Empty groups get exact zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot._memo import remember
from ragdot.kernels.launch import BoundLaunch

MAX_GROUPS = 1024  # the sizes are read as one vector per program


@triton.jit
def _group_sums_kernel(
    x_ptr,  # [R, N] rows grouped by group, row stride `stride_x`, unit column stride
    sizes_ptr,  # [G] int32/int64 rows per group (negative counts as 0)
    out_ptr,  # [G, N] contiguous, the sums in out's dtype
    R,  # scalar: rows of x (groups are clipped at R)
    N,  # scalar: columns
    G,  # scalar: groups
    stride_x,  # scalar: x's row stride in elements
    BLOCK_G: tl.constexpr,  # power of two >= G
    BLOCK_R: tl.constexpr,  # rows added per step
    BLOCK_N: tl.constexpr,  # columns per program
):
    g = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_g = tl.arange(0, BLOCK_G)
    sizes = tl.maximum(tl.load(sizes_ptr + offs_g, mask=offs_g < G, other=0).to(tl.int64), 0)
    start = tl.minimum(tl.sum(tl.where(offs_g < g, sizes, 0)), R)
    end = tl.minimum(start + tl.sum(tl.where(offs_g == g, sizes, 0)), R)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    rows = tl.arange(0, BLOCK_R).to(tl.int64)
    for r0 in range(start, end, BLOCK_R):
        r = r0 + rows
        mask = (r[:, None] < end) & (cols[None, :] < N)
        x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=0)
    tl.store(out_ptr + g.to(tl.int64) * N + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < N)


_BLOCK_R = 32
_BLOCK_N = 128


class GroupSums:
    """`group_sums` bound to one signature: a call is an allocation and one launch."""

    __slots__ = ("groups", "n", "out_dtype", "launch")

    def __init__(self, groups: int, n: int, out_dtype: torch.dtype, device: torch.device):
        self.groups, self.n, self.out_dtype = groups, n, out_dtype
        meta = {"BLOCK_G": max(16, triton.next_power_of_2(groups)), "BLOCK_R": _BLOCK_R, "BLOCK_N": _BLOCK_N}
        self.launch = BoundLaunch(_group_sums_kernel, (groups, triton.cdiv(n, _BLOCK_N)), meta,
                                  {"num_warps": 4}, device)

    def __call__(self, x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        out = torch.empty((self.groups, self.n), dtype=self.out_dtype, device=x.device)
        self.launch(x, sizes, out, x.shape[0], self.n, self.groups, x.stride(0))
        return out


_BOUND: dict[tuple, GroupSums] = {}


def group_sums(x: torch.Tensor, sizes: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [R, N] (rows grouped by group, unit column stride), sizes int32/int64 [G] on x's device ->
    [G, N] in out_dtype (default x's): each group's rows summed in float32, in row order."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"x: expected a [R, N] tensor with unit column stride, got {getattr(x, 'shape', x)!r}")
    if not isinstance(sizes, torch.Tensor) or sizes.dim() != 1 or sizes.dtype not in (torch.int32, torch.int64):
        raise TypeError("sizes: expected a 1-D int32 or int64 tensor [G]")
    if sizes.device != x.device:
        raise ValueError(f"sizes: expected device {x.device}, got {sizes.device}")
    groups, n = sizes.shape[0], x.shape[1]
    if not 0 < groups <= MAX_GROUPS:
        raise ValueError(f"sizes: expected 1 to {MAX_GROUPS} groups, got {groups}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if n == 0:
        return x.new_zeros((groups, 0), dtype=out_dtype)
    # R and the row stride are in the key: Triton specializes integer arguments (== 1, multiples of 16)
    key = (x.shape[0], x.stride(0), groups, n, x.dtype, sizes.dtype, out_dtype, x.device)
    bound = _BOUND.get(key)
    if bound is None:
        bound = remember(_BOUND, key, GroupSums(groups, n, out_dtype, x.device), 4096)
    return bound(x, sizes)
