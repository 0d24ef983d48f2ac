"""A minimal reproducer for the hang of Gluon ragged-M's item-lookup prefetch (00b824d, docs/gluon.md):
does a one-warp producer partition that carries table values from one item to the next, across its mbarrier
loop, still deliver every chunk, with few registers (where those values spill) and with more?

    persistent programs; item i of program p is p + i * P; info[item] = (row, chunks, x1, x1, x2, x2, x3, x3)
    producer (1 warp, PRODUCER_REGS):  for each item: TMA-load a[row + 3 (x1 - x1) + ... + c * BLOCK, :], c < chunks
                                       CARRY: the next item's info loaded at the top of the current item's loop
    consumer (default, 4 warps):       for each item: sum every chunk it is handed; out[item] = the sum

The consumer reads its items' chunk counts itself, so a producer that lost a carried value either hands it a
wrong row (a wrong sum) or a wrong number of chunks (a hang). `variant_results` runs each variant on a GPU
against a float64 reference; `spill_report` compiles each for sm_90 on any machine (Triton's ptxas) and
counts the spilled registers. benchmarks/gluon_probe.py runs the variants as its `carry*` steps, each in a
subprocess with a timeout.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ragdot.kernels.gluon.matmul import ring_barriers

#: (carry the next item's values, producer registers) per variant
VARIANTS = {"carry24": (True, 24), "carry48": (True, 48), "plain24": (False, 24)}
BLOCK = 64  # rows and columns of a chunk


@gluon.jit
def _info(info_ptr, item):
    """(first row, chunks, then three pairs of equal values) of one item: eight scalars, as many as the
    ragged-M producer holds for an item (group, rows, batch entry, column, chunks and their products)."""
    p = info_ptr + 8 * item
    return (gl.load(p), gl.load(p + 1), gl.load(p + 2), gl.load(p + 3), gl.load(p + 4), gl.load(p + 5),
            gl.load(p + 6), gl.load(p + 7))


@gluon.jit
def _producer(a_desc, bufs, ready, empty, info_ptr, total, CARRY: gl.constexpr):
    STAGES: gl.constexpr = bufs.type.shape[0]
    BLOCK_R: gl.constexpr = a_desc.block_type.shape[0]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    row, n, x1, y1, x2, y2, x3, y3 = _info(info_ptr, pid)
    it = 0
    for item in range(pid, total, nprog):
        if CARRY:
            row_n, n_n, x1_n, y1_n, x2_n, y2_n, x3_n, y3_n = _info(info_ptr, gl.minimum(item + nprog, total - 1))
        else:
            row, n, x1, y1, x2, y2, x3, y3 = _info(info_ptr, item)
        for c in range(n):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes)
            r = row + (x1 - y1) * 3 + (x2 - y2) * 5 + (x3 - y3) * 7 + c * BLOCK_R
            tma.async_copy_global_to_shared(a_desc, [r, 0], ready.index(s), bufs.index(s))
            it += 1
        if CARRY:
            row, n, x1, y1, x2, y2, x3, y3 = row_n, n_n, x1_n, y1_n, x2_n, y2_n, x3_n, y3_n


@gluon.jit
def _consumer(bufs, ready, empty, info_ptr, out_ptr, total, LAYOUT: gl.constexpr):
    STAGES: gl.constexpr = bufs.type.shape[0]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    for item in range(pid, total, nprog):
        acc = gl.zeros([], gl.float32)
        for _c in range(gl.load(info_ptr + 8 * item + 1)):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            acc += gl.sum(gl.sum(bufs.index(s).load(LAYOUT).to(gl.float32), axis=1), axis=0)
            mbarrier.arrive(empty.index(s))
            it += 1
        gl.store(out_ptr + item, acc)


@gluon.jit
def carry_kernel(
    a_desc,  # TMA descriptor of a [R, BLOCK] bf16, block [BLOCK, BLOCK]
    info_ptr,  # [total, 8] int32: per item its first row, chunk count and three pairs of equal values
    out_ptr,  # [total] float32: per item the sum of its chunks
    total,  # scalar: items
    STAGES: gl.constexpr,  # shared-memory ring depth
    CARRY: gl.constexpr,  # the producer loads the next item's info one item ahead (loop-carried)
    LAYOUT: gl.constexpr,  # register layout of a chunk in the consumer
    PRODUCER_REGS: gl.constexpr,  # registers per thread of the producer warp
):
    bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    ready, empty = ring_barriers(STAGES, 1)
    gl.warp_specialize([
        (_consumer, (bufs, ready, empty, info_ptr, out_ptr, total, LAYOUT)),
        (_producer, (a_desc, bufs, ready, empty, info_ptr, total, CARRY)),
    ], [1], [PRODUCER_REGS])


def launch(variant: str, a: torch.Tensor, info: torch.Tensor, programs: int):
    """out [total] float32 and the compiled kernel for a [R, BLOCK] bf16 and info [total, 8] int32."""
    from ragdot.kernels.configs import run_kernel
    from ragdot.kernels.gluon.common import descriptor, maxnreg_for

    carry, regs = VARIANTS[variant]
    out = torch.empty(info.shape[0], dtype=torch.float32, device=a.device)
    layout = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    kernel = run_kernel(carry_kernel, (programs,), descriptor(a, [BLOCK, BLOCK]), info, out, info.shape[0], 4,
                        carry, layout, regs, num_warps=4, maxnreg=maxnreg_for(4))
    return out, kernel


def make_case(items: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """a [R, BLOCK] bf16, info [items, 8] int32 (1-4 chunks an item, rows in order) and the float64 sums."""
    gen = torch.Generator().manual_seed(seed)
    chunks = torch.randint(1, 5, (items,), generator=gen)
    rows = torch.cumsum(chunks, 0) - chunks
    x = [torch.randint(0, 1000, (items,), generator=gen) for _ in range(3)]
    info = torch.stack([rows * BLOCK, chunks, x[0], x[0], x[1], x[1], x[2], x[2]], 1).to(torch.int32)
    a = torch.randn(int(chunks.sum()) * BLOCK, BLOCK, generator=gen).to(torch.bfloat16)
    ref = torch.stack([a[r: r + c * BLOCK].double().sum() for r, c in zip((rows * BLOCK).tolist(), chunks.tolist())])
    return a.to(device), info.to(device), ref


def variant_results(variant: str, programs: int = 132, items: int = 1000) -> dict:
    """Run one variant on the GPU with about items / programs items a program; ok when every sum matches."""
    a, info, ref = make_case(items, "cuda")
    out, _ = launch(variant, a, info, programs)
    torch.cuda.synchronize()
    err = float((out.double().cpu() - ref).abs().max() / ref.abs().max())
    return {"rows": [dict(variant=variant, items=items, programs=programs, max_rel_error=err)], "ok": err < 1e-3}


def spill_report() -> dict[str, dict]:
    """Per variant: spilled registers and registers a thread, compiled for sm_90 (no GPU needed)."""
    from ragdot.kernels.configs import compile_only, resource_usage

    a, info, _ = make_case(8, "cpu")
    out = {}
    with compile_only(90):
        for variant in VARIANTS:
            usage = resource_usage(launch(variant, a, info, 4)[1])
            out[variant] = {"spills": usage["spills"], "regs": usage["regs"]}
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(spill_report()))
