"""Ragged-K Group-GEMM for short groups in Gluon: b's rows stay resident in shared memory across a strip of tiles.

    c[g, bt] = a[bt, rows of g, :]^T @ b[bt, rows of g, :]       rows of g = [ends[g-1], ends[g])

Why: each output tile of the weight gradient contracts only its group's rows, so with groups of a few hundred rows
every tile re-reads both operands' rows from L2, (1/BLOCK_M + 1/BLOCK_N) x rows x 2 bytes an output element (6 B at
256 rows with 128x256 tiles): at the MoE layer's short groups that traffic is as large as the output's writes.
Here a work item is a strip of up to STRIP row tiles of one column band of one group: b's [rows, BLOCK_N] band is
loaded once per item into a ring of CAP chunks and kept there while every tile of the strip streams only its a
rows [rows, BLOCK_M] (2 B an output at 256 rows plus the band's share). A group of more than CAP chunks streams its
band through the same ring, tile after tile, like the plain kernel (`ragged_k.ragged_k_ws_kernel`).

Partitions (gl.warp_specialize): a one-warp TMA producer and one consumer partition (4 warps, or 8 cooperating on
the tile). Two rings: `ready`/`empty` over STAGES stages of a chunks [BLOCK_K, BLOCK_M], `bready`/`bempty` over CAP
slots of b chunks [BLOCK_K, BLOCK_N]. A resident b chunk is released after its use by the strip's last tile, so the
producer loads the next item's band while the consumer finishes this one. The rows past a group's end arrive as
zeros (ragged TMA views, as in `ragged_k`); an empty group's tiles store exact zeros; one fixed order of
accumulation per tile, so results are bitwise reproducible and equal to the plain kernel's for the same chunk depth.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ragdot.kernels.gluon.matmul import ring_barriers
from ragdot.kernels.gluon.ragged_k import _free_stage, _ready_stage, _release_before, store_tile
from ragdot.kernels.ragged_view import RAGGED_BASE

__all__ = ["ragged_k_resident_kernel", "STRIP"]

STRIP = 8  # row tiles per work item: the band's load is shared by up to 8 tiles


@gluon.jit
def _strip(item, sched_ptr, R, G, M, N, Bt, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STRIP_M: gl.constexpr):
    """Item -> (group, first row, end row, batch index, column tile, first row tile, row tiles): items walk the
    groups longest first (slots), then batch entries, then column bands, then strips of STRIP_M row tiles."""
    num_m = gl.cdiv(M, BLOCK_M)
    strips = gl.cdiv(num_m, STRIP_M)
    per = gl.cdiv(N, BLOCK_N) * strips
    slot = item // (Bt * per)
    rest = item % (Bt * per)
    bt = rest // per
    pid_n = (rest % per) // strips
    m0 = ((rest % per) % strips) * STRIP_M
    g = gl.load(sched_ptr + slot)
    start = gl.minimum(gl.load(sched_ptr + G + slot), R)
    end = gl.minimum(gl.load(sched_ptr + 2 * G + slot), R)
    return g, start, end, bt, pid_n, m0, gl.minimum(num_m - m0, STRIP_M)


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, bready, bempty, sched_ptr, R, M, N, G, Bt,
              STRIP_M: gl.constexpr):
    """Worker partition (1 warp): per item, the band's b chunks (once if they fit the CAP slots, else per tile)
    and every tile's a chunks, by TMA."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    CAP: gl.constexpr = b_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[2]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[3]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[3]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = G * Bt * gl.cdiv(N, BLOCK_N) * gl.cdiv(gl.cdiv(M, BLOCK_M), STRIP_M)
    it = 0  # a ring position
    bp = 0  # b ring position
    for item in range(pid, total, nprog):
        g, start, end, bt, pid_n, m0, count = _strip(item, sched_ptr, R, G, M, N, Bt, BLOCK_M, BLOCK_N, STRIP_M)
        stop = bt * R + end  # the group's end row: the ragged views clip every load there
        size = end - start
        n_k = gl.cdiv(size, BLOCK_K)
        streamed = n_k > CAP
        for t in range(count):
            for kk in range(n_k):
                row = RAGGED_BASE - size + kk * BLOCK_K
                if streamed | (t == 0):
                    s = _free_stage(bempty, bp, CAP)
                    mbarrier.expect(bready.index(s), b_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(b_desc, [RAGGED_BASE, stop, row, pid_n * BLOCK_N],
                                                    bready.index(s), b_bufs.index(s).reshape([1, 1, BLOCK_K, BLOCK_N]))
                    bp += 1
                s = _free_stage(empty, it, STAGES)
                mbarrier.expect(ready.index(s), a_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [RAGGED_BASE, stop, row, (m0 + t) * BLOCK_M], ready.index(s),
                                                a_bufs.index(s).reshape([1, 1, BLOCK_K, BLOCK_M]))
                it += 1


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, bready, bempty, c_desc, sched_ptr, R, M, N, G, Bt, c_ptr, stride_cg,
              stride_cm, STRIP_M: gl.constexpr, MMA_LAYOUT: gl.constexpr, EPILOGUE_CODE: gl.constexpr,
              STORE_LAYOUT: gl.constexpr):
    """Default partition: wgmma over every tile of this program's items, a chunk from the a ring against the b
    chunk of the same rows (resident: the same slots for every tile of the strip), then the epilogue."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    CAP: gl.constexpr = b_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[2]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = G * Bt * gl.cdiv(N, BLOCK_N) * gl.cdiv(gl.cdiv(M, BLOCK_M), STRIP_M)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], c_desc.dtype))
    it = 0
    bp = 0
    for item in range(pid, total, nprog):
        g, start, end, bt, pid_n, m0, count = _strip(item, sched_ptr, R, G, M, N, Bt, BLOCK_M, BLOCK_N, STRIP_M)
        n_k = gl.cdiv(end - start, BLOCK_K)
        streamed = n_k > CAP
        for t in range(count):
            free_b = streamed | (t == count - 1)  # the b chunks' last use in this item
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=MMA_LAYOUT)
            for kk in range(n_k):
                s = _ready_stage(ready, it + kk, STAGES)
                bs = _ready_stage(bready, bp + kk, CAP)  # resident: a phase already passed returns at once
                acc = warpgroup_mma(a_bufs.index(s).permute((1, 0)), b_bufs.index(bs), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                _release_before(empty, it + kk, STAGES, kk > 0)  # chunk kk - 1 retired
                _release_before(bempty, bp + kk, CAP, (kk > 0) & free_b)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _release_before(empty, it + n_k, STAGES, n_k > 0)
            _release_before(bempty, bp + n_k, CAP, (n_k > 0) & free_b)
            it += n_k
            if streamed:
                bp += n_k
            store_tile(acc, c_desc, c_smem, c_ptr, g * Bt + bt, m0 + t, pid_n, M, N, stride_cg, stride_cm,
                       EPILOGUE_CODE, STORE_LAYOUT)
        if n_k <= CAP:
            bp += n_k
    if EPILOGUE_CODE == 0:
        tma.store_wait(pendings=0)


@gluon.jit
def ragged_k_resident_kernel(
    a_desc,  # ragged TMA descriptor (`ragged_view`) of a viewed [Bt*R, M], M contiguous; box [1, 1, BLOCK_K, BLOCK_M]
    b_desc,  # ragged TMA descriptor of b viewed [Bt*R, N], block [1, 1, BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of c viewed [G*Bt, M, N] (out dtype), block [1, BLOCK_M, BLOCK_N]
    sched_ptr,  # [3, G] int32 from ragged_k._schedule_kernel: per slot (longest first) group / start / end
    R, M, N, G, Bt,  # scalars: token rows per batch, output rows, output columns, groups, batch count
    c_ptr,  # [G, Bt, M, N] c itself, for the pointer-store epilogue (EPILOGUE_CODE 1)
    stride_cg, stride_cm,  # scalars: elements between c's (group, batch) slabs and between its rows
    STAGES: gl.constexpr,  # depth of the a ring (>= 2)
    CAP: gl.constexpr,  # b chunks resident per item (groups of up to CAP * BLOCK_K rows keep their band)
    STRIP_M: gl.constexpr,  # row tiles per item
    MMA_LAYOUT: gl.constexpr,  # NVMMADistributedLayout of the [BLOCK_M, BLOCK_N] accumulator
    PRODUCER_REGS: gl.constexpr,  # registers per thread of the TMA producer warp
    EPILOGUE_CODE: gl.constexpr,  # 0: TMA store through c_desc; 1: pointer stores in STORE_LAYOUT
    STORE_LAYOUT: gl.constexpr,  # BlockedLayout of [BLOCK_M, BLOCK_N]: 16-byte vectors along rows (EPILOGUE_CODE 1)
):
    A_BLOCK: gl.constexpr = [a_desc.block_type.shape[2], a_desc.block_type.shape[3]]  # [BLOCK_K, BLOCK_M]
    B_BLOCK: gl.constexpr = [b_desc.block_type.shape[2], b_desc.block_type.shape[3]]  # [BLOCK_K, BLOCK_N]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + A_BLOCK,
                                       gl.NVMMASharedLayout.get_default_for(A_BLOCK, a_desc.dtype))
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [CAP] + B_BLOCK,
                                       gl.NVMMASharedLayout.get_default_for(B_BLOCK, b_desc.dtype))
    ready, empty = ring_barriers(STAGES)
    bready, bempty = ring_barriers(CAP)
    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, ready, empty, bready, bempty, c_desc, sched_ptr, R, M, N, G, Bt, c_ptr,
                     stride_cg, stride_cm, STRIP_M, MMA_LAYOUT, EPILOGUE_CODE, STORE_LAYOUT)),
        (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, bready, bempty, sched_ptr, R, M, N, G, Bt,
                     STRIP_M)),
    ], [1], [PRODUCER_REGS])
