"""Ragged-K Group-GEMM (the MoE weight gradient) for Hopper in Gluon: persistent and warp-specialized.

    c[g, bt] = a[bt, rows of g, :]^T @ b[bt, rows of g, :]       rows of g = [ends[g-1], ends[g])

Work items are (slot, batch, output tile), slots being the groups longest first (ragdot.kernels.ragged_k's
`_schedule_kernel`); program p of the persistent grid takes items p, p + P, ... Each item contracts only
over its group's token rows, in chunks of BLOCK_K rows, so there are no atomics and the result is bitwise
reproducible (one fixed order of accumulation per tile).

Partitions (gl.warp_specialize):
- producer (worker, 1 warp): walks the same items and issues two TMA loads per chunk into a ring of STAGES
  shared-memory stages: a rows [BLOCK_K, BLOCK_M] and b rows [BLOCK_K, BLOCK_N]. It runs ahead into the next
  item while the consumer finishes the current one, so the epilogue overlaps the next tile's loads.
- consumer (default partition, 4 warps = one warpgroup or 8 = two cooperating on the tile): wgmma with one
  group in flight, releases each stage once its MMA retired, then the epilogue (`EPILOGUE`): where groups are
  long, the tile goes through shared memory to a TMA store that is only waited for before the next tile's
  epilogue reuses the buffer; where they are short (`BLOCKED_MAX_ROWS`) and the output's writes bound the
  kernel, the tile is converted to rows of 16-byte vectors and written by pointer stores, more of them in flight
  per SM.

Group edges: the a and b operands are read through "ragged" TMA descriptors (`ragged_view`): two leading
dimensions whose strides cancel modulo 2^64 let the third coordinate count rows from a group's end, so the
hardware's bounds check clips every load at that end and zero-fills the rows past it. Only the last chunk of
a group straddles its end, and its rows of the next group (or past ends[-1], NaN possibly) never reach shared
memory: the consumer's main loop has no edge work. An empty group has no chunks: its tiles store exact zeros.

Layout requirements (checked by the host side): a and b are viewed [Bt*R, M] and [Bt*R, N] (last dim
contiguous, 16-byte aligned rows, R <= 2^30, Bt*R < 0x7FFF0000), c is [G*Bt, M, N]: its TMA store clips each
tile at M and N of its own (group, batch) slab, so M need not be a multiple of BLOCK_M (a's tiles past M are
zero-filled by TMA).
"""

from __future__ import annotations

from typing import Any

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

from ragdot.kernels.configs import check_group_ends, check_operands, num_sms, prepared_output
from ragdot.kernels.gluon.common import consumer_regs, maxnreg_for, mma_layout, store_layout
from ragdot.kernels.gluon.config import SHARED_BYTES, GluonConfig, pick_gluon_config
from ragdot.kernels.gluon.matmul import ring_barriers
from ragdot.kernels.launch import BoundLaunch
from ragdot.kernels.ragged_k import pointer_stores, schedule
from ragdot.kernels.ragged_view import RAGGED_BASE, check_ragged_rows, ragged_view, rows_view

__all__ = ["Prepared", "ragged_k", "ragged_k_ws_kernel"]

# The epilogue's path: "tma" (the tile through shared memory to a TMA store), "blocked" (the tile converted to rows
# of 16-byte vectors, then pointer stores) or None: blocked where the mean group has at most BLOCKED_MAX_ROWS token
# rows and the output's writes bound the kernel (`ragdot.kernels.ragged_k.pointer_stores`). Measured on an H100
# (graph clock): blocked 2-9% faster at 20-80 rows a group (`kernel_ab.py`, the anchor cells), 10-16% faster at 96
# and 128 rows, even at 192 (-2.5% to +2%), 13-15% slower at 256 and 10-14% at 480 (`wgrad_anatomy.py`, 2880 x 5760
# and 2048 x 1536 outputs, 128 experts; benchmarks/results/h100-20261207e/).
# Two more, set only by hand: "tma2" (two epilogue buffers, so a tile's store waits for the store of the tile two
# before it, not one; needs the shared memory of one more output tile) and "none" (no store at all: the main loop
# alone, for probes such as benchmarks/wgrad_anatomy.py; its output is left unwritten).
EPILOGUE: str | None = None
BLOCKED_MAX_ROWS = 192
# Whether a group's last chunk, where at most half its rows are the group's, runs its MMAs on that half alone (the
# other half holds the zero rows past the group's end: TMA's clipped load). Read when a kernel is prepared.
TRIM_LAST_CHUNK = False
_EPILOGUES = ("tma", "blocked", "tma2", "none")



