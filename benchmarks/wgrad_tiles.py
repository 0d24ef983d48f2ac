"""Triton ragged-K tiles with more programs per SM, at the MoE layer's weight-gradient widths (graph clock).

    python benchmarks/wgrad_tiles.py [--shapes 32768,2880,5760,128 32768,2880,2880,128] [--rounds 5] [--out FILE]
    python benchmarks/wgrad_tiles.py --device cpu --shapes 64,32,32,4 --rounds 1      # a smoke run (interpreter)

A weight gradient of fine-grained experts (gpt-oss-like: 256 token rows a group at 8192 tokens) runs each output
tile over a few chunks only, then stores it. Nsight Compute of the tuned two-programs tile on an H100
(`benchmarks/results/h100-20261207d/`) shows no unit saturated (DRAM 63%, L2 70%, SM 52%): each SM alternates
between two tiles' main loops and stores. This sweep asks whether three programs per SM (shallower rings and a
register cap, so that three fit) keep more tiles in flight. Shape: 'R,M,N,E' (token rows, output rows, output
columns, groups), bf16 operands, balanced group sizes. Systems: `vendor` (raw torch._grouped_mm on the same
operands, its offsets formed beforehand) and each tile of TILES (Triton's persistent TMA ragged_k); rounds
interleave them; each row is the median over rounds of the median of `--reps` CUDA-graph replays, with its error
against the vendor's result.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from ragdot.cli_common import count
from ragdot.kernels import ragged_k as rk
from ragdot.kernels.configs import TileConfig
from ragdot.measure.checks import normalised_error
from ragdot.measure.timing import capture_graph, interleaved_ms, warm_off_stream
from ragdot.routing import group_sizes


def _tile(bk: int, stages: int, pps: int, bm: int = 128, bn: int = 128, regs: int = 0) -> TileConfig:
    return TileConfig(bm, bn, bk, 8, 4, stages, True, pps, tma=True, max_regs=regs, flat=True)


TILES = [
    _tile(32, 4, 2),  # the H100 tune file's pick at gpt-oss-like's widths (<= 32768 rows)
    _tile(32, 5, 2),
    _tile(64, 2, 2),
    _tile(32, 2, 3, regs=168),
    _tile(16, 4, 3, regs=168),
    _tile(16, 5, 3, regs=168),
    _tile(32, 3, 3, bn=64),
    _tile(64, 2, 3, bn=64),
    _tile(32, 4, 4, bn=64, regs=128),
]


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        r, m, n, e = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'R,M,N,E' (four integers), got {text!r}") from None
    if min(r, m, n, e) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return r, m, n, e


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", type=_shape, default=[(32768, 2880, 5760, 128),
                                                                     (32768, 2880, 2880, 128)])
    parser.add_argument("--rounds", type=count(1), default=5)
    parser.add_argument("--reps", type=count(1), default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float16
    rows = []
    for r, m, n, e in args.shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(r, m, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(r, n, generator=gen).to(device=device, dtype=dtype)
        sizes = group_sizes("balanced", r, e, device=device).to(torch.int32)
        ends = sizes.cumsum(0).to(torch.int32)
        systems = {"vendor": lambda a=a, b=b, ends=ends: torch._grouped_mm(a.t(), b, offs=ends)}
        for cfg in TILES if cuda else TILES[:1]:
            prep = rk.Prepared(a[None], b[None], e, dtype, cfg, from_sizes=True)
            systems[cfg.short()] = lambda prep=prep, a=a, b=b, sizes=sizes: prep(a[None], b[None], sizes)[0][:, 0]
        ref = systems["vendor"]().float() if cuda else None
        timed, errors = {}, {}
        for name, fn in systems.items():
            try:
                warm_off_stream(fn, device)
                errors[name] = None if ref is None else normalised_error(fn().float(), ref)
                timed[name] = capture_graph(fn) if cuda else fn
            except Exception as exc:  # a tile this GPU cannot run (shared memory, registers): its row says why
                rows.append({"shape": [r, m, n, e], "system": name, "status": f"{type(exc).__name__}: {exc}"[:200]})
        times = interleaved_ms(timed, device, args.rounds, args.reps)
        base = statistics.median(times["vendor"])
        flops = 2 * r * m * n
        print(f"R={r} M={m} N={n} E={e}: graph ms (median of {args.rounds} rounds of {args.reps} replays)")
        for name, values in times.items():
            ms = statistics.median(values)
            rows.append({"shape": [r, m, n, e], "system": name, "graph_ms": ms, "x_vendor": base / ms,
                         "tflops": flops / ms / 1e9, "error": errors[name], "spread": [min(values), max(values)]})
            err = "-" if errors[name] is None else f"{errors[name]:.1e}"
            print(f"  {name:32s} {ms:8.3f} ms  {base / ms:5.3f}x vendor  {flops / ms / 1e9:5.0f} TFLOP/s  err {err}")
        for row in rows:
            if "status" in row and row["shape"] == [r, m, n, e]:
                print(f"  {row['system']:32s} {row['status']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        name = torch.cuda.get_device_name(device) if cuda else "cpu"
        args.out.write_text(json.dumps({"device": name, "clock": "graph", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
