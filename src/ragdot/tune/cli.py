"""`ragdot tune`: measure backends and Triton tiles for MoE shapes and store the winners."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ragdot.cli_common import (
    UsageError,
    add_device,
    add_dtype,
    add_quiet,
    add_shapes,
    check_out,
    count,
    new_stem,
    parse_device,
    parse_dtype,
    parse_shape_args,
    safe_name,
)

HELP = "measure backends and their tile configs (Triton, Gluon) on seeded group sizes; write the tuning cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ragdot.routing import ROUTINGS

    add_shapes(p, "tag:seed; a bare tag name such as seed means the same")
    p.add_argument("--classes", nargs="+", default=None, help="ragged-dot classes (default: all six)")
    add_dtype(p, "bf16")
    add_device(p, "cuda; tune measures CUDA kernels only")
    p.add_argument("--max-configs", type=count(1), default=8,
                   help="tile configs tried per backend and problem (Triton, Gluon)")
    p.add_argument("--routings", nargs="+", choices=ROUTINGS, default=None, metavar="ROUTING",
                   help="seeded group sizes to time each candidate on; the winner sums its times over them "
                   "(default: balanced skewed routed; routed is one seeded draw of a uniform router)")
    p.add_argument("--warmup", type=count(0), default=5)
    p.add_argument("--iters", type=count(1), default=20)
    p.add_argument("--ship", action="store_true",
                   help="write into the package's shipped results for this GPU instead of the user cache")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="output folder: write the entries to a new ragdot-tune-<gpu>-<date>.json there instead "
                   "of the user cache (same format; an earlier run's file is never overwritten)")
    add_quiet(p)


def _expand(specs: list[str]):
    """Shapes for names, 'M,K,N,E' strings and tags; a bare tag name means the same as 'tag:NAME'."""
    return parse_shape_args(specs)


def _classes(names: list[str] | None):
    from ragdot.measure.classes import CLASS_NAMES, parse_classes

    try:
        return parse_classes(names or list(CLASS_NAMES))
    except ValueError as exc:
        raise UsageError(f"--classes: {exc}") from None


def _out_path(args: argparse.Namespace, device: torch.device) -> Path:
    from ragdot.tune.cache import shipped_path, user_cache_path, write_entries
    from ragdot.tune.key import device_name

    if args.out is None:
        return shipped_path(device_name(device)) if args.ship else user_cache_path()
    if args.ship:
        raise UsageError("--ship and --out name two different destinations; give one of them")
    out = check_out(args.out)
    path = out / f"{new_stem(out, f'ragdot-tune-{safe_name(device_name(device))}', ('.json',))}.json"
    # a valid empty cache from the start (an interrupted run leaves a readable file); the file new_stem created
    # is empty, so it is replaced unread (read, it would be reported corrupt)
    write_entries(path, {}, merge=False)
    return path


def run(args: argparse.Namespace) -> int:
    from ragdot.dimension_numbers import canonicalize
    from ragdot.measure.console import Console, Table, track
    from ragdot.tune.cache import CACHE
    from ragdot.tune.key import device_name, key_for
    from ragdot.tune.tuner import ROUTINGS, candidates_for, entry_from_times, measure_problem

    routings = tuple(args.routings or ROUTINGS)
    console = Console(quiet=args.quiet)
    dtype = parse_dtype(args.dtype, "bf16")
    shapes = _expand(args.shapes or ["seed"])
    classes = _classes(args.classes)
    if args.out is not None:
        check_out(args.out)
    if args.device is None and not torch.cuda.is_available():
        print("ragdot tune measures CUDA kernels; no CUDA device here, nothing to do.")
        return 0
    device = parse_device(args.device, allowed=("cuda",))
    path = _out_path(args, device)
    entries: dict[str, dict] = {}
    table = Table(title=f"ragdot tune on {device_name(device)} ({str(dtype).removeprefix('torch.')})")
    order = "/".join(sorted(routings))
    for col in ("shape", "class", "problem", "winner", f"ms ({order})", f"torch ms ({order})"):
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
        cands = candidates_for(can.mode, dims, dtype, args.max_configs, can.a.device, key.b_kmajor)
        times = measure_problem(can.mode, can.a, can.b, shape.E, dtype, cands, routings=routings,
                                warmup=args.warmup, iters=args.iters)
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
    print(f"wrote {len(entries)} entries to {path}")
    return 0
