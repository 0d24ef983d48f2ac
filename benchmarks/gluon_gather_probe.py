"""Probe: the Gluon weight gradient with one operand's rows gathered through a token index (cp.async), not copied.

    python benchmarks/gluon_gather_probe.py [--shape 8192,2880,5760,128,4] [--rounds 5] [--out FILE]
    python benchmarks/gluon_gather_probe.py --compile-only      # build the kernel for sm_90 on any machine

The fused MoE block's last weight gradient is, per expert, x[token(r)]^T dpre[r] over the expert's rows r. Today it
gathers x's token rows a slice of D columns at a time and runs the Gluon ragged_k kernel on each slice
(`ragdot.moe.fused._wgrad_chunks`), so dpre is read once a slice. Here the kernel's producer reads x's rows itself:
each chunk's BLOCK_K token indices are loaded, and the rows' BLOCK_M columns copied into the shared-memory stage with
cp.async (zero-filled past the group's end); dpre's rows come by TMA through the ragged view as before. One stage's
`ready` barrier completes when TMA's bytes and every producer thread's copies have landed.

Shape 'T,D,Q,E,K': tokens, x's width, dpre's width, experts, top-k (one random routing, as `moe-bench --layer`
routes). Systems, graph clock (median over interleaved rounds of the median of --reps CUDA-graph replays):
`gather` (this kernel), `copy+gluon` (the rows gathered into a [T*k, D] copy, then ragdot's Gluon ragged_k with the
same tile), `gluon` (the same kernel on rows gathered beforehand: the rate to match), `chunks` (the block's path).
`gather` is checked bitwise against `gluon` (same chunks, same order of accumulation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ragdot.kernels.configs import run_kernel
from ragdot.kernels.gluon.common import maxnreg_for
from ragdot.kernels.gluon.ragged_k import _free_stage, _item, _ready_stage, _release_before
from ragdot.kernels.ragged_view import RAGGED_BASE

PRODUCER_WARPS = gl.constexpr(4)  # warps of the producer partition


@gluon.jit
def _gather_producer(x_ptr, stride_x, idx_ptr, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M, N, G,
                     GROUP_M: gl.constexpr, GATHER_LAYOUT: gl.constexpr):
    """Worker partition (PRODUCER_WARPS warps): per chunk, x's token rows by cp.async into the a stage (every
    thread arrives on `ready` once its copies landed) and dpre's rows by one TMA load into the b stage. The token
    indices of the next chunk are loaded before the wait for this chunk's stage, off the copies' critical path
    (248a094 loaded each chunk's indices after the previous chunk's copies: `benchmarks/results/h100-20261207d/`)."""
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
def _consumer(a_bufs, b_bufs, ready, empty, c_desc, sched_ptr, R, M, N, G, GROUP_M: gl.constexpr,
              MMA_LAYOUT: gl.constexpr):
    """Default partition (one warpgroup, or two cooperating on the tile): wgmma over each item's chunks, then the
    tile by TMA store."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[2]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[1]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = G * gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], c_desc.dtype))
    it = 0
    for item in range(pid, total, nprog):
        g, start, end, bt, pid_m, pid_n = _item(item, sched_ptr, R, G, M, N, 1, BLOCK_M, BLOCK_N, GROUP_M)
        n_k = gl.cdiv(end - start, BLOCK_K)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=MMA_LAYOUT)
        for kk in range(n_k):
            pos = it + kk
            s = _ready_stage(ready, pos, STAGES)
            fence_async_shared()  # the producer's cp.async writes (generic proxy) before wgmma reads them
            acc = warpgroup_mma(a_bufs.index(s).permute((1, 0)), b_bufs.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            _release_before(empty, pos, STAGES, kk > 0)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _release_before(empty, it + n_k, STAGES, n_k > 0)
        tma.store_wait(pendings=0)
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [g, pid_m * BLOCK_M, pid_n * BLOCK_N],
                                        c_smem.reshape([1, BLOCK_M, BLOCK_N]))
        it += n_k
    tma.store_wait(pendings=0)


