"""Probe: the Gluon weight gradient with one operand's rows gathered through a token index (cp.async), not copied.

    python benchmarks/gluon_gather_probe.py [--shape 8192,2880,5760,128,4] [--rounds 5] [--out FILE]
    python benchmarks/gluon_gather_probe.py --tile 128,128,64,4 --consumers 2 --stages 4 5   # ping-pong consumers
    python benchmarks/gluon_gather_probe.py --compile-only      # build the kernel for sm_90 on any machine

The fused MoE block's last weight gradient is, per expert, x[token(r)]^T dpre[r] over the expert's rows r. Today it
gathers x's token rows a slice of D columns at a time and runs the Gluon ragged_k kernel on each slice
(`ragdot.moe.fused._wgrad_chunks`), so dpre is read once a slice. `ragdot.kernels.gluon.ragged_k_gather` reads x's
rows itself (its producer copies each chunk's token rows into the stage with cp.async; the kernel was first written
here, 248a094-75a3bf5).

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

from ragdot.kernels.gluon.config import GluonConfig


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
    parser.add_argument("--tile", default="128,128,64,4", help="BLOCK_M,BLOCK_N,BLOCK_K,consumer warps (4 or 8)")
    parser.add_argument("--consumers", type=int, default=1, choices=(1, 2),
                        help="consumer partitions: 1, or 2 (ping-pong, 4 warps each, a four-warp producer)")
    parser.add_argument("--gather-warps", type=int, nargs="+", default=[4], choices=(4, 8),
                        help="warps of the gathering producer (8 only with a 4-warp consumer)")
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
    from ragdot.kernels.gluon.ragged_k import Prepared
    from ragdot.kernels.gluon.ragged_k_gather import Prepared as GatherPrepared
    from ragdot.kernels.ragged_k import schedule
    from ragdot.measure.timing import capture_graph, interleaved_ms, warm_off_stream
    from ragdot.moe import fused

    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(t, d, generator=gen).to(dev, torch.bfloat16)
    dpre = torch.randn(t * k, q, generator=gen).to(dev, torch.bfloat16)
    sizes, tokens = _routing(t, e, k, dev)
    sched = schedule(sizes, t * k)
    rows = x.index_select(0, tokens)
    systems, checks = {}, {}
    ref_cfg = GluonConfig(*args.block, max(args.stages), args.warps, consumers=args.consumers)
    ref = Prepared(rows[None], dpre[None], e, torch.bfloat16, ref_cfg, from_sizes=True)
    systems["gluon"] = lambda: ref(rows[None], dpre[None], sizes, None, sched)[0]
    systems["copy+gluon"] = lambda: ref(x.index_select(0, tokens)[None], dpre[None], sizes, None, sched)[0]
    w = torch.empty((e, d, q), dtype=torch.bfloat16, device="meta")
    systems["chunks"] = lambda: fused._wgrad_chunks(x, tokens, dpre, sizes, w, torch.bfloat16)
    for stages in args.stages:
        for gw in args.gather_warps:
            cfg = GluonConfig(*args.block, stages, args.warps, consumers=args.consumers)
            probe = GatherPrepared(x[None], dpre[None], e, torch.bfloat16, cfg, from_sizes=True, gather_warps=gw)
            systems[f"gather s{stages} gw{gw}"] = lambda probe=probe: probe(x[None], dpre[None], sizes, None, sched,
                                                                           tokens)[0]
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
    times = interleaved_ms(graphs, dev, args.rounds, args.reps)
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
    """Build the gathering kernel for sm_90 without a GPU (ragdot.kernels.configs.compile_only)."""
    from ragdot.kernels.configs import compile_only, resource_usage
    from ragdot.kernels.gluon.ragged_k_gather import Prepared

    with compile_only(90):
        x, b = torch.empty(1, 64, 512, dtype=torch.bfloat16), torch.empty(1, 256, 512, dtype=torch.bfloat16)
        idx, sched = torch.empty(256, dtype=torch.int32), torch.zeros(4, 4, dtype=torch.int32)
        for stages in args.stages:
            for gw in args.gather_warps:
                cfg = GluonConfig(*args.block, stages, args.warps, consumers=args.consumers)
                prep = Prepared(x, b, 4, torch.bfloat16, cfg, from_sizes=True, gather_warps=gw)
                handle = prep(x, b, torch.zeros(4, dtype=torch.int32), None, sched, idx)[1]
                print(f"{prep.cfg.short()} gw{gw}:", resource_usage(handle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
