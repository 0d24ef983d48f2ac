"""`ragdot bench`: the six ragged-dot classes over the MoE shapes, every backend, checked then timed.

    ragdot bench                          # CPU: the quick set; CUDA: all 11 MoE shapes (tag seed), bf16
    ragdot bench --anchors --routing balanced skewed --out benchmarks/results
    ragdot bench --shapes mixtral-8x7b 4096,1024,512,8 --classes fwd_wi wgrad_wi --backends torch auto
    ragdot bench --anchors --clocks graph # device time only (--cuda-graphs says the same)
    ragdot bench --dry-run                # the plan and its time estimate, nothing run

Every system's output is compared with the `reference` backend on the very inputs of the cell before it
is timed: a wrong one is reported as "wrong" and not timed; out-of-memory is "OOM", an unsupported case
"n/a". The system `vendor` (raw torch._grouped_mm, the baseline of every speed ratio) is in every run where
torch has it (--no-vendor leaves it out). On CUDA every system is timed on two clocks, interleaved:
`eager` (CUDA events around batches of back-to-back eager calls, host time included) and `graph`
(CUDA-graph replays, device time); a CPU has one, `wall`. Writes
<out>/ragdot-bench-<gpu>-<commit>-<date>.csv (+ .json, + .md summary, + PNG plots); the CSV gets the rows of
each shape as it finishes, so an interrupted run keeps them. An earlier run's files are never overwritten.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ragdot.cli_common import (
    add_device,
    add_dtype,
    add_out,
    add_quiet,
    add_shapes,
    add_targets,
    check_out,
    count,
    error_line,
    new_stem,
    parse_device,
    parse_dtype,
    parse_shape_args,
    positive,
    safe_name,
    seconds,
)
from ragdot.measure import records

HELP = "micro-benchmark: six ragged-dot classes x MoE shapes x backends (checked, then timed)"

_ORDER = ("vendor", "padded", "torch", "triton", "auto", "xla", "ragdot-jax", "tokamax", "reference")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ragdot.measure.classes import CLASS_NAMES
    from ragdot.measure.timing import CLOCKS, DEFAULT_ROUNDS, EAGER_BATCH
    from ragdot.routing import ROUTINGS

    add_shapes(parser, "tag:seed on CUDA, tag:tiny on a CPU")
    parser.add_argument("--anchors", action="store_true",
                        help="only the 8 shapes with reference numbers measured on an H200")
    parser.add_argument(
        "--classes",
        nargs="+",
        choices=CLASS_NAMES,
        metavar="CLASS",
        help=f"classes to run (default all: {' '.join(CLASS_NAMES)})",
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        metavar="NAME",
        help="ragdot backends, 'auto', 'xla', 'vendor', 'ragdot-jax', 'tokamax' (default: all usable here but the "
        "last two; vendor is always added)",
    )
    parser.add_argument("--no-xla", action="store_true", help="leave out jax.lax.ragged_dot_general")
    parser.add_argument(
        "--no-vendor", action="store_true", help="leave out the baseline `vendor` (raw torch._grouped_mm)"
    )
    parser.add_argument(
        "--routing",
        nargs="+",
        choices=ROUTINGS,
        default=["balanced"],
        help="group-size patterns (default: balanced)",
    )
    add_dtype(parser, "bf16 on CUDA, fp32 on a CPU")
    parser.add_argument("--warmup", type=count(0), help="warm-up calls per system and cell (default 10; quick 2)")
    parser.add_argument("--iters", type=count(1), help="timed calls per system and cell (default 50; quick 5)")
    parser.add_argument(
        "--max-seconds",
        type=seconds,
        help="time budget per system, clock and cell; slow systems get fewer iterations, at least 3 "
        "(default 1.0 on CUDA, 0.25 on CPU; 0 = unbounded)",
    )
    parser.add_argument("--rounds", type=count(1), default=DEFAULT_ROUNDS,
                        help=f"interleaved rounds per cell, at most one per iteration (default {DEFAULT_ROUNDS})")
    parser.add_argument(
        "--clocks",
        nargs="+",
        choices=CLOCKS,
        metavar="CLOCK",
        help=f"CUDA clocks, both by default: eager (CUDA events around batches of up to {EAGER_BATCH} "
        "back-to-back eager calls, a call of 5 ms or more alone; host time included) and graph (CUDA-graph "
        "replays: device time; the JAX systems: n calls in one jitted program); a CPU has one, wall",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="the same as --clocks graph: device time only, without Python/launch overhead",
    )
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few iterations (CI, CPU)")
    add_device(parser)
    add_out(parser, "out/bench", "CSV, JSON, summary and plots")
    add_quiet(parser)
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--peak-tflops", type=positive, help="use this matmul peak instead of measuring it")
    parser.add_argument(
        "--bandwidth-gbs", type=positive, help="use this bandwidth (GB/s) instead of measuring it"
    )
    add_targets(parser, "vendor and torch TFLOP/s (section bench.anchors) and to take --dry-run's ceilings from")
    parser.add_argument("--commit", help="commit id for the records (default: git rev-parse --short HEAD)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--dry-run", action="store_true",
        help="print the plan and time estimate, run nothing (the ceilings are still measured, about a second, "
        "unless --peak-tflops and --bandwidth-gbs or the --targets file give them)",
    )


def _systems(args: argparse.Namespace, device: Any, console: Any) -> list[Any]:
    import torch

    import ragdot
    from ragdot.backends import BACKEND_NAMES
    from ragdot.bench.systems import AUTO, JAX_SYSTEMS, VENDOR, RagdotSystem, VendorSystem

    usable = ragdot.backends()
    known = (*BACKEND_NAMES, AUTO, "xla", VENDOR, *JAX_SYSTEMS)
    wanted = args.backends or [*usable, AUTO, *([] if args.no_xla else ["xla"])]
    for name in wanted:
        if name not in known:
            raise ValueError(f"--backends: {name!r} is unknown; expected some of {', '.join(known)}")
    wanted = [n for n in wanted if n != VENDOR] if args.no_vendor else [VENDOR, *wanted]
    names = [n for n in _ORDER if n in wanted] + list(dict.fromkeys(n for n in wanted if n not in _ORDER))
    systems = []
    for name in names:
        if name == "xla":
            if args.no_xla:
                continue
            from ragdot.bench.xla import XlaSystem, xla_unavailable_reason

            reason = xla_unavailable_reason(device)
            if reason:
                console.print(f"[yellow]xla left out: {reason}[/]")
                continue
            systems.append(XlaSystem(device))
        elif name in JAX_SYSTEMS:
            from ragdot.bench.jax_system import jax_system

            system, reason = jax_system(name, device)
            if reason:
                console.print(f"[yellow]{name} left out: {reason}[/]")
                continue
            systems.append(system)
        elif name == VENDOR:
            if not hasattr(torch, "_grouped_mm"):
                console.print("[yellow]vendor left out: this torch has no torch._grouped_mm[/]")
                continue
            systems.append(VendorSystem())
        elif name != AUTO and name not in usable:
            console.print(f"[yellow]{name} left out: not usable here (usable: {', '.join(usable)})[/]")
        else:
            systems.append(RagdotSystem(name))
    return systems


def _clocks(args: argparse.Namespace, cuda: bool) -> tuple[str, ...]:
    """The clocks asked for: --clocks, --cuda-graphs (graph only), else both; ("wall",) on a CPU."""
    from ragdot.measure.timing import CLOCKS, GRAPH, WALL, parse_clocks

    if args.cuda_graphs and args.clocks and tuple(args.clocks) != (GRAPH,):
        raise ValueError("--cuda-graphs means --clocks graph; give one of them")
    clocks = parse_clocks(args.clocks) if args.clocks else (GRAPH,) if args.cuda_graphs else CLOCKS
    return clocks if cuda else (WALL,)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ValueError as exc:  # a bad option value: say which, no traceback
        return error_line("bench", exc)


def _run(args: argparse.Namespace) -> int:
    import torch

    from ragdot.bench import plan, plots, report
    from ragdot.bench.ceilings import Ceilings, measure_ceilings
    from ragdot.bench.runner import BenchConfig, run_cell
    from ragdot.measure.classes import CLASSES, parse_classes
    from ragdot.measure.console import HAVE_RICH, Console, Progress, progress_columns
    from ragdot.measure.progress import KeepOnInterrupt
    from ragdot.measure.progress import Progress as Eta
    from ragdot.measure.targets import load_targets, section
    from ragdot.measure.timing import EAGER_BATCH
    from ragdot.shapes import shapes_with_tag

    console = Console(width=None if sys.stdout.isatty() else 180, quiet=args.quiet)
    device = parse_device(args.device)
    cuda = device.type == "cuda"
    out = check_out(args.out)
    quick = args.quick or (not cuda and not args.shapes and not args.anchors)
    if args.shapes:
        shapes = parse_shape_args(args.shapes)
    else:
        shapes = shapes_with_tag("tiny" if quick else "anchor" if args.anchors else "seed")
    if args.anchors:
        shapes = [s for s in shapes if "anchor" in s.tags or "tiny" in s.tags]
    classes = parse_classes(args.classes) if args.classes else list(CLASSES)
    dtype = parse_dtype(args.dtype, "bf16" if cuda else "fp32")
    warmup = args.warmup if args.warmup is not None else (2 if quick else 10)
    iters = args.iters if args.iters is not None else (5 if quick else 50)
    max_s = args.max_seconds if args.max_seconds is not None else (1.0 if cuda else 0.25)
    if dtype == torch.float32:  # full float32, as the tolerance assumes
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    clocks = _clocks(args, cuda)
    systems = _systems(args, device, console)
    names = [s.name for s in systems]
    gpu = records.gpu_name(device)
    targets = load_targets(args.targets)
    given = section(targets, "ceilings", gpu)
    if args.peak_tflops and args.bandwidth_gbs:
        ceilings = Ceilings(args.peak_tflops * 1e12, args.bandwidth_gbs * 1e9, source="given")
    elif args.dry_run and "bf16_tflops" in given and "hbm_gbs" in given:
        ceilings = Ceilings(given["bf16_tflops"] * 1e12, given["hbm_gbs"] * 1e9, source=f"from {args.targets}")
    else:
        ceilings = measure_ceilings(device, dtype)
    memory = torch.cuda.get_device_properties(device).total_memory if cuda else None
    n_cells = len(shapes) * len(classes) * len(args.routing)

    def estimate(some: list[Any]) -> float:
        n_routings = len(args.routing)
        return plan.run_seconds(
            names, some, classes, n_routings, ceilings, dtype.itemsize, warmup, iters, max_s, cuda, memory,
            clocks=len(clocks),
        )

    est = estimate(shapes)
    dtype_name = str(dtype).removeprefix("torch.")
    console.print(
        f"ragdot bench on {gpu} ({device}), {dtype_name}: {len(shapes)} shapes x {len(classes)} classes x "
        f"{len(args.routing)} routings = {n_cells} cells; systems: {', '.join(names)}; "
        f"clocks: {', '.join(clocks)}\n"
        f"ceilings ({ceilings.label}): {ceilings.peak_tflops:.1f} TFLOP/s, "
        f"{ceilings.bandwidth_gbs:.0f} GB/s; warm-up {warmup}, iters {iters}, "
        f"budget {max_s or 'unbounded'} s per system, clock and cell; estimated time {est / 60:.1f} min"
    )
    if args.dry_run:
        return 0

    cfg = BenchConfig(
        device,
        dtype,
        ceilings,
        warmup,
        iters,
        max_s or None,
        args.rounds,
        args.seed,
        clocks=clocks,
    )
    base = records.run_meta(device, commit_id=args.commit)
    commit = base["commit"]
    meta = {
        "gpu": gpu,
        "commit": commit,
        "date": base["date"],
        "dtype": dtype_name,
        "torch": base["torch"],
        "device": str(device),
        "peak_tflops": ceilings.peak_tflops,
        "bandwidth_gbs": ceilings.bandwidth_gbs,
        "ceilings": ceilings.source,
        "ceilings_busy": ceilings.busy,
        "clocks": list(clocks),
        "cuda_graphs": clocks == ("graph",),
        "eager_batch": EAGER_BATCH if "eager" in clocks else None,  # the most; each row has its own `batch`
        "warmup": warmup,
        "iters": iters,
        "max_seconds": max_s,
        "seconds": None,
        "argv": sys.argv[1:],
    }
    stem = new_stem(out, f"ragdot-bench-{safe_name(gpu)}-{safe_name(commit)}")
    results = []
    if not HAVE_RICH:
        console.print("rich is not installed: plain-text tables and progress (pip install rich for the full view)")
    if ceilings.busy:
        console.print(f"[yellow]warning: the ceilings were measured on a busy machine ({ceilings.busy}); "
                      "% of speed of light is overstated[/]")
    eta = Eta(est, len(shapes), say=lambda line: progress.console.print(line, markup=False))
    with Progress(*progress_columns(), console=console, transient=True) as progress, KeepOnInterrupt(results) as kept:
        task = progress.add_task("cells", total=n_cells)
        for shape in shapes:
            for cls in classes:
                for routing in args.routing:
                    progress.update(task, description=f"{shape.name} {cls.name} {routing}")
                    results += run_cell(shape, cls, routing, systems, cfg)
                    progress.advance(task)
            # Keep what is measured so far: an interrupted run still leaves its rows behind.
            report.write_csv(report.result_rows(results, meta), out / f"{stem}.csv")
            eta.done(shape.name, estimate([shape]))

    meta["seconds"] = round(eta.elapsed, 1)
    rows = report.result_rows(results, meta)
    files = [
        report.write_csv(rows, out / f"{stem}.csv"),
        report.write_json(rows, meta, out / f"{stem}.json"),
    ]
    title = f"ragdot bench, {gpu}, {meta['dtype']}, {commit}"
    notes = [f"ceilings measured on a busy machine ({ceilings.busy}): % of speed of light is overstated"] * bool(
        ceilings.busy)
    files.append(report.write_markdown(rows, title, out / f"{stem}.md", notes))
    anchors = section(targets, "bench", gpu).get("anchors")
    if anchors and anchors.get("dtype", dtype_name) != dtype_name:
        anchors = None
    report.print_tables(results, console, title, anchors=anchors)
    if ceilings.busy:
        console.print(f"[yellow]warning: ceilings measured on a busy machine ({ceilings.busy})[/]")
    if not args.no_plots:
        files += plots.plot_results(results, out, stem, title)
    print(f"done in {meta['seconds']} s; wrote " + ", ".join(str(f) for f in files))
    bad = [r for r in results if r.status in ("wrong", "error")]
    for r in bad:
        print(f"{r.status}: {r.backend} on {r.shape.name} {r.cls} {r.routing}: err={r.err} {r.note}", file=sys.stderr)
    return kept.status or (1 if bad else 0)
