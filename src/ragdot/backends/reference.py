"""`reference`: float32-accumulating torch code, one matmul per group. The oracle of every test.

It reads group offsets on the host (a synchronisation): correctness first, speed never.
"""

from __future__ import annotations

import torch

__all__ = ["BACKEND"]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _bounds(group_ends: torch.Tensor) -> list[tuple[int, int]]:
    ends = group_ends.tolist()
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends))


class ReferenceBackend:
    name = "reference"

    def is_available(self) -> bool:
        return True

    def ragged_m(self, a, b, group_ends, out_dtype):
        acc = _acc_dtype(a.dtype)
        bt, m, _ = a.shape
        out = torch.zeros((bt, m, b.shape[3]), dtype=acc, device=a.device)
        for g, (start, end) in enumerate(_bounds(group_ends)):
            if end > start:
                out[:, start:end] = torch.matmul(a[:, start:end].to(acc), b[:, g].to(acc))
        return out.to(out_dtype)

    def ragged_k(self, a, b, group_ends, out_dtype):
        acc = _acc_dtype(a.dtype)
        bt, _, m = a.shape
        out = torch.zeros((group_ends.shape[0], bt, m, b.shape[2]), dtype=acc, device=a.device)
        for g, (start, end) in enumerate(_bounds(group_ends)):
            if end > start:
                out[g] = torch.matmul(a[:, start:end].transpose(1, 2).to(acc), b[:, start:end].to(acc))
        return out.to(out_dtype)

    def batch(self, a, b, out_dtype):
        acc = _acc_dtype(a.dtype)
        return torch.matmul(a.to(acc), b.to(acc)).to(out_dtype)


BACKEND = ReferenceBackend()
