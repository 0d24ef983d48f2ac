"""Ragged-K Group-GEMM reading one operand's rows through a row index, for Hopper in Gluon.

    c[g] = x[index[r], :]^T @ b[r, :], summed over the rows r of group g        rows of g = [ends[g-1], ends[g])

The MoE block's weight gradient of w_gate_up (x [T, D], the token of each routed row, dpre [T*k, 2H]) without a
gathered copy of x. It is `ragged_k`'s persistent warp-specialized kernel (same items, longest group first, same
consumer and epilogues, one consumer or two in ping-pong, so the same bits as that kernel on a gathered copy,
config for config) with another producer: a partition of GATHER_WARPS warps that, per chunk of BLOCK_K rows,
loads the rows' indices (the next chunk's while it waits for this chunk's stage), copies those rows' BLOCK_M columns
of x into the stage with cp.async (16 bytes a copy; rows past the group's end are zero-filled, so the next group's
tokens never reach the MMA) and loads b's rows by TMA through the ragged view. A stage is ready when TMA's bytes
and every producer thread's copies have landed (`cp.async.mbarrier.arrive.noinc` per thread: the barrier counts
1 + 32 * GATHER_WARPS arrivals); the consumer fences before its wgmma reads rows written by threads.

Layout requirements (checked by the host side): x [S, M] and b [R, N] with the last dim contiguous and 16-byte
aligned rows and bases, M and N 16-byte multiples of the element; one consumer partition (4 warps, or 8 cooperating)
or two ping-pong consumers of 4 warps each with a 4-warp producer (the three warpgroups' registers: 256 for the
default consumer, what is left for the other (`common.consumer_regs`), `GATHER_REGS` for the producer).
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ragdot.kernels.configs import check_group_ends, num_sms, prepared_output
from ragdot.kernels.gluon import ragged_k as _rk
from ragdot.kernels.gluon.common import consumer_regs, maxnreg_for, mma_layout, store_layout
from ragdot.kernels.gluon.config import GluonConfig
from ragdot.kernels.gluon.ragged_k import (
    _consumer,
    _descriptor,
    _free_stage,
    _gl_dtype,
    _item,
    _ring_and_turn_barriers,
)
from ragdot.kernels.launch import BoundLaunch
from ragdot.kernels.ragged_k import schedule
from ragdot.kernels.ragged_view import RAGGED_BASE, check_ragged_rows, ragged_view, rows_view

__all__ = ["GATHER_WARPS", "Prepared", "ragged_k_gather_kernel"]

GATHER_WARPS = 4  # warps of the producer partition (4 or 8; `Prepared(gather_warps=)`)
GATHER_REGS = 88  # its registers per thread (sm_90, Triton 3.6: no spills at 128x128x64 and 128x256x32)


@gluon.jit
def _gather_producer(x_ptr, stride_x, idx_ptr, S, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M, N, G,
                     GROUP_M: gl.constexpr, GATHER_LAYOUT: gl.constexpr):
    """Worker partition (the GATHER_LAYOUT's warps): every chunk of this program's items into the ring, x's rows by
    cp.async through the index (each thread arrives on `ready` once its copies landed), b's by one TMA load."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_M: gl.constexpr = a_bufs.type.shape[2]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[3]
    ROWS: gl.constexpr = gl.SliceLayout(1, GATHER_LAYOUT)
    COLS: gl.constexpr = gl.SliceLayout(0, GATHER_LAYOUT)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = G * gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    it = 0
    for item in range(pid, total, nprog):
        g, start, end, bt, pid_m, pid_n = _item(item, sched_ptr, R, G, M, N, 1, BLOCK_M, BLOCK_N, GROUP_M)
        size = end - start
        cols = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=COLS)
        col_ok = gl.expand_dims(cols < M, 0)
        rows = start + gl.arange(0, BLOCK_K, layout=ROWS)
        tokens = gl.load(idx_ptr + rows, mask=rows < end, other=0)
        for kk in range(gl.cdiv(size, BLOCK_K)):
            row_ok = rows < end
            tokens = gl.minimum(gl.maximum(tokens, 0), S - 1)  # no index reads outside x
            ptrs = x_ptr + gl.expand_dims(tokens.to(gl.int64) * stride_x, 1) + gl.expand_dims(cols, 0)
            rows += BLOCK_K  # the next chunk's indices, loaded while this chunk waits for its stage
            tokens = gl.load(idx_ptr + rows, mask=rows < end, other=0)
            s = _free_stage(empty, it, STAGES)
            mbarrier.expect(ready.index(s), b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(b_desc, [RAGGED_BASE, end, RAGGED_BASE - size + kk * BLOCK_K,
                                                     pid_n * BLOCK_N], ready.index(s),
                                            b_bufs.index(s).reshape([1, 1, BLOCK_K, BLOCK_N]))
            async_copy.async_copy_global_to_shared(a_bufs.index(s), ptrs, mask=gl.expand_dims(row_ok, 1) & col_ok)
            async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
            it += 1


@gluon.jit
def ragged_k_gather_kernel(
    x_ptr,  # [S, M] the gathered operand's source (M contiguous, 16-byte aligned rows)
    stride_x,  # scalar: elements between x's rows
    idx_ptr,  # [R] int32: the row of x at each of the R token rows (clamped into [0, S) here)
    S,  # scalar: rows of x
    b_desc,  # ragged TMA descriptor of b [R, N] (`ragged_view`), block [1, 1, BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of c viewed [G, M, N] (out dtype), block [1, BLOCK_M, BLOCK_N]
    sched_ptr,  # [3+, G] int32 from ragged_k.schedule: per slot (longest first) group / start / end
    R, M, N, G,  # scalars: token rows, output rows (x's columns), output columns, groups
    c_ptr,  # [G, M, N] c itself, for the pointer-store epilogue (EPILOGUE_CODE 1)
    stride_cg, stride_cm,  # scalars: elements between c's group slabs and between its rows
    STAGES: gl.constexpr,  # shared-memory ring depth (>= 2)
    BLOCK_K: gl.constexpr,  # token rows a chunk
    BLOCK_M: gl.constexpr,  # output rows a tile (columns of x)
    GROUP_M: gl.constexpr,  # row tiles walked together inside one group
    MMA_LAYOUT: gl.constexpr,  # NVMMADistributedLayout of the [BLOCK_M, BLOCK_N] accumulator (the consumer's warps)
    GATHER_LAYOUT: gl.constexpr,  # BlockedLayout of [BLOCK_K, BLOCK_M] over GATHER_WARPS warps, 16-byte vectors
    GATHER_REGS_: gl.constexpr,  # registers per thread of the producer partition
    EPILOGUE_CODE: gl.constexpr,  # ragged_k's: 0 TMA store through c_desc; 1 pointer stores; 2 TMA, two buffers
    STORE_LAYOUT: gl.constexpr,  # BlockedLayout of [BLOCK_M, BLOCK_N] for the pointer stores
    GATHER_WARPS: gl.constexpr,  # warps of the producer partition (GATHER_LAYOUT's)
    NCONS: gl.constexpr,  # consumer partitions: 1, or 2 (ping-pong, one warpgroup each, alternate items)
    CONSUMER_REGS: gl.constexpr,  # registers per thread of the second consumer (ping-pong only)
):
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[3]
    a_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_K, BLOCK_M],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_M], b_desc.dtype))
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_K, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], b_desc.dtype))
    # `ready` counts TMA's expect, then each producer thread's copies; `turn` is unused (one consumer)
    ready, empty, turn = _ring_and_turn_barriers(STAGES, 1 + 32 * GATHER_WARPS)
    # argument tuples spelled out per branch, as in ragged_k_ws_kernel (the frontend takes no prebuilt tuple of them)
    if NCONS == 2:
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, sched_ptr, R, M, N, G, 1, c_ptr, stride_cg,
                         stride_cm, GROUP_M, MMA_LAYOUT, 0, NCONS, EPILOGUE_CODE, STORE_LAYOUT, True, False)),
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, sched_ptr, R, M, N, G, 1, c_ptr, stride_cg,
                         stride_cm, GROUP_M, MMA_LAYOUT, 1, NCONS, EPILOGUE_CODE, STORE_LAYOUT, True, False)),
            (_gather_producer, (x_ptr, stride_x, idx_ptr, S, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M,
                                N, G, GROUP_M, GATHER_LAYOUT)),
        ], [4, GATHER_WARPS], [CONSUMER_REGS, GATHER_REGS_])
    else:
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, sched_ptr, R, M, N, G, 1, c_ptr, stride_cg,
                         stride_cm, GROUP_M, MMA_LAYOUT, 0, 1, EPILOGUE_CODE, STORE_LAYOUT, True, False)),
            (_gather_producer, (x_ptr, stride_x, idx_ptr, S, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M,
                                N, G, GROUP_M, GATHER_LAYOUT)),
        ], [GATHER_WARPS], [GATHER_REGS_])


