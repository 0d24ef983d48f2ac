"""Fused MoE backward kernels: dSwiGLU in the data-gradient GEMM's epilogue, weight gradients reading the index.

With the forward of ``ragdot.kernels.fused_moe`` (row r holds assignment ``a(r) = order[r]``, token
``t(r) = a(r) // k``, router weight ``w[a(r)]``) and the cotangent ``dy [T, D]``:

    g[r]        = dy[t(r)] @ w_down[e]^T                                 down_bwd_swiglu: gathered rows of dy,
    act[r]      = silu(gate[r]) * up[r]                                   recomputed from the saved pre
    dw[a(r)]    = <g[r], act[r]>                                          float32 partials per column tile
    dpre[r]     = dSwiGLU(w[a(r)] * g[r]; gate[r], up[r])                 [A, 2H], the up GEMM's cotangent
    dW_down[e]  = sum_{r in e} act[r]^T (w[a(r)] * dy[t(r)])              wgrad, right rows gathered and scaled
    dW_gu[e]    = sum_{r in e} x[t(r)]^T dpre[r]                          wgrad, left rows gathered
    dx          = sum_j (dpre @ w_gate_up[e]^T)[slot(t, j)]               fused_moe.down_scatter + sum_choices

The weight-gradient kernel is a ragged-K product: one program per (expert, output tile) contracts only that
expert's rows, so there are no atomics and an empty expert stores exact zeros. Row loads are masked to the
group, so NaN stored outside it never enters a result. The router-weight gradient is summed over the column
tiles in a fixed order afterwards (bitwise reproducible).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot.kernels.configs import dot_precision, next_pow2
from ragdot.kernels.fused_moe import FusedConfig, _consts, _gathered_rows, _grid, fused_config, launch_bound
from ragdot.kernels.ragged_m import _group_table, _locate

__all__ = ["down_bwd_swiglu", "swiglu_backward", "weight_grad"]


@triton.jit
def _down_bwd_swiglu_kernel(
    dy_ptr,  # [T, K] cotangent of y (row stride stride_dy, unit column stride)
    w_ptr,  # [E, K, N] w_down viewed transposed ([E, D, H]), any strides
    order_ptr,  # int32 [M]: assignment held by permuted row r
    sizes_ptr,  # int32 [E]: permuted rows per expert (sums to M)
    weights_ptr,  # float [M]: router weights in assignment order
    pre_ptr,  # [M, 2N] contiguous: the forward's gate | up
    dpre_ptr,  # [M, 2N] contiguous out: d gate | d up
    act_ptr,  # [M, N] contiguous out: silu(gate) * up, recomputed
    dw_ptr,  # float32 [cdiv(N, BLOCK_N), M] out: <g, act> over each column tile, at the assignment's index
    M, N, K, E,  # scalars: permuted rows, hidden width, model dim, experts
    stride_dy,  # scalar: row stride of dy
    stride_we, stride_wk, stride_wn,  # scalars: strides of the transposed w_down view
    max_tiles,  # scalar: the grid
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    offs, starts, ends, first, tiles = _group_table(sizes_ptr, M, E, 1, BLOCK_M, BLOCK_G, True)
    if pid < tl.sum(tiles, 0) * num_n:
        g, row0, row_end, n_idx = _locate(pid, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
        rm, row_ok, a, tok = _gathered_rows(order_ptr, row0, row_end, TOP_K, BLOCK_M)
        rn = n_idx * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        rk = tl.arange(0, BLOCK_K)
        dy_ptrs = dy_ptr + tok[:, None] * stride_dy + rk[None, :]
        w_ptrs = w_ptr + g.to(tl.int64) * stride_we + rk[:, None] * stride_wk + rn.to(tl.int64)[None, :] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.where(g < E, K, 0), BLOCK_K):
            k_ok = rk < K - k
            lhs = tl.load(dy_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            rhs = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = tl.dot(lhs, rhs, acc, input_precision=PRECISION)
            dy_ptrs += BLOCK_K
            w_ptrs += BLOCK_K * stride_wk
        m = row_ok[:, None] & n_ok[None, :]
        rows64 = rm.to(tl.int64)[:, None]
        pre = pre_ptr + rows64 * (2 * N) + rn[None, :]
        gate = tl.load(pre, mask=m, other=0.0).to(tl.float32)
        up = tl.load(pre + N, mask=m, other=0.0).to(tl.float32)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        act = (silu * up).to(act_ptr.dtype.element_ty)
        tl.store(act_ptr + rows64 * N + rn[None, :], act, mask=m)
        dot = tl.sum(tl.where(m, acc * act.to(tl.float32), 0.0), axis=1)
        tl.store(dw_ptr + n_idx.to(tl.int64) * M + a, dot, mask=row_ok)
        d_act = acc * tl.load(weights_ptr + a, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        d_up = d_act * silu
        d_gate = d_act * up * sig * (1.0 + gate * (1.0 - sig))
        dpre = dpre_ptr + rows64 * (2 * N) + rn[None, :]
        tl.store(dpre, d_gate.to(dpre_ptr.dtype.element_ty), mask=m)
        tl.store(dpre + N, d_up.to(dpre_ptr.dtype.element_ty), mask=m)


@triton.jit
def _weight_grad_kernel(
    l_ptr,  # [*, P] left factor rows: token rows if GATHER_L, else permuted rows (row stride stride_l)
    r_ptr,  # [*, Q] right factor rows: token rows if GATHER_R, else permuted rows (row stride stride_r)
    order_ptr,  # int32 [M]: assignment held by permuted row r
    sizes_ptr,  # int32 [E]: permuted rows per expert (sums to M)
    weights_ptr,  # float [M]: router weights in assignment order (read only if SCALE_R)
    out_ptr,  # [E, P, Q] contiguous out: sum over the expert's rows of l^T (w * r)
    P, Q, E,  # scalars: output rows, output columns, experts
    stride_l, stride_r,  # scalars: row strides of the factors
    TOP_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,  # power of two >= E
    GATHER_L: tl.constexpr, GATHER_R: tl.constexpr, SCALE_R: tl.constexpr, PRECISION: tl.constexpr,
):
    e = tl.program_id(1)
    num_q = tl.cdiv(Q, BLOCK_Q)
    rp = (tl.program_id(0) // num_q) * BLOCK_P + tl.arange(0, BLOCK_P)
    rq = (tl.program_id(0) % num_q) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    p_ok = rp < P
    q_ok = rq < Q
    ge = tl.arange(0, BLOCK_E)
    sizes = tl.load(sizes_ptr + ge, mask=ge < E, other=0)
    end = tl.sum(tl.where(ge == e, tl.cumsum(sizes, 0), 0), 0)
    start = end - tl.sum(tl.where(ge == e, sizes, 0), 0)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    for k0 in tl.range(start, end, BLOCK_K):
        rows = k0 + rk
        ok = rows < end
        a = tl.load(order_ptr + rows, mask=ok, other=0).to(tl.int64)
        li = rows.to(tl.int64)
        ri = rows.to(tl.int64)
        if GATHER_L:
            li = a // TOP_K
        if GATHER_R:
            ri = a // TOP_K
        lhs = tl.load(l_ptr + li[None, :] * stride_l + rp[:, None], mask=ok[None, :] & p_ok[:, None], other=0.0)
        rhs = tl.load(r_ptr + ri[:, None] * stride_r + rq[None, :], mask=ok[:, None] & q_ok[None, :], other=0.0)
        if SCALE_R:
            w = tl.load(weights_ptr + a, mask=ok, other=0.0).to(tl.float32)
            rhs = (rhs.to(tl.float32) * w[:, None]).to(r_ptr.dtype.element_ty)
        acc = tl.dot(lhs, rhs, acc, input_precision=PRECISION)
    out = out_ptr + (e.to(tl.int64) * P + rp.to(tl.int64)[:, None]) * Q + rq[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=p_ok[:, None] & q_ok[None, :])


@triton.jit
def _swiglu_bwd_kernel(
    g_ptr,  # [M, N]: the down projection's data gradient per permuted row (row stride stride_g, unit columns)
    pre_ptr,  # [M, 2N] contiguous: the forward's gate | up
    order_ptr,  # int32 [M]: assignment held by permuted row r
    weights_ptr,  # float [M]: router weights in assignment order
    dpre_ptr,  # [M, 2N] contiguous out: d gate | d up of w * g (may be pre_ptr: read, then written in place)
    act_ptr,  # [M, N] contiguous out: w * silu(gate) * up, the activation recomputed and scaled (may be g_ptr)
    dw_ptr,  # float32 [M] out: <g, silu(gate) * up> at the assignment's index
    M,  # scalar: permuted rows
    stride_g,  # scalar: row stride of g
    N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < M
    a = tl.load(order_ptr + rows, mask=ok, other=0)
    w = tl.load(weights_ptr + a, mask=ok, other=0.0).to(tl.float32)[:, None]
    r64 = rows.to(tl.int64)[:, None]
    dot = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):  # N is a compile-time bound: one fixed order of the row sums
        cols = n0 + tl.arange(0, BLOCK_N)
        m = ok[:, None] & (cols < N)[None, :]
        g = tl.load(g_ptr + r64 * stride_g + cols[None, :], mask=m, other=0.0).to(tl.float32)
        pre = pre_ptr + r64 * (2 * N) + cols[None, :]
        gate = tl.load(pre, mask=m, other=0.0).to(tl.float32)
        up = tl.load(pre + N, mask=m, other=0.0).to(tl.float32)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        act = (silu * up).to(act_ptr.dtype.element_ty).to(tl.float32)  # the forward's rounded activation
        dot += tl.sum(g * act, axis=1)
        tl.store(act_ptr + r64 * N + cols[None, :], (act * w).to(act_ptr.dtype.element_ty), mask=m)
        d_act = g * w
        dpre = dpre_ptr + r64 * (2 * N) + cols[None, :]
        tl.store(dpre, (d_act * up * sig * (1.0 + gate * (1.0 - sig))).to(dpre_ptr.dtype.element_ty), mask=m)
        tl.store(dpre + N, (d_act * silu).to(dpre_ptr.dtype.element_ty), mask=m)
    tl.store(dw_ptr + a, dot, mask=ok)


def down_bwd_swiglu(
    dy: torch.Tensor,  # [T, D] cotangent of y, unit column stride
    w_down: torch.Tensor,  # [E, H, D]
    order: torch.Tensor,  # int32 [A]
    sizes: torch.Tensor,  # int32 [E]
    weights: torch.Tensor,  # float [A] router weights in assignment order
    pre: torch.Tensor,  # [A, 2H] the forward's gate | up
    top_k: int,
    config: FusedConfig | None = None,  # tiles (None: `fused_config`'s heuristic)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dpre [A, 2H], act [A, H] in pre.dtype, dw float32 [A] in assignment order)."""
    a, h2 = pre.shape
    h, (e, _, d) = h2 // 2, w_down.shape
    dpre, act = pre.new_empty((a, h2)), pre.new_empty((a, h))
    if a == 0 or h == 0:
        return dpre, act, pre.new_zeros((a,), dtype=torch.float32)
    wt = w_down.transpose(1, 2)  # [E, D, H]
    cfg = config or fused_config(pre.dtype, pre.device, h, "dbwd")
    grid = _grid(a, h, e, cfg)
    dw = pre.new_empty((triton.cdiv(h, cfg.block_n), a), dtype=torch.float32)
    launch_bound(_down_bwd_swiglu_kernel, (grid,), _consts(cfg, e, top_k, pre.dtype), cfg, pre.device,
                 dy, wt, order, sizes, weights, pre, dpre, act, dw, a, h, d, e, dy.stride(0), *wt.stride(),
                 grid)  # fmt: skip
    return dpre, act, (dw[0] if dw.shape[0] == 1 else dw.sum(0))


