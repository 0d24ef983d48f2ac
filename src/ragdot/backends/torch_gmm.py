"""`torch`: the vendor grouped GEMM behind `torch._grouped_mm` (CUTLASS on CUDA sm90+, CK/hipBLASLt on ROCm).

ragdot's rules are enforced on top of it: rows past the last group, which it leaves uninitialised, are
zeroed; operands whose strides or alignment it rejects are first copied into a layout it accepts (that copy
is part of this backend's cost). Cases it cannot compute raise NotImplementedError.
"""

from __future__ import annotations

import torch

__all__ = ["BACKEND"]

_ALIGN_BYTES = 16


def _layout_ok(t: torch.Tensor) -> bool:
    """Row- or column-major in the last two dims with a 16-byte aligned leading stride and base."""
    rows, cols = t.shape[-2], t.shape[-1]
    s_rows, s_cols = t.stride(-2), t.stride(-1)
    align = _ALIGN_BYTES // t.element_size()
    if t.data_ptr() % _ALIGN_BYTES:
        return False
    if t.ndim == 3 and t.shape[0] > 1 and t.stride(0) % align:
        return False
    if s_cols == 1 and s_rows >= max(1, cols):
        return s_rows % align == 0
    if s_rows == 1 and s_cols >= max(1, rows):
        return s_cols % align == 0
    return False


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t` itself if _grouped_mm accepts its layout, else a row-major copy with a padded leading stride."""
    if _layout_ok(t):
        return t
    align = _ALIGN_BYTES // t.element_size()
    cols = t.shape[-1]
    padded = -(-cols // align) * align
    buf = t.new_empty((*t.shape[:-1], padded))
    buf[..., :cols].copy_(t)
    return buf[..., :cols]


def _zero_tail_rows_(c: torch.Tensor, group_ends: torch.Tensor) -> None:
    """Zero rows >= group_ends[-1] of c [Bt, M, N] without a host synchronisation."""
    if c.is_cuda:
        try:
            from ragdot.kernels.tail import zero_tail_rows_
        except ImportError:
            pass
        else:
            zero_tail_rows_(c, group_ends)
            return
    rows = torch.arange(c.shape[1], device=c.device)
    c.masked_fill_((rows >= group_ends[-1])[None, :, None], 0)


class TorchGroupedMMBackend:
    name = "torch"

    def is_available(self) -> bool:
        return hasattr(torch, "_grouped_mm")

    def _check(self, a: torch.Tensor, out_dtype: torch.dtype) -> torch.dtype:
        """The dtype to run _grouped_mm in; NotImplementedError where it has no kernel."""
        if a.dtype == torch.float64 or out_dtype == torch.float64:
            raise NotImplementedError("torch._grouped_mm has no float64 kernel")
        if a.is_cuda and a.dtype != torch.bfloat16:
            raise NotImplementedError(f"torch._grouped_mm on CUDA computes bfloat16 only, got {a.dtype}")
        if a.is_cuda:
            if out_dtype not in (torch.bfloat16, torch.float32):
                raise NotImplementedError(f"torch._grouped_mm on CUDA writes bfloat16 or float32, not {out_dtype}")
            return a.dtype
        # CPU: the output dtype must equal the input dtype; widen the inputs when a wider output is asked for.
        return out_dtype if out_dtype.itemsize > a.dtype.itemsize else a.dtype

    def _gmm(self, mat_a, mat_b, offs, run_dtype, out_dtype):
        mat_a, mat_b = mat_a.to(run_dtype), mat_b.to(run_dtype)
        kwargs = {"out_dtype": out_dtype} if mat_a.is_cuda else {}
        try:
            out = torch._grouped_mm(_aligned(mat_a), _aligned(mat_b), offs=offs, **kwargs)
        except RuntimeError as exc:
            raise NotImplementedError(str(exc)) from exc
        return out.to(out_dtype)

    def ragged_m(self, a, b, group_ends, out_dtype):
        run = self._check(a, out_dtype)
        outs = [self._gmm(a[i], b[i], group_ends, run, out_dtype) for i in range(a.shape[0])]
        out = outs[0].unsqueeze(0) if len(outs) == 1 else torch.stack(outs)
        if not out.is_contiguous():  # CUDA pads the row stride to 16 bytes when N is not a multiple
            out = out.contiguous()
        _zero_tail_rows_(out, group_ends)
        return out

    def ragged_k(self, a, b, group_ends, out_dtype):
        run = self._check(a, out_dtype)
        # 2D x 2D -> 3D: mat_a [M, R] with the ragged dim last, mat_b [R, N]; empty groups come back zero.
        outs = [self._gmm(a[i].transpose(0, 1), b[i], group_ends, run, out_dtype) for i in range(a.shape[0])]
        return outs[0].unsqueeze(1) if len(outs) == 1 else torch.stack(outs, dim=1)

    def batch(self, a, b, out_dtype):
        if a.dtype == torch.float64:
            raise NotImplementedError("no float64 path in the torch backend")
        run = out_dtype if out_dtype.itemsize > a.dtype.itemsize else a.dtype
        return torch.bmm(a.to(run), b.to(run)).to(out_dtype)


BACKEND = TorchGroupedMMBackend()