def gather_layout(block_m: int, warps: int) -> Any:
    """A BlockedLayout of [BLOCK_K, block_m] 16-bit elements: 16-byte vectors along x's columns, a warp's threads
    across the row as far as block_m allows, `warps` warps stacked along the rows."""
    vec = 8
    across = max(1, min(32, block_m // vec))
    return gl.BlockedLayout(size_per_thread=[1, vec], threads_per_warp=[32 // across, across],
                            warps_per_cta=[warps, 1], order=[1, 0])


class Prepared:
    """The gathering Gluon ragged_k for one static signature: x [1, S, M] (the source), b [1, R, N], G groups.
    A call `(x, b, sizes_or_ends, out=None, sched=None, index=...)` ranks the groups (one small launch, unless
    `sched` is given), builds the b and c descriptors and launches once -> (c [G, 1, M, N], kernel).

    `gather_warps`: warps of the producer partition that copies x's rows (4 or 8; 4 with a ping-pong config).

    Raises NotImplementedError for what it does not serve: operands other than bf16/fp16 row views with 16-byte
    rows, a ping-pong config with an eight-warp producer (no registers left for the second consumer), a config
    that does not fit shared memory."""

    replayable = False  # no backend runs it (the fused block calls it directly): nothing records its calls

    def __init__(self, x: torch.Tensor, b: torch.Tensor, g: int, out_dtype: torch.dtype,
                 config: GluonConfig | None = None, from_sizes: bool = False, gather_warps: int = GATHER_WARPS):
        if x.dim() != 3 or b.dim() != 3 or x.shape[0] != 1 or b.shape[0] != 1:
            raise ValueError(f"x, b: expected [1, S, M] and [1, R, N], got {tuple(x.shape)}, {tuple(b.shape)}")
        s_rows, m = x.shape[1:]
        r, n = b.shape[1:]
        self.shape = (g, 1, m, n)
        self.out_dtype, self.device = out_dtype, x.device
        self.sizes_extent = r if from_sizes else None
        self.empty = g * m * n == 0
        self.zero = r == 0
        if gather_warps not in (4, 8):
            raise ValueError(f"gather_warps: expected 4 or 8, got {gather_warps!r}")
        cfg, out_bytes = _rk.checked_config("gluon ragged_k_gather", x.dtype, b.dtype, out_dtype, m, n, config)
        if cfg.consumers == 2 and gather_warps != 4:
            raise NotImplementedError(f"gluon ragged_k_gather: config {cfg.short()} with {gather_warps} producer "
                                      "warps (ping-pong takes a four-warp producer)")
        self.cfg = cfg
        if self.empty or self.zero:
            return
        views = (rows_view(x), rows_view(b))  # (rows, row stride) each, None where not a 16-byte row view
        if s_rows == 0 or None in views or (n * out_bytes) % 16:
            raise NotImplementedError("gluon ragged_k_gather: x and b are not row views with 16-byte aligned rows")
        check_ragged_rows("gluon ragged_k_gather", 1, r)
        self.b_view = ragged_view(n, views[1][1])
        self.stride_x, self.src_rows = views[0][1], s_rows
        self.c_layout = ([g, m, n], [m * n, n, 1])
        in_dt, out_dt = _gl_dtype(x.dtype), _gl_dtype(out_dtype)
        self.blocks = ([1, 1, cfg.block_k, cfg.block_n], [1, cfg.block_m, cfg.block_n])
        self.layouts = (gl.NVMMASharedLayout.get_default_for(self.blocks[0], in_dt),
                        gl.NVMMASharedLayout.get_default_for(self.blocks[1], out_dt))
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        self.grid = (max(1, min(g * tiles, num_sms(x.device))),)
        self.consts = (cfg.stages, cfg.block_k, cfg.block_m, cfg.group_m,
                       mma_layout(cfg.block_m, cfg.block_n, cfg.num_warps),
                       gather_layout(cfg.block_m, gather_warps), GATHER_REGS, _rk.epilogue_code(r, g, cfg, out_bytes),
                       store_layout(cfg.block_m, cfg.block_n, cfg.num_warps, out_bytes), gather_warps,
                       cfg.consumers, consumer_regs(cfg, GATHER_REGS))
        self.options = {"num_warps": cfg.num_warps,
                        "maxnreg": maxnreg_for(cfg.num_warps * cfg.consumers, gather_warps)}
        self.launch = BoundLaunch.in_order(ragged_k_gather_kernel, self.grid, self.consts, self.options, x.device)
        self.scalars = (r, m, n, g)

    def __call__(self, x: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, out: torch.Tensor | None = None,
                 sched: torch.Tensor | None = None, index: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """x [1, S, M], b [1, R, N], ends [G] (raw sizes with from_sizes), index int32 [R] (rows of x; values
        outside [0, S) are clamped into it) -> (c [G, 1, M, N], kernel handle or None)."""
        if index is None:
            raise ValueError("index: a call of the gathering ragged_k takes the int32 row index of x")
        c, done = prepared_output(self, out)
        if done:
            return c, None
        if (x.data_ptr() | b.data_ptr() | c.data_ptr()) % 16:
            raise NotImplementedError("gluon ragged_k_gather: operands not 16-byte aligned")
        if sched is None:
            sched = schedule(ends, self.sizes_extent)
        b_desc = _descriptor(b, *self.b_view, self.blocks[0], self.layouts[0])
        c_desc = _descriptor(c, *self.c_layout, self.blocks[1], self.layouts[1])
        return c, self.launch(x, self.stride_x, index, self.src_rows, b_desc, c_desc, sched, *self.scalars, c,
                              *self.c_layout[1][:2])


def ragged_k_gather(x: torch.Tensor, index: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor,
                    out_dtype: torch.dtype | None = None, *, config: GluonConfig | None = None) -> torch.Tensor:
    """c [G, M, N]: per group g, the sum over its rows r of x[index[r]]^T b[r] (x [S, M], index int32 [R] with
    values in [0, S); others are clamped into it), b [R, N], group_ends [G]) on an sm_90 GPU (see Prepared)."""
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int32 or index.dim() != 1:
        raise ValueError("index: expected an int32 [R] tensor")
    if index.shape[0] != b.shape[0]:
        raise ValueError(f"index: expected {b.shape[0]} rows (b's), got {index.shape[0]}")
    g = group_ends.shape[0]
    ends = check_group_ends(group_ends, g, x.device)
    prep = Prepared(x[None], b[None], g, x.dtype if out_dtype is None else out_dtype, config)
    return prep(x[None], b[None], ends, index=index)[0][:, 0]
