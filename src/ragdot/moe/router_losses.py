"""The router's two auxiliary losses in three launches per train step (two forward, one backward).

    aux = aux_coef * E * sum_e f_e * P_e      f_e = counts[e] / total,  P_e = mean_t softmax(logits_t)_e
    z   = z_coef * mean_t logsumexp(logits_t)^2

`ragdot.moe.router`'s `load_balancing_loss` and `router_z_loss` compute the same with about fifteen small
PyTorch launches forward and a dozen autograd nodes backward; an eager train step pays each of them in host
time, once per MoE layer. Here:

1. ``_partials_kernel``: per block of BLOCK_T tokens, the softmax's column sums and the sum of lse^2
   -> ``part [NB, E + 1]`` (float32);
2. ``_finish_kernel``: one program sums the blocks in order and writes ``out [2] = (aux, z)``;
3. ``_grad_kernel`` (backward): recomputes each row's softmax and lse and writes the logits' gradient
   ``p * (2 g_z z_coef lse / T + c - <p, c>)`` with ``c_e = g_aux aux_coef E f_e / T``.

The sums run in a fixed order (no atomics), so repeats are bitwise equal; the values differ from the PyTorch
form only by float32 rounding. `router_losses` takes this path for float32 logits on CUDA in eager mode and
the PyTorch form everywhere else (CPU, float64, torch.compile, which fuses those ops itself, functorch
transforms, more than `router_rows.MAX_EXPERTS` experts). No host synchronisation: `total` is a Python int.
"""

from __future__ import annotations

import torch

from ragdot import amp
from ragdot.moe.router import load_balancing_loss, router_z_loss
from ragdot.moe.router_rows import _ROW_ELEMS, _fused_applies, _geometry, check_logits
from ragdot.moe.routing_kernels import HAS_TRITON, _launch, _pow2

__all__ = ["router_losses", "fused_router_losses"]

if HAS_TRITON:
    import triton
    import triton.language as tl

    from ragdot.moe.router_rows import _softmax_rows

    @triton.jit
    def _partials_kernel(
        logits_ptr,  # float32 [T, E], row stride stride_t
        part_ptr,  # float32 [NB, E + 1] out: per block, column sums of the softmax, then the sum of lse^2
        T, E, stride_t,  # scalars: tokens, experts, row stride of the logits
        BLOCK_T: tl.constexpr,  # tokens per program
        E_POW2: tl.constexpr,  # power of two >= E
    ):
        pid = tl.program_id(0)
        p, lse, row_ok, col_ok = _softmax_rows(logits_ptr, pid, T, E, stride_t, BLOCK_T, E_POW2)
        cols = tl.arange(0, E_POW2)
        col_sum = tl.sum(tl.where(row_ok[:, None], p, 0.0), axis=0)
        tl.store(part_ptr + pid * (E + 1) + cols, col_sum, mask=col_ok)
        tl.store(part_ptr + pid * (E + 1) + E, tl.sum(tl.where(row_ok, lse * lse, 0.0), axis=0))

    @triton.jit
    def _finish_kernel(
        part_ptr,  # float32 [NB, E + 1] from _partials_kernel
        counts_ptr,  # int32|int64 [E]: assignments per expert
        out_ptr,  # float32 [2] out: aux_coef * aux, z_coef * z
        NB, E, T, total,  # scalars: blocks, experts, tokens, assignments counted (f_e's divisor)
        aux_coef, z_coef,  # float scalars: the losses' coefficients
        BLOCK_B: tl.constexpr,  # blocks summed per step
        E_POW2: tl.constexpr,  # power of two >= E
    ):
        cols = tl.arange(0, E_POW2)
        col_ok = cols < E
        col_sum = tl.zeros((E_POW2,), dtype=tl.float32)
        z_sum = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for b0 in range(0, NB, BLOCK_B):
            blocks = b0 + tl.arange(0, BLOCK_B)
            b_ok = blocks < NB
            part = tl.load(part_ptr + blocks[:, None] * (E + 1) + cols[None, :], mask=b_ok[:, None] & col_ok[None, :],
                           other=0.0)
            col_sum += tl.sum(part, axis=0)
            z_sum += tl.load(part_ptr + blocks * (E + 1) + E, mask=b_ok, other=0.0)
        f = tl.load(counts_ptr + cols, mask=col_ok, other=0).to(tl.float32) / total
        aux = E * tl.sum(f * (col_sum / T), axis=0)
        tl.store(out_ptr, aux_coef * aux)
        tl.store(out_ptr + 1, z_coef * (tl.sum(z_sum, axis=0) / T))

    @triton.jit
    def _grad_kernel(
        logits_ptr,  # float32 [T, E], row stride stride_t
        counts_ptr,  # int32|int64 [E]
        grad_out_ptr,  # float32 [2]: gradients of (aux, z)
        grad_ptr,  # float32 [T, E] out (contiguous): gradient of the logits
        T, E, stride_t, total,  # scalars
        aux_coef, z_coef,  # float scalars
        BLOCK_T: tl.constexpr,
        E_POW2: tl.constexpr,
    ):
        pid = tl.program_id(0)
        p, lse, row_ok, col_ok = _softmax_rows(logits_ptr, pid, T, E, stride_t, BLOCK_T, E_POW2)
        cols = tl.arange(0, E_POW2)
        g_aux = tl.load(grad_out_ptr)
        g_z = tl.load(grad_out_ptr + 1)
        f = tl.load(counts_ptr + cols, mask=col_ok, other=0).to(tl.float32) / total
        c = g_aux * aux_coef * E * f / T  # d loss / d p_te, the same for every token
        per_row = 2.0 * g_z * z_coef * lse / T - tl.sum(p * c[None, :], axis=1)  # softmax backward's row term
        g = p * (c[None, :] + per_row[:, None])
        rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        tl.store(grad_ptr + rows.to(tl.int64)[:, None] * E + cols[None, :], g, mask=row_ok[:, None] & col_ok[None, :])


