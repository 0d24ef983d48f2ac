"""Fused MoE forward kernels: gather in the up projection's loads, SwiGLU in its epilogue, weighted scatter in the
down projection's epilogue (``ragdot.moe.fused``'s forward_kind "fused"), and the elementwise SwiGLU
of its default forward (``swiglu``: the same formula from the rounded pre-activation).

    act[r]           = silu(x[t(r)] @ wg[e(r)]) * (x[t(r)] @ wu[e(r)])      up_swiglu     (no permuted copy of x)
    buf[a(r)]        = w[a(r)] * (act[r] @ w_down[e(r)])                     down_scatter  (buf [T*k, D] = [T, k, D])
    y[t]             = sum_j buf[t*k + j]                                    fixed order j = 0..k-1, float32

Row r of the permuted layout (rows grouped by expert, ``sizes [E]`` rows each) holds assignment
``a(r) = order[r] = t*k + j``: token ``t(r) = a(r) // k``'s ``j``-th choice. Both kernels reuse the ragged-M
tiling of ``ragdot.kernels.ragged_m`` (group-major tiles that never span two groups, the tile map rebuilt per
program from the raw sizes; no host sync), with pointer loads: the up projection reads its token rows through
``order`` (a gather TMA cannot describe on Hopper), and the down projection stores each finished row at its
assignment's slot of ``buf``. Slots are unique, so no atomics are needed and the result is bitwise
reproducible; ``atomic=True`` instead adds the weighted rows straight into a float32 ``[T, D]`` (one launch
less, order of the additions not fixed: opt-in only).

Rows outside a tile's group are masked at the load (never read), so NaN in unused buffer rows cannot reach a
result. ``pre`` (the gate|up pre-activation, rounded to the input dtype) is written only when the backward
needs it; ``act`` is computed from the rounded ``pre``, so the backward's recomputation matches it bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ragdot._memo import remember
from ragdot.kernels.configs import dot_precision, next_pow2, wide_shared_memory
from ragdot.kernels.launch import BoundLaunch
from ragdot.kernels.ragged_m import _group_table, _locate

__all__ = ["FusedConfig", "fused_config", "up_swiglu", "down_scatter", "sum_choices", "swiglu", "launch_bound"]


@dataclass(frozen=True)
class FusedConfig:
    """Tiles of the fused kernels: rows, output columns, contraction step; warps and pipeline stages."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


# Tiles per kernel where a block may take >= 160 KB of shared memory, 2-byte dtypes: (BLOCK_N cap, BLOCK_K,
# stages), the best of a sweep at deepseek-v3 widths on an H200 (benchmarks/fused_sweep.py; graph replays):
# up 1.26x, down 1.20x, dbwd 1.40x the previous 128x64x64 / 128x128x64 three-stage tiles, weight gradients
# unchanged (their best was within 9%). Elsewhere (float32, smaller shared memory) the previous tiles.
_WIDE_TILES = {"up": (128, 32, 4), "dbwd": (128, 64, 4), "down": (256, 64, 4), "wgrad": (128, 64, 3)}
FUSED_KERNELS = tuple(_WIDE_TILES)


def fused_config(dtype: torch.dtype, device: torch.device, columns: int, kernel: str = "down",
                 wide: bool | None = None) -> FusedConfig:
    """The heuristic config of fused kernel `kernel` ("up", "dbwd": two float32 accumulators, gate and up;
    "down"; "wgrad") for `columns` output columns: small tiles in the interpreter, 128-row tiles on GPUs.
    `wide`: whether a block may take >= 160 KB of shared memory (None: ask the device)."""
    if kernel not in _WIDE_TILES:
        raise ValueError(f"kernel must be one of {FUSED_KERNELS}, got {kernel!r}")
    if device.type != "cuda":
        return FusedConfig(block_m=16, block_n=16, block_k=16, group_m=1, num_warps=1, num_stages=1)
    cap = lambda n: min(n, max(16, next_pow2(columns)))  # noqa: E731
    if dtype != torch.float32 and (wide_shared_memory(device) if wide is None else wide):
        block_n, block_k, stages = _WIDE_TILES[kernel]
        return FusedConfig(block_n=cap(block_n), block_k=block_k, num_stages=stages)
    wide_epilogue = kernel in ("up", "dbwd")  # half the columns: one 128x128 accumulator's registers in all
    return FusedConfig(block_n=cap(64 if wide_epilogue else 128), block_k=32 if dtype == torch.float32 else 64)


