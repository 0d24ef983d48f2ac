"""In-process A/B of the fused block's routing index: one launch (`routing_kernels.routing_index` with Triton)
against the torch forms it replaced (a division, an arange and a scatter), in one MoE layer's eager step.

    PYTHONPATH=src python3 benchmarks/index_ab.py --configs qwen3-30b-a3b deepseek2-16b --tokens 8192

Per config: `MoELayer` (bf16, sparse, the fused block) on x [tokens, dim]; the two arms alternate round by round
(`--rounds`, one untimed step after each switch, then `--steps` timed ones): host clock per phase (wall time of
the forward call and of `backward`, no sync inside a step), eager clock per step (CUDA events around forward and
backward, host time included), the kernels one step launches (torch.profiler's count), and whether the two
arms' outputs and gradients are bitwise equal. CUDA only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ragdot.moe import fused
from ragdot.moe import routing_kernels as rk
from ragdot.moe.layer import MoELayer
from ragdot.moe.model import get_config

_KERNEL = rk.routing_index


def _torch_forms(order, top_k, impl):
    return _KERNEL(order, top_k, "torch")


def _arm(name: str) -> None:
    fused._rk.routing_index = _KERNEL if name == "kernel" else _torch_forms


def _step(layer, x, dy) -> tuple[float, float, float]:
    layer.zero_grad(set_to_none=True)
    x.grad = None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    t0 = time.perf_counter()
    y = layer(x)
    t1 = time.perf_counter()
    y.backward(dy)
    t2 = time.perf_counter()
    end.record()
    end.synchronize()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, start.elapsed_time(end)


def _kernels(layer, x, dy) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(layer, x, dy)
    return sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")


def run(name: str, tokens: int, rounds: int, steps: int) -> str:
    cfg = get_config(name)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layer = MoELayer(cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, path="sparse", dtype=torch.bfloat16,
                     device=dev)
    gen = torch.Generator(device=dev).manual_seed(tokens)
    x = torch.randn(tokens, cfg.dim, generator=gen, device=dev, dtype=torch.bfloat16).requires_grad_(True)
    dy = torch.randn(tokens, cfg.dim, generator=gen, device=dev, dtype=torch.bfloat16)
    arms = ("kernel", "torch-forms")
    results, times = {}, {a: [] for a in arms}
    for arm in arms:
        _arm(arm)
        y = layer(x)
        y.backward(dy)
        results[arm] = [y.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in layer.parameters())]
        layer.zero_grad(set_to_none=True)
        x.grad = None
    equal = all(torch.equal(a, b) for a, b in zip(*results.values(), strict=True))
    counts = {}
    for _ in range(rounds):
        for arm in arms:
            _arm(arm)
            _step(layer, x, dy)
            times[arm] += [_step(layer, x, dy) for _ in range(steps)]
    for arm in arms:
        _arm(arm)
        counts[arm] = _kernels(layer, x, dy)
    _arm("kernel")
    lines = [f"== {name} T={tokens} (fused block: {layer.uses_fused(x)}), bitwise equal: {equal}"]
    for arm in arms:
        fwd, bwd, step = (statistics.median(t[i] for t in times[arm]) for i in range(3))
        lines.append(f"  {arm:12s} host forward {fwd:.3f} ms, host backward {bwd:.3f} ms (host clock); "
                     f"step {step:.3f} ms (eager clock); {counts[arm]} kernels a step")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["qwen3-30b-a3b", "deepseek2-16b"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("index_ab.py: needs a CUDA device", file=sys.stderr)
        return 2
    for name in args.configs:
        for t in args.tokens:
            print(run(name, t, args.rounds, args.steps), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
