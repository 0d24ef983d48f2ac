"""The router's softmax and top-k in one launch forward and one backward.

    probs            = softmax(logits)                                   [T, E]
    weights, experts = top_k(probs)                                      [T, k], best first
    weights          = weights / sum(weights)      (if normalize)

`ragdot.moe.router.Router` writes this as `torch.softmax`, `torch.topk`, a sum and a division: four launches
forward and about as many autograd nodes backward, each paid in host time once per MoE layer and eager train
step. Here:

1. ``_softmax_topk_kernel``: per block of BLOCK_T tokens, the softmax (written out: the losses and the dense
   paths use it) and k rounds of a row-wise argmax over the experts not chosen yet -> ``probs [T, E]``,
   ``weights [T, k]`` and ``experts [T, k]`` (int64);
2. ``_softmax_topk_bwd_kernel`` (backward): scatters the weights' gradient to the chosen experts (through the
   renormalisation: ``dp_j += (dw_j - sum_i dw_i w_i) / S`` with ``S`` the sum of the chosen probs, else
   ``dp_j += dw_j``), adds the probs' gradient and writes the logits' gradient ``p * (dp - <p, dp>)``.

Ties go to the lower expert index, so the choice is deterministic (`torch.topk` promises no order among equal
values); a row holding NaN still gets k distinct experts in ``[0, E)``. The weights before renormalisation are
the written probs' bits. No atomics and fixed reduction orders: repeats are bitwise equal; the values differ from
the PyTorch form only by float32 rounding. `softmax_topk` takes this path for float32 logits on CUDA in eager
mode and the PyTorch form everywhere else (CPU, float64, torch.compile, which fuses those ops itself, functorch
transforms, more than MAX_EXPERTS experts), the same rule as `ragdot.moe.router_losses`.
"""

from __future__ import annotations

import functools

import torch

from ragdot import amp
from ragdot.moe.router_rows import _fused_applies, _geometry, check_logits
from ragdot.moe.routing_kernels import HAS_TRITON, _launch, _pow2

__all__ = ["softmax_topk", "fused_softmax_topk"]