_LAUNCHES: dict[tuple, BoundLaunch] = {}
_MAX_LAUNCHES = 4096


def launch_bound(kernel, grid: tuple[int, ...], consts: dict, cfg: FusedConfig, device: torch.device, *args):
    """Launch `kernel` through a cached `BoundLaunch` (the static part of the launch resolved once).

    The key holds every non-tensor argument: Triton specializes on integer values (1, multiples of 16), so
    a bound launch must only ever see the integers it was compiled for."""
    scalars = tuple(a for a in args if not isinstance(a, torch.Tensor))
    key = (kernel.__name__, grid, tuple(sorted(consts.items())), cfg, device, scalars)
    bound = _LAUNCHES.get(key)
    if bound is None:
        opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        bound = remember(_LAUNCHES, key, BoundLaunch(kernel, grid, consts, opts, device), _MAX_LAUNCHES)
    return bound(*args)


@triton.jit
def _gathered_rows(
    order_ptr,  # int32 [M]: assignment held by each permuted row
    row0,  # scalar: first permuted row of the tile
    row_end,  # scalar: end of the tile's group (rows at or past it are masked)
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """(row ids, in-group mask, assignment ids, token ids) of the tile's rows; rows off the group read 0."""
    rm = row0 + tl.arange(0, BLOCK_M)
    ok = rm < row_end
    a = tl.load(order_ptr + rm, mask=ok, other=0).to(tl.int64)
    return rm, ok, a, a // TOP_K


@triton.jit
def _up_swiglu_kernel(
    x_ptr,  # [T, K] token rows (row stride stride_x, unit column stride)
    w_ptr,  # [E, K, 2N] w_gate_up, any strides: columns [:N] gate, [N:] up
    order_ptr,  # int32 [M]: assignment a = t*TOP_K + j held by permuted row r
    sizes_ptr,  # int32 [E]: permuted rows per expert (sums to M)
    act_ptr,  # [M, N] out, contiguous: silu(gate) * up
    pre_ptr,  # [M, 2N] out, contiguous (written only if SAVE_PRE): gate | up pre-activation
    M, N, K, E,  # scalars: permuted rows, hidden width, model dim, experts
    stride_x,  # scalar: row stride of x, in elements
    stride_we, stride_wk, stride_wn,  # scalars: strides of w_gate_up, in elements
    max_tiles,  # scalar: (cdiv(M, BLOCK_M) + E) * cdiv(N, BLOCK_N), the grid
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr,  # power of two >= E + 1
    GROUP_M: tl.constexpr,  # row tiles walked together (L2 reuse of the weight tiles)
    SAVE_PRE: tl.constexpr,  # write pre for the backward
    PRECISION: tl.constexpr,  # tl.dot input_precision
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
        x_ptrs = x_ptr + tok[:, None] * stride_x + rk[None, :]
        w_ptrs = w_ptr + g.to(tl.int64) * stride_we + rk[:, None] * stride_wk + rn.to(tl.int64)[None, :] * stride_wn
        up_off = N * stride_wn
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.where(g < E, K, 0), BLOCK_K):
            k_ok = rk < K - k
            xa = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            bm = k_ok[:, None] & n_ok[None, :]
            gate = tl.dot(xa, tl.load(w_ptrs, mask=bm, other=0.0), gate, input_precision=PRECISION)
            up = tl.dot(xa, tl.load(w_ptrs + up_off, mask=bm, other=0.0), up, input_precision=PRECISION)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K * stride_wk
        gate = gate.to(act_ptr.dtype.element_ty)
        up = up.to(act_ptr.dtype.element_ty)
        rows64 = rm.to(tl.int64)[:, None]
        m = row_ok[:, None] & n_ok[None, :]
        if SAVE_PRE:
            pre = pre_ptr + rows64 * (2 * N) + rn[None, :]
            tl.store(pre, gate, mask=m)
            tl.store(pre + N, up, mask=m)
        g32 = gate.to(tl.float32)
        act = g32 * tl.sigmoid(g32) * up.to(tl.float32)
        tl.store(act_ptr + rows64 * N + rn[None, :], act.to(act_ptr.dtype.element_ty), mask=m)


@triton.jit
def _down_scatter_kernel(
    a_ptr,  # [M, K] permuted rows (row stride stride_a, unit column stride)
    b_ptr,  # [E, K, N] one matrix per expert, any strides
    order_ptr,  # int32 [M]: assignment held by permuted row r
    sizes_ptr,  # int32 [E]: permuted rows per expert (sums to M)
    weights_ptr,  # float [M] router weights in assignment order (read only if WEIGHTED)
    out_ptr,  # [M, N] contiguous (assignment order = [T, TOP_K, N]) out; ATOMIC: float32 [T, N] accumulated
    M, N, K, E,  # scalars: permuted rows, output columns, contraction, experts
    stride_a,  # scalar: row stride of a, in elements
    stride_be, stride_bk, stride_bn,  # scalars: strides of b, in elements
    max_tiles,  # scalar: the grid
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr, GROUP_M: tl.constexpr,
    WEIGHTED: tl.constexpr,  # multiply row r by weights[order[r]]
    ATOMIC: tl.constexpr,  # add into out[token] with atomics (non-deterministic order)
    PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    offs, starts, ends, first, tiles = _group_table(sizes_ptr, M, E, 1, BLOCK_M, BLOCK_G, True)
    if pid < tl.sum(tiles, 0) * num_n:
        g, row0, row_end, n_idx = _locate(pid, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
        rm = row0 + tl.arange(0, BLOCK_M)
        row_ok = rm < row_end
        rn = n_idx * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_a + rk[None, :]
        b_ptrs = b_ptr + g.to(tl.int64) * stride_be + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.where(g < E, K, 0), BLOCK_K):
            k_ok = rk < K - k
            lhs = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            rhs = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = tl.dot(lhs, rhs, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * stride_bk
        asg = tl.load(order_ptr + rm, mask=row_ok, other=0).to(tl.int64)
        if WEIGHTED:
            acc = acc * tl.load(weights_ptr + asg, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        m = row_ok[:, None] & n_ok[None, :]
        if ATOMIC:
            tl.atomic_add(out_ptr + (asg // TOP_K)[:, None] * N + rn[None, :], acc, mask=m, sem="relaxed")
        else:
            tl.store(out_ptr + asg[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _sum_choices_kernel(
    buf_ptr,  # [T, TOP_K, N] contiguous: per-assignment rows
    out_ptr,  # [T, N] contiguous out: sum over the choices, j ascending, float32
    T, N,  # scalars
    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
):
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (toks < T)[:, None] & (cols < N)[None, :]
    base = toks.to(tl.int64)[:, None] * (TOP_K * N) + cols[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(buf_ptr + base + j * N, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + toks.to(tl.int64)[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _swiglu_kernel(
    pre_ptr,  # [M, 2N] contiguous: gate | up pre-activation
    act_ptr,  # [M, N] contiguous out: silu(gate) * up
    M, N,  # scalars: rows, hidden width
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (rows < M)[:, None] & (cols < N)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    pre = pre_ptr + r64 * (2 * N) + cols[None, :]
    gate = tl.load(pre, mask=m, other=0.0).to(tl.float32)
    up = tl.load(pre + N, mask=m, other=0.0).to(tl.float32)
    act = gate * tl.sigmoid(gate) * up  # as _up_swiglu_kernel's epilogue: the backward recomputes the same bits
    tl.store(act_ptr + r64 * N + cols[None, :], act.to(act_ptr.dtype.element_ty), mask=m)


def _grid(m: int, n: int, e: int, cfg: FusedConfig) -> int:
    return (triton.cdiv(m, cfg.block_m) + e) * triton.cdiv(n, cfg.block_n)


def _consts(cfg: FusedConfig, e: int, top_k: int, dtype: torch.dtype) -> dict:
    return dict(TOP_K=top_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                BLOCK_G=next_pow2(e + 1), GROUP_M=cfg.group_m, PRECISION=dot_precision(dtype))


def up_swiglu(
    x: torch.Tensor,  # [T, D] token rows, unit column stride
    w_gate_up: torch.Tensor,  # [E, D, 2H]
    order: torch.Tensor,  # int32 [A]: assignment of each permuted row
    sizes: torch.Tensor,  # int32 [E]: rows per expert, summing to A
    top_k: int,
    save_pre: bool,
    config: FusedConfig | None = None,  # tiles (None: `fused_config`'s heuristic)
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (act [A, H], pre [A, 2H] or an empty [0, 2H] when not saved), both in x.dtype."""
    a, (e, d, h2) = order.numel(), w_gate_up.shape
    h = h2 // 2
    act = x.new_empty((a, h))
    pre = x.new_empty((a if save_pre else 0, h2))
    if a == 0 or h == 0:
        return act, pre
    cfg = config or fused_config(x.dtype, x.device, h, "up")
    grid = _grid(a, h, e, cfg)
    consts = {**_consts(cfg, e, top_k, x.dtype), "SAVE_PRE": save_pre}
    launch_bound(_up_swiglu_kernel, (grid,), consts, cfg, x.device,
                 x, w_gate_up, order, sizes, act, pre if save_pre else act, a, h, d, e, x.stride(0),
                 *w_gate_up.stride(), grid)  # fmt: skip
    return act, pre


def down_scatter(
    rows: torch.Tensor,  # [A, K] permuted rows, unit column stride
    b: torch.Tensor,  # [E, K, N] (any strides)
    order: torch.Tensor,  # int32 [A]
    sizes: torch.Tensor,  # int32 [E]
    weights: torch.Tensor | None,  # float [A] router weights in assignment order, or None
    top_k: int,
    atomic: bool = False,
    config: FusedConfig | None = None,  # tiles (None: `fused_config`'s heuristic)
) -> torch.Tensor:
    """-> [A, N] in rows.dtype, row a = t*k + j holding its (weighted) product; atomic: float32 [T, N] sums."""
    a, k = rows.shape
    e, n = b.shape[0], b.shape[2]
    out = rows.new_zeros((a // top_k, n), dtype=torch.float32) if atomic else rows.new_empty((a, n))
    if a == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    cfg = config or fused_config(rows.dtype, rows.device, n, "down")
    grid = _grid(a, n, e, cfg)
    consts = {**_consts(cfg, e, top_k, rows.dtype), "WEIGHTED": weights is not None, "ATOMIC": atomic}
    launch_bound(_down_scatter_kernel, (grid,), consts, cfg, rows.device,
                 rows, b, order, sizes, rows if weights is None else weights, out, a, n, k, e, rows.stride(0),
                 *b.stride(), grid)  # fmt: skip
    return out


def swiglu(pre: torch.Tensor) -> torch.Tensor:
    """pre [A, 2H] contiguous (gate | up) -> silu(gate) * up [A, H] in pre.dtype, computed in float32 from the
    rounded pre as the up projection's epilogue computes it."""
    a, h2 = pre.shape
    h = h2 // 2
    act, pre = pre.new_empty((a, h)), pre.contiguous()
    if a == 0 or h == 0:
        return act
    block_r, block_n = 32, min(128, max(16, next_pow2(h)))
    grid = (triton.cdiv(a, block_r), triton.cdiv(h, block_n))
    launch_bound(_swiglu_kernel, grid, dict(BLOCK_R=block_r, BLOCK_N=block_n), FusedConfig(num_warps=4, num_stages=1),
                 pre.device, pre, act, a, h)  # fmt: skip
    return act


def sum_choices(buf: torch.Tensor, top_k: int) -> torch.Tensor:
    """buf [T*k, N] in assignment order -> [T, N]: the k rows of each token summed in float32, j ascending."""
    a, n = buf.shape
    tokens = a // top_k
    if top_k == 1:
        return buf
    out = buf.new_empty((tokens, n))
    if a == 0 or n == 0:
        return out.zero_()
    block_t, block_n = 16, min(128, max(16, next_pow2(n)))
    cfg = FusedConfig(num_warps=4, num_stages=1)
    grid = (triton.cdiv(tokens, block_t), triton.cdiv(n, block_n))
    consts = dict(TOP_K=top_k, BLOCK_T=block_t, BLOCK_N=block_n)
    launch_bound(_sum_choices_kernel, grid, consts, cfg, buf.device, buf, out, tokens, n)
    return out
