"""Profile one ragged-dot cell under Nsight Compute: torch._grouped_mm and Triton configs, one call each.

Warm-up (compile, autotune nothing) runs outside the profiled range; each variant is then called once between
torch.cuda.profiler.start()/stop(), so run it as

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats python3 benchmarks/profile_cell.py \\
        --shape qwen3-30b-a3b --cls wgrad_wi --configs "128x128x32 g8 w4 s3 tma" ...

Config strings use `TileConfig.short()` syntax; `heuristic` is the default config.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from triton_dev import SHAPES, group_sizes, operands, run_triton  # noqa: E402

from ragdot.kernels import TileConfig  # noqa: E402


def parse_config(text: str) -> TileConfig | None:
    """`128x128x32 g8 w4 s3 p2 r168 tma` -> TileConfig; `heuristic` -> None."""
    if text == "heuristic":
        return None
    bm, bn, bk = (int(x) for x in re.match(r"(\d+)x(\d+)x(\d+)", text).groups())
    field = lambda tag, default: int(m.group(1)) if (m := re.search(rf"\b{tag}(\d+)", text)) else default
    pps = field("p", 0)
    return TileConfig(bm, bn, bk, field("g", 8), field("w", 4), field("s", 3), persistent=pps > 0,
                      programs_per_sm=max(pps, 1), tma="tma" in text, max_regs=field("r", 0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    parser.add_argument("--cls", default="wgrad_wi")
    parser.add_argument("--routing", default="balanced")
    parser.add_argument("--configs", nargs="*", default=["heuristic"])
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    problem, a, b, targs = operands(args.cls, shape, "cuda", fill=True)
    ends = torch.tensor(group_sizes(shape[0], shape[3], args.routing), device="cuda").cumsum(0).to(torch.int32)
    variants = [("torch", lambda: torch._grouped_mm(*targs, offs=ends))]
    for text in args.configs:
        cfg = parse_config(text)
        variants.append((text, lambda cfg=cfg: run_triton(problem, a, b, ends, cfg)))
    for _, fn in variants:  # compile and warm up outside the profiled range
        fn(), fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in variants:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(name for name, _ in variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
