"""The MoE layer in a mixed-precision training loop: float32 parameters under torch.autocast, against the same layer
with bfloat16 parameters and against float32 without autocast.

    PYTHONPATH=src python3 benchmarks/autocast_layer.py [--configs qwen3-30b-a3b ...] [--tokens 8192] [--rounds 2]

One forward+backward of `MoELayer(path="sparse")` per step (the cotangent in the output's dtype). Variants, all on
the same weights: `bf16` (bfloat16 parameters and input), `fp32+autocast` (float32 parameters and input inside
`torch.autocast("cuda", torch.bfloat16)`, the backward after the region, as torch's AMP recipe has it), `fp32`
(float32 everything, no autocast). The variants take turns (`--rounds` passes over them); each row is the median
over its passes of the step's median. Clock: CUDA events around each step, host time included (eager), as
`ragdot moe-bench --layer`; memory: the step's peak above what was allocated before it (`step_memory`).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from ragdot.bench.moe_layer import step_memory, time_step
from ragdot.measure.timing import free_memory
from ragdot.moe import MoELayer
from ragdot.moe.model import LAYER_CONFIGS

VARIANTS = ("bf16", "fp32+autocast", "fp32")


def _runner(variant, layer32, layer16, x32, x16):
    if variant == "bf16":
        return layer16, x16, layer16.parameters()
    if variant == "fp32":
        return layer32, x32, layer32.parameters()

    def under_autocast(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return layer32(x)

    return under_autocast, x32, layer32.parameters()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["qwen3-30b-a3b", "deepseek2-16b"])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    for name in args.configs:
        cfg = LAYER_CONFIGS[name]
        torch.manual_seed(0)
        layer32 = MoELayer(cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, path="sparse", device=dev)
        layer16 = MoELayer(cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, path="sparse", device=dev,
                           dtype=torch.bfloat16)
        layer16.load_state_dict(layer32.state_dict())
        for tokens in args.tokens:
            gen = torch.Generator(device=dev).manual_seed(tokens)
            x32 = torch.randn((tokens, cfg.dim), generator=gen, device=dev).requires_grad_()
            x16 = x32.detach().bfloat16().requires_grad_()
            dy = torch.randn((tokens, cfg.dim), generator=gen, device=dev)
            times: dict[str, list] = {v: [] for v in VARIANTS}
            memory = {}
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    fn, x, params = _runner(variant, layer32, layer16, x32, x16)
                    params = list(params)
                    g = dy.to(torch.float32 if variant == "fp32" else torch.bfloat16)

                    def reset(params=params, x=x):
                        for q in params:
                            q.grad = None
                        x.grad = None

                    def step(fn=fn, x=x, g=g):
                        fn(x).backward(g)

                    times[variant].append(time_step(step, reset, dev, 3, args.steps, 2.0))
                    if variant not in memory:
                        reset()
                        memory[variant] = step_memory(fn, x, g, params)
                    reset()
                    free_memory(dev)
            base = statistics.median(t["ms"] for t in times["bf16"])
            for variant in VARIANTS:
                ms = statistics.median(t["ms"] for t in times[variant])
                host = statistics.median(t["host_ms"] for t in times[variant])
                row = {"config": name, "tokens": tokens, "variant": variant, "ms": round(ms, 3),
                       "host_ms": round(host, 3), "vs_bf16": round(base / ms, 3),
                       "peak_mib": round(memory[variant]["peak_mib"], 1), "clock": "event (eager, host included)"}
                rows.append(row)
                print(f"{name:16s} T={tokens:<6d} {variant:14s} {ms:8.3f} ms  host {host:7.3f} ms  "
                      f"x bf16 {base / ms:5.2f}  peak {row['peak_mib']:8.1f} MiB", flush=True)
        del layer32, layer16
        free_memory(dev)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