if HAS_TRITON:
    import triton
    import triton.language as tl

    from ragdot.moe.router_rows import _softmax_rows

    @triton.jit
    def _top_k(p, col_ok, BLOCK_T: tl.constexpr, K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr):
        """(p [BLOCK_T, K_POW2], experts int32 [BLOCK_T, K_POW2]) of each row's K largest p [BLOCK_T, E_POW2],
        best first, ties to the lower index; 0 past K."""
        cols = tl.arange(0, E_POW2)[None, :]
        kcols = tl.arange(0, K_POW2)[None, :]
        cand = tl.where(col_ok[None, :], p, -1.0)  # -1: chosen already or padding (probs are >= 0)
        w = tl.zeros((BLOCK_T, K_POW2), dtype=tl.float32)
        ids = tl.zeros((BLOCK_T, K_POW2), dtype=tl.int32)
        for j in range(K):
            best = tl.max(cand, axis=1)[:, None]
            hit = ((cand == best) & (cand >= 0.0)) | (cand != cand)  # NaN counts as a candidate of its own
            pick = tl.min(tl.where(hit, cols, E_POW2), axis=1)[:, None]  # the lowest index among equals
            chosen = cols == pick
            w = tl.where(kcols == j, tl.sum(tl.where(chosen, cand, 0.0), axis=1)[:, None], w)  # p's exact bits
            ids = tl.where(kcols == j, pick, ids)
            cand = tl.where(chosen, -1.0, cand)
        return w, ids

    @triton.jit
    def _softmax_topk_kernel(
        logits_ptr,  # float32 [T, E], row stride stride_t
        probs_ptr,  # float32 [T, E] out (contiguous): softmax of each row
        weights_ptr,  # float32 [T, K] out (contiguous): probs of the chosen experts, renormalised if NORMALIZE
        experts_ptr,  # int64 [T, K] out (contiguous): chosen experts, best first, ties to the lower index
        T, E, stride_t,  # scalars: tokens, experts, row stride of the logits
        K: tl.constexpr,  # experts chosen per token, 1 <= K <= E
        K_POW2: tl.constexpr,  # power of two >= K
        NORMALIZE: tl.constexpr,  # renormalise the weights to sum to 1
        BLOCK_T: tl.constexpr,  # tokens per program
        E_POW2: tl.constexpr,  # power of two >= E
    ):
        pid = tl.program_id(0)
        p, _, row_ok, col_ok = _softmax_rows(logits_ptr, pid, T, E, stride_t, BLOCK_T, E_POW2)
        rows = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None]
        cols = tl.arange(0, E_POW2)[None, :]
        tl.store(probs_ptr + rows * E + cols, p, mask=row_ok[:, None] & col_ok[None, :])
        w, ids = _top_k(p, col_ok, BLOCK_T, K, K_POW2, E_POW2)
        if NORMALIZE:
            w = w / tl.where(row_ok, tl.sum(w, axis=1), 1.0)[:, None]  # 0 past K
        kcols = tl.arange(0, K_POW2)[None, :]
        out = rows * K + kcols
        out_ok = row_ok[:, None] & (kcols < K)
        tl.store(weights_ptr + out, w, mask=out_ok)
        tl.store(experts_ptr + out, ids.to(tl.int64), mask=out_ok)

    @triton.jit
    def _top_k_grad(
        p, rows, row_ok, experts_ptr, dweights_ptr, sdw_t, sdw_k,
        BLOCK_T: tl.constexpr, K: tl.constexpr, NORMALIZE: tl.constexpr, E_POW2: tl.constexpr,
    ):
        """Gradient of the probs p [BLOCK_T, E_POW2] through the weights of the top-k (renormalised if NORMALIZE)."""
        cols = tl.arange(0, E_POW2)[None, :]
        dw = tl.zeros((BLOCK_T, E_POW2), dtype=tl.float32)  # the weights' gradient at the chosen experts
        chosen = tl.zeros((BLOCK_T, E_POW2), dtype=tl.int32)
        for j in range(K):
            e = tl.load(experts_ptr + rows * K + j, mask=row_ok[:, None], other=-1)
            g = tl.load(dweights_ptr + rows * sdw_t + j * sdw_k, mask=row_ok[:, None], other=0.0).to(tl.float32)
            hit = cols == e
            dw = tl.where(hit, g, dw)
            chosen = tl.where(hit, 1, chosen)
        if NORMALIZE:  # w_j = p_j / S
            s = tl.where(row_ok, tl.sum(tl.where(chosen != 0, p, 0.0), axis=1), 1.0)[:, None]
            dot = tl.sum(dw * p, axis=1)[:, None] / s  # sum_i dw_i w_i
            dw = tl.where(chosen != 0, (dw - dot) / s, 0.0)
        return dw

    @triton.jit
    def _softmax_topk_bwd_kernel(
        probs_ptr,  # float32 [T, E] (contiguous): the forward's probs
        experts_ptr,  # int64 [T, K] (contiguous): the forward's experts
        dprobs_ptr,  # float [T, E], strides (sdp_t, sdp_e): gradient of the probs (read only if HAS_DPROBS)
        dweights_ptr,  # float [T, K], strides (sdw_t, sdw_k): gradient of the weights (read only if HAS_DWEIGHTS)
        dlogits_ptr,  # float32 [T, E] out (contiguous): gradient of the logits
        T, E, sdp_t, sdp_e, sdw_t, sdw_k,  # scalars: tokens, experts, the gradients' strides
        K: tl.constexpr,  # experts chosen per token
        NORMALIZE: tl.constexpr,  # the weights were renormalised
        HAS_DPROBS: tl.constexpr,  # the probs have a gradient (else 0)
        HAS_DWEIGHTS: tl.constexpr,  # the weights have a gradient (else 0)
        BLOCK_T: tl.constexpr,  # tokens per program
        E_POW2: tl.constexpr,  # power of two >= E
    ):
        rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        row_ok = rows < T
        rows = rows[:, None]
        cols = tl.arange(0, E_POW2)[None, :]
        m = row_ok[:, None] & (cols < E)
        p = tl.load(probs_ptr + rows * E + cols, mask=m, other=0.0)
        dp = tl.zeros((BLOCK_T, E_POW2), dtype=tl.float32)
        if HAS_DPROBS:
            dp += tl.load(dprobs_ptr + rows * sdp_t + cols * sdp_e, mask=m, other=0.0).to(tl.float32)
        if HAS_DWEIGHTS:
            dp += _top_k_grad(p, rows, row_ok, experts_ptr, dweights_ptr, sdw_t, sdw_k, BLOCK_T, K, NORMALIZE,
                              E_POW2)
        g = p * (dp - tl.sum(p * dp, axis=1)[:, None])
        tl.store(dlogits_ptr + rows * E + cols, g, mask=m)


