"""`ragdot tune`: measure backends and Triton tiles for MoE shapes and store the winners."""

from __future__ import annotations

import argparse

import torch

HELP = "measure backends and Triton tile configs on seeded group sizes; write the tuning cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", nargs="+", default=["seed"],
                   help="shape names, 'M,K,N,E' strings, or a tag (seed, anchor, tiny); default: seed")
    p.add_argument("--classes", nargs="+", default=None, help="ragged-dot classes (default: all six)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--max-configs", type=int, default=8, help="Triton tile configs tried per problem")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--ship", action="store_true",
                   help="write into the package's shipped results for this GPU instead of the user cache")
    p.add_argument("--out", default=None, help="write the entries to this JSON file instead")


def _expand(specs: list[str]):
    """Shapes for names, 'M,K,N,E' strings and tags; a bare tag name means the same as 'tag:NAME'."""
    from ragdot.shapes import TAGS, parse_shapes

    return parse_shapes([f"tag:{spec}" if spec in TAGS else spec for spec in specs])


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    from ragdot.bench.classes import CLASS_NAMES, parse_classes
    from ragdot.dimension_numbers import canonicalize
    from ragdot.tune.cache import CACHE, shipped_path, user_cache_path
    from ragdot.tune.key import device_name, key_for
    from ragdot.tune.tuner import candidates_for, entry_from_times, measure_problem

    console = Console()
    if not torch.cuda.is_available():
        console.print("ragdot tune measures GPU kernels; no CUDA device here, nothing to do.")
        return 0
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    shapes = _expand(args.shapes)
    classes = parse_classes(args.classes or list(CLASS_NAMES))
    if args.out:
        path = Path(args.out)
    elif args.ship:
        path = shipped_path(device_name(device))
    else:
        path = user_cache_path()
    entries: dict[str, dict] = {}
    table = Table(title=f"ragdot tune on {device_name(device)} ({args.dtype})")
    for col in ("shape", "class", "problem", "winner", "ms (bal/skew)", "torch ms (bal/skew)"):
        table.add_column(col)
    jobs = [(s, c) for s in shapes for c in classes]
    for shape, cls in track(jobs, description="tuning", console=console):
        lshape, rshape, _ = cls.shapes(shape)
        lhs = torch.randn(lshape, device=device).to(dtype)
        rhs = torch.randn(rshape, device=device).to(dtype)
        can = canonicalize(lhs, rhs, shape.E, cls.ragdot_dimension_numbers())
        key = key_for(can.mode, can.a, can.b, shape.E, dtype)
        if key.text() in entries:
            continue
        a, b = can.a, can.b
        dims = (a.shape[1], a.shape[2], b.shape[3], shape.E) if can.mode == "ragged_m" else (
            a.shape[2], a.shape[1], b.shape[2], shape.E)
        cands = candidates_for(can.mode, dims, dtype, args.max_configs)
        times = measure_problem(can.mode, can.a, can.b, shape.E, dtype, cands, warmup=args.warmup,
                                iters=args.iters)
        entry = entry_from_times(times, cands)
        del lhs, rhs, can
        torch.cuda.empty_cache()
        if entry is None:
            continue
        entries[key.text()] = entry
        CACHE.put({key.text(): entry}, path)  # as we go: an interrupted run keeps what it measured
        fmt = lambda t: "/".join(f"{t[r]:.3f}" for r in sorted(t))  # noqa: E731
        table.add_row(shape.name, cls.name, key.problem, entry["winner"], fmt(times[entry["winner"]]),
                      fmt(times["torch"]) if "torch" in times else "-")
    console.print(table)
    console.print(f"wrote {len(entries)} entries to {path}")
    return 0
