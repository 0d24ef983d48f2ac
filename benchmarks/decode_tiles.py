"""Decode-sized ragged_m problems (a few rows per expert): device time of ragdot's Triton kernel per tile
against the raw `torch._grouped_mm` call, to choose the heuristic's tile for rows <= 64 per group.

    PYTHONPATH=src python3 benchmarks/decode_tiles.py --out DIR [--shapes M,K,N,E ...] [--routing balanced]

Clock: device, CUDA-graph replays (`ragdot.measure.timing.median_ms`, median of 20 replays after warm-up);
`raw` gets its offsets precomputed (no prefix sum in its graph). Weight bytes per call are the active groups'
K x N bf16 matrices; GB/s is those bytes over the time (the kernels are weight-bandwidth bound here). Writes
decode-tiles.csv under --out and prints the table. CUDA only.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

from ragdot.kernels import ragged_m as rm
from ragdot.kernels.configs import TileConfig, pick_config
from ragdot.measure.timing import median_ms
from ragdot.routing import group_sizes
from ragdot.shapes import get_shape

# (block_m, block_n, block_k, num_stages): small-row tiles; 4 warps each, group_m 1
TILES = ((64, 128, 64, 4), (64, 64, 128, 4), (64, 64, 64, 4), (32, 64, 128, 4), (32, 128, 128, 3),
         (16, 64, 128, 4), (16, 128, 128, 4), (32, 64, 256, 3), (64, 32, 128, 4), (16, 32, 256, 4))
SHAPES = ("4,2880,5760,32", "4,2880,2880,32", "32,2880,5760,32", "32,2880,2880,32", "8,7168,4096,64",
          "8,2048,7168,64", "64,7168,4096,64", "64,2048,7168,64")


def measure(spec: str, routing: str, dev: torch.device) -> list[dict]:
    """The rows of one shape: raw and every tile, device time of graph replays; values checked against raw."""
    m, k, n, e = get_shape(spec).dims
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(e, k, n, device=dev, dtype=torch.bfloat16, generator=gen).mul_(k**-0.5)
    sizes = group_sizes(routing, m, e, device=dev).to(torch.int32)
    offs = torch.cumsum(sizes, 0, dtype=torch.int32)
    active = int((sizes > 0).sum())
    gbytes = active * k * n * 2 / 1e9
    want = torch._grouped_mm(x, w, offs=offs)
    times = {"raw": median_ms(lambda: torch._grouped_mm(x, w, offs=offs), dev, graph=True)}
    a, b = x.unsqueeze(0), w.unsqueeze(0)
    default = pick_config("ragged_m", m, k, n, e, torch.bfloat16, dev)
    for bm, bn, bk, st in TILES:
        cfg = TileConfig(bm, bn, bk, group_m=1, num_warps=4, num_stages=st)
        prep = rm.Prepared(a, b, torch.bfloat16, cfg, from_sizes=True)
        torch.testing.assert_close(prep(a, b, sizes)[0][0].float(), want.float(), rtol=2e-2, atol=2e-2)
        times[cfg.short()] = median_ms(lambda prep=prep: prep(a, b, sizes), dev, graph=True)
    best = min((t for t in times if t != "raw"), key=times.get)
    print(f"{spec:18s} raw {times['raw'] * 1e3:7.1f} us | default {default.short()} "
          f"{times.get(default.short(), float('nan')) * 1e3:7.1f} | best {best} {times[best] * 1e3:7.1f} us")
    for name, ms in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"    {name:28s} {ms * 1e3:8.1f} us  {times['raw'] / ms:5.2f}x raw  {gbytes / (ms * 1e-3):7.1f} GB/s")
    return [{"shape": spec, "active_groups": active, "tile": name, "default": name == default.short(),
             "us": round(ms * 1e3, 2), "vs_raw": round(times["raw"] / ms, 3),
             "GB_per_s": round(gbytes / (ms * 1e-3), 1)}
            for name, ms in times.items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--routing", default="balanced")
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = [row for spec in args.shapes for row in measure(spec, args.routing, dev)]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "decode-tiles.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
