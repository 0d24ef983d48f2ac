"""Host time per call of the Triton weight-gradient kernel: pointer loads against ragged TMA-view loads.

    PYTHONPATH=src python3 benchmarks/wgrad_host_probe.py [--shapes deepseek3-test qwen3-30b-a3b] [--calls 400]

For each shape's weight gradient (a [1, M, K], b [1, M, N], G groups, balanced sizes) one `ragged_k.Prepared`
per config, called back to back: `pointer` (128x128x32 s4, TMA store only), `pointer-p2` (the same tile,
persistent, two programs per SM), `tma-loads` (the same, a and b read through ragged TMA views: three
descriptors a call instead of one). Clock: host (`ragdot.measure.host.time_host_interleaved`: wall time of
back-to-back calls, chunks of 16 with a sync between them, median of the passes, the configs interleaved),
with the device time per call beside it. It also reports whether each launch runs its bound descriptor path
(`kernels/launch.py`) and the host cost of encoding one ragged-view descriptor. CUDA only.
"""

from __future__ import annotations

import argparse
import time

import torch

from ragdot.kernels import TileConfig
from ragdot.kernels import ragged_k as rk
from ragdot.measure.host import time_host_interleaved
from ragdot.shapes import get_shape

CONFIGS = {
    "pointer": TileConfig(128, 128, 32, 8, 4, 4, tma=True),
    "pointer-p2": TileConfig(128, 128, 32, 8, 4, 4, True, 2, tma=True),
    "tma-loads": TileConfig(128, 128, 32, 8, 4, 4, True, 2, tma=True, flat=True),
}


def _bound(prepared: rk.Prepared) -> str:
    """'bound' when every compiled launch of `prepared` forms its descriptors itself, else what is not."""
    states = []
    for launch in prepared.launches.values():
        for _, raw, descs in launch._compiled.values():
            states.append("bound" if raw is not None and descs is not None else f"raw={raw is not None}")
    return ",".join(sorted(set(states))) or "-"


def _encode_us(prepared: rk.Prepared, a: torch.Tensor, n: int = 2000) -> float:
    """µs to encode one ragged-view descriptor of `a` the way a bound launch does (Triton's fill function)."""
    _, _, descs = next(iter(prepared.launches[True, True]._compiled.values()))
    fill, fixed = descs.slots[-1][2]  # the first descriptor argument (a's view): fill function, static args
    start = time.perf_counter()
    for _ in range(n):
        fill(a.data_ptr(), *fixed)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["deepseek3-test", "qwen3-30b-a3b"])
    p.add_argument("--calls", type=int, default=400)
    args = p.parse_args()
    dev = torch.device("cuda")
    for name in args.shapes:
        s = get_shape(name)
        m, k, n, g = s.M, s.K, s.N, s.E
        a = torch.randn(1, m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(1, m, n, device=dev, dtype=torch.bfloat16)
        sizes = torch.full((g,), m // g, device=dev, dtype=torch.int32)
        preps = {c: rk.Prepared(a, b, g, torch.bfloat16, cfg, from_sizes=True) for c, cfg in CONFIGS.items()}
        calls = {c: (lambda p=p, a=a, b=b, sizes=sizes: p(a, b, sizes)) for c, p in preps.items()}
        timings = time_host_interleaved(calls, dev, calls=args.calls, repeats=5, warmup=20, chunk=16)
        for c, t in timings.items():
            print(f"{name:16s} {c:11s} host {t.host_us:7.1f} µs  device {t.device_us:7.1f} µs  "
                  f"launch {_bound(preps[c])}  tma_load={preps[c].tma_load}")
        print(f"{name:16s} one ragged-view descriptor encode: {_encode_us(preps['tma-loads'], a):.1f} µs")


if __name__ == "__main__":
    main()