def weight_grad(
    left: torch.Tensor,  # [T or A, P]: token rows (gather_left) or permuted rows, unit column stride
    right: torch.Tensor,  # [T or A, Q]: token rows (gather_right) or permuted rows, unit column stride
    order: torch.Tensor,  # int32 [A]
    sizes: torch.Tensor,  # int32 [E]
    weights: torch.Tensor | None,  # float [A] router weights in assignment order, scaling the right rows
    top_k: int,
    *,
    gather_left: bool,
    gather_right: bool,
    config: FusedConfig | None = None,  # tiles (None: `fused_config`'s heuristic; 16-wide in the interpreter)
) -> torch.Tensor:
    """-> [E, P, Q] in left.dtype: per expert, the sum over its rows of left^T @ (w * right)."""
    e, p, q = sizes.numel(), left.shape[1], right.shape[1]
    out = left.new_empty((e, p, q))
    if out.numel() == 0:
        return out
    if order.numel() == 0:
        return out.zero_()
    cfg = config or (fused_config(left.dtype, left.device, q, "wgrad") if left.device.type == "cuda"
                     else FusedConfig(16, 16, 16, 1, 1, 1))
    grid = (triton.cdiv(p, cfg.block_m) * triton.cdiv(q, cfg.block_n), e)
    consts = dict(TOP_K=top_k, BLOCK_P=cfg.block_m, BLOCK_Q=cfg.block_n, BLOCK_K=cfg.block_k,
                  BLOCK_E=next_pow2(e), GATHER_L=gather_left, GATHER_R=gather_right, SCALE_R=weights is not None,
                  PRECISION=dot_precision(left.dtype))
    launch_bound(_weight_grad_kernel, grid, consts, cfg, left.device,
                 left, right, order, sizes, left if weights is None else weights, out, p, q, e,
                 left.stride(0), right.stride(0))  # fmt: skip
    return out


