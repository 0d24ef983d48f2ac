"""How fast the device writes, by which store path, against a weight gradient whose output is most of its bytes.

    python benchmarks/write_ceiling.py                      # deepseek3-test's weight gradient: 256 x 512 x 512
    python benchmarks/write_ceiling.py --groups 128 --m 2048 --n 768 --tokens 10240   # qwen3-30b-a3b wgrad_wi
    TRITON_INTERPRET=1 python benchmarks/write_ceiling.py --check --groups 2 --m 16 --n 32 --tokens 8   # CPU

`ragdot bench` rates a call against the speed of light from a measured copy bandwidth (reads plus writes). A
weight gradient with few tokens per group writes far more than it reads (deepseek3-test: 134 MB written, 10 MB
read), and a `fill_` of its output streamed at 3.0-3.2 TB/s on the H200 against a copy's 3.95-4.25. Whether that
is the device's write ceiling or the fill kernel's is what the store paths below tell apart. Timed as medians of
CUDA-graph replays (graph clock) on one output buffer, each as bytes per second:

- torch's `fill_(1.0)` and `zero_()`; the driver's `cuMemsetD32Async` (where libcuda loads);
- a Triton kernel storing a constant, one block per program, with each of `tl.store`'s cache modifiers
  ("" the default write-back, ".cs" streaming / evict-first, ".wt" write-through, ".cg" L2 only);
- a Triton kernel storing 128 x 128 bf16 tiles through a host TMA descriptor (what ragdot's weight-gradient
  epilogues do), one tile per program and persistent (one program per SM, tiles strided);
- a copy (reads and writes), and the ragged_k call itself (triton and auto).

Every path is first run once and checked to have written the whole buffer (a wrong one stops the probe before
any timing); `--check` does only that, and prints each verdict: on a CPU through Triton's interpreter, float16
(the memset row needs CUDA and is left out there).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

if __package__ is None or __package__ == "":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import ragdot  # noqa: E402
from ragdot.cli_common import count  # noqa: E402
from ragdot.kernels.configs import num_sms  # noqa: E402
from ragdot.measure.timing import median_ms  # noqa: E402
from ragdot.routing import group_sizes  # noqa: E402

_CACHE = {"": 0, ".cs": 1, ".wt": 2, ".cg": 3}
_BLOCK = 8192  # elements a program stores
_TILE = 128  # rows and columns of a TMA-stored tile


@triton.jit
def _store_kernel(
    c_ptr,  # [numel] contiguous output
    numel,  # scalar: elements of the output
    BLOCK: tl.constexpr,  # elements stored per program
    CACHE: tl.constexpr,  # 0: default, 1: ".cs", 2: ".wt", 3: ".cg"
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ones = tl.full((BLOCK,), 1.0, c_ptr.dtype.element_ty)
    mask = offs < numel
    if CACHE == 1:
        tl.store(c_ptr + offs, ones, mask=mask, cache_modifier=".cs")
    elif CACHE == 2:
        tl.store(c_ptr + offs, ones, mask=mask, cache_modifier=".wt")
    elif CACHE == 3:
        tl.store(c_ptr + offs, ones, mask=mask, cache_modifier=".cg")
    else:
        tl.store(c_ptr + offs, ones, mask=mask)


@triton.jit
def _tma_store_kernel(
    c_desc,  # host TMA descriptor of the [rows, cols] output, block [TILE, TILE]
    tiles_n,  # scalar: tiles along a row of the output
    tiles,  # scalar: tiles in all
    TILE: tl.constexpr,  # rows and columns of a tile
):
    ones = tl.full((TILE, TILE), 1.0, c_desc.dtype)
    for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
        c_desc.store([(t // tiles_n) * TILE, (t % tiles_n) * TILE], ones)


def _memset(out: torch.Tensor) -> Callable[[], None] | None:
    """cuMemsetD32Async of the whole (4-byte-multiple) buffer to 1.0-bf16 pairs, or None without libcuda."""
    if out.device.type != "cuda" or out.numel() * out.element_size() % 4:
        return None
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    fn = cuda.cuMemsetD32Async
    fn.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p]
    word = int(torch.ones(2, dtype=out.dtype).view(torch.int32).item()) & 0xFFFFFFFF
    count = out.numel() * out.element_size() // 4

    def run() -> None:
        err = fn(out.data_ptr(), word, count, torch.cuda.current_stream(out.device).cuda_stream)
        if err:
            raise RuntimeError(f"cuMemsetD32Async failed with CUresult {err}")

    return run


def writers(out: torch.Tensor) -> list[tuple[str, Callable[[], object]]]:
    """Every write path over `out` [G, M, N] (contiguous) that this machine runs; each writes 1.0 everywhere
    but zero_ (zeros)."""
    flat = out.view(-1)
    grid = (triton.cdiv(flat.numel(), _BLOCK),)
    rows: list[tuple[str, Callable[[], object]]] = [("fill_", lambda: out.fill_(1.0)), ("zero_", out.zero_)]
    memset = _memset(out)
    if memset is not None:
        rows.append(("cuMemsetD32Async", memset))
    for name, code in _CACHE.items():
        rows.append((f"triton store {name or 'default'}",
                     lambda code=code: _store_kernel[grid](flat, flat.numel(), BLOCK=_BLOCK, CACHE=code, num_warps=8)))
    two_d = out.view(-1, out.shape[-1])
    if two_d.shape[0] % _TILE == 0 and two_d.shape[1] % _TILE == 0:
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor.from_tensor(two_d, [_TILE, _TILE])
        tiles_n = two_d.shape[1] // _TILE
        tiles = tiles_n * (two_d.shape[0] // _TILE)
        for name, programs in (("tile per program", tiles), ("persistent", num_sms(out.device))):
            rows.append((f"triton TMA store {name}", lambda programs=programs: _tma_store_kernel[(programs,)](
                desc, tiles_n, tiles, TILE=_TILE, num_warps=4)))
    return rows


def _checked(out: torch.Tensor, quiet: bool) -> list[tuple[str, Callable[[], object]]] | None:
    """The write paths over `out` that ran: each run once (NaN first) and checked to have written every element;
    a verdict printed per path unless `quiet` (then only failures). None when a path ran and missed an element;
    a path that raises (one this GPU or Triton refuses) is reported and left out."""
    kept = []
    for name, fn in writers(out):
        out.fill_(float("nan"))
        try:
            fn()
        except Exception as exc:
            print(f"  {name:32s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        ok = bool((out == (0.0 if name == "zero_" else 1.0)).all())
        if not (ok and quiet):
            print(f"  {name:32s} {'ok' if ok else 'WRONG'}")
        if not ok:
            return None
        kept.append((name, fn))
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=count(1), default=256)
    parser.add_argument("--m", type=count(1), default=512, help="rows of each group's output")
    parser.add_argument("--n", type=count(1), default=512, help="columns of each group's output")
    parser.add_argument("--tokens", type=count(1), default=5120, help="contracted token rows, all groups together")
    parser.add_argument("--reps", type=count(1), default=50)
    parser.add_argument("--check", action="store_true", help="run each write path once and check it, no timing")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.check:
        print("write_ceiling: timing needs a CUDA device (--check runs on a CPU)", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float16
    out = torch.empty(args.groups, args.m, args.n, device=dev, dtype=dtype)
    paths = _checked(out, quiet=not args.check)
    if paths is None:  # a path that misses an element: nothing is timed
        return 1
    if args.check:
        return 0
    src = torch.randn_like(out)
    lhs = torch.randn(args.tokens, args.m, device=dev, dtype=dtype)
    rhs = torch.randn(args.tokens, args.n, device=dev, dtype=dtype)
    sizes = group_sizes("balanced", args.tokens, args.groups, device=dev)
    wrote = out.numel() * out.element_size()
    read = (lhs.numel() + rhs.numel()) * lhs.element_size()
    dn = ragdot.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])  # contract the ragged token rows

    def wgrad(backend: str):
        return lambda: ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend=backend)

    rows = [(name, fn, wrote) for name, fn in paths] + [
        ("copy (read + write)", lambda: out.copy_(src), 2 * wrote),
        ("ragged_k triton", wgrad("triton"), wrote + read),
        ("ragged_k auto", wgrad("auto"), wrote + read),
    ]
    print(f"{torch.cuda.get_device_name(dev)}; output {args.groups} x {args.m} x {args.n} bf16 ({wrote / 1e6:.1f} MB), "
          f"operands {read / 1e6:.1f} MB; graph clock, median of {args.reps} replays")
    for name, fn, nbytes in rows:
        try:
            ms = median_ms(fn, dev, graph=True, reps=args.reps)
        except Exception as exc:  # a path this GPU or Triton refuses: say so, time the rest
            print(f"  {name:32s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        print(f"  {name:32s} {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:7.2f} TB/s of bytes moved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
