"""What the router's fused kernels share: when they apply, their block geometry and a row-softmax helper.

`ragdot.moe.router_losses` (the auxiliary losses) and `ragdot.moe.router_topk` (softmax and top-k) read rows of
the router's float32 logits [T, E], one row per block row of E_POW2 columns, BLOCK_T rows per program.
"""

from __future__ import annotations

import functools

import torch

from ragdot.moe.routing_kernels import HAS_TRITON, _pow2
from ragdot.ops import _transformed, fake_tracing

__all__ = ["MAX_EXPERTS", "check_logits"]

MAX_EXPERTS = 1024  # a row of logits is one block of the kernels
_ROW_ELEMS = 8192  # logits per program (BLOCK_T x E_POW2)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _softmax_rows(logits_ptr, pid, T, E, stride_t, BLOCK_T: tl.constexpr, E_POW2: tl.constexpr):
        """Rows pid*BLOCK_T.. of the logits: (softmax [BLOCK_T, E_POW2], lse [BLOCK_T], row mask, col mask)."""
        rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, E_POW2)
        row_ok = rows < T
        col_ok = cols < E
        ptrs = logits_ptr + rows.to(tl.int64)[:, None] * stride_t + cols[None, :]
        x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=float("-inf"))
        m = tl.where(row_ok, tl.max(x, axis=1), 0.0)
        ex = tl.exp(x - m[:, None])  # 0 in the padding columns and rows
        s = tl.where(row_ok, tl.sum(ex, axis=1), 1.0)
        return ex / s[:, None], m + tl.log(s), row_ok, col_ok


@functools.lru_cache(maxsize=256)
def _geometry(t: int, e: int) -> tuple[int, int, int]:
    """(E_POW2, BLOCK_T, NB) for t tokens and e experts."""
    e_pow2 = _pow2(max(e, 2))
    block_t = max(1, min(_pow2(t), _ROW_ELEMS // e_pow2))
    return e_pow2, block_t, -(-t // block_t)


def _fused_applies(logits: torch.Tensor) -> bool:
    """Whether the router kernels take these logits: float32 [T >= 1, E <= MAX_EXPERTS] with contiguous rows, on
    CUDA, in eager mode (not while torch.compile traces, not under a functorch transform or a fake tensor mode;
    under other TorchDispatchModes, which do not see the launches, they run as usual)."""
    return (HAS_TRITON and logits.is_cuda and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.stride(1) == 1 and logits.shape[0] > 0 and logits.shape[1] <= MAX_EXPERTS
            and not torch.compiler.is_compiling() and not _transformed() and not fake_tracing())


def check_logits(logits: torch.Tensor) -> None:
    """ValueError unless the kernels can take `logits`: float32 [T >= 1, E <= MAX_EXPERTS] with contiguous rows."""
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1 or logits.shape[0] == 0:
        raise ValueError(f"logits: expected a float32 [T, E] tensor with T >= 1 and contiguous rows, got "
                         f"{logits.dtype} {tuple(logits.shape)} strides {logits.stride()}")
    if logits.shape[1] > MAX_EXPERTS:
        raise ValueError(f"logits: at most {MAX_EXPERTS} experts, got {logits.shape[1]}")
