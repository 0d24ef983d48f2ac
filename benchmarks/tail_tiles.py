"""Ragged-M tiles on routed group sizes: how much a group's last, part-filled row tile costs, per tile height.

    python benchmarks/tail_tiles.py [--layers gpt-oss-like qwen3-30b-a3b] [--tokens 8192] [--out FILE]

The MoE layer's ragged-M products (the forward's up and down projections, the data gradient of the up projection
with its weight read K-major) at the layer's widths, on two routings: `balanced` (every group the mean, a multiple
of 128 rows at the default token counts: no part-filled tile) and `routed` (the group sizes of one random top-k
routing of random logits: binomial spread about the mean, as `moe-bench --layer` routes). Systems: the raw
`torch._grouped_mm` (vendor), the Triton kernel with the heuristic's tile and with a few others, and the Gluon
kernel's candidate tiles (`--gluon-tiles` picks some by label). Graph clock (median of CUDA-graph replays, the
systems interleaved over `--rounds`). TFLOP/s counts useful work only (2 x rows x K x N); `pad` = the rows the tiles
compute over the rows routed, per tile height. `--half` times each Gluon tile of 128 rows or more also with
`ragdot.kernels.gluon.ragged_m.HALF_TAIL_TILES` (a group's last tile, at most half full, multiplies its own rows
alone), suffix " half".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from wgrad_anatomy import switch  # the module switches' setter

from ragdot.kernels import ragged_m as triton_m
from ragdot.kernels.configs import TileConfig, pick_config
from ragdot.kernels.gluon import ragged_m as gluon_m
from ragdot.kernels.gluon.config import gluon_m_tuning_configs
from ragdot.measure.timing import Timed, measure_clocks
from ragdot.moe.model import LAYER_CONFIGS

TRITON_TILES = {
    "t128x256": TileConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=3, persistent=True, tma=True, flat=True),
    "t64x256": TileConfig(64, 256, 64, group_m=8, num_warps=4, num_stages=4, persistent=True, tma=True, flat=True),
    "t128x128p2": TileConfig(128, 128, 64, group_m=8, num_warps=4, num_stages=3, persistent=True, programs_per_sm=2,
                             tma=True, flat=True),
}


def _sizes(routing: str, tokens: int, experts: int, top_k: int, device: torch.device) -> torch.Tensor:
    if routing == "balanced":
        return torch.full((experts,), tokens * top_k // experts, dtype=torch.int64, device=device)
    gen = torch.Generator(device=device).manual_seed(tokens)
    logits = torch.randn((tokens, experts), generator=gen, device=device)
    return torch.bincount(logits.topk(top_k, dim=1).indices.flatten(), minlength=experts)


def _pad(sizes: torch.Tensor, block_m: int) -> float:
    return float(((sizes + block_m - 1) // block_m * block_m).sum() / sizes.sum())


def _systems(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, gluon: bool,
             tiles: list[str] | None = None, half: bool = False, triton: bool = True
             ) -> dict[str, Callable[[], Any]]:
    out: dict[str, Callable[[], Any]] = {"vendor": lambda: torch._grouped_mm(a[0], b[0], offs=ends)}
    k, n, g = a.shape[2], b.shape[3], b.shape[1]
    heur = pick_config("ragged_m", a.shape[1], k, n, g, a.dtype, a.device)
    for label, cfg in {"triton-heuristic": heur, **TRITON_TILES}.items() if triton else ():
        prep = triton_m.Prepared(a, b, a.dtype, cfg)
        out[f"{label} ({cfg.short()})"] = lambda prep=prep: prep(a, b, ends)
    for cfg in gluon_m_tuning_configs(k, n) if gluon else ():
        if tiles and cfg.short() not in tiles:
            continue
        for halves in (False, True) if half and cfg.block_m >= 128 else (False,):
            try:
                with switch("HALF_TAIL_TILES", halves, gluon_m):
                    prep = gluon_m.Prepared(a, b, a.dtype, cfg)
            except NotImplementedError:
                continue
            out[f"gluon {cfg.short()}" + (" half" if halves else "")] = lambda prep=prep: prep(a, b, ends)
    return out



def _interleaved(systems: dict[str, Callable[[], Any]], dev: torch.device, rounds: int, reps: int
                 ) -> dict[str, float]:
    """Median ms of each system's CUDA-graph replays (graph clock), the systems interleaved over `rounds` rounds
    (`ragdot.measure.timing.measure_clocks`), about `reps` samples each."""
    timed = [Timed(name, [fn]) for name, fn in systems.items()]
    times = measure_clocks(timed, dev, clocks=("graph",), warmup=2, iters=reps, rounds=rounds)
    return {name: times[name, "graph"].median for name in systems}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", nargs="+", default=["gpt-oss-like", "qwen3-30b-a3b", "deepseek3-671b-reduced"])
    p.add_argument("--tokens", nargs="+", type=int, default=[8192])
    p.add_argument("--reps", type=int, default=20, help="samples per system (graph replays)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds the samples are spread over")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-gluon", action="store_true", help="leave the Gluon tiles out")
    p.add_argument("--no-triton", action="store_true", help="leave the Triton tiles out")
    p.add_argument("--gluon-tiles", nargs="+", default=None, metavar="LABEL",
                   help="only these Gluon tiles (labels as printed, e.g. 128x256x64s3w8g8r24)")
    p.add_argument("--problems", nargs="+", default=["up", "down", "dgrad_up"],
                   choices=["up", "down", "dgrad_up", "dgrad_down"])
    p.add_argument("--half", action="store_true",
                   help="each Gluon tile of 128+ rows also with HALF_TAIL_TILES (suffix ' half')")
    args = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for name in args.layers:
        cfg = LAYER_CONFIGS[name]
        d, h, e, k = cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k
        w_up = torch.randn((1, e, d, 2 * h), device=dev, dtype=dt) / d**0.5
        w_down = torch.randn((1, e, h, d), device=dev, dtype=dt) / h**0.5
        for t in args.tokens:
            m = t * k
            x = torch.randn((1, m, d), device=dev, dtype=dt)
            act = torch.randn((1, m, h), device=dev, dtype=dt)
            dpre = torch.randn((1, m, 2 * h), device=dev, dtype=dt)
            problems = {"up": (x, w_up), "down": (act, w_down), "dgrad_up": (dpre, w_up.transpose(2, 3)),
                        "dgrad_down": (x, w_down.transpose(2, 3))}  # dy's rows: x's shape
            problems = {k: v for k, v in problems.items() if k in args.problems}
            for routing in ("balanced", "routed"):
                sizes = _sizes(routing, t, e, k, dev)
                ends = sizes.cumsum(0).to(torch.int32)
                pads = {bm: round(_pad(sizes, bm), 3) for bm in (64, 128)}
                for prob, (a, b) in problems.items():
                    flops = 2 * m * a.shape[2] * b.shape[3]
                    systems = _systems(a, b, ends, not args.no_gluon, args.gluon_tiles, args.half,
                                       not args.no_triton)
                    for system, ms in _interleaved(systems, dev, args.rounds, args.reps).items():
                        row = {"layer": name, "tokens": t, "routing": routing, "problem": prob, "system": system,
                               "ms": ms, "tflops": flops / ms / 1e9, "pad64": pads[64], "pad128": pads[128]}
                        rows.append(row)
                        print(f"{name:22s} T={t:<6d} {routing:8s} {prob:9s} {system:44s} {ms:8.3f} ms "
                              f"{row['tflops']:6.0f} TFLOP/s  pad 64/128 {pads[64]:.3f}/{pads[128]:.3f}", flush=True)
            del x, act, dpre
        del w_up, w_down
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
