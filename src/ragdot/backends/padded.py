"""`padded`: the baseline every speedup is quoted against, as XLA's default ragged-dot rewrite does it.

The ragged operand is expanded into G masked dense copies (G x the work, G x the temporaries), one dense
batched matmul runs over all of them, and the results are combined. Nothing here is optimised on purpose:
its time and memory are the cost that Group-GEMM removes. Masks are selects, so data outside every group
(NaN included) never reaches a result.
"""

from __future__ import annotations

import torch

from ragdot.backends.base import BackendBase

__all__ = ["BACKEND"]


def _membership(group_ends: torch.Tensor, extent: int) -> torch.Tensor:
    """[G, extent] bool: row r belongs to group g."""
    ends = group_ends.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    rows = torch.arange(extent, device=group_ends.device)
    return (rows[None, :] >= starts[:, None]) & (rows[None, :] < ends[:, None])


def _compute_dtype(in_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype:
    """The dtype the dense products run in.

    Equal dtypes keep the input dtype (a 16-bit matmul accumulates in float32 on its own). Otherwise the
    widest of float32, input and output: a wider output (bf16 -> fp32, fp32 -> fp64) needs the products in
    that width, and a 16-bit output of other 16-bit inputs (f16 -> bf16) must not round or overflow in f16.
    """
    if in_dtype == out_dtype:
        return in_dtype
    return torch.float64 if torch.float64 in (in_dtype, out_dtype) else torch.float32


class PaddedBackend(BackendBase):
    name = "padded"

    def ragged_m(self, a, b, group_ends, out_dtype):
        dt = _compute_dtype(a.dtype, out_dtype)
        mask = _membership(group_ends, a.shape[1])[:, None, :, None]  # [G, 1, M, 1]
        zero = a.new_zeros((), dtype=dt)
        expanded = torch.where(mask, a.to(dt)[None], zero)  # [G, Bt, M, K]
        dense = torch.matmul(expanded, b.to(dt).transpose(0, 1))  # [G, Bt, M, N]
        return torch.where(mask, dense, zero).sum(0).to(out_dtype)

    def ragged_k(self, a, b, group_ends, out_dtype):
        dt = _compute_dtype(a.dtype, out_dtype)
        mask = _membership(group_ends, a.shape[1])[:, None, :, None]  # [G, 1, R, 1]
        zero = a.new_zeros((), dtype=dt)
        a_exp = torch.where(mask, a.to(dt)[None], zero)  # [G, Bt, R, M]
        b_exp = torch.where(mask, b.to(dt)[None], zero)  # [G, Bt, R, N]
        return torch.matmul(a_exp.transpose(-1, -2), b_exp).to(out_dtype)

    def batch(self, a, b, out_dtype):
        dt = _compute_dtype(a.dtype, out_dtype)
        return torch.matmul(a.to(dt), b.to(dt)).to(out_dtype)


BACKEND = PaddedBackend()
