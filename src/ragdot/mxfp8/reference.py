"""The oracle of the MXFP8 weight gradient: dequantize both operands, one float32 matmul per group.

It also fixes the one rule that makes the operation total: group ends are the clamped prefix sums of the
sizes (negative sizes count as 0, ends capped at T), and a 32-token scale block belongs to the group that owns
its first token. With sizes that are multiples of 32 (the contract) this is exactly "the rows of g"; with
other sizes every kernel still computes the same well-defined thing and never reads out of bounds.
"""

from __future__ import annotations

import torch

from ragdot.mxfp8.quantize import BLOCK, dequantize

__all__ = ["token_windows", "grouped_wgrad_reference"]


def token_windows(group_sizes: torch.Tensor, tokens: int) -> list[tuple[int, int]]:
    """Host list of each group's token window [start, end), block-aligned as the kernels see it."""
    sizes = group_sizes.detach().to("cpu", torch.int64).clamp(min=0)
    ends = sizes.cumsum(0).clamp(max=tokens)
    blocks = (ends + BLOCK - 1) // BLOCK * BLOCK  # a block goes with the group owning its first token
    starts = torch.cat([blocks.new_zeros(1), blocks[:-1]])
    return list(zip(starts.tolist(), blocks.tolist(), strict=True))


def grouped_wgrad_reference(
    a_q: torch.Tensor,
    a_s: torch.Tensor,
    b_q: torch.Tensor,
    b_s: torch.Tensor,
    group_sizes: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """dw[g] = dequant(a)[window g]^T @ dequant(b)[window g] in `compute_dtype`, rounded to `out_dtype`.

    Inputs as for `ragdot.mxfp8.grouped_wgrad`; reads only the tokens inside the windows, so whatever the
    padding holds never reaches the result. TF32 is switched off for the float32 products.
    """
    tokens, n = a_q.shape
    k = b_q.shape[1]
    out = torch.zeros((group_sizes.shape[0], n, k), dtype=compute_dtype, device=a_q.device)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for g, (start, end) in enumerate(token_windows(group_sizes, tokens)):
            if end <= start:
                continue
            b0, b1 = start // BLOCK, end // BLOCK
            a = dequantize(a_q[start:end], a_s[b0:b1]).to(compute_dtype)
            b = dequantize(b_q[start:end], b_s[b0:b1]).to(compute_dtype)
            out[g] = a.t() @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return out.to(out_dtype)
