"""One weight-gradient (or forward) cell timed the tuner's way and the call path's way, in one process.

    python3 benchmarks/tune_vs_call.py --shape llama4-17b-16e --cls wgrad_wi
    python3 benchmarks/tune_vs_call.py --shape 64,32,32,4 --cls wgrad_wo --device cpu     # a dry run

Why: in every balanced anchor run since the Triton weight gradient read through ragged TMA views, `auto` trails
the forced `triton` system on three cells (docs/gluon.md, "Where `auto` trails the Triton kernel"), because the
shipped tune measured that backend's tile slower than every bench has. The two measurements differ in how the
kernel is called, not in the kernel. Here the same candidates (the tuned entry's best tile of each backend,
the default where there is no entry, and the vendor) are timed three ways, all on CUDA-graph replays:

- `tuner`: `ragdot.tune.tuner.measure_problem`, as `ragdot tune` runs it (every candidate writes one shared
  output through its prepared kernel, the candidates interleaved);
- `own-out`: each candidate's prepared call allocating its own output (`system_call`), interleaved;
- `call`: `ragdot.ragged_dot_general` with the backend forced (as `ragdot bench`'s systems call it: the
  entry's tile, its own output, the cached call path), interleaved with the raw vendor call.

Prints one line per (way, system, routing): median ms. Clock: graph replays (device time) on CUDA, the wall
clock on a CPU (a dry run of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_gpu import CELL_CLASSES, named_cell, system_call  # noqa: E402

from ragdot.cli_common import error_line  # noqa: E402


def _candidates(problem: str, a, b, e: int, names: list[str]) -> list[tuple[str, object]]:
    """(backend, config) per backend: the tuned entry's best config (None: the backend's default)."""
    from ragdot.tune.key import key_for
    from ragdot.tune.select import entry_config, tuned_entry

    entry = tuned_entry(key_for(problem, a, b, e, a.dtype))
    return [(name, entry_config(entry, name)) for name in names]


def _user_call(cls: str, ops, sizes, backend: str):
    """The public call of the cell with `backend` forced: ragged_dot_general on the user's tensors."""
    import ragdot

    problem, a, b, mat_a, mat_b = ops
    if problem == "ragged_k":  # a [1, R, M], b [1, R, N]: contract the ragged token dimension
        dn = ragdot.RaggedDotDimensionNumbers(dot_dimension_numbers=(((0,), (0,)), ((), ())),
                                              lhs_ragged_dimensions=(0,), rhs_group_dimensions=())
        lhs, rhs = a[0], b[0]
    else:
        dn = ragdot.RaggedDotDimensionNumbers(dot_dimension_numbers=(((1,), (1,)), ((), ())),
                                              lhs_ragged_dimensions=(0,), rhs_group_dimensions=(0,))
        lhs, rhs = a[0], b[0]
    return lambda: ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend=backend)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama4-17b-16e", help="anchor shape name or 'M,K,N,E'")
    parser.add_argument("--cls", default="wgrad_wi", choices=CELL_CLASSES)
    parser.add_argument("--routings", nargs="+", default=["balanced", "skewed"], choices=("balanced", "skewed"))
    parser.add_argument("--backends", nargs="+", default=["triton", "gluon"], metavar="BACKEND")
    parser.add_argument("--iters", type=int, default=20, help="replays per sample (the tuner's default: 20)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run, fp32)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ValueError as exc:
        return error_line("tune_vs_call", exc)


def _run(args: argparse.Namespace) -> int:
    import ragdot
    from ragdot.measure.timing import Timed, measure
    from ragdot.routing import group_sizes
    from ragdot.tune.tuner import label, measure_problem

    if args.iters < 1:
        raise ValueError(f"--iters must be >= 1, got {args.iters}")
    shape, ops = named_cell(args.shape, args.cls, args.device)
    problem, a, b = ops[:3]
    dev = a.device
    usable = [n for n in args.backends if n in ragdot.backends()]
    if not usable:
        raise ValueError(f"--backends: none of {args.backends} is usable here (usable: {', '.join(ragdot.backends())})")
    cands = _candidates(problem, a, b, shape.E, usable)
    graphs = dev.type == "cuda"
    clock = "graph replays" if graphs else "wall clock (CPU dry run)"
    print(f"{shape.name} {args.cls}: {', '.join(label(c) for c in cands)} and the vendor; {clock}, median ms")
    tuned = measure_problem(problem, a, b, shape.E, a.dtype, [*cands, ("torch", None)], routings=args.routings,
                            warmup=3, iters=args.iters)
    for routing in args.routings:
        for name, times in sorted(tuned.items()):
            if routing in times:
                print(f"tuner    {routing:8s} {name:40s} {times[routing]:.5f}")
        sizes = group_sizes(routing, shape.M, shape.E, device=dev)
        systems = [Timed(label(c), [system_call(c[0], ops, sizes, shape.E, c[1])]) for c in cands]
        systems.append(Timed("vendor", [system_call("vendor", ops, sizes, shape.E)]))
        for name, timing in measure(systems, dev, warmup=3, iters=args.iters, graphs=graphs).items():
            print(f"own-out  {routing:8s} {name:40s} {timing.median:.5f}")
        calls = [Timed(f"call:{c[0]}", [_user_call(args.cls, ops, sizes, c[0])]) for c in cands]
        calls.append(Timed("vendor", [system_call("vendor", ops, sizes, shape.E)]))
        for name, timing in measure(calls, dev, warmup=3, iters=args.iters, graphs=graphs).items():
            print(f"call     {routing:8s} {name:40s} {timing.median:.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
