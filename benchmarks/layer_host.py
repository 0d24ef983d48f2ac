"""Where one MoE layer's eager forward+backward spends host time: wall time per phase, then cProfile per phase.

    python benchmarks/layer_host.py --configs qwen3-30b-a3b deepseek2-16b --tokens 4096 --steps 20 --top 30

Per config: ``MoELayer`` (bf16, sparse path, its defaults: the fused block where ``preferred``) on x [tokens, dim];
the host's wall time of the forward call and of ``y.backward(dy)`` (the calling thread, no synchronisation inside
a step: the device runs behind), median of --steps; then the same steps under cProfile, the forward and the
backward profiled apart (the backward with autograd's device threads off, so that its Python runs on the
profiled thread; its wall time that way is printed too). `--modes eager compile` times the layer also as
`moe-bench --layer` compiles it (`torch.compile`, inductor, fullgraph, static shapes). Clock: host
(time.perf_counter). CUDA only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

if not os.environ.get("PYTHONPATH"):  # this checkout's ragdot unless PYTHONPATH names one
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ragdot.moe.layer import MoELayer  # noqa: E402
from ragdot.moe.model import get_config  # noqa: E402


def _phases(layer, x, dy, steps: int, profiles=None, fn=None) -> tuple[float, float]:
    fn = layer if fn is None else fn
    fwd, bwd = [], []
    for _ in range(steps):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if profiles:
            profiles[0].enable()
        y = fn(x)
        if profiles:
            profiles[0].disable()
        t1 = time.perf_counter()
        if profiles:
            profiles[1].enable()
        y.backward(dy)
        if profiles:
            profiles[1].disable()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
    torch.cuda.synchronize()
    return statistics.median(fwd) * 1e3, statistics.median(bwd) * 1e3


def _top(profile: cProfile.Profile, top: int, steps: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    return f"(totals over {steps} steps)\n" + text[text.find("   ncalls"):]


def run(name: str, tokens: int, steps: int, top: int, mode: str = "eager") -> str:
    cfg = get_config(name)
    device = torch.device("cuda")
    torch.manual_seed(0)
    layer = MoELayer(cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, path="sparse", dtype=torch.bfloat16,
                     device=device)
    x = torch.randn(tokens, cfg.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, cfg.dim, device=device, dtype=torch.bfloat16)
    fn = layer
    if mode == "compile":
        torch._dynamo.reset()
        fn = torch.compile(layer, fullgraph=True, dynamic=False)
    _phases(layer, x, dy, 3, fn=fn)
    fwd, bwd = _phases(layer, x, dy, steps, fn=fn)
    lines = [f"== {name} T={tokens} {mode} (fused block: {layer.uses_fused(x)}): host ms per phase, device threads "
             f"on: forward {fwd:.3f}, backward {bwd:.3f}"]
    previous = torch.autograd.is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(False)
    try:
        fwd1, bwd1 = _phases(layer, x, dy, steps, fn=fn)
        lines.append(f"   device threads off: forward {fwd1:.3f}, backward {bwd1:.3f}")
        profiles = (cProfile.Profile(), cProfile.Profile())
        _phases(layer, x, dy, steps, profiles, fn=fn)
    finally:
        torch.autograd.set_multithreading_enabled(previous)
    lines.append("-- forward, cProfile by own time " + _top(profiles[0], top, steps))
    lines.append("-- backward, cProfile by own time " + _top(profiles[1], top, steps))
    layer.aux_loss = layer.z_loss = None
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["qwen3-30b-a3b", "deepseek2-16b"])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--modes", nargs="+", choices=("eager", "compile"), default=["eager"])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("layer_host.py: needs a CUDA device", file=sys.stderr)
        return 2
    for name in args.configs:
        for mode in args.modes:
            print(run(name, args.tokens, args.steps, args.top, mode), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
