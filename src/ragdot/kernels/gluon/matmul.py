"""Two plain Hopper matmuls in Gluon, c = a @ b, one output tile per program: the primitives under test.

- `matmul_pipelined_kernel`: one partition; a ring of STAGES shared-memory buffers filled by TMA, each
  stage's mbarrier counting its bytes; async wgmma with one group in flight, so the load of chunk
  k + STAGES - 1 overlaps the MMAs of chunks k - 1 and k.
- `matmul_ws_kernel`: the same ring driven by two partitions: a one-warp TMA producer (worker) and the
  wgmma consumer (default partition: one warpgroup, or two cooperating on the tile with num_warps=8). Two
  mbarriers per stage: `ready` (producer -> consumer: the bytes landed) and `empty` (consumer -> producer:
  the MMA that read the stage retired).

benchmarks/gluon_probe.py runs both on the GPU against torch.matmul before the ragged kernels build on them.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ragdot.kernels.gluon.common import descriptor, maxnreg_for, mma_layout

__all__ = ["matmul", "matmul_pipelined_kernel", "matmul_ws_kernel", "ring_barriers"]


@gluon.jit
def _store_tile(c_desc, acc, off_m, off_n):
    """acc [BLOCK_M, BLOCK_N] (fp32, wgmma layout) -> c through shared memory and one TMA store."""
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def ring_barriers(STAGES: gl.constexpr, READY_COUNT: gl.constexpr):
    """The `ready` and `empty` mbarriers (one of each per stage) of a producer/consumer ring: `empty` counts one
    arrival, `ready` READY_COUNT (1 for a TMA producer's expect; more where producer threads arrive too)."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=READY_COUNT)
        mbarrier.init(empty.index(i), count=1)
    return ready, empty


@gluon.jit
def matmul_pipelined_kernel(
    a_desc,  # TMA descriptor of a [M, K], block [BLOCK_M, BLOCK_K]
    b_desc,  # TMA descriptor of b [K, N], block [BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of c [M, N], block [BLOCK_M, BLOCK_N]
    K,  # scalar: contraction length
    STAGES: gl.constexpr,  # shared-memory ring depth (>= 2)
    MMA_LAYOUT: gl.constexpr,  # NVMMADistributedLayout of the accumulator (common.mma_layout)
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    n_k = gl.cdiv(K, BLOCK_K)
    for p in gl.static_range(STAGES - 1):  # prologue: the first STAGES - 1 chunks in flight
        ok = p < n_k
        mbarrier.expect(bars.index(p), NBYTES, pred=ok)
        tma.async_copy_global_to_shared(a_desc, [off_m, p * BLOCK_K], bars.index(p), a_bufs.index(p), pred=ok)
        tma.async_copy_global_to_shared(b_desc, [p * BLOCK_K, off_n], bars.index(p), b_bufs.index(p), pred=ok)
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=MMA_LAYOUT)
    for kk in range(n_k):
        s = kk % STAGES
        mbarrier.wait(bars.index(s), (kk // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # chunk kk - 1 retired: its stage is free
        nxt = kk + STAGES - 1
        ns = nxt % STAGES
        ok = nxt < n_k
        mbarrier.expect(bars.index(ns), NBYTES, pred=ok)
        tma.async_copy_global_to_shared(a_desc, [off_m, nxt * BLOCK_K], bars.index(ns), a_bufs.index(ns), pred=ok)
        tma.async_copy_global_to_shared(b_desc, [nxt * BLOCK_K, off_n], bars.index(ns), b_bufs.index(ns), pred=ok)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    _store_tile(c_desc, acc, off_m, off_n)


@gluon.jit
def _mm_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, K):
    """Worker partition (1 warp): fills the ring; waits for a stage's `empty` before refilling it."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    for kk in range(gl.cdiv(K, BLOCK_K)):
        s = kk % STAGES
        mbarrier.wait(empty.index(s), ((kk // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1 at once
        mbarrier.expect(ready.index(s), NBYTES)
        tma.async_copy_global_to_shared(a_desc, [off_m, kk * BLOCK_K], ready.index(s), a_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [kk * BLOCK_K, off_n], ready.index(s), b_bufs.index(s))


@gluon.jit
def _mm_consumer(a_bufs, b_bufs, ready, empty, c_desc, off_m, off_n, K, MMA_LAYOUT: gl.constexpr):
    """Default partition (the kernel's num_warps): wgmma over the ring, then the epilogue."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=MMA_LAYOUT)
    for kk in range(gl.cdiv(K, BLOCK_K)):
        s = kk % STAGES
        mbarrier.wait(ready.index(s), (kk // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index((kk + STAGES - 1) % STAGES), pred=kk > 0)  # chunk kk - 1 retired
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _store_tile(c_desc, acc, off_m, off_n)


@gluon.jit
def matmul_ws_kernel(
    a_desc,  # TMA descriptor of a [M, K], block [BLOCK_M, BLOCK_K]
    b_desc,  # TMA descriptor of b [K, N], block [BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of c [M, N], block [BLOCK_M, BLOCK_N]
    K,  # scalar: contraction length
    STAGES: gl.constexpr,  # shared-memory ring depth (>= 2)
    MMA_LAYOUT: gl.constexpr,  # NVMMADistributedLayout of the accumulator over the default partition's warps
    PRODUCER_REGS: gl.constexpr,  # registers per thread of the TMA producer warp
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready, empty = ring_barriers(STAGES, 1)
    gl.warp_specialize([
        (_mm_consumer, (a_bufs, b_bufs, ready, empty, c_desc, off_m, off_n, K, MMA_LAYOUT)),
        (_mm_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, K)),
    ], [1], [PRODUCER_REGS])


def matmul(
    a: torch.Tensor, b: torch.Tensor, *, warp_specialized: bool = False, block: tuple[int, int, int] = (128, 128, 64),
    stages: int = 4, num_warps: int = 4,
) -> torch.Tensor:
    """c [M, N] = a [M, K] @ b [K, N] (bf16/fp16, row-major, 16-byte aligned rows) on an sm_90 GPU."""
    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk = block
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    descs = (descriptor(a, [bm, bk]), descriptor(b, [bk, bn]), descriptor(c, [bm, bn]))
    grid = (-(-m // bm), -(-n // bn))
    layout = mma_layout(bm, bn, num_warps)
    if warp_specialized:
        matmul_ws_kernel[grid](*descs, k, stages, layout, 24, num_warps=num_warps, maxnreg=maxnreg_for(num_warps))
    else:
        matmul_pipelined_kernel[grid](*descs, k, stages, layout, num_warps=num_warps)
    return c