@gluon.jit
def _item(item, sched_ptr, R, G, M, N, Bt, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """Item -> (group, first row, end row, batch index, row tile, column tile); tiles walked in bands. The rows
    are clamped to the R token rows of a batch entry (ends past R are the caller's; they read nothing more)."""
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    tiles = num_m * num_n
    slot = item // (Bt * tiles)
    rest = item % (Bt * tiles)
    bt = rest // tiles
    tile = rest % tiles
    width = GROUP_M * num_n
    band_m = (tile // width) * GROUP_M
    band_h = gl.minimum(num_m - band_m, GROUP_M)
    pid_m = band_m + (tile % width) % band_h
    pid_n = (tile % width) // band_h
    g = gl.load(sched_ptr + slot)
    start = gl.minimum(gl.load(sched_ptr + G + slot), R)
    end = gl.minimum(gl.load(sched_ptr + 2 * G + slot), R)
    return g, start, end, bt, pid_m, pid_n


@gluon.jit
def _free_stage(empty, it, STAGES: gl.constexpr):
    """Producer: wait until ring position `it`'s stage is free (its previous fill consumed); the stage.
    A fresh barrier passes phase 1 at once, so the first round waits for nobody."""
    s = it % STAGES
    mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
    return s


@gluon.jit
def _ready_stage(ready, pos, STAGES: gl.constexpr):
    """Consumer: wait until ring position `pos` has been loaded; its stage."""
    s = pos % STAGES
    mbarrier.wait(ready.index(s), (pos // STAGES) & 1)
    return s


@gluon.jit
def _release_before(empty, pos, STAGES: gl.constexpr, pred):
    """Consumer: hand the stage of ring position `pos - 1` back to the producer (its MMA retired), if `pred`."""
    mbarrier.arrive(empty.index((pos + STAGES - 1) % STAGES), pred=pred)


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M, N, G, Bt,
              GROUP_M: gl.constexpr):
    """Worker partition (1 warp): TMA loads of every chunk of this program's items into the ring."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[2]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[3]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[3]
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = G * Bt * gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    it = 0
    for item in range(pid, total, nprog):
        g, start, end, bt, pid_m, pid_n = _item(item, sched_ptr, R, G, M, N, Bt, BLOCK_M, BLOCK_N, GROUP_M)
        stop = bt * R + end  # the group's end row: the ragged views clip every load there
        size = end - start
        for kk in range(gl.cdiv(size, BLOCK_K)):
            s = _free_stage(empty, it, STAGES)
            mbarrier.expect(ready.index(s), NBYTES)  # a clipped box still delivers (and counts) every byte
            row = RAGGED_BASE - size + kk * BLOCK_K
            tma.async_copy_global_to_shared(a_desc, [RAGGED_BASE, stop, row, pid_m * BLOCK_M], ready.index(s),
                                            a_bufs.index(s).reshape([1, 1, BLOCK_K, BLOCK_M]))
            tma.async_copy_global_to_shared(b_desc, [RAGGED_BASE, stop, row, pid_n * BLOCK_N], ready.index(s),
                                            b_bufs.index(s).reshape([1, 1, BLOCK_K, BLOCK_N]))
            it += 1


@gluon.jit
def _ring_and_turn_barriers(STAGES: gl.constexpr, READY_COUNT: gl.constexpr):
    """The ring's `ready` / `empty` mbarriers (`matmul.ring_barriers`, `ready` counting READY_COUNT arrivals) and
    the ping-pong consumers' two `turn` mbarriers (`_take_turn`), with count 1."""
    ready, empty = ring_barriers(STAGES, READY_COUNT)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    return ready, empty, turn


@gluon.jit
def _take_turn(turn, mine, PARITY: gl.constexpr, NCONS: gl.constexpr):
    """Ping-pong: before the `mine`-th main loop of consumer PARITY, wait until the other consumer has passed
    the ready barriers of its previous item (consumer 0's first item waits for nobody). Strict alternation
    means each turn barrier is at most one phase ahead of its waiter."""
    if NCONS == 2:
        if PARITY == 0:
            mbarrier.wait(turn.index(0), (mine - 1) & 1, pred=mine > 0)
        else:
            mbarrier.wait(turn.index(1), mine & 1)


@gluon.jit
def _pass_turn(turn, PARITY: gl.constexpr, NCONS: gl.constexpr):
    """Ping-pong: this consumer has waited for every chunk of its item; the other one may start its loop."""
    if NCONS == 2:
        mbarrier.arrive(turn.index(1 - PARITY))


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, turn, c_desc, sched_ptr, R, M, N, G, Bt, c_ptr, stride_cg, stride_cm,
              GROUP_M: gl.constexpr, MMA_LAYOUT: gl.constexpr, PARITY: gl.constexpr, NCONS: gl.constexpr,
              EPILOGUE_CODE: gl.constexpr, STORE_LAYOUT: gl.constexpr, FENCE: gl.constexpr, TRIM: gl.constexpr):
    """A consumer partition: wgmma over the chunks of this program's items number PARITY, PARITY + NCONS, ...
    (rows past a group's end arrive as zeros), epilogue by TMA or pointer stores. With two consumers (ping-pong)
    each one counts the other's chunks to keep its place in the shared ring, and the two take turns (`_take_turn`), so
    a consumer never waits on a stage before every earlier chunk of that stage was loaded. FENCE: a stage's a rows
    were written by threads (cp.async, `ragged_k_gather`), so a proxy fence orders them before wgmma reads them.
    TRIM: the item's last chunk, where at most BLOCK_K // 2 of its rows are the group's, multiplies only that
    first half of the stage (`TRIM_LAST_CHUNK`)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[2]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = G * Bt * gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    C_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], c_desc.dtype)
    C_BUFS: gl.constexpr = 2 if EPILOGUE_CODE == 2 else 1
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [C_BUFS, BLOCK_M, BLOCK_N], C_LAYOUT)
    ROWS: gl.constexpr = gl.SliceLayout(1, STORE_LAYOUT)
    COLS: gl.constexpr = gl.SliceLayout(0, STORE_LAYOUT)
    it = 0  # ring position of the item's first chunk (every consumer's chunks counted)
    j = 0  # the item's number among this program's items
    for item in range(pid, total, nprog):
        g, start, end, bt, pid_m, pid_n = _item(item, sched_ptr, R, G, M, N, Bt, BLOCK_M, BLOCK_N, GROUP_M)
        n_k = gl.cdiv(end - start, BLOCK_K)
        if j % NCONS == PARITY:
            _take_turn(turn, j // NCONS, PARITY, NCONS)
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=MMA_LAYOUT)
            half_last = (end - start) - (n_k - 1) * BLOCK_K <= BLOCK_K // 2  # the last chunk at most half full
            for kk in range(n_k):
                pos = it + kk
                s = _ready_stage(ready, pos, STAGES)
                if FENCE:
                    fence_async_shared()
                if TRIM and half_last and kk == n_k - 1:  # (the wait in each branch: an if yields tensors only)
                    acc = warpgroup_mma(a_bufs.index(s).slice(0, BLOCK_K // 2).permute((1, 0)),
                                        b_bufs.index(s).slice(0, BLOCK_K // 2), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                else:
                    acc = warpgroup_mma(a_bufs.index(s).permute((1, 0)), b_bufs.index(s), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                _release_before(empty, pos, STAGES, kk > 0)  # chunk pos - 1 retired
            _pass_turn(turn, PARITY, NCONS)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _release_before(empty, it + n_k, STAGES, n_k > 0)  # the item's last chunk
            if EPILOGUE_CODE == 0 or EPILOGUE_CODE == 2:
                c_smem = c_bufs.index((j // NCONS) % C_BUFS)
                tma.store_wait(pendings=C_BUFS - 1)  # this buffer's previous store has read it
                c_smem.store(acc.to(c_desc.dtype))
                fence_async_shared()  # one slab of c per (group, batch entry): the store clips at M and N
                tma.async_copy_shared_to_global(c_desc, [g * Bt + bt, pid_m * BLOCK_M, pid_n * BLOCK_N],
                                                c_smem.reshape([1, BLOCK_M, BLOCK_N]))
            elif EPILOGUE_CODE == 3:  # no store (a probe of the main loop); `g < 0` never holds but keeps the MMAs
                if g < 0:
                    c_bufs.index(0).store(acc.to(c_desc.dtype))
            else:  # rows of 16-byte vectors by pointer stores, masked at M and N of this (group, batch) slab
                rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROWS)
                cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=COLS)
                offs = (gl.expand_dims(rows.to(gl.int64) * stride_cm, 1) + gl.expand_dims(cols, 0)
                        + (g * Bt + bt).to(gl.int64) * stride_cg)
                mask = gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0)
                gl.store(c_ptr + offs, gl.convert_layout(acc.to(c_ptr.dtype.element_ty), STORE_LAYOUT), mask=mask)
        it += n_k
        j += 1  # noqa: SIM113 (a Gluon loop over a range with a step: no enumerate)
    if EPILOGUE_CODE == 0 or EPILOGUE_CODE == 2:
        tma.store_wait(pendings=0)


@gluon.jit
def ragged_k_ws_kernel(
    a_desc,  # ragged TMA descriptor (`ragged_view`) of a viewed [Bt*R, M], M contiguous; box [1, 1, BLOCK_K, BLOCK_M]
    b_desc,  # ragged TMA descriptor of b viewed [Bt*R, N], block [1, 1, BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of c viewed [G*Bt, M, N] (out dtype), block [1, BLOCK_M, BLOCK_N]
    sched_ptr,  # [3, G] int32 from ragged_k._schedule_kernel: per slot (longest first) group / start / end
    R, M, N, G, Bt,  # scalars: token rows per batch, output rows, output columns, groups, batch count
    c_ptr,  # [G, Bt, M, N] c itself, for the pointer-store epilogue (EPILOGUE_CODE 1)
    stride_cg, stride_cm,  # scalars: elements between c's (group, batch) slabs and between its rows
    STAGES: gl.constexpr,  # shared-memory ring depth (>= 2)
    GROUP_M: gl.constexpr,  # row tiles walked together inside one group (L2 reuse of b)
    MMA_LAYOUT: gl.constexpr,  # NVMMADistributedLayout of the [BLOCK_M, BLOCK_N] accumulator (one consumer's warps)
    PRODUCER_REGS: gl.constexpr,  # registers per thread of the TMA producer warp
    NCONS: gl.constexpr,  # consumer partitions: 1, or 2 (ping-pong, one warpgroup each, alternate items)
    CONSUMER_REGS: gl.constexpr,  # registers per thread of the second consumer (ping-pong only)
    EPILOGUE_CODE: gl.constexpr,  # 0: TMA store through c_desc; 1: pointer stores; 2: TMA, two buffers; 3: none
    STORE_LAYOUT: gl.constexpr,  # BlockedLayout of [BLOCK_M, BLOCK_N]: 16-byte vectors along rows (EPILOGUE_CODE 1)
    TRIM: gl.constexpr,  # a group's last chunk, where at most half full, multiplied on its first half alone
):
    A_BLOCK: gl.constexpr = [a_desc.block_type.shape[2], a_desc.block_type.shape[3]]  # [BLOCK_K, BLOCK_M]
    B_BLOCK: gl.constexpr = [b_desc.block_type.shape[2], b_desc.block_type.shape[3]]  # [BLOCK_K, BLOCK_N]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + A_BLOCK,
                                       gl.NVMMASharedLayout.get_default_for(A_BLOCK, a_desc.dtype))
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + B_BLOCK,
                                       gl.NVMMASharedLayout.get_default_for(B_BLOCK, b_desc.dtype))
    ready, empty, turn = _ring_and_turn_barriers(STAGES, 1)
    # The argument tuples are spelled out in each branch: Triton 3.6's Gluon frontend does not take a tuple built
    # beforehand (or concatenated) that holds a layout or a function, so the branches cannot share one.
    if NCONS == 2:
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, sched_ptr, R, M, N, G, Bt, c_ptr, stride_cg,
                         stride_cm, GROUP_M, MMA_LAYOUT, 0, NCONS, EPILOGUE_CODE,
                         STORE_LAYOUT, False, TRIM)),
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, sched_ptr, R, M, N, G, Bt, c_ptr, stride_cg,
                         stride_cm, GROUP_M, MMA_LAYOUT, 1, NCONS, EPILOGUE_CODE,
                         STORE_LAYOUT, False, TRIM)),
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M, N, G, Bt, GROUP_M)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, sched_ptr, R, M, N, G, Bt, c_ptr, stride_cg,
                         stride_cm, GROUP_M, MMA_LAYOUT, 0, NCONS, EPILOGUE_CODE,
                         STORE_LAYOUT, False, TRIM)),
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M, N, G, Bt, GROUP_M)),
        ], [1], [PRODUCER_REGS])


# ---- host side ---------------------------------------------------------------------------------------------

_GL_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def _gl_dtype(dtype: torch.dtype):
    return getattr(gl, _GL_DTYPES[str(dtype).removeprefix("torch.")])


def checked_config(kernel: str, a_dtype: torch.dtype, b_dtype: torch.dtype, out_dtype: torch.dtype, m: int, n: int,
                   config: GluonConfig | None) -> tuple[GluonConfig, int]:
    """(the config, the output's element size) of a weight-gradient kernel for an [M, N] output, or
    NotImplementedError naming `kernel` and what it does not serve (dtypes, no config, shared memory)."""
    if a_dtype not in (torch.bfloat16, torch.float16) or b_dtype != a_dtype:
        raise NotImplementedError(f"{kernel}: operand dtypes {a_dtype}, {b_dtype} (bf16/fp16 only)")
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise NotImplementedError(f"{kernel}: out_dtype {out_dtype}")
    out_bytes = torch.empty((), dtype=out_dtype).element_size()
    cfg = config if config is not None else pick_gluon_config(m, n, out_bytes)
    if cfg is None:
        raise NotImplementedError(f"{kernel}: no config fits an output of {m} x {n}")
    if cfg.shared_bytes(2, out_bytes) > SHARED_BYTES:
        raise NotImplementedError(f"{kernel}: config {cfg.short()} needs too much shared memory")
    return cfg, out_bytes


def epilogue_code(rows: int, groups: int, cfg: GluonConfig | None = None, out_bytes: int = 2) -> int:
    """The consumer's EPILOGUE_CODE for `rows` token rows over `groups` groups: `EPILOGUE` where set, else pointer
    stores where the mean group is short and the output's writes bound the kernel (`BLOCKED_MAX_ROWS`), else TMA.
    NotImplementedError for an `EPILOGUE` ragdot does not know, or "tma2" where `cfg`'s second epilogue buffer
    does not fit shared memory."""
    epilogue = EPILOGUE or ("blocked" if pointer_stores(rows, groups, BLOCKED_MAX_ROWS) else "tma")
    if epilogue not in _EPILOGUES:
        raise NotImplementedError(f"gluon ragged_k: EPILOGUE {epilogue!r} (one of {', '.join(_EPILOGUES)})")
    if epilogue == "tma2" and cfg is not None and cfg.shared_bytes(2, out_bytes, epilogue_tiles=2) > SHARED_BYTES:
        raise NotImplementedError(f"gluon ragged_k: config {cfg.short()} has no room for a second epilogue tile")
    return _EPILOGUES.index(epilogue)


class Prepared:
    """The Gluon ragged_k for one static signature: checks, config, layouts, grid and the bound launch
    (`kernels.launch.BoundLaunch`) resolved once; a call ranks the groups (one small Triton launch), builds
    the three descriptors and launches once.

    Raises NotImplementedError for what it does not serve: dtypes other than bf16/fp16 operands, operands that
    are not [Bt*R, X] row views with 16-byte aligned rows, output rows of N not 16-byte aligned, a config that
    does not fit shared memory.
    A call on operands whose start is not 16-byte aligned runs the triton kernel instead (TMA needs it)."""

    # a call is BoundLaunches and ragdot.kernels.record's hooks alone (ragdot.kernels.replay and ragdot.jax replay it)
    replayable = True

    def __init__(self, a: torch.Tensor, b: torch.Tensor, g: int, out_dtype: torch.dtype,
                 config: GluonConfig | None = None, from_sizes: bool = False, scale: int = 1,
                 out_strides: tuple[int, int] | None = None):
        bt, r, m = a.shape
        n = b.shape[2]
        self.shape = (g, bt, m, n)
        self.out_dtype, self.device = out_dtype, a.device
        self.sizes_extent = r if from_sizes else None
        self.scale = scale
        self.empty = g * bt * m * n == 0
        self.zero = r == 0
        self.fallback: Any = None
        cfg, out_bytes = checked_config("gluon ragged_k", a.dtype, b.dtype, out_dtype, m, n, config)
        self.cfg = cfg
        if self.empty or self.zero:
            return
        views = (rows_view(a), rows_view(b))
        if None in views or (n * out_bytes) % 16:
            raise NotImplementedError("gluon ragged_k: operands are not row views with 16-byte aligned rows")
        if out_strides is not None and (bt != 1 or any((x * out_bytes) % 16 for x in out_strides)):
            raise NotImplementedError(f"gluon ragged_k: out_strides {out_strides} (batch 1, 16-byte multiples only)")
        self.out_strides = out_strides
        self.c_layout = ([g * bt, m, n], [*(out_strides or (m * n, n)), 1])
        check_ragged_rows("gluon ragged_k", bt, r)
        self.ragged = (ragged_view(m, views[0][1]), ragged_view(n, views[1][1]))  # built once: the bound
        self.scalars = (r, m, n, g, bt)  # launch compares a call's descriptor layouts by identity first
        in_dt, out_dt = _gl_dtype(a.dtype), _gl_dtype(out_dtype)
        blocks = ([1, 1, cfg.block_k, cfg.block_m], [1, 1, cfg.block_k, cfg.block_n], [1, cfg.block_m, cfg.block_n])
        self.blocks = blocks
        self.layouts = (gl.NVMMASharedLayout.get_default_for(blocks[0], in_dt),
                        gl.NVMMASharedLayout.get_default_for(blocks[1], in_dt),
                        gl.NVMMASharedLayout.get_default_for(blocks[2], out_dt))
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        self.grid = (max(1, min(g * bt * tiles, num_sms(a.device))),)
        self.consts = (cfg.stages, cfg.group_m, mma_layout(cfg.block_m, cfg.block_n, cfg.num_warps),
                       cfg.producer_regs, cfg.consumers, consumer_regs(cfg), epilogue_code(r, g, cfg, out_bytes),
                       store_layout(cfg.block_m, cfg.block_n, cfg.num_warps, out_bytes), TRIM_LAST_CHUNK)
        self.options = {"num_warps": cfg.num_warps, "maxnreg": maxnreg_for(cfg.num_warps * cfg.consumers)}
        self.launch = BoundLaunch.in_order(ragged_k_ws_kernel, self.grid, self.consts, self.options, a.device)
        from ragdot.kernels.ragged_k import Prepared as TritonPrepared  # for operands TMA cannot address

        self.fallback = TritonPrepared(a, b, g, out_dtype, None, from_sizes=from_sizes, scale=scale,
                                       out_strides=out_strides)

    def descriptors(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[Any, Any, Any]:
        """The three TMA descriptors at these operands' addresses (layout and alignment checked already)."""
        (a_shape, a_strides), (b_shape, b_strides) = self.ragged
        return (_descriptor(a, a_shape, a_strides, self.blocks[0], self.layouts[0]),
                _descriptor(b, b_shape, b_strides, self.blocks[1], self.layouts[1]),
                _descriptor(c, *self.c_layout, self.blocks[2], self.layouts[2]))

    def __call__(self, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, out: torch.Tensor | None = None,
                 sched: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """a [Bt, R, M], b [Bt, R, N], ends [G] (raw sizes with from_sizes) -> (c [G, Bt, M, N], kernel)."""
        c, done = prepared_output(self, out)
        if done:
            return c, None
        if (a.data_ptr() | b.data_ptr() | c.data_ptr()) % 16:
            return self.fallback(a, b, ends, c, sched)
        if sched is None:
            sched = schedule(ends, self.sizes_extent, self.scale)
        return c, self.launch(*self.descriptors(a, b, c), sched, *self.scalars, c, *self.c_layout[1][:2])


def _descriptor(base: torch.Tensor, shape: list[int], strides: list[int], block: list[int], layout: Any) -> Any:
    """A Gluon host TensorDescriptor without its constructor's checks, for a layout checked once by Prepared
    (last dim contiguous, 16-byte rows) and a base whose 16-byte alignment was checked on this call."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    desc = object.__new__(TensorDescriptor)
    desc.__dict__.update(base=base, shape=shape, strides=strides, block_shape=block, layout=layout, padding="zero")
    return desc


def ragged_k(a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype | None = None,
             *, config: GluonConfig | None = None) -> torch.Tensor:
    """c[G, Bt, M, N]: c[g, bt] = a[bt, rows of g]^T @ b[bt, rows of g] on an sm_90 GPU (see Prepared)."""
    check_operands(a, b, 3)
    g = group_ends.shape[0]
    ends = check_group_ends(group_ends, g, a.device)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    return Prepared(a, b, g, out_dtype, config)(a, b, ends)[0]