@functools.lru_cache(maxsize=256)
def _plan(t: int, e: int, k: int, normalize: bool) -> tuple[tuple[int], dict, dict]:
    """(grid, forward constexprs, backward constexprs without HAS_*) of a signature, computed once."""
    e_pow2, block_t, nb = _geometry(t, e)
    shared = {"K": k, "NORMALIZE": normalize, "BLOCK_T": block_t, "E_POW2": e_pow2}
    return (nb,), {**shared, "K_POW2": _pow2(k)}, shared


class _SoftmaxTopK(torch.autograd.Function):
    """(logits [T, E] float32, k, normalize) -> (probs [T, E], weights [T, k], experts int64 [T, k]); see the
    module."""

    @staticmethod
    def forward(ctx, logits, k, normalize):
        t, e = logits.shape
        grid, consts, bwd_consts = _plan(t, e, k, normalize)
        probs = torch.empty((t, e), dtype=torch.float32, device=logits.device)
        weights = torch.empty((t, k), dtype=torch.float32, device=logits.device)
        experts = torch.empty((t, k), dtype=torch.int64, device=logits.device)
        _launch(_softmax_topk_kernel, grid, consts, 4, logits, probs, weights, experts, t, e, logits.stride(0))
        ctx.mark_non_differentiable(experts)
        ctx.set_materialize_grads(False)  # a missing gradient stays None: the kernel skips its loads
        ctx.save_for_backward(probs, experts)
        ctx.grid, ctx.bwd_consts = grid, bwd_consts
        return probs, weights, experts

    @staticmethod
    @amp.autocast_off
    def backward(ctx, dprobs, dweights, _dexperts):
        if dprobs is None and dweights is None:
            return None, None, None
        probs, experts = ctx.saved_tensors
        dlogits = torch.empty_like(probs)
        dp = probs if dprobs is None else dprobs  # a placeholder where the kernel reads nothing
        dw = experts if dweights is None else dweights
        consts = {**ctx.bwd_consts, "HAS_DPROBS": dprobs is not None, "HAS_DWEIGHTS": dweights is not None}
        _launch(_softmax_topk_bwd_kernel, ctx.grid, consts, 4, probs, experts, dp, dw, dlogits, *probs.shape,
                *dp.stride(), *dw.stride())
        return dlogits, None, None


def fused_softmax_topk(
    logits: torch.Tensor, k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs float32 [T, E], weights float32 [T, k], experts int64 [T, k]) of float32 logits [T, E] (T >= 1,
    E <= MAX_EXPERTS, row-major rows) through the kernels above; ties to the lower expert index."""
    check_logits(logits)
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k must be in [1, {logits.shape[1]}], got {k}")
    return _SoftmaxTopK.apply(logits, int(k), bool(normalize))


def softmax_topk(
    logits: torch.Tensor, k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs [T, E], weights [T, k], experts int64 [T, k], best first) of the logits [T, E], the weights
    renormalised to sum to 1 if `normalize`: through the fused kernels where they apply (see the module), else
    the PyTorch form."""
    if _fused_applies(logits) and 1 <= k <= logits.shape[1]:  # fused_softmax_topk's checks, without raising
        return _SoftmaxTopK.apply(logits, k, normalize)
    probs = torch.softmax(logits, dim=-1)
    weights, experts = torch.topk(probs, k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return probs, weights, experts
