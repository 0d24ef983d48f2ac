"""Where one MoE layer's forward+backward spends device time: CUPTI kernel sums per phase, per variant.

    python benchmarks/layer_profile.py --configs gpt-oss-like deepseek3-671b-reduced --tokens 8192 32768

For each (config, tokens, variant) the layer of `ragdot moe-bench --layer` (same construction, same seeds) runs
`--warmup` steps, then one forward and one backward each under torch.profiler (device clock: the kernels' own
time, no host time, no gaps). Prints the largest kernels of each phase with their share, and writes all rows to
`--out` as JSON. Variants are those of `moe-bench --layer` (peer, sparse-auto, sparse-unfused, ...).
`--modes eager compile` profiles each also as `moe-bench --layer` compiles it (`torch.compile`, inductor,
fullgraph, static shapes), so the kernels the compiled step adds, drops or slows show beside the eager step's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ragdot.bench.models import profile_step
from ragdot.bench.moe_layer import _forward, bench_layer, layer_inputs
from ragdot.moe.model import LAYER_CONFIGS


def _phases(fn, x: torch.Tensor, dy: torch.Tensor, top: int) -> dict[str, dict]:
    holder: dict[str, torch.Tensor] = {}

    def forward() -> None:
        holder["y"] = fn(x)

    def backward() -> None:
        holder.pop("y").backward(dy)

    return {"forward": profile_step(forward, x.device, top), "backward": profile_step(backward, x.device, top)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["gpt-oss-like", "deepseek3-671b-reduced"])
    p.add_argument("--tokens", nargs="+", type=int, default=[8192])
    p.add_argument("--variants", nargs="+", default=["peer", "sparse-auto"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", nargs="+", choices=("eager", "compile"), default=["eager"])
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--out", type=Path, default=None, help="JSON file for all rows")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    rows = []
    for name in args.configs:
        cfg = LAYER_CONFIGS[name]
        layer = bench_layer(cfg, device, dtype)
        for t in args.tokens:
            x, dy = layer_inputs(cfg, t, device, dtype)
            flops = 18 * t * cfg.top_k * cfg.dim * cfg.moe_hidden
            for variant, mode in [(v, m) for v in args.variants for m in args.modes]:
                fn = _forward(layer, variant)
                if mode == "compile":
                    torch._dynamo.reset()
                    fn = torch.compile(fn, fullgraph=True, dynamic=False)
                for _ in range(args.warmup):
                    fn(x).backward(dy)
                    layer.zero_grad(set_to_none=True)
                    x.grad = None
                phases = _phases(fn, x, dy, args.top)
                layer.zero_grad(set_to_none=True)
                x.grad = None
                total = sum(ph["kernel_ms"] for ph in phases.values())
                print(f"\n== {name} T={t} {variant} {mode}: kernels {total:.3f} ms (device clock), "
                      f"{flops / total / 1e9:.0f} TFLOP/s of expert GEMM work over all kernel time")
                for phase, ph in phases.items():
                    print(f"  {phase}: {ph['kernel_ms']:.3f} ms")
                    for item in ph["top_kernels"].split("; "):
                        kname, _, ms = item.rpartition("=")
                        print(f"    {float(ms):8.3f} ms {100 * float(ms) / total:5.1f}%  {kname}")
                rows.append({"config": name, "tokens": t, "variant": variant, "mode": mode, "kernel_ms": total, **{
                    f"{k}_{f}": v for k, ph in phases.items() for f, v in ph.items()}})
            del x, dy
        del layer
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