@gluon.jit
def gather_k_kernel(
    x_ptr,  # [T, M] row-major (M contiguous), the gathered operand's source
    stride_x,  # scalar: elements between x's rows
    idx_ptr,  # [R] int32: the token (row of x) at each of the R token rows
    b_desc,  # ragged TMA descriptor of b [R, N] (`ragged_view`), block [1, 1, BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of c [G, M, N], block [1, BLOCK_M, BLOCK_N]
    sched_ptr,  # [3+, G] int32 from ragged_k.schedule: per slot (longest first) group / start / end
    R, M, N, G,  # scalars: token rows, output rows (x's width), output columns, groups
    STAGES: gl.constexpr,  # ring depth
    BLOCK_K: gl.constexpr,  # token rows a chunk
    BLOCK_M: gl.constexpr,  # output rows a tile (x's columns)
    GROUP_M: gl.constexpr,  # row tiles walked together
    MMA_LAYOUT: gl.constexpr,  # wgmma accumulator layout of [BLOCK_M, BLOCK_N] over the consumer's 4 or 8 warps
    GATHER_LAYOUT: gl.constexpr,  # BlockedLayout of [BLOCK_K, BLOCK_M] over the producer's warps, 16-byte vectors
    PRODUCER_REGS: gl.constexpr,  # registers per thread of the producer partition
):
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[3]
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_M], b_desc.dtype)
    a_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_K, BLOCK_M], a_layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_K, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], b_desc.dtype))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1 + 32 * PRODUCER_WARPS)  # TMA's expect + each thread's copies
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, sched_ptr, R, M, N, G, GROUP_M, MMA_LAYOUT)),
        (_gather_producer, (x_ptr, stride_x, idx_ptr, b_desc, a_bufs, b_bufs, ready, empty, sched_ptr, R, M, N, G,
                            GROUP_M, GATHER_LAYOUT)),
    ], [PRODUCER_WARPS], [PRODUCER_REGS])


