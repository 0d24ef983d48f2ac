"""A/B of one MoE layer's eager forward+backward under two settings of ragdot's module-level switches.

    python benchmarks/layer_ab.py --set ragdot.tune.select.GLUON_WGRAD_FIRST=0 --configs gpt-oss-like --tokens 8192
    python benchmarks/layer_ab.py --set-a ragdot.kernels.ragged_m.TMA_STORE=False \\
        --set ragdot.kernels.ragged_m.TMA_STORE=True --configs gpt-oss-like qwen3-30b-a3b --peer

The layer is `ragdot moe-bench --layer`'s (same construction and seeds, bf16, variant sparse-auto: the default
`MoELayer(path="sparse")`). Arm A runs with the `--set-a` settings (default: none, the code as it is), arm B with
the `--set` ones; values are Python literals (1, 0, True, "tma"). Each round runs A then B (then `peer` with
`--peer`): the settings applied, every prepared call re-planned (the tune cache's generation bumped, so `auto`
chooses again), `--warmup` steps, then `--steps` steps on the **eager clock** (CUDA events around each step, the
device synchronised before it, host time included, as `moe-bench --layer` times it) with their host ms (issuing
the step, no wait). Rows per round and arm, and the medians over rounds: `B / A` below 1 means B is faster.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ragdot.bench.moe_layer import _forward, bench_layer, layer_inputs, time_step  # noqa: E402
from ragdot.moe.model import get_config  # noqa: E402
from ragdot.tune.cache import CACHE  # noqa: E402


def parse_setting(text: str) -> tuple[object, str, object]:
    """'pkg.module.NAME=VALUE' -> (module, NAME, value); a ValueError naming the setting otherwise."""
    target, sep, value = text.partition("=")
    module_name, _, name = target.rpartition(".")
    if not sep or not module_name or not name:
        raise ValueError(f"--set {text!r}: expected module.NAME=VALUE")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise ValueError(f"--set {text!r}: {module_name} has no {name}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    return module, name, parsed


def apply(settings: list[tuple[object, str, object]], defaults: list[tuple[object, str, object]]) -> None:
    """Restore every switch either arm sets to its default (`defaults`: (module, name, value) as found), then set
    this arm's; `auto` chooses again."""
    for module, name, value in [*defaults, *settings]:
        setattr(module, name, value)
    CACHE.generation += 1  # every prepared call looks its runner up again


def compare(layer, x: torch.Tensor, dy: torch.Tensor, arms: dict, defaults: list, args: argparse.Namespace,
            name: str) -> str:
    """The interleaved rounds of one layer on x [T, dim] with cotangent dy; returns the summary line."""
    device = x.device

    def reset() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None

    systems = {"A": "sparse-auto", "B": "sparse-auto", **({"peer": "peer"} if args.peer else {})}
    medians: dict[str, list[float]] = {s: [] for s in systems}
    for r in range(args.rounds):
        for label, variant in systems.items():
            apply(arms.get(label, []), defaults)
            fn = _forward(layer, variant)
            t = time_step(lambda fn=fn: fn(x).backward(dy), reset, device, args.warmup, args.steps, float("inf"))
            medians[label].append(t["ms"])
            print(f"{name} round {r} {label:4s} {t['ms']:8.3f} ms  host {t['host_ms']:6.3f} ms", flush=True)
    apply([], defaults)
    a, b = statistics.median(medians["A"]), statistics.median(medians["B"])
    line = f"{name} A {a:.3f} ms  B {b:.3f} ms  B / A {b / a:.3f}"
    if args.peer:
        p = statistics.median(medians["peer"])
        line += f"  peer {p:.3f} ms  (x peer: A {p / a:.3f}, B {p / b:.3f})"
    return line + "  [eager clock]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", dest="set_b", nargs="+", default=[], metavar="MODULE.NAME=VALUE", help="arm B")
    ap.add_argument("--set-a", nargs="+", default=[], metavar="MODULE.NAME=VALUE", help="arm A (default: none)")
    ap.add_argument("--configs", nargs="+", default=["gpt-oss-like"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[8192])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--peer", action="store_true", help="time the plain-PyTorch layer too, each round")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("layer_ab.py: needs a CUDA device", file=sys.stderr)
        return 2
    try:
        arms = {"A": [parse_setting(s) for s in args.set_a], "B": [parse_setting(s) for s in args.set_b]}
    except (ValueError, ImportError) as exc:
        print(f"layer_ab.py: {exc}", file=sys.stderr)
        return 2
    defaults = [(module, name, getattr(module, name)) for module, name, _ in arms["A"] + arms["B"]]
    device, dtype = torch.device("cuda"), torch.bfloat16
    for label, settings in arms.items():
        print(f"arm {label}: " + (", ".join(f"{m.__name__}.{n}={v!r}" for m, n, v in settings) or "defaults"))
    for cfg_name in args.configs:
        cfg = get_config(cfg_name)
        layer = bench_layer(cfg, device, dtype)
        for tokens in args.tokens:
            x, dy = layer_inputs(cfg, tokens, device, dtype)
            print(compare(layer, x, dy, arms, defaults, args, f"{cfg_name:24s} T={tokens:<6d}"), flush=True)
            del x, dy
        del layer
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