class _RouterLosses(torch.autograd.Function):
    """(logits [T, E] float32, counts [E]) -> float32 [2] = (aux_coef * aux, z_coef * z); see the module."""

    @staticmethod
    def forward(ctx, logits, counts, total, aux_coef, z_coef):
        t, e = logits.shape
        e_pow2, block_t, nb = _geometry(t, e)
        part = torch.empty((nb, e + 1), dtype=torch.float32, device=logits.device)
        out = torch.empty((2,), dtype=torch.float32, device=logits.device)
        _launch(_partials_kernel, (nb,), {"BLOCK_T": block_t, "E_POW2": e_pow2}, 4, logits, part, t, e,
                logits.stride(0))
        _launch(_finish_kernel, (1,), {"BLOCK_B": max(1, min(_pow2(nb), _ROW_ELEMS // e_pow2)), "E_POW2": e_pow2},
                4, part, counts, out, nb, e, t, total, aux_coef, z_coef)
        ctx.save_for_backward(logits, counts)
        ctx.consts = (total, aux_coef, z_coef)
        return out

    @staticmethod
    @amp.autocast_off
    def backward(ctx, grad_out):
        logits, counts = ctx.saved_tensors
        total, aux_coef, z_coef = ctx.consts
        t, e = logits.shape
        e_pow2, block_t, nb = _geometry(t, e)
        grad = torch.empty((t, e), dtype=torch.float32, device=logits.device)
        _launch(_grad_kernel, (nb,), {"BLOCK_T": block_t, "E_POW2": e_pow2}, 4, logits, counts,
                grad_out.float().contiguous(), grad, t, e, logits.stride(0), total, aux_coef, z_coef)
        return grad, None, None, None, None


def fused_router_losses(
    logits: torch.Tensor, counts: torch.Tensor, total: int, aux_coef: float, z_coef: float
) -> torch.Tensor:
    """float32 [2]: (aux_coef * load-balancing loss, z_coef * z-loss) of float32 logits [T, E] (T >= 1,
    E <= MAX_EXPERTS, row-major rows) and assignment counts [E] (int32/int64) of `total` assignments, through
    the kernels above."""
    check_logits(logits)
    if counts.shape != (logits.shape[1],) or counts.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"counts: expected int32/int64 [{logits.shape[1]}], got {counts.dtype} "
                         f"{tuple(counts.shape)}")
    return _RouterLosses.apply(logits, counts.contiguous(), max(int(total), 1), float(aux_coef), float(z_coef))


def router_losses(
    logits: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor, total: int | None, aux_coef: float,
    z_coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux_coef * load_balancing_loss(probs, counts, total), z_coef * router_z_loss(logits)): through the fused
    kernels where they apply (see the module; `total` given), else the PyTorch form."""
    if total is not None and _fused_applies(logits):
        out = fused_router_losses(logits, counts, total, aux_coef, z_coef)
        return out[0], out[1]
    return aux_coef * load_balancing_loss(probs, counts, total), z_coef * router_z_loss(logits)
