"""In-process A/B of the router's kernels (`ragdot.moe.router_losses`, `ragdot.moe.router_topk`) in eager MoE
train steps.

    PYTHONPATH=src python3 benchmarks/router_kernels_ab.py [--configs deepseek3-test deepseek2-16b] [--rounds 6] \
        [--kernels losses topk]

The decoder and step of `ragdot moe-bench` (forward, backward, fused AdamW) per config and variant, timed
eagerly (CUDA events around each step, host time included) with the chosen kernels on (`fused`) and off
(`torch`: the PyTorch form), interleaved round by round in one process: eager steps are host-bound on small
configs and the host's speed differs between processes and machines by up to 1.7x, so only an in-process
comparison tells the change apart. Each round runs one untimed step after the switch, then two timed ones.
Prints the median step per arm and their ratio. CUDA only.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
from unittest import mock

import torch

from ragdot.bench.moe_train import _train_step, training_setup, use_variant
from ragdot.measure.timing import event_ms
from ragdot.moe import router_losses, router_topk
from ragdot.moe.model import get_config

MODULES = {"losses": router_losses, "topk": router_topk}


def _arm(fused: bool, kernels: list[str]) -> contextlib.ExitStack:
    """Patches that turn the chosen kernels off (nothing to patch when `fused`)."""
    stack = contextlib.ExitStack()
    if not fused:
        for name in kernels:
            stack.enter_context(mock.patch.object(MODULES[name], "_fused_applies", lambda logits: False))
    return stack


def _config(name: str, variants: list[str], rounds: int, kernels: list[str], dev: torch.device) -> None:
    cfg = get_config(name)
    model, opt, tokens = training_setup(cfg, dev, torch.bfloat16)
    step = functools.partial(_train_step, model, opt, tokens)
    for variant in variants:
        use_variant(model, variant)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(2):
            step()
        for r in range(rounds):
            for fused in ((True, False) if r % 2 == 0 else (False, True)):
                with _arm(fused, kernels):
                    step()
                    times[fused] += [event_ms(step, dev) for _ in range(2)]
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"{name:16s} {variant:12s} eager step: {'+'.join(kernels)} fused {on:7.2f} ms, torch {off:7.2f} ms "
              f"(torch / fused {off / on:.3f}; {len(times[True])} steps each)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["deepseek3-test", "deepseek2-16b"])
    p.add_argument("--variants", nargs="+", default=["sparse-auto", "dense_drop"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--kernels", nargs="+", default=["losses"], choices=sorted(MODULES))
    args = p.parse_args()
    for name in args.configs:
        _config(name, args.variants, args.rounds, args.kernels, torch.device("cuda"))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
