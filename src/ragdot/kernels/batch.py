"""Batched GEMM (ragged batch dimension: every batch entry is a full GEMM, group sizes are not read).

    c[bt] = a[bt] @ b[bt]

Program (tile, bt) computes one [BLOCK_M, BLOCK_N] tile; tiles are walked in bands of GROUP_M row tiles for
L2 reuse, as in the usual Triton matmul.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot.kernels.configs import (
    TileConfig,
    check_operands,
    dot_precision,
    launch_options,
    make_output,
    prepared_output,
    resolve_config,
)
from ragdot.kernels.launch import BoundLaunch


@triton.jit
def batch_kernel(
    a_ptr,  # [Bt, M, K] lhs, any strides
    b_ptr,  # [Bt, K, N] rhs, any strides
    c_ptr,  # [Bt, M, N] output, contiguous
    M, N, K,  # scalars: problem sizes
    stride_ab, stride_am, stride_ak,  # scalars: strides of a, in elements
    stride_bb, stride_bk, stride_bn,  # scalars: strides of b, in elements
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row tiles walked together
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0
    PRECISION: tl.constexpr,  # tl.dot input_precision: "ieee" or "tf32" (used for float32 inputs)
):
    pid = tl.program_id(0)
    bt = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    band_m = (pid // width) * GROUP_M
    band_h = tl.minimum(num_m - band_m, GROUP_M)
    pid_m = band_m + (pid % width) % band_h
    pid_n = (pid % width) // band_h

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    rm_safe = tl.minimum(rm, M - 1).to(tl.int64)  # clamped in bounds; rows past M are never stored
    n_ok = rn < N
    a_ptrs = a_ptr + bt * stride_ab + rm_safe[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + bt * stride_bb + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    step_a = tl.full([], BLOCK_K, tl.int64) * stride_ak
    step_b = tl.full([], BLOCK_K, tl.int64) * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = rk < K - k
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += step_a
        b_ptrs += step_b
    c_ptrs = c_ptr + (bt * M + rm.to(tl.int64))[:, None] * N + rn.to(tl.int64)[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & n_ok[None, :])


class Prepared:
    """`batch` for one static signature (shapes, strides, dtypes, device, config): the config, the grid and the
    constexprs are resolved once (a `BoundLaunch`); a call allocates the output (or takes `out`) and launches.
    Calls take operands of the prepared layout, or any tensors that start at the same addresses."""

    replayable = False  # ragdot.kernels.replay records calls that take group sizes; a batch call has none

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, config: TileConfig | None):
        bt, m, k = a.shape
        n = b.shape[2]
        self.shape = (bt, m, n)
        self.out_dtype = out_dtype
        self.device = a.device
        cfg = resolve_config(config, "batch", m, k, n, bt, a)
        self.empty = bt * m * n == 0
        self.zero = k == 0
        if self.empty or self.zero:
            return
        if bt > 65535:
            raise ValueError(f"a: batch size {bt} exceeds the 65535 the grid allows")
        grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), bt)
        consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                      EVEN_K=k % cfg.block_k == 0, PRECISION=dot_precision(a.dtype))
        self.args = (m, n, k, *a.stride(), *b.stride())
        self.launch = BoundLaunch(batch_kernel, grid, consts, launch_options(cfg, a.device), a.device)

    def __call__(self, a: torch.Tensor, b: torch.Tensor, sizes: object = None,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """a [Bt, M, K], b [Bt, K, N] (`sizes` is not read) -> (c [Bt, M, N], kernel handle or None)."""
        c, done = prepared_output(self, out)
        if done:
            return c, None
        return c, self.launch(a, b, c, *self.args)


def launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, object]:
    """`batch` returning also the launched kernel handle (compiled kernel on a GPU), for inspection."""
    check_operands(a, b, 3)
    bt, m, k = a.shape
    if b.shape[0] != bt or b.shape[1] != k:
        raise ValueError(f"b: expected shape [{bt}, {k}, N] to match a {tuple(a.shape)}, got {tuple(b.shape)}")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    c = make_output("out", out, (bt, m, b.shape[2]), out_dtype, a.device)
    return Prepared(a, b, out_dtype, config)(a, b, None, c)


def batch(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """c[Bt, M, N] = a[Bt, M, K] @ b[Bt, K, N] (any strided views of one float dtype), float32 accumulation."""
    return launch(a, b, out_dtype, config=config, out=out)[0]
