"""The MoE layer's last weight gradient (w_gate_up's) with x's token rows read through the routing index.

    python benchmarks/wgrad_rows.py [--layers qwen3-30b-a3b gpt-oss-like] [--tokens 8192] [--out FILE]
    python benchmarks/wgrad_rows.py --device cpu --tiny     # a smoke run (Triton's interpreter, float16)

The product: per expert, the sum over its routed rows of x[token]^T dpre ([D, 2H] per expert) at the layer's
widths, with the group sizes and token order of one random top-k routing (as `moe-bench --layer` routes).
Systems:
- `copy+auto`: the token rows gathered into a [T*k, D] copy, then ragdot's chosen backend (`ops.run`, auto):
  what the fused block's backward ran before it read x through the index;
- `auto`: the same product on rows gathered beforehand (the kernel alone);
- `vendor`: raw `torch._grouped_mm` on the rows gathered beforehand;
- `chunks <slices>`: the fused block's "chunks" mode (`ragdot.moe.fused`): the token rows gathered a slice of D
  columns at a time (D cut into at most `slices`: `fused.CHUNK_SLICES`, whose value "(default)" marks), each slice
  of the gradient written in place by the Gluon kernel;
- `index <tile>`: ragdot's Triton ragged_k reading x through the token index (`a_rows`), no copy, per tile.
Two clocks per row: graph (median of CUDA-graph replays: device time) and eager (median of CUDA events around
single calls, host time included). TFLOP/s counts useful work (2 x T*k x D x 2H); % SOL against the device's
bf16 dense rate measured at the start (`ragdot.bench.ceilings.measure_ceilings`). A system that cannot run
here is a row with its error as `status`. Off a GPU both clocks are the host's (no graphs).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ragdot import ops
from ragdot.kernels import ragged_k as rk
from ragdot.kernels.configs import TileConfig, gather_config
from ragdot.measure.timing import median_ms
from ragdot.moe import fused
from ragdot.moe.model import LAYER_CONFIGS
from ragdot.moe.routing_kernels import sort_order

TILES = [TileConfig(128, 128, 32, 8, 4, s, True, 2, tma=True, flat=True) for s in (4, 5, 6)] + [
    TileConfig(128, 128, 64, 8, 4, s, True, 1, tma=True, flat=True) for s in (4, 5)] + [
    TileConfig(128, 256, 64, 8, 8, s, True, 1, tma=True, flat=True) for s in (3, 5)] + [
    TileConfig(128, 128, 32, 8, 4, 4, True, 2, tma=True)]


def _systems(x: torch.Tensor, tokens: torch.Tensor, dpre: torch.Tensor, sizes: torch.Tensor,
             tiles: list[TileConfig]) -> dict[str, Callable[[], Any]]:
    rows = x.index_select(0, tokens)
    ends = sizes.cumsum(0).to(torch.int32)
    out: dict[str, Callable[[], Any]] = {
        "copy+auto": lambda: ops.run("ragged_k", x.index_select(0, tokens)[None], dpre[None], sizes, x.dtype, "auto"),
        "auto": lambda: ops.run("ragged_k", rows[None], dpre[None], sizes, x.dtype, "auto"),
        "vendor": lambda: torch._grouped_mm(rows.t(), dpre, offs=ends),
    }
    if fused._gluon_runs(x.device):  # w: the weight's layout ([E, D, 2H] row-major) and dtype, no storage
        w = torch.empty((sizes.shape[0], x.shape[1], dpre.shape[1]), dtype=x.dtype, device="meta")
        for slices in CHUNK_SLICES:
            label = f"chunks {slices}" + (" (default)" if slices == fused.CHUNK_SLICES else "")
            out[label] = lambda slices=slices: _chunks(x, tokens, dpre, sizes, w, slices)
    heur = gather_config(tokens.shape[0], x.shape[1], dpre.shape[1], sizes.shape[0], x.dtype, x.device)
    for cfg in [heur, *(t for t in tiles if t != heur)]:
        prep = rk.Prepared(x[None], dpre[None], sizes.shape[0], x.dtype, cfg, from_sizes=True, gather="a")
        label = f"index {cfg.short()}" + (" (heuristic)" if cfg == heur else "")
        out[label] = lambda prep=prep: prep(x[None], dpre[None], sizes, index=tokens)
    return out


CHUNK_SLICES = (2, 3, 4)  # the "chunks" systems: D cut into at most this many slices


def _chunks(x, tokens, dpre, sizes, w, slices: int) -> torch.Tensor:
    """The fused block's "chunks" product with `fused.CHUNK_SLICES` set to `slices` for the call."""
    saved, fused.CHUNK_SLICES = fused.CHUNK_SLICES, slices
    try:
        return fused._wgrad_chunks(x, tokens, dpre, sizes, w, x.dtype)
    finally:
        fused.CHUNK_SLICES = saved


