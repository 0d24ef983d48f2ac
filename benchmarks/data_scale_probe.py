"""Does the operands' scale change kernel time? torch._grouped_mm and the Triton ragged-M kernel on one
qwen3-235b data-gradient cell (M=20480, K=4096, N=1536, 128 experts, balanced), with unit-normal operands and
with operands scaled by K**-0.25 (what `ragdot bench` draws), interleaved CUDA-graph replays, median of 40.

    python benchmarks/data_scale_probe.py
"""

from __future__ import annotations

import statistics

import torch

from ragdot.kernels import TileConfig
from ragdot.kernels import ragged_m as rm_mod


def main() -> None:
    m, k, n, e = 20480, 4096, 1536, 128
    ends = torch.full((e,), m // e, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    cfg = TileConfig(64, 256, 64, 8, 4, 4, True, 1, tma=True, flat=True)
    variants = {}
    for label, scale in (("unit", 1.0), ("k^-0.25", k**-0.25), ("1e-2", 1e-2)):
        x = (torch.randn(m, k, device="cuda") * scale).to(torch.bfloat16)
        w = (torch.randn(e, n, k, device="cuda") * scale).to(torch.bfloat16).transpose(-1, -2)
        variants[f"torch {label}"] = lambda x=x, w=w: torch._grouped_mm(x, w, offs=ends)
        variants[f"triton {label}"] = lambda x=x, w=w: rm_mod.ragged_m(x[None], w[None], ends, config=cfg)
    graphs = {}
    for name, fn in variants.items():
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs[name] = g
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(40):
        for name, g in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    for name, ts in times.items():
        print(f"{name:18s} median {statistics.median(ts):.4f} ms  min {min(ts):.4f}  max {max(ts):.4f}")


if __name__ == "__main__":
    main()
