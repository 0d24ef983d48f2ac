"""`ragdot bench-mxfp8`: the MXFP8 weight gradient against bf16 grouped GEMMs at the MoE shapes.

Per shape and routing it times, interleaved in one process with sustained back-to-back launches (a CUDA event
pair around each window, no per-call synchronisation, several passes in rotated order):
- torch._grouped_mm in bf16 (dY^T [N, T] x X [T, K] -> [G, N, K]), the vendor baseline;
- ragdot's own bf16 weight gradient (ragged_dot_general, contracting mode, backend='triton');
- every MXFP8 kernel variant on pre-quantized operands (path/tile config), checked against the FP32 oracle
  on a few experts first; timing-only strip-downs (scales ignored) bound what each inner step could reach.
Quantization is timed separately. Results go to new files per run, <out>/mxfp8-bench-<gpu>-<date>.csv and .json,
row by row as they finish; a progress line with the time left follows every routing, and a run cut short by
--budget or Ctrl-C keeps its rows. The kernels and the timed run of a shape are in `ragdot.bench.mxfp8_cases`.

    ragdot bench-mxfp8 --shapes 16B 671B-4096        # (the older '--shapes 16B,671B-4096' works too)
    ragdot bench-mxfp8 --shapes 8192,2048,1408,8     # 'M,K,N,E': M tokens (a multiple of 256), K, N, E experts
    TRITON_INTERPRET=1 ragdot bench-mxfp8 --device cpu --shapes tiny --passes 1 --seconds 0  # CPU smoke run
"""

from __future__ import annotations

import argparse
import platform
from dataclasses import asdict

import torch

from ragdot import catalog
from ragdot.bench.mxfp8_cases import Variant, mx_variants, precompile
from ragdot.cli_common import (
    UsageError,
    add_device,
    add_out,
    add_quiet,
    add_shapes,
    add_targets,
    check_out,
    count,
    parse_device,
    parse_shape_args,
    safe_name,
    seconds,
)
from ragdot.measure import records
from ragdot.measure.progress import KeepOnInterrupt, Progress

HELP = "benchmark the MXFP8 grouped weight gradient against bf16 grouped GEMMs (GPU)"

#: (N, K, experts, total tokens) by name: the MXFP8 problems of `ragdot.catalog` (the DeepSeek 16B shape and two
#: 671B shapes, the default set; and a tiny one for smoke runs)
SHAPES: dict[str, tuple[int, int, int, int]] = {p.name: p.dims for p in catalog.mxfp8_problems()}
DEFAULT_SHAPES: tuple[str, ...] = tuple(p.name for p in catalog.mxfp8_problems(tiny=False))
ROUTINGS: tuple[str, ...] = ("aligned", "shifted")
COLUMNS: tuple[str, ...] = ("shape", "routing", "variant", "ms", "tflops", "speedup", "err", "note")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shapes(parser, f"{' '.join(DEFAULT_SHAPES)}; this command's own: {', '.join(SHAPES)}")
    parser.add_argument("--routings", nargs="+", default=list(ROUTINGS), metavar="ROUTING",
                        help="aligned (256) and/or shifted (32) (default both)")
    parser.add_argument("--seconds", type=seconds, default=0.25, help="timed window per variant and pass")
    parser.add_argument("--passes", type=count(1), default=2, help="interleaved passes over all variants")
    parser.add_argument("--variants", nargs="+", default=[], metavar="TEXT",
                        help="keep the MXFP8 variants whose names contain one of these (default all)")
    parser.add_argument("--strip", action="store_true", help="add the timing-only strip-downs (aligned only)")
    parser.add_argument("--no-baselines", action="store_true", help="skip torch._grouped_mm and ragdot bf16")
    parser.add_argument("--compile-jobs", type=count(0), default=0, help="compile the kernels in N processes first")
    parser.add_argument("--compile-only", action="store_true", help="only fill the kernel cache (--compile-jobs)")
    parser.add_argument("--budget", type=seconds, default=0.0, metavar="SECONDS",
                        help="time budget of the whole run: once spent, no new shape or routing starts (default 0: "
                        "none)")
    add_targets(parser, "the quantization bandwidth (section ceilings, hbm_gbs)")
    add_out(parser, "out/bench-mxfp8", "CSV and JSON")
    add_device(parser, "cuda if available; cpu only smoke-tests the kernels, with TRITON_INTERPRET=1")
    add_quiet(parser)


