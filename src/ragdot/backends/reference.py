"""`reference`: plain torch code, one matmul per group, accumulating in the widest of float32, the input dtype
and the output dtype (float64 whenever either is float64). The oracle of every test.

It reads group offsets on the host (a synchronisation): correctness first, speed never.
"""

from __future__ import annotations

import torch

from ragdot.backends.base import BackendBase

__all__ = ["BACKEND"]


def _acc_dtype(in_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype:
    """The widest of float32, the input dtype and the output dtype."""
    return torch.float64 if torch.float64 in (in_dtype, out_dtype) else torch.float32


def _bounds(group_ends: torch.Tensor) -> list[tuple[int, int]]:
    ends = group_ends.tolist()
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends))


class ReferenceBackend(BackendBase):
    name = "reference"

    def ragged_m(self, a, b, group_ends, out_dtype):
        acc = _acc_dtype(a.dtype, out_dtype)
        bt, m, _ = a.shape
        out = torch.zeros((bt, m, b.shape[3]), dtype=acc, device=a.device)
        for g, (start, end) in enumerate(_bounds(group_ends)):
            if end > start:
                out[:, start:end] = torch.matmul(a[:, start:end].to(acc), b[:, g].to(acc))
        return out.to(out_dtype)

    def ragged_k(self, a, b, group_ends, out_dtype):
        acc = _acc_dtype(a.dtype, out_dtype)
        bt, _, m = a.shape
        out = torch.zeros((group_ends.shape[0], bt, m, b.shape[2]), dtype=acc, device=a.device)
        for g, (start, end) in enumerate(_bounds(group_ends)):
            if end > start:
                out[g] = torch.matmul(a[:, start:end].transpose(1, 2).to(acc), b[:, start:end].to(acc))
        return out.to(out_dtype)

    def batch(self, a, b, out_dtype):
        acc = _acc_dtype(a.dtype, out_dtype)
        return torch.matmul(a.to(acc), b.to(acc)).to(out_dtype)


BACKEND = ReferenceBackend()