TINY = (64, 32, 4, 2)  # --tiny: dim, expert hidden, experts, top-k


def _time(fn: Callable[[], Any], dev: torch.device, reps: int, flops: int) -> dict[str, Any]:
    row: dict[str, Any] = {"status": "ok"}
    try:
        for clock in ("graph", "eager"):
            ms = median_ms(fn, dev, graph=clock == "graph", reps=reps)
            row[f"{clock}_ms"] = ms
            row[f"{clock}_tflops"] = flops / ms / 1e9
    except (RuntimeError, NotImplementedError, ValueError) as exc:  # a system this device or dtype lacks
        row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", nargs="+", default=["qwen3-30b-a3b", "deepseek2-16b", "gpt-oss-like",
                                                    "deepseek3-671b-reduced"])
    p.add_argument("--tokens", nargs="+", type=int, default=[8192])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--heuristic-only", action="store_true", help="time the heuristic's index tile alone")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (Triton's interpreter, float16)")
    p.add_argument("--tiny", action="store_true", help=f"one tiny layer instead of --layers: D, H, E, k = {TINY}")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    from ragdot.bench.ceilings import measure_ceilings

    dev = torch.device(args.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float16  # the interpreter's bf16 dots are wrong
    ceil = measure_ceilings(dev, dt)
    peak = ceil.peak_tflops
    print(f"dense {dt} {peak:.1f} TFLOP/s ({ceil.label})", flush=True)
    layers = {"tiny": TINY} if args.tiny else {
        name: (c.dim, c.moe_hidden, c.num_experts, c.top_k) for name, c in ((n, LAYER_CONFIGS[n]) for n in args.layers)}
    rows_out = []
    for name, (d, h, e, k) in layers.items():
        for t in args.tokens:
            gen = torch.Generator(device=dev).manual_seed(t)
            chosen = torch.randn((t, e), generator=gen, device=dev).topk(k, dim=1).indices
            sizes, order = sort_order(chosen, e, "torch")
            tokens = torch.div(order, k, rounding_mode="floor")
            x = torch.randn((t, d), device=dev, dtype=dt)
            dpre = torch.randn((t * k, 2 * h), device=dev, dtype=dt)
            flops = 2 * t * k * d * 2 * h
            for system, fn in _systems(x, tokens, dpre, sizes, [] if args.heuristic_only else TILES).items():
                row = {"layer": name, "tokens": t, "system": system, **_time(fn, dev, args.reps, flops)}
                rows_out.append(row)
                if row["status"] != "ok":
                    print(f"{name:24s} T={t:<6d} {system:44s} {row['status']}", flush=True)
                    continue
                row["graph_sol_pct"] = 100 * row["graph_tflops"] / peak
                print(f"{name:24s} T={t:<6d} {system:44s} graph {row['graph_ms']:7.3f} ms "
                      f"{row['graph_tflops']:5.0f} TFLOP/s ({row['graph_sol_pct']:4.1f}% SOL)  "
                      f"eager {row['eager_ms']:7.3f} ms", flush=True)
            del x, dpre
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