def swiglu_backward(
    g: torch.Tensor,  # [A, H] the down projection's data gradient per permuted row, unit column stride
    pre: torch.Tensor,  # [A, 2H] the forward's gate | up, contiguous
    order: torch.Tensor,  # int32 [A]
    weights: torch.Tensor,  # float [A] router weights in assignment order
    in_place: bool = False,  # write dpre over pre (each element is read before the same program writes it)
    act_over_g: bool = False,  # write w * act over g (g contiguous; read before written, as pre)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dpre [A, 2H], w * act [A, H] in pre.dtype, dw float32 [A] in assignment order): dSwiGLU of w * g,
    the recomputed activation scaled by the router weight, and the router weights' gradient <g, act>."""
    a, h2 = pre.shape
    h = h2 // 2
    if act_over_g and (not g.is_contiguous() or g.dtype != pre.dtype):
        raise ValueError(f"act_over_g needs a contiguous g in pre's dtype {pre.dtype}, got {g.dtype} {g.stride()}")
    dpre = pre if in_place else pre.new_empty((a, h2))
    act = g if act_over_g else pre.new_empty((a, h))
    if a == 0 or h == 0:
        return dpre, act, pre.new_zeros((a,), dtype=torch.float32)
    dw = pre.new_empty((a,), dtype=torch.float32)
    block_n = min(128, next_pow2(h))
    cfg = FusedConfig(16, block_n, 16, 1, 4, 1)
    launch_bound(_swiglu_bwd_kernel, (triton.cdiv(a, 16),), dict(N=h, BLOCK_R=16, BLOCK_N=block_n), cfg,
                 pre.device, g, pre, order, weights, dpre, act, dw, a, g.stride(0))  # fmt: skip
    return dpre, act, dw
