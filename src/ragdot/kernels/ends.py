"""Group sizes to clamped group ends in one launch (the prefix sum every ragged call starts with).

    ends[g] = min(scale * sum_{h <= g} clamp(sizes[h], 0, extent // scale), extent)      int32 [G]

Negative sizes count as zero and every end is clamped to the ragged extent, so no value of `sizes` can send
a kernel out of bounds. The running sum is kept in int64, so it cannot wrap whatever the sizes hold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot.kernels.configs import next_pow2
from ragdot.kernels.launch import BoundLaunch

__all__ = ["group_ends", "MAX_GROUPS"]

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


_LAUNCHES: dict[tuple, BoundLaunch] = {}


def group_ends(sizes: torch.Tensor, extent: int, scale: int = 1) -> torch.Tensor:
    """int32 [G] clamped ends of `sizes` (1-D integer CUDA tensor, G <= MAX_GROUPS, contiguous), one launch."""
    g = sizes.shape[0]
    key = (g, extent, scale, sizes.device)
    launch = _LAUNCHES.get(key)
    if launch is None:
        if len(_LAUNCHES) >= 4096:  # many distinct extents (e.g. serving): start over rather than grow
            _LAUNCHES.clear()
        launch = _LAUNCHES[key] = BoundLaunch(
            _group_ends_kernel, (1,), {"BLOCK_G": max(next_pow2(g), 16)}, {"num_warps": 1}, sizes.device
        )
    ends = torch.empty(g, dtype=torch.int32, device=sizes.device)
    launch(sizes, ends, g, extent // scale, scale, extent)
    return ends
