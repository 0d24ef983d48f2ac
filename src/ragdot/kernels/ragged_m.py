"""Ragged-M Group-GEMM (non-contracting ragged dimension: MoE forward and data gradient).

    c[bt, r, :] = a[bt, r, :] @ b[bt, group(r)]      for rows r < group_ends[-1];   c[bt, r, :] = 0 beyond

Work decomposition. Group g owns rows [ends[g-1], ends[g]) and is cut into ceil(size_g / BLOCK_M) row tiles
that start at the group's first row, so a tile never spans two groups. The rows from ends[-1] to M form one
more "tail group" whose tiles only store zeros. Tiles are numbered group-major: all (m, n) tiles of group 0,
then of group 1, ...; inside a group, bands of GROUP_M row tiles are walked M-fastest (GROUP_M=1 walks N
fastest), so programs that run together share the group's weight tiles in L2. Every program rebuilds the
tile-to-group map from `group_ends` (a cumulative sum of tiles per group, on the device; no host sync).

The flat persistent kernel (`ragged_m_tma_flat_kernel`) runs the K steps of all of a program's tiles as
ONE loop (the tile loop and the K loop flattened by hand, as in ragged_k), so the software pipeline issues
the next tile's TMA loads while the current tile's last steps and its store run; it zeroes the tail group's
tiles in a short loop first.

Rows of `a` that belong to a neighbouring group or to the tail may be read into a tile, but each output row
depends only on its own `a` row and rows outside the tile's group are never stored, so NaN stored there never
reaches a result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ragdot.kernels.configs import (
    TileConfig,
    check_group_ends,
    check_operands,
    dot_precision,
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
from ragdot.kernels.ragged_view import RAGGED_BASE, fits_ragged_rows, ragged_view, vector_rows

# The flat kernel's output tiles (and the tail rows' zero tiles) through a ragged TMA view of c (`ragged_view`: its
# row bound is the tile's group end, so rows of the next group are never written) instead of masked pointer
# stores. True: wherever rows of c are 16-byte multiples; False: never; None (the default): only where N is no
# multiple of 16 (`vector_rows`), whose pointer stores go out one element at a time and make the 128-row tiles
# spill 968-992 bytes (built for sm_90; none with TMA stores). Where N is a multiple of 16 the two are even: on
# an H100 the A/B (benchmarks/kernel_ab.py with this flag on in the old file) measured TMA stores 0.99-1.02x the
# pointer stores' time on every flat-kernel cell, bitwise equal (benchmarks/results/h100-20261205/u4), and the
# H200's 0.987-1.017x, geomean 1.002 over 24 cell-configs (benchmarks/results/h200-20261205c/r2).
TMA_STORE: bool | None = None
# With TMA_STORE, the tile is stored as this many column slices (1 or 2). Built for sm_90 (`compile_only`,
# qwen3-235b-a22b widths), a whole tile staged for its store takes 16-32 KB more shared memory a program (two
# 128x128x64 s3 programs, 131 KB each, no longer fit one SM); two slices take about what the pointer stores do
# (114.7 against 106.5 KB there; 64x256x64 s4: 180.4 against 180.3 KB).
STORE_SPLIT = 2


@triton.jit
def _group_table(
    groups_ptr, M, G, size_scale, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, FROM_SIZES: tl.constexpr
):
    """Per-group vectors of length BLOCK_G (>= G + 1): first row, end row, first row tile, row tiles.

    groups_ptr holds the clamped inclusive group ends, or with FROM_SIZES the raw group sizes (any integer
    dtype): then each program clamps them (negatives count as 0) and forms the ends itself,
    ends = min(size_scale * cumsum(sizes), M), in int64 so no sizes can wrap the sum.
    Slot G is the tail group [ends[G-1], M); slots beyond it are empty groups at M.
    """
    offs = tl.arange(0, BLOCK_G)
    if FROM_SIZES:
        sizes = tl.load(groups_ptr + offs, mask=offs < G, other=0).to(tl.int64)
        sizes = tl.minimum(tl.maximum(sizes, 0), M // size_scale)
        cum = tl.cumsum(sizes, 0) * size_scale
        ends = tl.minimum(cum, M).to(tl.int32)
        prev = tl.minimum(cum - sizes * size_scale, M).to(tl.int32)
    else:
        ends = tl.load(groups_ptr + offs, mask=offs < G, other=0).to(tl.int32)
        prev = tl.load(groups_ptr + offs - 1, mask=(offs > 0) & (offs <= G), other=0).to(tl.int32)
    ends = tl.where(offs < G, ends, M)
    starts = tl.where(offs <= G, prev, M)
    ends = tl.maximum(ends, starts)
    tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M
    first = tl.cumsum(tiles, 0) - tiles
    return offs, starts, ends, first, tiles


@triton.jit
def _locate(
    tile, num_n, offs, starts, ends, first, tiles, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr
):
    """(group, first row, end row, column tile) of linear tile id `tile` (group-major order)."""
    g = tl.sum(((first + tiles) * num_n <= tile).to(tl.int32), 0)
    sel = offs == g
    # start row and end row packed in one int64 so that one reduction extracts both
    packed = tl.sum(tl.where(sel, (starts.to(tl.int64) << 32) | ends.to(tl.int64), 0), 0)
    first_g = tl.sum(tl.where(sel, first, 0), 0)
    start_g = (packed >> 32).to(tl.int32)
    end_g = (packed & 0xFFFFFFFF).to(tl.int32)
    tiles_g = (end_g - start_g + BLOCK_M - 1) // BLOCK_M
    local = tile - first_g * num_n
    width = GROUP_M * num_n
    band_m = (local // width) * GROUP_M
    band_h = tl.minimum(tiles_g - band_m, GROUP_M)
    m_idx = band_m + (local % width) % band_h
    n_idx = (local % width) // band_h
    return g, start_g + m_idx * BLOCK_M, end_g, n_idx


@triton.jit
def _tile(
    a_ptr, b_ptr, c_ptr, M, N, K, G, g, row0, row_end, n_idx, bt,
    stride_ab, stride_am, stride_ak, stride_bb, stride_bg, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PRECISION: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile: rows [row0, row_end) of group g (g == G: the zero tail)."""
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = n_idx * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rk64 = rk.to(tl.int64)
    rm_safe = tl.minimum(rm, M - 1).to(tl.int64)  # rows past M are clamped in bounds, never stored
    rn64 = rn.to(tl.int64)
    n_ok = rn < N
    a_ptrs = a_ptr + bt.to(tl.int64) * stride_ab + rm_safe[:, None] * stride_am + rk64[None, :] * stride_ak
    b_ptrs = (
        b_ptr + bt.to(tl.int64) * stride_bb + g.to(tl.int64) * stride_bg
        + rk64[:, None] * stride_bk + rn64[None, :] * stride_bn
    )
    step_a = tl.full([], BLOCK_K, tl.int64) * stride_ak
    step_b = tl.full([], BLOCK_K, tl.int64) * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.where(g < G, K, 0)  # the tail group skips the contraction
    for k in tl.range(0, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            if EVEN_N:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = rk < K - k
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += step_a
        b_ptrs += step_b
    c_ptrs = c_ptr + (bt.to(tl.int64) * M + rm.to(tl.int64))[:, None] * N + rn64[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < row_end)[:, None] & n_ok[None, :])


