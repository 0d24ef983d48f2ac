"""Ragged-M Group-GEMM (MoE forward and data gradient) for Hopper in Gluon: persistent, warp-specialized.

    c[bt, r, :] = a[bt, r, :] @ b[bt, group(r)]      rows r < ends[-1];   c[bt, r, :] = 0 beyond

Row tiles. Group g owns rows [ends[g-1], ends[g]) and is cut into ceil(size / BLOCK_M) row tiles starting at
its first row, so a tile never spans two groups' outputs; rows from ends[-1] to M form a "tail group" (G)
whose tiles store zeros without contracting. A Triton kernel (`_m_tile_table_kernel`, no host sync, prefix
sums over all groups at once in each of its programs) writes the table of row tiles: per slot its group (G: tail, -1:
unused slot), first row, end row, and its group's first slot and tile count; the slot count
cdiv(M, BLOCK_M) + G + 1 bounds the tiles of any routing.

Work items are (slot, column tile, batch entry), a group's items contiguous and walked in bands of GROUP_M of
its own slots (the tiles that share a column of the group's matrix run together, so that column is read from
DRAM about once); program p of the persistent grid takes items p, p + P, ... The partitions are those of the
weight gradient (gluon/ragged_k.py): a one-warp TMA producer filling a ring of (a [BLOCK_M, BLOCK_K],
b [BLOCK_K, BLOCK_N] or [BLOCK_N, BLOCK_K]) stages, and the wgmma consumer (one or two warpgroups cooperating
on a tile) that releases each stage once its MMA retired; or two one-warpgroup consumers on alternate items
(ping-pong), so that one's epilogue runs under the other's main loop.

Rows of a from the next group (or the NaN tail) may be loaded into a tile, but each output row depends only on
its own a row, and only the tile's own rows are stored: every tile goes through shared memory to a TMA store
(waited for only before the next tile reuses the buffer) into a "ragged" view of c (gluon/ragged_k.py's
`ragged_view`) whose row bound is the tile's group end, so the hardware clips a group's last tile at that
end and the epilogue is the same for every tile. K must be a multiple of BLOCK_K (a chunk of b never reaches
into the next group's matrix); TMA zero-fills past K, N and the tensor ends.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ragdot.kernels.configs import check_group_ends, check_operands, num_sms, prepared_output, run_kernel
from ragdot.kernels.gluon.common import consumer_regs, maxnreg_for, mma_layout
from ragdot.kernels.gluon.config import SHARED_BYTES, GluonConfig, pick_gluon_m_config
from ragdot.kernels.gluon.ragged_k import (
    _descriptor,
    _free_stage,
    _gl_dtype,
    _pass_turn,
    _ready_stage,
    _release_before,
    _ring_and_turn_barriers,
    _take_turn,
)
from ragdot.kernels.launch import BoundLaunch
from ragdot.kernels.ragged_view import RAGGED_BASE, check_ragged_rows, ragged_view
from ragdot.kernels.record import scratch

__all__ = ["Prepared", "ragged_m", "ragged_m_ws_kernel", "tile_table"]

# Whether a group's last row tile, where it holds at most half of BLOCK_M rows of its group, runs the MMAs of that
# half alone (its own accumulator layout; tiles of 128 rows and more). Read when a kernel is prepared.
HALF_TAIL_TILES = False


@triton.jit
def _max_combine(x, y):
    return tl.maximum(x, y)


@triton.jit
def _m_tile_table_kernel(
    groups_ptr,  # [G] inclusive clamped group ends (int32/int64); FROM_SIZES: raw group sizes, any integer dtype
    table_ptr,  # [5, T] int32 output: per row-tile slot its group (G = tail, -1 = unused), first row, end row,
    #             its group's first slot and tile count (an unused slot: itself and 1)
    M,  # scalar: rows of a (the ragged extent the ends are clamped to)
    G,  # scalar: number of groups
    size_scale,  # scalar: rows per unit of group size (FROM_SIZES only)
    T,  # scalar: slots, cdiv(M, BLOCK_M) + G + 1; program p writes slots [p * BLOCK_T, (p + 1) * BLOCK_T)
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_G: tl.constexpr,  # power of two > G: the groups and the tail group at once
    BLOCK_T: tl.constexpr,  # slots written per program (power of two)
    FROM_SIZES: tl.constexpr,  # form the clamped ends from the raw sizes (negatives count as 0, int64 sums)
):
    gi = tl.arange(0, BLOCK_G)  # group index; G is the tail group, beyond it nothing (zero tiles)
    real = gi < G
    if FROM_SIZES:
        size = tl.load(groups_ptr + gi, mask=real, other=0).to(tl.int64)
        size = tl.minimum(tl.maximum(size, 0), M // size_scale)
        carry = tl.cumsum(size, 0)
        end = tl.minimum(carry * size_scale, M).to(tl.int32)
        start = tl.minimum((carry - size) * size_scale, M).to(tl.int32)
    else:  # a running maximum makes the ends non-decreasing, as the rows' order does
        end = tl.associative_scan(tl.load(groups_ptr + gi, mask=real, other=0).to(tl.int32), 0, _max_combine)
        prev = tl.load(groups_ptr + gi - 1, mask=real & (gi > 0), other=0).to(tl.int32)
        start = tl.associative_scan(prev, 0, _max_combine)
    end = tl.where(real, tl.maximum(end, 0), M)
    start = tl.where(gi <= G, tl.maximum(start, 0), M)
    start = tl.where(gi == G, tl.max(tl.where(real, end, 0), 0), start)  # the tail starts at the last end
    ntiles = (end - start + BLOCK_M - 1) // BLOCK_M
    stop = tl.cumsum(ntiles, 0)  # one past each group's last slot
    first = stop - ntiles
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # this program's slots
    g = tl.sum((stop[None, :] <= t[:, None]).to(tl.int32), 1)  # groups whose slots all come before t
    pick = gi[None, :] == g[:, None]  # [BLOCK_T, BLOCK_G]: slot t's group
    g_first = tl.sum(tl.where(pick, first[None, :], 0), 1)
    g_tiles = tl.sum(tl.where(pick, ntiles[None, :], 0), 1)
    g_start = tl.sum(tl.where(pick, start[None, :], 0), 1)
    g_end = tl.sum(tl.where(pick, end[None, :], 0), 1)
    used = g <= G
    ok = t < T
    tl.store(table_ptr + t, tl.where(used, g, -1), mask=ok)
    tl.store(table_ptr + T + t, tl.where(used, g_start + (t - g_first) * BLOCK_M, 0), mask=ok)
    tl.store(table_ptr + 2 * T + t, tl.where(used, g_end, 0), mask=ok)
    tl.store(table_ptr + 3 * T + t, tl.where(used, g_first, t), mask=ok)
    tl.store(table_ptr + 4 * T + t, tl.where(used, g_tiles, 1), mask=ok)


def tile_table(groups: torch.Tensor, m: int, block_m: int, from_sizes: bool, scale: int = 1,
               launch: BoundLaunch | None = None) -> torch.Tensor:
    """int32 [5, T] row-tile table (see `_m_tile_table_kernel`); one launch, no host sync. `launch`: the kernel
    bound for these arguments (a Prepared's, `table_launch`), else an ordinary launch."""
    g = groups.shape[0]
    t = table_slots(m, block_m, g)
    table = scratch((5, t), torch.int32, groups.device)
    if launch is not None:
        launch(groups, table, m, g, scale, t)
    else:
        consts = _table_consts(block_m, g, from_sizes)
        run_kernel(_m_tile_table_kernel, _table_grid(t, consts), groups, table, m, g, scale, t, **consts, num_warps=4)
    return table


def table_slots(m: int, block_m: int, groups: int) -> int:
    """The table's slot count T: cdiv(M, BLOCK_M) + G + 1 bounds the row tiles of any routing (the tail group too)."""
    return -(-m // block_m) + groups + 1


def table_launch(m: int, block_m: int, groups: int, from_sizes: bool, device: torch.device) -> BoundLaunch:
    """`_m_tile_table_kernel` bound for one (M, BLOCK_M, G, FROM_SIZES): what `tile_table` takes as `launch`."""
    consts = _table_consts(block_m, groups, from_sizes)
    return BoundLaunch(_m_tile_table_kernel, _table_grid(table_slots(m, block_m, groups), consts), consts,
                       {"num_warps": 4}, device)


def _table_grid(slots: int, consts: dict[str, Any]) -> tuple[int]:
    """One program per BLOCK_T slots: each forms the groups' prefix sums itself (one pass over BLOCK_G values),
    so the table costs one such pass, not one per BLOCK_T slots in a row (48 µs at 385 slots and 128 groups on an
    H100, in the MoE layer's profile, where a program walked the slots alone)."""
    return (-(-slots // consts["BLOCK_T"]),)


def _table_consts(block_m: int, groups: int, from_sizes: bool) -> dict[str, Any]:
    block_g = triton.next_power_of_2(groups + 1)
    # the slot-to-group comparison is a [BLOCK_T, BLOCK_G] tile: keep it near 8192 elements
    return {"BLOCK_M": block_m, "BLOCK_G": block_g, "BLOCK_T": max(1, min(128, 8192 // block_g)),
            "FROM_SIZES": from_sizes}


@gluon.jit
def _m_item(item, table_ptr, T, N, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """Item -> (group, first row, end row, batch index, column tile). A group's items are contiguous (its slots
    times the column tiles) and walked in bands of GROUP_M of its own slots, so the slots that share a column
    of the group's matrix run together whatever the other groups' sizes."""
    num_n = gl.cdiv(N, BLOCK_N)
    tiles = T * num_n
    bt = item // tiles
    tile = item % tiles
    some = tile // num_n  # a slot of the item's group: the group's items start at its first slot times num_n
    first = gl.load(table_ptr + 3 * T + some)
    count = gl.load(table_ptr + 4 * T + some)
    local = tile - first * num_n
    width = GROUP_M * num_n
    band_m = (local // width) * GROUP_M
    band_h = gl.minimum(count - band_m, GROUP_M)
    slot = first + band_m + (local % width) % band_h
    pid_n = (local % width) // band_h
    g = gl.load(table_ptr + slot)
    row0 = gl.load(table_ptr + T + slot)
    end = gl.load(table_ptr + 2 * T + slot)
    return g, row0, end, bt, pid_n


@gluon.jit
def _m_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, table_ptr, T, M, N, K, G, Bt,
                GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr):
    """Worker partition (1 warp): TMA loads of every K chunk of this program's items into the ring."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    if B_KMAJOR:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    else:
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    for item in range(pid, Bt * T * gl.cdiv(N, BLOCK_N), nprog):
        g, row0, end, bt, pid_n = _m_item(item, table_ptr, T, N, BLOCK_N, GROUP_M)
        n_k = gl.where((g >= 0) & (g < G), gl.cdiv(K, BLOCK_K), 0)
        for kk in range(n_k):
            s = _free_stage(empty, it, STAGES)
            mbarrier.expect(ready.index(s), NBYTES)
            tma.async_copy_global_to_shared(a_desc, [bt * M + row0, kk * BLOCK_K], ready.index(s), a_bufs.index(s))
            if B_KMAJOR:  # b[bt, g] stored [N, K]: rows of the group's matrix are columns of c
                tma.async_copy_global_to_shared(b_desc, [(bt * G + g) * N + pid_n * BLOCK_N, kk * BLOCK_K],
                                                ready.index(s), b_bufs.index(s))
            else:
                tma.async_copy_global_to_shared(b_desc, [(bt * G + g) * K + kk * BLOCK_K, pid_n * BLOCK_N],
                                                ready.index(s), b_bufs.index(s))
            it += 1


@gluon.jit
def _m_tile(acc, dst, a_bufs, b_bufs, ready, empty, turn, c_smem, c_desc, it, n_k, g, row0, end, bt, pid_n, M,
            B_KMAJOR: gl.constexpr, PARITY: gl.constexpr, NCONS: gl.constexpr):
    """One item of a consumer: its main loop into the zeroed acc (a whole tile's accumulator, or a half tile's),
    the turn passed on, the last MMA waited for and its stage released, then the epilogue through `dst`."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    acc = _m_main_loop(a_bufs, b_bufs, ready, empty, it, n_k, acc, B_KMAJOR)
    _pass_turn(turn, PARITY, NCONS)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _release_before(empty, it + n_k, STAGES, n_k > 0)  # the item's last chunk
    _m_store(acc, dst, c_smem, c_desc, g, row0, end, bt, pid_n, M)


@gluon.jit
def _m_main_loop(a_bufs, b_bufs, ready, empty, it, n_k, acc, B_KMAJOR: gl.constexpr):
    """wgmma over an item's n_k chunks from ring position `it` into acc, each stage released once its MMA
    retired; acc's rows are the first acc.shape[0] rows of each a stage (all of them, or a half tile's)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    ROWS: gl.constexpr = acc.type.shape[0]
    for kk in range(n_k):
        pos = it + kk
        s = _ready_stage(ready, pos, STAGES)
        if B_KMAJOR:
            b_op = b_bufs.index(s).permute((1, 0))
        else:
            b_op = b_bufs.index(s)
        acc = warpgroup_mma(a_bufs.index(s).slice(0, ROWS), b_op, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _release_before(empty, pos, STAGES, kk > 0)  # chunk pos - 1 retired
    return acc


@gluon.jit
def _m_store(acc, dst, c_smem, c_desc, g, row0, end, bt, pid_n, M):
    """A tile's epilogue: acc into `dst` (c_smem, or its first rows for a half tile), then c_smem by TMA into
    the ragged view of c, whose row bound is the tile's group end: the box is clipped there, so rows of c_smem
    past the tile's own (a half tile's stale lower half) are never written. Nothing for an unused slot."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[3]
    if g >= 0:
        stop = bt * M + end
        tma.store_wait(pendings=0)  # this consumer's previous tile's store has read c_smem
        dst.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [RAGGED_BASE, stop, RAGGED_BASE - (end - row0), pid_n * BLOCK_N],
                                        c_smem.reshape([1, 1, BLOCK_M, BLOCK_N]))


@gluon.jit
def _m_consumer(a_bufs, b_bufs, ready, empty, turn, c_desc, table_ptr, T, M, N, K, G, Bt,
                GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr, MMA_LAYOUT: gl.constexpr,
                PARITY: gl.constexpr, NCONS: gl.constexpr, HALF_LAYOUT: gl.constexpr, HALF: gl.constexpr):
    """A consumer partition: wgmma over the K chunks of this program's items number PARITY, PARITY + NCONS, ...,
    then the tile's own rows stored. With two consumers (ping-pong) each counts the other's chunks to keep its
    place in the shared ring and they take turns at the ring (gluon/ragged_k.py's `_take_turn`). HALF: a tile
    with at most BLOCK_M / 2 rows of its group (a group's last tile) multiplies those rows alone, into a
    [BLOCK_M / 2, BLOCK_N] accumulator of HALF_LAYOUT (half the MMAs; the loads are the whole tile's)."""
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[3]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    C_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], c_desc.dtype)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], C_LAYOUT)
    it = 0  # ring position of the item's first chunk (every consumer's chunks counted)
    j = 0  # the item's number among this program's items
    for item in range(pid, Bt * T * gl.cdiv(N, BLOCK_N), nprog):
        g, row0, end, bt, pid_n = _m_item(item, table_ptr, T, N, BLOCK_N, GROUP_M)
        n_k = gl.where((g >= 0) & (g < G), gl.cdiv(K, BLOCK_K), 0)
        if j % NCONS == PARITY:
            _take_turn(turn, j // NCONS, PARITY, NCONS)
            if HALF and end - row0 <= BLOCK_M // 2:
                _m_tile(gl.zeros((BLOCK_M // 2, BLOCK_N), dtype=gl.float32, layout=HALF_LAYOUT),
                        c_smem.slice(0, BLOCK_M // 2), a_bufs, b_bufs, ready, empty, turn, c_smem, c_desc, it, n_k,
                        g, row0, end, bt, pid_n, M, B_KMAJOR, PARITY, NCONS)
            else:
                _m_tile(gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=MMA_LAYOUT), c_smem, a_bufs, b_bufs,
                        ready, empty, turn, c_smem, c_desc, it, n_k, g, row0, end, bt, pid_n, M, B_KMAJOR, PARITY,
                        NCONS)
        it += n_k
        j += 1  # noqa: SIM113 (a Gluon loop over a range with a step: no enumerate)
    tma.store_wait(pendings=0)


@gluon.jit
def ragged_m_ws_kernel(
    a_desc,  # TMA descriptor of a viewed [Bt*M, K] (K contiguous), block [BLOCK_M, BLOCK_K]
    b_desc,  # TMA descriptor of b viewed [Bt*G*K, N], block [BLOCK_K, BLOCK_N]; B_KMAJOR: [Bt*G*N, K], [BN, BK]
    c_desc,  # ragged TMA descriptor (`ragged_view`) of c viewed [Bt*M, N] (out dtype), box [1, 1, BLOCK_M, BLOCK_N]
    table_ptr,  # [5, T] int32 from _m_tile_table_kernel: per slot group / first row / end row / group's slots
    T, M, N, K, G, Bt,  # scalars: slots, rows, output columns, contraction (% BLOCK_K == 0), groups, batch
    STAGES: gl.constexpr,  # shared-memory ring depth (>= 2)
    GROUP_M: gl.constexpr,  # row-tile slots walked together (L2 reuse of the group's b tiles)
    B_KMAJOR: gl.constexpr,  # b's matrices are stored [N, K] (the data-gradient layout)
    MMA_LAYOUT: gl.constexpr,  # NVMMADistributedLayout of the [BLOCK_M, BLOCK_N] accumulator (one consumer's warps)
    PRODUCER_REGS: gl.constexpr,  # registers per thread of the TMA producer warp
    NCONS: gl.constexpr,  # consumer partitions: 1, or 2 (ping-pong, one warpgroup each, alternate items)
    CONSUMER_REGS: gl.constexpr,  # registers per thread of the second consumer (ping-pong only)
    HALF_LAYOUT: gl.constexpr,  # NVMMADistributedLayout of a half tile's [BLOCK_M / 2, BLOCK_N] accumulator
    HALF: gl.constexpr,  # a group's last tile, where at most half full, multiplies its own half alone
):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready, empty, turn = _ring_and_turn_barriers(STAGES, 1)
    if NCONS == 2:
        gl.warp_specialize([
            (_m_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, table_ptr, T, M, N, K, G, Bt, GROUP_M,
                           B_KMAJOR, MMA_LAYOUT, 0, NCONS, HALF_LAYOUT, HALF)),
            (_m_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, table_ptr, T, M, N, K, G, Bt, GROUP_M,
                           B_KMAJOR, MMA_LAYOUT, 1, NCONS, HALF_LAYOUT, HALF)),
            (_m_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, table_ptr, T, M, N, K, G, Bt, GROUP_M,
                           B_KMAJOR)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_m_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, table_ptr, T, M, N, K, G, Bt, GROUP_M,
                           B_KMAJOR, MMA_LAYOUT, 0, NCONS, HALF_LAYOUT, HALF)),
            (_m_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, table_ptr, T, M, N, K, G, Bt, GROUP_M,
                           B_KMAJOR)),
        ], [1], [PRODUCER_REGS])