def gather_layout(block_k: int, block_m: int, warps: int):
    """16-byte vectors along x's columns, a warp's threads across the row as far as BLOCK_M allows."""
    vec = 8
    across = min(32, block_m // vec)
    return gl.BlockedLayout(size_per_thread=[1, vec], threads_per_warp=[32 // across, across],
                            warps_per_cta=[warps, 1], order=[1, 0])


class GatherK:
    """The probe kernel for x [T, M], b [R, N] (bf16, row-major) and G groups: c [G, M, N] = per group sum over
    its rows r of x[idx[r]]^T b[r]."""

    def __init__(self, x: torch.Tensor, b: torch.Tensor, g: int, block=(128, 128, 64), stages: int = 4,
                 producer_regs: int = 88, warps: int = 4):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from ragdot.kernels.configs import num_sms
        from ragdot.kernels.gluon.common import mma_layout
        from ragdot.kernels.ragged_view import ragged_view

        self.TensorDescriptor = TensorDescriptor
        (bm, bn, bk), r, m, n = block, b.shape[0], x.shape[1], b.shape[1]
        self.shape, self.block, self.stages, self.regs, self.warps = (g, m, n), block, stages, producer_regs, warps
        dt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
        self.b_view = ragged_view(n, b.stride(0))
        self.b_layout = gl.NVMMASharedLayout.get_default_for([1, 1, bk, bn], dt)
        self.c_layout = gl.NVMMASharedLayout.get_default_for([1, bm, bn], dt)
        tiles = g * -(-m // bm) * -(-n // bn)
        self.grid = (min(tiles, num_sms(x.device)),)
        self.consts = dict(STAGES=stages, BLOCK_K=bk, BLOCK_M=bm, GROUP_M=8, MMA_LAYOUT=mma_layout(bm, bn, warps),
                           GATHER_LAYOUT=gather_layout(bk, bm, PRODUCER_WARPS.value), PRODUCER_REGS=producer_regs)
        self.scalars = (r, m, n, g)

    def __call__(self, x: torch.Tensor, idx: torch.Tensor, b: torch.Tensor, sched: torch.Tensor) -> torch.Tensor:
        bm, bn, bk = self.block
        c = torch.empty(self.shape, dtype=x.dtype, device=x.device)
        b_desc = self.TensorDescriptor(b, *self.b_view, [1, 1, bk, bn], self.b_layout, padding="zero")
        c_desc = self.TensorDescriptor(c, list(self.shape), [self.shape[1] * self.shape[2], self.shape[2], 1],
                                       [1, bm, bn], self.c_layout)
        handle = run_kernel(gather_k_kernel, self.grid, x, x.stride(0), idx, b_desc, c_desc, sched, *self.scalars,
                            **self.consts, num_warps=self.warps, maxnreg=maxnreg_for(self.warps, PRODUCER_WARPS.value))
        return handle if c.device.type == "cpu" else c


def _routing(t: int, e: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sizes int32 [E], tokens int32 [T*k]): one random top-k routing, rows grouped by expert."""
    from ragdot.moe.routing_kernels import sort_order

    gen = torch.Generator(device="cpu").manual_seed(0)
    experts = torch.rand(t, e, generator=gen).topk(k, dim=1).indices.to(device)
    sizes, order = sort_order(experts, e, "torch")
    return sizes.to(torch.int32), torch.div(order, k, rounding_mode="floor").to(torch.int32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8192,2880,5760,128,4", help="T,D,Q,E,K")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--stages", type=int, nargs="+", default=[4])
    parser.add_argument("--regs", type=int, default=88)
    parser.add_argument("--tile", default="128,128,64,4", help="BLOCK_M,BLOCK_N,BLOCK_K,consumer warps (4 or 8)")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        t, d, q, e, k = (int(v) for v in args.shape.split(","))
    except ValueError:
        parser.error(f"--shape: expected 'T,D,Q,E,K' (five integers), got {args.shape!r}")
    try:
        bm, bn, bk, warps = (int(v) for v in args.tile.split(","))
    except ValueError:
        parser.error(f"--tile: expected 'BLOCK_M,BLOCK_N,BLOCK_K,WARPS', got {args.tile!r}")
    args.block, args.warps = (bm, bn, bk), warps
    if args.compile_only:
        return _compile_only(args)
    from ragdot.kernels.gluon.config import GluonConfig
    from ragdot.kernels.gluon.ragged_k import Prepared
    from ragdot.kernels.ragged_k import schedule
    from ragdot.measure.timing import capture_graph, event_ms, warm_off_stream
    from ragdot.moe import fused

    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(t, d, generator=gen).to(dev, torch.bfloat16)
    dpre = torch.randn(t * k, q, generator=gen).to(dev, torch.bfloat16)
    sizes, tokens = _routing(t, e, k, dev)
    sched = schedule(sizes, t * k)
    rows = x.index_select(0, tokens)
    systems, checks = {}, {}
    ref_cfg = GluonConfig(*args.block, max(args.stages), args.warps)
    ref = Prepared(rows[None], dpre[None], e, torch.bfloat16, ref_cfg, from_sizes=True)
    systems["gluon"] = lambda: ref(rows[None], dpre[None], sizes, None, sched)[0]
    systems["copy+gluon"] = lambda: ref(x.index_select(0, tokens)[None], dpre[None], sizes, None, sched)[0]
    w = torch.empty((e, d, q), dtype=torch.bfloat16, device="meta")
    systems["chunks"] = lambda: fused._wgrad_chunks(x, tokens, dpre, sizes, w, torch.bfloat16)
    for stages in args.stages:
        probe = GatherK(x, dpre, e, args.block, stages, args.regs, args.warps)
        systems[f"gather s{stages}"] = lambda probe=probe: probe(x, tokens, dpre, sched)
    expected = systems["gluon"]()[:, 0]
    torch.cuda.synchronize()
    graphs = {}
    for name, fn in systems.items():
        try:
            warm_off_stream(fn, dev)
            out = fn()
            torch.cuda.synchronize()
            got = out[:, 0] if out.dim() == 4 else out
            checks[name] = "bitwise" if torch.equal(got, expected) else (
                f"max abs diff {(got.float() - expected.float()).abs().max().item():.3g}")
            graphs[name] = capture_graph(fn)
        except Exception as exc:  # a system that fails here is a row with its error
            checks[name] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"{name}: {checks[name]}", flush=True)
    times: dict[str, list[float]] = {n: [] for n in graphs}
    for r in range(args.rounds):
        for name in (list(graphs) if r % 2 == 0 else list(reversed(graphs))):
            times[name].append(statistics.median(event_ms(graphs[name], dev) for _ in range(args.reps)))
    flops = 2 * t * k * d * q
    rows_out = []
    for name, values in times.items():
        ms = statistics.median(values)
        rows_out.append({"system": name, "graph_ms": ms, "tflops": flops / ms / 1e9, "check": checks[name],
                         "spread": [min(values), max(values)]})
        print(f"  {name:14s} {ms:7.3f} ms  {flops / ms / 1e9:5.0f} TFLOP/s  ({checks[name]})")
    if args.out:
        args.out.write_text(json.dumps({"shape": [t, d, q, e, k], "clock": "graph", "rows": rows_out}, indent=1))
    return 0


def _compile_only(args: argparse.Namespace) -> int:
    """Build gather_k_kernel for sm_90 without a GPU (ragdot.kernels.configs.compile_only)."""
    from ragdot.kernels.configs import compile_only, resource_usage

    with compile_only(90):
        x, b = torch.empty(64, 512, dtype=torch.bfloat16), torch.empty(256, 512, dtype=torch.bfloat16)
        idx, sched = torch.empty(256, dtype=torch.int32), torch.empty(4, 4, dtype=torch.int32)
        for stages in args.stages:
            handle = GatherK(x, b, 4, args.block, stages, args.regs, args.warps)(x, idx, b, sched)
            print(f"s{stages} r{args.regs}:", resource_usage(handle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