def _table(rows: list[dict]) -> None:
    from ragdot.measure.console import Console, Table

    table = Table(title="MXFP8 weight gradient vs bf16 (ms per call; speedup over torch._grouped_mm bf16)")
    for col in ("shape", "routing", "variant", "ms", "TFLOP/s", "x torch", "max rel err"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in rows:
        table.add_row(r["shape"], r["routing"], r["variant"], f"{r['ms']:.3f}", f"{r['tflops']:.0f}",
                      f"{r['speedup']:.2f}", f"{r['err']:.1e}")
    console = Console(width=110)
    console.print(table)
    for r in rows:
        if r["note"] and not r["note"][0].isdigit():
            console.print(f"{r['shape']} {r['routing']} {r['variant']}: {r['note']}")


def _split(values: list[str]) -> list[str]:
    """Items of a space-separated option, each also split at commas (the older spelling)."""
    return [part for v in values for part in v.split(",") if part]


def _problems(specs: list[str] | None) -> dict[str, tuple[int, int, int, int]]:
    """(N, K, experts, tokens) by name for --shapes: this command's names, or any ragdot shape ('M,K,N,E')."""
    problems = {}
    for shape in parse_shape_args(specs or list(DEFAULT_SHAPES), catalog=SHAPES):
        if isinstance(shape, str):
            problems[shape] = SHAPES[shape]
            continue
        if shape.M % 256:
            raise UsageError(f"--shapes {shape.name}: M={shape.M} tokens must be a multiple of 256 (aligned routing)")
        problems[shape.name] = (shape.N, shape.K, shape.E, shape.M)
    return problems


def _check_device(spec: str | None) -> torch.device:
    """--device: CUDA, or a CPU when Triton's interpreter is on (a smoke run: the times mean nothing)."""
    import os

    device = parse_device(spec)
    if device.type == "cpu":
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            raise UsageError("--device cpu: the MXFP8 kernels are Triton kernels and triton is not installed")
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("--device cpu: the MXFP8 kernels need a CUDA GPU, or TRITON_INTERPRET=1 in the "
                             "environment for a CPU smoke run through Triton's interpreter")
    return device


def _meta(variants: list[Variant], args: argparse.Namespace) -> dict:
    return records.run_meta(args.device, with_triton=True) | dict(
        python=platform.python_version(), args={k: v for k, v in vars(args).items() if not k.startswith("_")},
        variants=[asdict(v) for v in variants])  # fmt: skip


def _variants(args: argparse.Namespace) -> list[Variant]:
    args.routings = _split(args.routings)
    for routing in args.routings:
        if routing not in ROUTINGS:
            raise UsageError(f"--routings: {routing!r} is unknown; expected some of {', '.join(ROUTINGS)}")
    variants = mx_variants(args.strip)
    if args.variants:
        keep = _split(args.variants)
        variants = [v for v in variants if any(w in v.name for w in keep)]
    return variants


def run(args: argparse.Namespace) -> int:
    from ragdot.bench.mxfp8_cases import bench_shape
    from ragdot.measure.targets import load_targets, section

    args.device = str(_check_device(args.device))
    out = check_out(args.out)
    problems = _problems(args.shapes)
    variants = _variants(args)
    hbm = section(load_targets(args.targets), "ceilings", records.gpu_name(args.device)).get("hbm_gbs")
    if args.compile_jobs > 0 or args.compile_only:
        precompile(max(1, args.compile_jobs), list(problems), variants, problems)
        if args.compile_only:
            return 0
    writer = records.RowWriter(out, f"mxfp8-bench-{safe_name(records.gpu_name(args.device))}",
                               _meta(variants, args), COLUMNS)  # fmt: skip
    progress = Progress(len(problems) * len(args.routings), budget=args.budget, say=None if args.quiet else print)
    with KeepOnInterrupt(writer.rows) as kept:
        for shape in progress.until_spent(problems, "shapes"):
            bench_shape(shape, problems[shape], args, variants, writer.add, progress.done, progress.spent, hbm)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if not args.quiet:
        _table(writer.rows)
    print("wrote " + ", ".join(str(p) for p in writer.files))
    return kept.status