# ---- host side ---------------------------------------------------------------------------------------------


def _flat_rows(t: torch.Tensor) -> tuple[int, int] | None:
    """(rows, row stride) of `t` seen as a 2-D [rows, last dim] view with the last dim contiguous and 16-byte
    aligned rows; None if its strides do not allow that."""
    *lead, x = t.shape
    if t.stride(-1) != 1 and x > 1:
        return None
    rows, stride = 1, None
    for i in range(len(lead) - 1, -1, -1):
        if lead[i] == 1:
            continue
        if stride is None:
            stride = t.stride(i)
        elif t.stride(i) != rows * stride:
            return None
        rows *= lead[i]
    stride = x if stride is None else stride
    if (stride * t.element_size()) % 16 or (x * t.element_size()) % 16:
        return None
    return rows, stride


class Prepared:
    """The Gluon ragged_m for one static signature: a call builds the row-tile table (one small Triton launch,
    from the raw sizes with from_sizes), the descriptors, and launches once.

    Raises NotImplementedError for what it does not serve: operands other than bf16/fp16, K not a multiple of
    the config's block_k, operands that are not row views
    with 16-byte aligned rows. A call whose operands start off a 16-byte boundary runs the triton kernel
    instead."""

    # a call is BoundLaunches and ragdot.kernels.record's hooks alone (ragdot.kernels.replay and ragdot.jax replay it)
    replayable = True

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, config: GluonConfig | None = None,
                 from_sizes: bool = False, scale: int = 1):
        bt, m, k = a.shape
        g, n = b.shape[1], b.shape[3]
        self.shape, self.out_dtype, self.device = (bt, m, n), out_dtype, a.device
        self.from_sizes, self.scale, self.fallback = from_sizes, scale, None
        self.empty = bt * m * n == 0
        self.zero = g == 0 or k == 0
        if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
            raise NotImplementedError(f"gluon ragged_m: operand dtypes {a.dtype}, {b.dtype} (bf16/fp16 only)")
        if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise NotImplementedError(f"gluon ragged_m: out_dtype {out_dtype}")
        out_bytes = torch.empty((), dtype=out_dtype).element_size()
        cfg = config if config is not None else pick_gluon_m_config(m, k, n, g, out_bytes)
        if cfg is None or k % cfg.block_k:
            raise NotImplementedError(f"gluon ragged_m: K={k} is not a multiple of the tile's block_k")
        if cfg.shared_bytes(2, out_bytes) > SHARED_BYTES:
            raise NotImplementedError(f"gluon ragged_m: config {cfg.short()} needs too much shared memory")
        self.cfg = cfg
        if self.empty or self.zero:
            return
        self.kmajor = b.stride(3) != 1
        bv = b.transpose(2, 3) if self.kmajor else b
        views = (_flat_rows(a), _flat_rows(bv))
        if None in views or (n * out_bytes) % 16:
            raise NotImplementedError("gluon ragged_m: operands are not row views with 16-byte aligned rows")
        check_ragged_rows("gluon ragged_m", bt, m)
        self.views, self.g, self.k = views, g, k
        self.c_view = ragged_view(n, n)  # c [Bt*M, N] contiguous, stores clipped at each tile's group end
        in_dt, out_dt = _gl_dtype(a.dtype), _gl_dtype(out_dtype)
        b_block = [cfg.block_n, cfg.block_k] if self.kmajor else [cfg.block_k, cfg.block_n]
        self.blocks = ([cfg.block_m, cfg.block_k], b_block, [1, 1, cfg.block_m, cfg.block_n])
        self.layouts = tuple(gl.NVMMASharedLayout.get_default_for(blk, dt)
                             for blk, dt in zip(self.blocks, (in_dt, in_dt, out_dt)))
        self.t = table_slots(m, cfg.block_m, g)
        items = bt * self.t * -(-n // cfg.block_n)
        self.grid = (max(1, min(items, num_sms(a.device))),)
        half = HALF_TAIL_TILES and cfg.block_m >= 128  # wgmma's rows: 64 a warpgroup at least
        self.consts = (cfg.stages, cfg.group_m, self.kmajor, mma_layout(cfg.block_m, cfg.block_n, cfg.num_warps),
                       cfg.producer_regs, cfg.consumers, consumer_regs(cfg),
                       mma_layout(cfg.block_m // 2, cfg.block_n, cfg.num_warps), half)
        self.options = {"num_warps": cfg.num_warps, "maxnreg": maxnreg_for(cfg.num_warps * cfg.consumers)}
        self.launch = BoundLaunch.in_order(ragged_m_ws_kernel, self.grid, self.consts, self.options, a.device)
        self.table_launch = table_launch(m, cfg.block_m, g, from_sizes, a.device)
        from ragdot.kernels.ragged_m import Prepared as TritonPrepared  # for operands TMA cannot address

        self.fallback = TritonPrepared(a, b, out_dtype, None, from_sizes=from_sizes, scale=scale)

    def descriptors(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[Any, Any, Any]:
        (ra, sa), (rb, sb) = self.views
        b_cols = self.k if self.kmajor else self.shape[2]
        return (_descriptor(a, [ra, self.k], [sa, 1], self.blocks[0], self.layouts[0]),
                _descriptor(b, [rb, b_cols], [sb, 1], self.blocks[1], self.layouts[1]),
                _descriptor(c, *self.c_view, self.blocks[2], self.layouts[2]))

    def __call__(self, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, object]:
        """a [Bt, M, K], b [Bt, G, K, N], ends [G] (raw sizes with from_sizes) -> (c [Bt, M, N], kernel)."""
        c, done = prepared_output(self, out)
        if done:
            return c, None
        if (a.data_ptr() | b.data_ptr() | c.data_ptr()) % 16:
            return self.fallback(a, b, ends, c)
        bt, m, n = self.shape
        table = tile_table(ends, m, self.cfg.block_m, self.from_sizes, self.scale, self.table_launch)
        return c, self.launch(*self.descriptors(a, b, c), table, self.t, m, n, self.k, self.g, bt)


def ragged_m(a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype | None = None,
             *, config: GluonConfig | None = None) -> torch.Tensor:
    """c[Bt, M, N]: row r of group g is a[bt, r] @ b[bt, g]; rows past ends[-1] are exact zeros (sm_90 GPU)."""
    check_operands(a, b, 4)
    g = group_ends.shape[0]
    ends = check_group_ends(group_ends, g, a.device)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    return Prepared(a, b, out_dtype, config)(a, b, ends)[0]
