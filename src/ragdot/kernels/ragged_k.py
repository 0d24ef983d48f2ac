"""Ragged-K Group-GEMM (contracting ragged dimension: the MoE weight gradient).

    c[g, bt] = a[bt, rows of g, :]^T @ b[bt, rows of g, :]       rows of g = [ends[g-1], ends[g])

The group is a work axis: each output tile belongs to one group and contracts only over that group's token
range, so there are no atomics and results are bitwise reproducible. A one-program prep kernel
(`_schedule_kernel`, no host sync) ranks the groups longest first and writes, per rank ("slot"), the group
and its token range; slots are handed out in that order, so under skewed routing the long groups start first
and the short ones fill in behind them. Token rows outside the group are masked to zero by the load (a
select), so NaN stored in other groups or past ends[-1] never reaches a result; an empty group stores zeros.

Two schedules:
- one program per (tile, slot, batch) (`ragged_k_kernel`);
- persistent (`ragged_k_persistent_kernel`): each program walks its (slot, batch, tile) items round-robin in
  ONE loop over token chunks (the tile loop and the chunk loop flattened by hand), so the software pipeline
  prefetches the next tile's rows while the current tile's epilogue runs. Groups hold tens to hundreds of
  tokens, so without this the epilogue and load latency of every tile would be exposed. With `TMA_LOAD`
  (config `flat`, sm_90, row-major operands) its a and b rows come through ragged TMA views
  (`ragdot.kernels.ragged_view`) clipped at each group's end instead of masked pointer loads: the hardware
  zero-fills the rows past the end, so the same zeros enter the same MMAs. Called from raw group sizes on a
  problem small enough that its host time matters (`INLINE_GROUPS`, `INLINE_FLOPS`), every program does the
  prep kernel's work itself into its own rows of a scratch: one launch, the same slots, the same result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot._memo import remember
from ragdot.kernels.configs import (
    TileConfig,
    check_group_ends,
    check_operands,
    dot_precision,
    gather_config,
    host_descriptor,
    launch_options,
    make_output,
    next_pow2,
    num_sms,
    prepared_output,
    resolve_config,
    tma_capable,
)
from ragdot.kernels.launch import BoundLaunch
from ragdot.kernels.ragged_view import RAGGED_BASE, fits_ragged_rows, ragged_view, rows_view, vector_rows
from ragdot.kernels.record import active, scratch

# How output tiles are written where the config asks for TMA (`cfg.tma`) and c allows it: True, through a TMA
# descriptor; False, pointer stores; None, by `pointer_stores` where `vector_rows`, else TMA. A weight gradient with
# few token rows per group is bounded by its output's writes, and pointer stores keep more of them in flight than
# one TMA tile at a time: on the H200 a persistent kernel storing TMA tiles wrote 3.8 TB/s, pointer stores 4.3
# (`benchmarks/write_ceiling.py`).
TMA_STORE: bool | None = None
POINTER_STORE_MAX_ROWS = 128  # mean token rows per group up to which this kernel writes by pointer stores


def pointer_stores(rows: int, groups: int, max_rows: int = POINTER_STORE_MAX_ROWS) -> bool:
    """Whether a weight gradient contracting `rows` token rows over `groups` groups writes its output by pointer
    stores: where the mean group (of at most `max_rows` rows) is short, so the output's writes bound it. Measured on
    an H100 (`kernel_ab.py`, two runs): this kernel's pointer stores -1 to +6% at 20-80 rows a group, 3-7% slower at
    160 and 4-5% slower at 480."""
    return rows <= max_rows * max(groups, 1)


@triton.jit
def _form_ends(
    sizes_ptr,  # [G] raw group sizes, any integer dtype
    ends_ptr,  # [G] int32 output: the clamped inclusive ends
    G, R, size_scale,  # scalars: groups, the ragged extent, rows per unit of group size
    BLOCK_G: tl.constexpr,  # groups per step (power of two)
):
    """ends[g] = min(R, size_scale * (sizes[0] + ... + sizes[g])) with each size clamped to [0, R // size_scale]
    (negatives count as 0, int64 sums); a barrier makes them visible to the program's other threads."""
    carry = tl.full([], 0, tl.int64)
    for g0 in range(0, G, BLOCK_G):
        og = g0 + tl.arange(0, BLOCK_G)
        sizes = tl.load(sizes_ptr + og, mask=og < G, other=0).to(tl.int64)
        sizes = tl.minimum(tl.maximum(sizes, 0), R // size_scale)
        ends = tl.minimum((tl.cumsum(sizes, 0) + carry) * size_scale, R)
        tl.store(ends_ptr + og, ends.to(tl.int32), mask=og < G)
        carry += tl.sum(sizes, 0)
    tl.debug_barrier()


@triton.jit
def _rank_groups(
    ends_ptr,  # [G] int32/int64 inclusive group ends
    sched_ptr,  # [3, G] int32 output: per slot (groups by size descending, ties by index): group, start, end
    G,  # scalar: number of groups
    BLOCK_G: tl.constexpr,  # groups ranked per step (power of two)
    BLOCK_H: tl.constexpr,  # groups compared against per inner step (power of two)
):
    for g0 in range(0, G, BLOCK_G):
        og = g0 + tl.arange(0, BLOCK_G)
        end = tl.load(ends_ptr + og, mask=og < G, other=0).to(tl.int32)
        start = tl.load(ends_ptr + og - 1, mask=(og > 0) & (og < G), other=0).to(tl.int32)
        end = tl.maximum(end, start)
        size = end - start
        rank = tl.zeros((BLOCK_G,), dtype=tl.int32)
        for h0 in range(0, G, BLOCK_H):
            oh = h0 + tl.arange(0, BLOCK_H)
            end_h = tl.load(ends_ptr + oh, mask=oh < G, other=0).to(tl.int32)
            start_h = tl.load(ends_ptr + oh - 1, mask=(oh > 0) & (oh < G), other=0).to(tl.int32)
            size_h = tl.where(oh < G, tl.maximum(end_h - start_h, 0), -1)
            before = (size_h[None, :] > size[:, None]) | (
                (size_h[None, :] == size[:, None]) & (oh[None, :] < og[:, None])
            )
            rank += tl.sum(before.to(tl.int32), 1)
        ok = og < G
        tl.store(sched_ptr + rank, og, mask=ok)
        tl.store(sched_ptr + G + rank, start, mask=ok)
        tl.store(sched_ptr + 2 * G + rank, end, mask=ok)


@triton.jit
def _schedule_kernel(
    groups_ptr,  # [G] int32/int64 inclusive group ends; FROM_SIZES: [G] raw group sizes, any integer dtype
    sched_ptr,  # [3, G] int32 output: per slot (groups by size descending, ties by index): group, start, end;
    #             FROM_SIZES: [4, G], row 3 receives the clamped ends
    G,  # scalar: number of groups
    R,  # scalar: the ragged extent (token rows) the ends are clamped to (FROM_SIZES only)
    size_scale,  # scalar: rows per unit of group size (FROM_SIZES only)
    BLOCK_G: tl.constexpr,  # groups ranked per step (power of two)
    BLOCK_H: tl.constexpr,  # groups compared against per inner step (power of two)
    FROM_SIZES: tl.constexpr,  # form the ends from the sizes first (negatives count as 0, int64 sums)
):
    if FROM_SIZES:
        _form_ends(groups_ptr, sched_ptr + 3 * G, G, R, size_scale, BLOCK_G)
        _rank_groups(sched_ptr + 3 * G, sched_ptr, G, BLOCK_G, BLOCK_H)
    else:
        _rank_groups(groups_ptr, sched_ptr, G, BLOCK_G, BLOCK_H)


@triton.jit
def _tile_of(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of linear tile id `tile`, walked in bands of GROUP_M row tiles."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    band_m = (tile // width) * GROUP_M
    band_h = tl.minimum(num_m - band_m, GROUP_M)
    return band_m + (tile % width) % band_h, (tile % width) // band_h


@triton.jit
def _load_rows(
    ptr, idx_ptr, bt, k, end, pid, C, src_rows, stride_b, stride_r, stride_c,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_C: tl.constexpr, GATHER: tl.constexpr,
):
    """Token rows [k, k + BLOCK_K) of one operand, columns of tile `pid`: [BLOCK_K, BLOCK_C]; rows >= end are 0.
    GATHER: token row r is the operand's row idx[r] (clamped into [0, src_rows)), batch entry 0."""
    rk = tl.arange(0, BLOCK_K)
    rc = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = rk < end - k  # rows of this group only: a select, so NaN elsewhere never enters
    if GATHER:
        src = tl.load(idx_ptr + k + rk, mask=k_ok, other=0)
        rows = tl.minimum(tl.maximum(src, 0), src_rows - 1).to(tl.int64)
    else:
        rows = (k + rk).to(tl.int64)
    ptrs = ptr + bt.to(tl.int64) * stride_b + rows[:, None] * stride_r + rc.to(tl.int64)[None, :] * stride_c
    if EVEN_C:
        return tl.load(ptrs, mask=k_ok[:, None], other=0.0)
    return tl.load(ptrs, mask=k_ok[:, None] & (rc < C)[None, :], other=0.0)


@triton.jit
def _load_rows_tma(desc, bt, R, k, end, pid, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    """`_load_rows` through the operand's ragged view: rows [k, k + BLOCK_K) of batch entry bt, rows >= end
    zero-filled by TMA (out of the view's bounds), columns past the operand's width likewise."""
    return desc.load([RAGGED_BASE, bt * R + end, RAGGED_BASE - end + k, pid * BLOCK_C]).reshape(BLOCK_K, BLOCK_C)


@triton.jit
def _load_operand(
    ptr, desc, idx_ptr, bt, R, k, end, pid, C, src_rows, stride_b, stride_r, stride_c,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_C: tl.constexpr, TMA: tl.constexpr, GATHER: tl.constexpr,
):
    """One operand's token rows [k, k + BLOCK_K), columns of tile `pid`: through its ragged TMA view (TMA), or
    masked pointer loads (always for a gathered operand, whose rows TMA cannot address)."""
    if TMA and not GATHER:
        rows = _load_rows_tma(desc, bt, R, k, end, pid, BLOCK_C, BLOCK_K)
    else:
        rows = _load_rows(ptr, idx_ptr, bt, k, end, pid, C, src_rows, stride_b, stride_r, stride_c,
                          BLOCK_C, BLOCK_K, EVEN_C, GATHER)
    return rows


@triton.jit
def _store_tile(
    c_ptr, c_desc, acc, g, bt, Bt, pid_m, pid_n, M, N, stride_cg, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA_STORE: tl.constexpr,
):
    """Write one accumulator tile to c[g, bt] (through the TMA descriptor of c viewed [G*Bt, M, N] if set);
    c's group entry g, batch entry bt starts at (g * Bt + bt) * stride_cg, its rows stride_cm apart."""
    out = acc.to(c_ptr.dtype.element_ty)
    if TMA_STORE:
        c_desc.store([g * Bt + bt, pid_m * BLOCK_M, pid_n * BLOCK_N], out.reshape(1, BLOCK_M, BLOCK_N))
    else:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        base = (g.to(tl.int64) * Bt + bt) * stride_cg
        c_ptrs = c_ptr + base + rm.to(tl.int64)[:, None] * stride_cm + rn.to(tl.int64)[None, :]
        tl.store(c_ptrs, out, mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def ragged_k_kernel(
    a_ptr,  # [Bt, R, M] lhs, R = ragged contraction (tokens in group order), any strides
    b_ptr,  # [Bt, R, N] rhs, any strides
    c_ptr,  # [G, Bt, M, N] output: rows of N contiguous, entry (g, bt) at (g * Bt + bt) * stride_cg
    c_desc,  # TMA descriptor of c viewed [G*Bt, M, N], block [1, BLOCK_M, BLOCK_N] (None without TMA_STORE)
    sched_ptr,  # [3, G] int32 from _schedule_kernel: per slot, group / first token row / end token row
    a_idx_ptr,  # GATHER_A: [R] int32, the row of a [1, src_rows, M] that token row r reads (else not read)
    b_idx_ptr,  # GATHER_B: [R] int32, likewise for b [1, src_rows, N]
    M, N, G, Bt,  # scalars: output sizes, groups, batch count
    src_rows,  # scalar: rows of the gathered operand (indices are clamped into [0, src_rows))
    stride_ab, stride_ar, stride_am,  # scalars: strides of a, in elements
    stride_bb, stride_br, stride_bn,  # scalars: strides of b, in elements
    stride_cg, stride_cm,  # scalars: elements between c's (group, batch) entries and between its rows
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row tiles walked together inside one group
    EVEN_M: tl.constexpr,  # M % BLOCK_M == 0
    EVEN_N: tl.constexpr,  # N % BLOCK_N == 0
    TMA_STORE: tl.constexpr,  # store the output tile through c_desc
    PRECISION: tl.constexpr,  # tl.dot input_precision: "ieee" or "tf32" (used for float32 inputs)
    GATHER_A: tl.constexpr,  # a's token rows come through a_idx_ptr
    GATHER_B: tl.constexpr,  # b's token rows come through b_idx_ptr
):
    slot = tl.program_id(1)
    bt = tl.program_id(2)
    g = tl.load(sched_ptr + slot)
    start = tl.load(sched_ptr + G + slot)
    end = tl.load(sched_ptr + 2 * G + slot)
    pid_m, pid_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(start, end, BLOCK_K):
        a = _load_rows(a_ptr, a_idx_ptr, bt, k, end, pid_m, M, src_rows, stride_ab, stride_ar, stride_am,
                       BLOCK_M, BLOCK_K, EVEN_M, GATHER_A)
        b = _load_rows(b_ptr, b_idx_ptr, bt, k, end, pid_n, N, src_rows, stride_bb, stride_br, stride_bn,
                       BLOCK_N, BLOCK_K, EVEN_N, GATHER_B)
        acc = tl.dot(tl.trans(a), b, acc, input_precision=PRECISION)
    _store_tile(c_ptr, c_desc, acc, g, bt, Bt, pid_m, pid_n, M, N, stride_cg, stride_cm, BLOCK_M, BLOCK_N,
                TMA_STORE)


@triton.jit
def ragged_k_persistent_kernel(
    a_ptr,  # [Bt, R, M] lhs, R = ragged contraction (tokens in group order), any strides
    b_ptr,  # [Bt, R, N] rhs, any strides
    c_ptr,  # [G, Bt, M, N] output: rows of N contiguous, entry (g, bt) at (g * Bt + bt) * stride_cg
    c_desc,  # TMA descriptor of c viewed [G*Bt, M, N], block [1, BLOCK_M, BLOCK_N] (None without TMA_STORE)
    a_desc,  # ragged view (`ragged_view`) of a as [Bt*R, M], block [1, 1, BLOCK_K, BLOCK_M] (None w/o TMA_LOAD)
    b_desc,  # ragged view of b as [Bt*R, N], block [1, 1, BLOCK_K, BLOCK_N] (None without TMA_LOAD)
    sched_ptr,  # [3, G] int32 from _schedule_kernel: per slot, group / first token row / end token row;
    #             INLINE: [programs, 4, G] int32 scratch, each program's own schedule and clamped ends
    sizes_ptr,  # INLINE: [G] raw group sizes, any integer dtype (else not read)
    a_idx_ptr,  # GATHER_A: [R] int32, the row of a [1, src_rows, M] that token row r reads (else not read)
    b_idx_ptr,  # GATHER_B: [R] int32, likewise for b [1, src_rows, N]
    M, N, G, Bt, R,  # scalars: output sizes, groups, batch count, token rows per batch entry
    size_scale,  # scalar: rows per unit of group size (INLINE only)
    src_rows,  # scalar: rows of the gathered operand (indices are clamped into [0, src_rows))
    stride_ab, stride_ar, stride_am,  # scalars: strides of a, in elements
    stride_bb, stride_br, stride_bn,  # scalars: strides of b, in elements
    stride_cg, stride_cm,  # scalars: elements between c's (group, batch) entries and between its rows
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_I: tl.constexpr,  # items counted per step when sizing the loop (power of two)
    INLINE: tl.constexpr,  # each program ranks the groups itself (no schedule launch; the same slots)
    BLOCK_G: tl.constexpr,  # INLINE: groups per step of the ranking (power of two)
    BLOCK_H: tl.constexpr,  # INLINE: groups compared against per inner step (power of two)
    GROUP_M: tl.constexpr,  # row tiles walked together inside one group
    EVEN_M: tl.constexpr,  # M % BLOCK_M == 0
    EVEN_N: tl.constexpr,  # N % BLOCK_N == 0
    TMA_STORE: tl.constexpr,  # store the output tile through c_desc
    TMA_LOAD: tl.constexpr,  # read a and b through a_desc / b_desc (a gathered operand: masked pointer loads)
    PRECISION: tl.constexpr,  # tl.dot input_precision: "ieee" or "tf32" (used for float32 inputs)
    GATHER_A: tl.constexpr,  # a's token rows come through a_idx_ptr (Bt == 1)
    GATHER_B: tl.constexpr,  # b's token rows come through b_idx_ptr (Bt == 1)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if INLINE:  # the schedule kernel's work, into this program's own rows (a few µs for G <= 256)
        sched_ptr += pid * 4 * G
        _form_ends(sizes_ptr, sched_ptr + 3 * G, G, R, size_scale, BLOCK_G)
        _rank_groups(sched_ptr + 3 * G, sched_ptr, G, BLOCK_G, BLOCK_H)
        tl.debug_barrier()
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    per_slot = Bt * tiles
    # this program's items are pid, pid + nprog, ...; the loop runs over all their token chunks
    mine = tl.cdiv(G * per_slot - pid, nprog)
    total = pid * 0
    for i0 in range(0, mine, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        slots = (pid + ii * nprog) // per_slot
        s_v = tl.minimum(tl.load(sched_ptr + G + slots, mask=ii < mine, other=0), R)
        e_v = tl.minimum(tl.load(sched_ptr + 2 * G + slots, mask=ii < mine, other=0), R)
        total += tl.sum(tl.where(ii < mine, tl.maximum(tl.cdiv(e_v - s_v, BLOCK_K), 1), 0), 0)

    item = pid - nprog  # current item (int32 scalar, loop-carried)
    kk = pid * 0  # chunk index inside the current item
    n_i = pid * 0 + 1
    g = pid * 0
    bt = pid * 0
    start = pid * 0
    end = pid * 0
    pid_m = pid * 0
    pid_n = pid * 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, total):
        if kk == 0:  # first chunk of the next item: its group, token range and tile
            item += nprog
            slot = item // per_slot
            g = tl.load(sched_ptr + slot)
            start = tl.minimum(tl.load(sched_ptr + G + slot), R)  # rows end with the batch entry
            end = tl.minimum(tl.load(sched_ptr + 2 * G + slot), R)
            n_i = tl.maximum(tl.cdiv(end - start, BLOCK_K), 1)  # an empty group: one zero step
            rest = item % per_slot
            bt = rest // tiles
            pid_m, pid_n = _tile_of(rest % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        k = start + kk * BLOCK_K
        a = _load_operand(a_ptr, a_desc, a_idx_ptr, bt, R, k, end, pid_m, M, src_rows, stride_ab, stride_ar,
                          stride_am, BLOCK_M, BLOCK_K, EVEN_M, TMA_LOAD, GATHER_A)
        b = _load_operand(b_ptr, b_desc, b_idx_ptr, bt, R, k, end, pid_n, N, src_rows, stride_bb, stride_br,
                          stride_bn, BLOCK_N, BLOCK_K, EVEN_N, TMA_LOAD, GATHER_B)
        acc = tl.dot(tl.trans(a), b, acc, input_precision=PRECISION)
        kk += 1
        if kk == n_i:  # last chunk: write the tile and start the next one from zero
            _store_tile(c_ptr, c_desc, acc, g, bt, Bt, pid_m, pid_n, M, N, stride_cg, stride_cm,
                        BLOCK_M, BLOCK_N, TMA_STORE)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            kk = pid * 0


_SCHEDULES: dict[tuple, BoundLaunch] = {}
# Where the persistent kernel ranks the groups itself (H200, `benchmarks/kernel_ab.py --from-sizes`, eager and
# graph clocks against the separate ranking launch, bitwise equal): on weight gradients of 2.7-41 GFLOP with
# 128-256 groups the eager call took 0.79-1.0x the time (host 10-23 µs less per call), graph replays within
# -4% / +1%; on one of 258 GFLOP (qwen3-235b-a22b) eager calls took 1.02-1.11x, so larger problems keep the launch.
INLINE_GROUPS = 256  # most groups a program ranks itself (G^2 / 4096 compare steps of 128x32)
INLINE_FLOPS = 2**36  # largest problem (2 x rows x M x N, about 69 GFLOP) that ranks inline


def schedule(groups: torch.Tensor, extent: int | None = None, scale: int = 1) -> torch.Tensor:
    """int32 [3, G]: per slot (groups by size, largest first, ties by index) the group, its first and end row.

    `groups` holds the clamped group ends; with `extent` given it holds the raw group sizes instead (any
    integer dtype; `scale` rows per unit), and the result is [4, G] with the clamped ends in row 3.
    One launch of one program on the device; no host sync.
    """
    g = groups.shape[0]
    from_sizes = extent is not None
    key = (g, from_sizes, extent, scale, groups.device)
    launch = _SCHEDULES.get(key)
    if launch is None:
        consts = {"BLOCK_G": min(next_pow2(g), 128), "BLOCK_H": 32, "FROM_SIZES": from_sizes}
        launch = remember(_SCHEDULES, key, BoundLaunch(_schedule_kernel, (1,), consts, {"num_warps": 4},
                                                       groups.device), 4096)
    sched = scratch((4 if from_sizes else 3, g), torch.int32, groups.device)
    launch(groups, sched, g, extent or 0, scale)
    return sched


def longest_first(group_ends: torch.Tensor) -> torch.Tensor:
    """int32 [G] permutation of the groups by size, largest first (ties by index); no host sync."""
    return schedule(group_ends)[0]


class Prepared:
    """`ragged_k` for one static signature (shapes, strides, dtypes, device, config): checks, config, grid and
    kernel choice resolved once; a call allocates the output, ranks the groups and launches. With
    `from_sizes` the third argument of a call is the raw group sizes ([G], any integer dtype; `scale` rows
    per unit), which the ranking kernel turns into clamped ends. With `gather` ("a" or "b") that operand is
    read through a row index given to each call (`index`, int32 [R]): it is the source [1, S, X] whose row
    index[r] stands at token row r (indices clamped into [0, S)); the other operand holds the R token rows.
    `out_strides` (group, row), batch 1: every call writes a given `out` [G, 1, M, N] view with those strides
    (elements; columns contiguous), e.g. a slice of a larger gradient, instead of a contiguous one."""

    # a call is BoundLaunches and ragdot.kernels.record's hooks alone (ragdot.kernels.replay and ragdot.jax replay it)
    replayable = True

    def __init__(self, a: torch.Tensor, b: torch.Tensor, g: int, out_dtype: torch.dtype, config: TileConfig | None,
                 from_sizes: bool = False, scale: int = 1, gather: str | None = None,
                 out_strides: tuple[int, int] | None = None):
        if gather not in (None, "a", "b"):
            raise ValueError(f"gather={gather!r}: expected None, 'a' or 'b'")
        if gather is not None and (a.shape[0] != 1 or b.shape[0] != 1):
            raise ValueError(f"gather: needs batch 1 operands, got a {tuple(a.shape)}, b {tuple(b.shape)}")
        self.gather = gather
        bt, m, n = a.shape[0], a.shape[2], b.shape[2]
        r = (b if gather == "a" else a).shape[1]  # the token rows (the index's length when gathering)
        src_rows = (a if gather == "a" else b).shape[1] if gather else 0
        self.shape = (g, bt, m, n)
        self.sizes_extent = r if from_sizes else None
        self.scale = scale
        self.out_dtype = out_dtype
        self.device = a.device
        if config is None and gather:
            config = gather_config(r, m, n, g, a.dtype, a.device)
        cfg = self.cfg = resolve_config(config, "ragged_k", m, r, n, g, a)
        self.empty = g * bt * m * n == 0
        self.zero = r == 0
        if self.empty or self.zero:
            return
        if g > 65535 or bt > 65535:
            raise ValueError(f"group_ends/a: {g} groups x batch {bt} exceed the grid's 65535 per axis")
        if gather and src_rows == 0:
            raise ValueError(f"gather: the gathered operand {gather} has no rows to read")
        if out_strides is not None and (bt != 1 or out_strides[1] < n or out_strides[0] < m * out_strides[1]):
            raise ValueError(f"out_strides={out_strides}: expected (group, row) strides of a batch-1 [{g}, 1, {m}, "
                             f"{n}] view whose groups and rows do not overlap")
        self.out_strides = out_strides
        c_strides = out_strides or (m * n, n)
        elem = torch.empty((), dtype=out_dtype).element_size()
        tma_store = not (pointer_stores(r, g) and vector_rows(n, c_strides)) if TMA_STORE is None else TMA_STORE
        self.tma = bool(tma_store and cfg.tma and tma_capable(a.device)
                        and all((x * elem) % 16 == 0 for x in (n, *c_strides)))
        self.c_desc = ([g * bt, m, n], [*c_strides, 1], [1, cfg.block_m, cfg.block_n])
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        consts = dict(
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            EVEN_M=m % cfg.block_m == 0, EVEN_N=n % cfg.block_n == 0, PRECISION=dot_precision(a.dtype),
            GATHER_A=gather == "a", GATHER_B=gather == "b",
        )
        opts = launch_options(cfg, a.device)
        self.persistent = cfg.persistent
        self.tma_load = False
        # from raw sizes, a persistent program ranks up to INLINE_GROUPS groups itself on problems of up to
        # INLINE_FLOPS: one launch, not two, where the call's host time matters
        self.inline = bool(cfg.persistent and from_sizes and g <= INLINE_GROUPS and 2 * bt * r * m * n <= INLINE_FLOPS)
        strides = (*a.stride(), *b.stride())
        if cfg.persistent:
            # TMA reads the operands that hold the token rows; a gathered one is read through masked pointer loads
            views = (None if gather == "a" else rows_view(a), None if gather == "b" else rows_view(b))
            needed = [v for side, v in zip("ab", views) if side != gather]
            self.tma_load = bool(cfg.flat and tma_capable(a.device) and None not in needed and fits_ragged_rows(bt, r))
            if self.tma_load:  # built once: a bound launch compares later calls' descriptor layouts by identity
                self.views = tuple(None if v is None else (*ragged_view(width, v[1]), [1, 1, cfg.block_k, block])
                                   for v, width, block in zip(views, (m, n), (cfg.block_m, cfg.block_n)))
            self.scalars = (m, n, g, bt, r, scale, src_rows, *strides, *c_strides)
            self.programs = min(g * bt * tiles, num_sms(a.device) * cfg.programs_per_sm)
            kernel, grid = ragged_k_persistent_kernel, (self.programs,)
            consts = {**consts, "BLOCK_I": 128, "BLOCK_G": min(next_pow2(g), 128), "BLOCK_H": 32}
        else:
            self.scalars = (m, n, g, bt, src_rows, *strides, *c_strides)
            kernel, grid = ragged_k_kernel, (tiles, g, bt)
        self.launches = {
            (store, load, inline): BoundLaunch(kernel, grid, {**consts, "TMA_STORE": store, **(
                {"TMA_LOAD": load, "INLINE": inline} if cfg.persistent else {})}, opts, a.device)
            for store in {False, self.tma} for load in {False, self.tma_load} for inline in {False, self.inline}
        }

    def __call__(
        self, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, out: torch.Tensor | None = None,
        sched: torch.Tensor | None = None, index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, object]:
        """a [Bt, R, M], b [Bt, R, N], ends int32/int64 [G] -> (c [G, Bt, M, N], kernel handle or None);
        with `gather`, `index` int32 [R] (the gathered operand is its [1, S, X] source)."""
        if self.out_strides is not None and (out is None or out.shape != self.shape or (
                out.stride(0), out.stride(2), out.stride(3)) != (*self.out_strides, 1)):
            raise ValueError(f"out: expected a {list(self.shape)} view with strides {self.out_strides} (group, row)")
        c, done = prepared_output(self, out)
        if done:
            return c, None
        if (index is None) != (self.gather is None):
            raise ValueError("index: a call of a gathering ragged_k takes an int32 row index, others none")
        # a call recorded for a fixed workspace (ragdot.jax's, which holds one [4, G] ranking) ranks separately
        rec = active()
        inline = self.inline and sched is None and (rec is None or rec.workspace is None)
        if inline:  # the kernel's programs form and rank the groups themselves, each into its own rows
            sched = scratch((self.programs, 4, self.shape[0]), torch.int32, self.device)
        elif sched is None:
            sched = schedule(ends, self.sizes_extent, self.scale)
        idx = (index if self.gather == "a" else sched, index if self.gather == "b" else sched)
        tma = self.tma and c.data_ptr() % 16 == 0
        c_desc = host_descriptor(c, *self.c_desc) if tma else None
        if not self.persistent:
            return c, self.launches[tma, False, False](a, b, c, c_desc, sched, *idx, *self.scalars)
        load = self.tma_load and ((0 if self.gather == "a" else a.data_ptr())
                                  | (0 if self.gather == "b" else b.data_ptr())) % 16 == 0
        descs = tuple(None if view is None else host_descriptor(t, *view)
                      for t, view in zip((a, b), self.views)) if load else (None, None)
        return c, self.launches[tma, load, inline](a, b, c, c_desc, *descs, sched, ends if inline else sched, *idx,
                                                   *self.scalars)


def _row_index(a: torch.Tensor, b: torch.Tensor, a_rows: torch.Tensor | None,
               b_rows: torch.Tensor | None) -> tuple[str | None, torch.Tensor | None]:
    """(gathered operand or None, its int32 row index) of a `ragged_k` call, checked."""
    if a_rows is None and b_rows is None:
        if b.shape[0] != a.shape[0] or b.shape[1] != a.shape[1]:
            raise ValueError(f"b: expected shape [{a.shape[0]}, {a.shape[1]}, N] to match a {tuple(a.shape)}, "
                             f"got {tuple(b.shape)}")
        return None, None
    if a_rows is not None and b_rows is not None:
        raise ValueError("a_rows, b_rows: at most one operand is read through a row index")
    side, index = ("a", a_rows) if a_rows is not None else ("b", b_rows)
    name = f"{side}_rows"
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.is_floating_point() or index.is_complex():
        raise TypeError(f"{name}: expected a 1-D integer tensor [R], got {index!r:.60}")
    if index.device != a.device:
        raise ValueError(f"{name}: on {index.device}, the operands on {a.device}")
    if a.shape[0] != 1 or b.shape[0] != 1:
        raise ValueError(f"{name}: needs batch-1 operands, got a {tuple(a.shape)}, b {tuple(b.shape)}")
    other = b if side == "a" else a
    if other.shape[1] != index.shape[0]:
        raise ValueError(f"{name}: {index.shape[0]} rows, but the other operand has {other.shape[1]} token rows")
    return side, index.to(torch.int32).contiguous()


def launch(
    a: torch.Tensor,
    b: torch.Tensor,
    group_ends: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
    sched: torch.Tensor | None = None,
    a_rows: torch.Tensor | None = None,
    b_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, object]:
    """`ragged_k` returning also the launched kernel handle (compiled kernel on a GPU), for inspection."""
    check_operands(a, b, 3)
    gather, index = _row_index(a, b, a_rows, b_rows)
    if not isinstance(group_ends, torch.Tensor) or group_ends.dim() != 1:
        raise ValueError("group_ends: expected a 1-D integer tensor [G]")
    bt, m = a.shape[0], a.shape[2]
    g, n = group_ends.shape[0], b.shape[2]
    ends = check_group_ends(group_ends, g, a.device)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    c = make_output("out", out, (g, bt, m, n), out_dtype, a.device)
    return Prepared(a, b, g, out_dtype, config, gather=gather)(a, b, ends, c, sched, index)


def ragged_k(
    a: torch.Tensor,
    b: torch.Tensor,
    group_ends: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
    a_rows: torch.Tensor | None = None,
    b_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """c[G, Bt, M, N]: c[g, bt] = a[bt, rows of g]^T @ b[bt, rows of g]; an empty group gives exact zeros.

    a [Bt, R, M] and b [Bt, R, N] may be any strided views of one float dtype; group_ends is int32 or int64
    [G], non-decreasing, each in [0, R]; rows past ends[-1] contribute to no group.

    `a_rows` (or `b_rows`), integer [R]: that operand is read through the index instead of being gathered
    first (batch 1): a [1, S, M] is the source, and token row r is a[0, a_rows[r]] (indices clamped into
    [0, S), so none reads out of bounds); the result equals `ragged_k(a[:, a_rows], b, ...)` bit for bit.
    """
    return launch(a, b, group_ends, out_dtype, config=config, out=out, a_rows=a_rows, b_rows=b_rows)[0]