@triton.jit
def ragged_m_kernel(
    a_ptr,  # [Bt, M, K] lhs, rows in group order, any strides
    b_ptr,  # [Bt, G, K, N] one rhs matrix per group, any strides
    c_ptr,  # [Bt, M, N] output, contiguous
    ends_ptr,  # [G] int32 inclusive group ends (non-decreasing, each in [0, M]); FROM_SIZES: [G] any-int sizes
    M, N, K, G,  # scalars: problem sizes
    size_scale,  # scalar: rows per unit of group size (FROM_SIZES only; 1 for the usual call)
    stride_ab, stride_am, stride_ak,  # scalars: strides of a, in elements
    stride_bb, stride_bg, stride_bk, stride_bn,  # scalars: strides of b, in elements
    max_tiles,  # scalar: upper bound of the tile count per batch entry, (cdiv(M, BLOCK_M) + G) * cdiv(N, BLOCK_N)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr,  # power of two >= G + 1
    GROUP_M: tl.constexpr,  # row tiles walked together (L2 reuse of the weight tile)
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0
    EVEN_N: tl.constexpr,  # N % BLOCK_N == 0
    PERSISTENT: tl.constexpr,  # programs loop over tiles with stride num_programs(0)
    PRECISION: tl.constexpr,  # tl.dot input_precision: "ieee" or "tf32" (used for float32 inputs)
    FROM_SIZES: tl.constexpr,  # ends_ptr holds raw group sizes: the ends are formed in the kernel
):
    pid = tl.program_id(0)
    bt = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    offs, starts, ends, first, tiles = _group_table(ends_ptr, M, G, size_scale, BLOCK_M, BLOCK_G, FROM_SIZES)
    total = tl.sum(tiles, 0) * num_n
    if PERSISTENT:
        for tile in tl.range(pid, max_tiles, tl.num_programs(0)):
            if tile < total:
                g, row0, row_end, n_idx = _locate(tile, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
                _tile(a_ptr, b_ptr, c_ptr, M, N, K, G, g, row0, row_end, n_idx, bt,
                      stride_ab, stride_am, stride_ak, stride_bb, stride_bg, stride_bk, stride_bn,
                      BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, PRECISION)
    else:
        if pid < total:
            g, row0, row_end, n_idx = _locate(pid, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
            _tile(a_ptr, b_ptr, c_ptr, M, N, K, G, g, row0, row_end, n_idx, bt,
                  stride_ab, stride_am, stride_ak, stride_bb, stride_bg, stride_bk, stride_bn,
                  BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, PRECISION)


@triton.jit
def _store_rows(c_ptr, vals, bt, row0, row_end, n0, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store vals [BLOCK_M, BLOCK_N] at rows row0.. (only those < row_end) and columns n0.. (< N) of c[bt]."""
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + (bt.to(tl.int64) * M + rm.to(tl.int64))[:, None] * N + rn.to(tl.int64)[None, :]
    tl.store(c_ptrs, vals.to(c_ptr.dtype.element_ty), mask=(rm < row_end)[:, None] & (rn < N)[None, :])


@triton.jit
def _store_tma(c_desc, out, bt, row0, row_end, n0, M,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STORE_SPLIT: tl.constexpr):
    """Store out [BLOCK_M, BLOCK_N] (c's dtype) at rows row0.. and columns n0.. of c[bt] through its ragged view
    c_desc, whole or as two column slices (STORE_SPLIT): the box's rows end at the group's end row_end, and TMA
    drops the rest (and columns past N)."""
    stop = bt * M + row_end
    at = RAGGED_BASE - (row_end - row0)
    if STORE_SPLIT == 2:
        left, right = out.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
        c_desc.store([RAGGED_BASE, stop, at, n0], left.reshape(1, 1, BLOCK_M, BLOCK_N // 2))
        c_desc.store([RAGGED_BASE, stop, at, n0 + BLOCK_N // 2], right.reshape(1, 1, BLOCK_M, BLOCK_N // 2))
    else:
        c_desc.store([RAGGED_BASE, stop, at, n0], out.reshape(1, 1, BLOCK_M, BLOCK_N))


@triton.jit
def _load_tma(
    a_desc, b_desc, bt, g, row0, k, n0,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, B_KMAJOR: tl.constexpr,
):
    """One K step's operands through the descriptors: a [BLOCK_M, BLOCK_K] and b [BLOCK_K, BLOCK_N] of group g."""
    a = a_desc.load([bt, row0, k]).reshape(BLOCK_M, BLOCK_K)
    if B_KMAJOR:
        b = b_desc.load([bt, g, n0, k]).reshape(BLOCK_N, BLOCK_K).T
    else:
        b = b_desc.load([bt, g, k, n0]).reshape(BLOCK_K, BLOCK_N)
    return a, b


@triton.jit
def _tile_tma(
    a_desc, b_desc, c_ptr, M, N, K, G, g, row0, row_end, n_idx, bt,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    B_KMAJOR: tl.constexpr, PRECISION: tl.constexpr,
):
    """`_tile` with tensor-descriptor (TMA) loads; out-of-bounds K/N/M elements arrive as zeros."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.where(g < G, K, 0)
    n0 = n_idx * BLOCK_N
    for k in tl.range(0, k_end, BLOCK_K):
        a, b = _load_tma(a_desc, b_desc, bt, g, row0, k, n0, BLOCK_M, BLOCK_N, BLOCK_K, B_KMAJOR)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    _store_rows(c_ptr, acc, bt, row0, row_end, n0, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def ragged_m_tma_kernel(
    a_desc,  # descriptor of a [Bt, M, K] (K contiguous), block [1, BLOCK_M, BLOCK_K]
    b_desc,  # descriptor of b [Bt, G, K, N] (N contiguous), block [1, 1, BLOCK_K, BLOCK_N];
    #          or, with B_KMAJOR, of b^T [Bt, G, N, K] (K contiguous), block [1, 1, BLOCK_N, BLOCK_K]
    c_ptr,  # [Bt, M, N] output, contiguous
    ends_ptr,  # [G] int32 inclusive group ends (non-decreasing, each in [0, M]); FROM_SIZES: [G] any-int sizes
    M, N, K, G,  # scalars: problem sizes
    size_scale,  # scalar: rows per unit of group size (FROM_SIZES only; 1 for the usual call)
    max_tiles,  # scalar: upper bound of the tile count per batch entry
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr,  # power of two >= G + 1
    GROUP_M: tl.constexpr,  # row tiles walked together (L2 reuse of the weight tile)
    B_KMAJOR: tl.constexpr,  # b_desc describes b transposed (K contiguous)
    PERSISTENT: tl.constexpr,  # programs loop over tiles with stride num_programs(0)
    PRECISION: tl.constexpr,  # tl.dot input_precision
    FROM_SIZES: tl.constexpr,  # ends_ptr holds raw group sizes: the ends are formed in the kernel
):
    pid = tl.program_id(0)
    bt = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    offs, starts, ends, first, tiles = _group_table(ends_ptr, M, G, size_scale, BLOCK_M, BLOCK_G, FROM_SIZES)
    total = tl.sum(tiles, 0) * num_n
    if PERSISTENT:
        for tile in tl.range(pid, max_tiles, tl.num_programs(0)):
            if tile < total:
                g, row0, row_end, n_idx = _locate(tile, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
                _tile_tma(a_desc, b_desc, c_ptr, M, N, K, G, g, row0, row_end, n_idx, bt,
                          BLOCK_M, BLOCK_N, BLOCK_K, B_KMAJOR, PRECISION)
    else:
        if pid < total:
            g, row0, row_end, n_idx = _locate(pid, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
            _tile_tma(a_desc, b_desc, c_ptr, M, N, K, G, g, row0, row_end, n_idx, bt,
                      BLOCK_M, BLOCK_N, BLOCK_K, B_KMAJOR, PRECISION)


@triton.jit
def ragged_m_tma_flat_kernel(
    a_desc,  # descriptor of a [Bt, M, K] (K contiguous), block [1, BLOCK_M, BLOCK_K]
    b_desc,  # descriptor of b [Bt, G, K, N] (N contiguous), block [1, 1, BLOCK_K, BLOCK_N];
    #          or, with B_KMAJOR, of b^T [Bt, G, N, K] (K contiguous), block [1, 1, BLOCK_N, BLOCK_K]
    c_ptr,  # [Bt, M, N] output, contiguous
    c_desc,  # ragged view (`ragged_view`) of c as [Bt*M, N], block [1, 1, BLOCK_M, BLOCK_N] (None w/o TMA_STORE)
    ends_ptr,  # [G] int32 inclusive group ends (non-decreasing, each in [0, M]); FROM_SIZES: [G] any-int sizes
    M, N, K, G,  # scalars: problem sizes (K >= 1)
    size_scale,  # scalar: rows per unit of group size (FROM_SIZES only; 1 for the usual call)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr,  # power of two >= G + 1
    GROUP_M: tl.constexpr,  # row tiles walked together (L2 reuse of the weight tile)
    B_KMAJOR: tl.constexpr,  # b_desc describes b transposed (K contiguous)
    PRECISION: tl.constexpr,  # tl.dot input_precision
    FROM_SIZES: tl.constexpr,  # ends_ptr holds raw group sizes: the ends are formed in the kernel
    TMA_STORE: tl.constexpr,  # output tiles through c_desc, clipped at the group's end row (else pointer stores)
    STORE_SPLIT: tl.constexpr,  # with TMA_STORE: column slices a tile is stored in (1 or 2; c_desc's block is one)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    bt = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    offs, starts, ends, first, tiles = _group_table(ends_ptr, M, G, size_scale, BLOCK_M, BLOCK_G, FROM_SIZES)
    real = tl.sum(tl.where(offs < G, tiles, 0), 0) * num_n  # tiles of the G groups; the tail group's follow
    total = tl.sum(tiles, 0) * num_n
    for tile in range(real + pid, total, nprog):  # tail rows: zeros, no contraction
        g, row0, row_end, n_idx = _locate(tile, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
        if TMA_STORE:  # as the tiles below: a tile of scalar pointer stores spills where N is no multiple of 16
            blank = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_desc.dtype)
            _store_tma(c_desc, blank, bt, row0, row_end, n_idx * BLOCK_N, M, BLOCK_M, BLOCK_N, STORE_SPLIT)
        else:
            zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)
            _store_rows(c_ptr, zeros, bt, row0, row_end, n_idx * BLOCK_N, M, N, BLOCK_M, BLOCK_N)

    k_steps = tl.cdiv(K, BLOCK_K)
    steps = tl.cdiv(tl.maximum(real - pid, 0), nprog) * k_steps  # this program's tiles are pid, pid + nprog, ...
    tile = pid - nprog  # current tile (loop-carried)
    kk = pid * 0  # K step inside the current tile
    g = pid * 0
    row0 = pid * 0
    row_end = pid * 0
    n0 = pid * 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, steps):
        if kk == 0:  # first step of the next tile: its group, rows and columns
            tile += nprog
            g, row0, row_end, n_idx = _locate(tile, num_n, offs, starts, ends, first, tiles, BLOCK_M, GROUP_M)
            n0 = n_idx * BLOCK_N
        a, b = _load_tma(a_desc, b_desc, bt, g, row0, kk * BLOCK_K, n0, BLOCK_M, BLOCK_N, BLOCK_K, B_KMAJOR)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        kk += 1
        if kk == k_steps:  # last step: store the tile, start the next one from zero
            if TMA_STORE:
                _store_tma(c_desc, acc.to(c_desc.dtype), bt, row0, row_end, n0, M, BLOCK_M, BLOCK_N, STORE_SPLIT)
            else:
                _store_rows(c_ptr, acc, bt, row0, row_end, n0, M, N, BLOCK_M, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            kk = pid * 0


def _tma_strides_ok(t: torch.Tensor) -> bool:
    """Strides a TMA descriptor can describe: last dim contiguous, the others 16-byte multiples."""
    size = t.element_size()
    return t.stride(-1) == 1 and all((s * size) % 16 == 0 for s in t.stride()[:-1])


class Prepared:
    """`ragged_m` for one static signature (shapes, strides, dtypes, device, config): the checks, the config,
    the grid and the kernel choice are resolved once; a call allocates the output and launches.

    Calls take operands with exactly the shapes, strides and dtypes it was prepared for, or any tensors that
    start at the same addresses (a call reads only their addresses: the layout is the prepared one), and an
    optional `out` of Bt * M * N contiguous elements in any shape. With `from_sizes`,
    the third argument of a call is the raw group sizes ([G], any integer dtype; `scale` rows per unit) and
    the kernel forms the clamped ends itself: one launch for the whole call."""

    # a call is BoundLaunches and ragdot.kernels.record's hooks alone (ragdot.kernels.replay and ragdot.jax replay it)
    replayable = True

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, config: TileConfig | None,
                 from_sizes: bool = False, scale: int = 1):
        bt, m, k = a.shape
        g, n = b.shape[1], b.shape[3]
        self.shape = (bt, m, n)
        self.out_dtype = out_dtype
        self.device = a.device
        self.kmajor = b.stride(3) != 1
        cfg = self.cfg = resolve_config(config, "ragged_m", m, k, n, g, a, self.kmajor)
        self.empty = bt * m * n == 0
        self.zero = g == 0 or k == 0
        if self.empty or self.zero:
            return
        if bt > 65535:
            raise ValueError(f"a: batch size {bt} exceeds the 65535 the grid allows")
        num_n = triton.cdiv(n, cfg.block_n)
        max_tiles = (triton.cdiv(m, cfg.block_m) + g) * num_n
        programs = min(max_tiles, num_sms(a.device) * cfg.programs_per_sm) if cfg.persistent else max_tiles
        grid = (programs, bt)
        opts = launch_options(cfg, a.device)
        consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_G=next_pow2(g + 1),
                      GROUP_M=cfg.group_m, PRECISION=dot_precision(a.dtype), FROM_SIZES=from_sizes)
        self.sizes = (m, n, k, g, scale) if cfg.flat else (m, n, k, g, scale, max_tiles)
        self.scale = scale
        bv = b.transpose(2, 3) if self.kmajor else b
        self.tma = (cfg.tma and tma_capable(a.device) and _tma_strides_ok(a) and _tma_strides_ok(bv))
        self.c_view = None
        if self.tma:
            self.a_desc = (list(a.shape), list(a.stride()), [1, cfg.block_m, cfg.block_k])
            bblock = [1, 1, cfg.block_n, cfg.block_k] if self.kmajor else [1, 1, cfg.block_k, cfg.block_n]
            self.b_desc = (list(bv.shape), list(bv.stride()), bblock)
            kernel = ragged_m_tma_flat_kernel if cfg.flat else ragged_m_tma_kernel
            # the output through a ragged TMA view where rows of c are 16-byte multiples (`TMA_STORE`)
            split = 1
            store = not vector_rows(n) if TMA_STORE is None else TMA_STORE
            if cfg.flat and store and (n * torch.finfo(out_dtype).bits // 8) % 16 == 0 and fits_ragged_rows(bt, m):
                split = STORE_SPLIT if STORE_SPLIT in (1, 2) and cfg.block_n >= 32 else 1
                self.c_view = (*ragged_view(n, n), [1, 1, cfg.block_m, cfg.block_n // split])
            extra = ({"TMA_STORE": self.c_view is not None, "STORE_SPLIT": split} if cfg.flat
                     else {"PERSISTENT": cfg.persistent})
            self.tma_launch = BoundLaunch(kernel, grid, {**consts, "B_KMAJOR": self.kmajor, **extra}, opts, a.device)
        self.strides = (*a.stride(), *b.stride())
        self.ptr_launch = BoundLaunch(
            ragged_m_kernel, grid,
            {**consts, "EVEN_K": k % cfg.block_k == 0, "EVEN_N": n % cfg.block_n == 0, "PERSISTENT": cfg.persistent},
            opts, a.device,
        )
        self.max_tiles = max_tiles

    def __call__(
        self, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, object]:
        """a [Bt, M, K], b [Bt, G, K, N], ends int32/int64 [G] (or sizes [G]) -> (c [Bt, M, N], kernel handle)."""
        c, done = prepared_output(self, out)
        if done:
            return c, None
        if self.tma and (a.data_ptr() | b.data_ptr()) % 16 == 0 and (self.c_view is None or c.data_ptr() % 16 == 0):
            # a descriptor's base gives only the address and dtype: shapes and strides are the prepared ones
            a_desc = host_descriptor(a, *self.a_desc)
            b_desc = host_descriptor(b, *self.b_desc)
            if not self.cfg.flat:
                return c, self.tma_launch(a_desc, b_desc, c, ends, *self.sizes)
            c_desc = None if self.c_view is None else host_descriptor(c, *self.c_view)
            return c, self.tma_launch(a_desc, b_desc, c, c_desc, ends, *self.sizes)
        return c, self.ptr_launch(a, b, c, ends, *self.sizes[:4], self.scale, *self.strides, self.max_tiles)


def launch(
    a: torch.Tensor,
    b: torch.Tensor,
    group_ends: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, object]:
    """`ragged_m` returning also the launched kernel handle (compiled kernel on a GPU), for inspection."""
    check_operands(a, b, 4)
    bt, m, k = a.shape
    if b.shape[0] != bt or b.shape[2] != k:
        raise ValueError(f"b: expected shape [{bt}, G, {k}, N] to match a {tuple(a.shape)}, got {tuple(b.shape)}")
    g, n = b.shape[1], b.shape[3]
    ends = check_group_ends(group_ends, g, a.device)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    c = make_output("out", out, (bt, m, n), out_dtype, a.device)
    return Prepared(a, b, out_dtype, config)(a, b, ends, c)


def ragged_m(
    a: torch.Tensor,
    b: torch.Tensor,
    group_ends: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """c[Bt, M, N] = a[Bt, M, K] x b[Bt, G, K, N] with row r using b[:, group(r)]; rows past ends[-1] zero.

    a and b may be any strided views of one float dtype (float16, bfloat16, float32); group_ends is int32 or
    int64 [G] on the same device, non-decreasing, each in [0, M]. `config` overrides the heuristic's tiles;
    `out` is an optional contiguous output buffer.
    """
    return launch(a, b, group_ends, out_dtype, config=config, out=out)[0]
