"""Group sizes to clamped group ends in one launch (the prefix sum every ragged call starts with).

    ends[g] = min(scale * sum_{h <= g} clamp(sizes[h], 0, extent // scale), extent)      int32 [G]

Negative sizes count as zero and every end is clamped to the ragged extent, so no value of `sizes` can send
a kernel out of bounds. The running sum is kept in int64, so it cannot wrap whatever the sizes hold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot._memo import remember
from ragdot.kernels.configs import next_pow2
from ragdot.kernels.launch import BoundLaunch
from ragdot.kernels.record import scratch

__all__ = ["group_ends", "GroupEnds", "MAX_GROUPS"]

MAX_GROUPS = 1 << 14  # one program holds all groups; larger G takes the torch path


@triton.jit
def _group_ends_kernel(
    sizes_ptr,  # [G] any integer dtype: group sizes (may be negative or too large)
    ends_ptr,  # [G] int32 output: clamped inclusive group ends
    G,  # scalar: number of groups
    ROWS,  # scalar: extent // scale, the largest meaningful size
    SCALE,  # scalar: rows per unit of size (merged contracting dimensions), >= 1
    EXTENT,  # scalar: the ragged dimension's size
    BLOCK_G: tl.constexpr,  # power of two >= G
):
    offs = tl.arange(0, BLOCK_G)
    sizes = tl.load(sizes_ptr + offs, mask=offs < G, other=0).to(tl.int64)
    sizes = tl.minimum(tl.maximum(sizes, 0), ROWS)
    ends = tl.minimum(tl.cumsum(sizes, 0) * SCALE, EXTENT)
    tl.store(ends_ptr + offs, ends.to(tl.int32), mask=offs < G)


class GroupEnds:
    """`group_ends` bound to one (G, extent, scale, device): a call is one allocation and one launch."""

    __slots__ = ("g", "extent", "scale", "device", "launch")

    def __init__(self, g: int, extent: int, scale: int, device: torch.device):
        self.g, self.extent, self.scale, self.device = g, extent, scale, device
        self.launch = BoundLaunch(_group_ends_kernel, (1,), {"BLOCK_G": max(next_pow2(g), 16)}, {"num_warps": 1},
                                  device)

    def __call__(self, sizes: torch.Tensor) -> torch.Tensor:
        """sizes: [G] integer, contiguous, on `device` -> int32 [G] clamped ends."""
        ends = scratch((self.g,), torch.int32, self.device)
        self.launch(sizes, ends, self.g, self.extent // self.scale, self.scale, self.extent)
        return ends


_BOUND: dict[tuple, GroupEnds] = {}


def group_ends(sizes: torch.Tensor, extent: int, scale: int = 1) -> torch.Tensor:
    """int32 [G] clamped ends of `sizes` (1-D integer CUDA tensor, G <= MAX_GROUPS, contiguous), one launch."""
    key = (sizes.shape[0], extent, scale, sizes.device)
    bound = _BOUND.get(key)
    if bound is None:
        bound = remember(_BOUND, key, GroupEnds(*key), 4096)  # one compiled kernel per sizes dtype
    return bound(sizes)
