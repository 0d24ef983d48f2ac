"""`ragdot moe-bench`: train steps of a small MoE decoder over compute paths x ragdot backends.

    ragdot moe-bench                                   # every config of ragdot.moe.model.MODEL_CONFIGS
    ragdot moe-bench --configs qwen3-30b-a3b gemma4-26b --variants sparse-torch sparse-triton dense_drop
    ragdot moe-bench --quick                           # CPU smoke run of a tiny model, seconds
    ragdot moe-bench --routing-only --configs qwen3-30b-a3b  # permute + unpermute alone, against argsort
    ragdot moe-bench --layer                           # one MoE layer's fwd+bwd against the plain `peer` layer

Per (config, variant): step time (median of steps 5-10), tokens/s, model TFLOP/s,
peak and temporary memory of a step (temporary = peak minus what was allocated before the step,
i.e. gradients and activations), and, in a separate profiled forward+backward of one MoE layer, the split of
its kernel time into routing (permute + unpermute), grouped GEMMs (ragdot's ops) and the rest.
The ``no_experts`` variant is the step with no routed-expert work (`ragdot.moe.variants`): its row carries the
bounds on every variant's speedup over dense_drop, and each variant's row the rate of its routed work
(`ragdot.bench.moe_report.relative`), against the dense matmul rate measured at the start of the run.
On CUDA the whole step (forward, backward, AdamW) is captured in a CUDA graph and the replays are timed, as a
compiled step runs (``--eager`` times Python-driven steps instead, two or more variants interleaved; the ``mode``
column says which was used).
Writes new files per run under --out: moe-bench-<gpu>-<date>.json and .csv (rewritten after every variant,
so a run cut short by ``--budget`` or Ctrl-C keeps its rows) and PNG figures named like them; each finished
variant prints a progress line with the time left. ``--routing-only`` writes moe-routing-<gpu>-<date>.*
(`ragdot.bench.moe_routing`). With ``--targets FILE`` (e.g. benchmarks/targets-h200.json) the goals of its
``moe-bench`` section are checked and printed, on CUDA runs only (`ragdot.bench.moe_report.check_targets`).
``--layer`` times forward+backward of a single MoE layer instead (eager and torch.compile, against the
plain-PyTorch ``peer`` layer); see ``ragdot.bench.moe_layer``. The train steps themselves are timed in
``ragdot.bench.moe_train``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from ragdot.bench.moe_layer import LAYER_VARIANTS, add_layer_arguments
from ragdot.cli_common import (
    UsageError,
    add_deprecated_alias,
    add_device,
    add_dtype,
    add_out,
    add_quiet,
    add_targets,
    check_out,
    count,
    parse_device,
    parse_dtype,
    safe_name,
    seconds,
)
from ragdot.measure import records
from ragdot.moe.variants import DEFAULT_VARIANTS, FLOOR, VARIANTS

HELP = "end-to-end MoE train-step benchmark: paths x backends over the model configs"
LAYER_STEPS = 20  # timed steps per row of --layer

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ragdot.moe.model import MODEL_CONFIGS

    parser.add_argument(
        "--configs", nargs="+", metavar="NAME", help=f"model configs (default all: {' '.join(MODEL_CONFIGS)})"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=[*VARIANTS, "peer"],
        metavar="VARIANT",
        help=f"path-backend variants (default: {' '.join(DEFAULT_VARIANTS)}; also sparse-recompute; {FLOOR}: the "
        "step with no routed-expert work, the floor under every variant; with --layer: "
        f"{' '.join(LAYER_VARIANTS)}, where peer is the plain torch._grouped_mm layer)",
    )
    parser.add_argument(
        "--steps", type=count(1), help=f"train steps per variant (default 10; timed steps with --layer: {LAYER_STEPS})"
    )
    parser.add_argument("--measure-from", type=count(1), default=5, help="first step of the median (default 5)")
    parser.add_argument(
        "--max-seconds",
        type=seconds,
        default=20.0,
        help="stop a variant's steps early once it has run this long (default 20)",
    )
    parser.add_argument(
        "--budget", type=seconds, default=0.0, metavar="SECONDS",
        help="time budget of the whole run: once spent, no new config or variant starts (default 0: none)",
    )  # fmt: skip
    parser.add_argument("--layers", type=count(1), help="override the configs' layer count")
    parser.add_argument("--seq-len", type=count(1), help="override the configs' sequence length")
    parser.add_argument("--batch", type=count(1), help="override the configs' batch size")
    add_dtype(parser, "bf16 on CUDA, fp32 on a CPU")
    add_device(parser, "cuda if available, else cpu; cpu with --quick")
    parser.add_argument(
        "--routing-impl", choices=["triton", "torch"], help="permute/unpermute implementation"
    )
    parser.add_argument("--eager", action="store_true",
                        help="time eager steps, not CUDA-graph replays (variants interleaved round by round)")
    parser.add_argument(
        "--no-profile", action="store_true", help="skip the routing/GEMM split of the MoE layer"
    )
    parser.add_argument("--no-plots", action="store_true", help="write no PNG figures")
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 steps: a smoke run in seconds")
    parser.add_argument(
        "--routing-only",
        action="store_true",
        help="time only permute + unpermute (forward and backward) per config and implementation",
    )
    add_deprecated_alias(parser, "--routing", "--routing-only", "routing_only")
    add_out(parser, "out/moe-bench", "CSV, JSON and figures")
    add_targets(parser, "the train steps (section moe-bench)")
    add_quiet(parser)
    add_layer_arguments(parser)


def _meta(args, device, dtype) -> dict[str, Any]:
    return records.run_meta(device, dtype, with_triton=True) | {
        "steps": args.steps,
        "measure_from": args.measure_from,
        "capacity_factor": 1.25,
        "optimizer": "AdamW",
    }


# ------------------------------------------------------------------------------------------ entry
def run(args: argparse.Namespace) -> int:
    if getattr(args, "layer", False):
        return _run_layer(args)
    _reject_layer_options(args)
    from ragdot.measure.console import Console
    from ragdot.measure.targets import load_targets
    from ragdot.moe.model import MODEL_CONFIGS, QUICK_CONFIG

    console = Console(quiet=args.quiet)
    if not console.is_terminal:
        console = Console(width=max(console.width, 150), quiet=args.quiet)
    if args.steps is None:
        args.steps = 10
    if args.quick:
        args.steps, args.measure_from = min(args.steps, 4), min(args.measure_from, 2)
    if args.steps < 1 or not 1 <= args.measure_from <= args.steps:
        raise UsageError(
            f"--steps, --measure-from: need steps >= 1 and 1 <= measure-from <= steps, got {args.steps}, "
            f"{args.measure_from}"
        )
    device, dtype = _device_dtype(args)
    names = args.configs or ([QUICK_CONFIG.name] if args.quick else list(MODEL_CONFIGS))
    configs = _configs(names, args)
    args.variants = args.variants or list(DEFAULT_VARIANTS)
    out = check_out(args.out)
    targets = load_targets(args.targets)
    meta = _meta(args, device, dtype)
    if args.routing_only:
        from ragdot.bench.moe_routing import run_routing

        return run_routing(configs, device, dtype, meta, out, console, args.budget)
    sol: dict[str, float] = {}
    if FLOOR in args.variants:  # the floor's bounds and the routed work's speed of light: the device's ceilings
        from ragdot.bench.ceilings import measure_ceilings
        from ragdot.bench.moe_report import routed_sol_s

        ceilings = measure_ceilings(device, dtype)
        meta |= {"matmul_tflops": round(ceilings.peak_tflops, 3), "copy_gbs": round(ceilings.bandwidth_gbs, 1),
                 "ceilings": ceilings.label}  # fmt: skip
        sol = {c.name: 1e3 * routed_sol_s(c, ceilings.peak_flops, ceilings.bandwidth, dtype.itemsize) for c in configs}
    return _run_train(configs, args, device, dtype, meta, console, targets, sol)


def _run_train(configs, args, device, dtype, meta, console, targets, sol: dict[str, float]) -> int:
    """Every config's variants, rows written as they finish; table, targets and figures at the end. `sol`: the
    routed GEMMs' speed of light per config name (ms; empty without the floor), put on each row."""
    from ragdot.bench.moe_report import check_targets, plot, print_table, relative
    from ragdot.bench.moe_train import run_config, run_config_in_subprocess
    from ragdot.measure.progress import KeepOnInterrupt, Progress
    from ragdot.measure.targets import section

    writer = records.RowWriter(args.out, f"moe-bench-{safe_name(meta['gpu'])}", meta)
    progress = Progress(len(configs) * len(args.variants), budget=args.budget,
                        say=None if args.quiet else lambda line: console.print(line, markup=False))  # fmt: skip

    def emit(row: dict[str, Any]) -> None:
        if row["config"] in sol:
            row["routed_sol_ms"] = sol[row["config"]]
        relative([*writer.rows, row], meta.get("matmul_tflops"))
        writer.add(row)
        writer.rewrite()  # the new row may give earlier ones their speed ratios
        result = f"{1e3 * row['step_s']:.1f} ms" if row.get("status") == "ok" else row.get("status", "")
        progress.done(f"{row['config']} {row['variant']} {result}")

    isolate = device.type == "cuda" and len(configs) > 1
    with KeepOnInterrupt(writer.rows) as kept:
        for cfg in progress.until_spent(configs, "configs", lambda c: c.name):
            if isolate:  # a fresh process per config: memory one config leaves behind cannot starve the next
                for row in run_config_in_subprocess(cfg, args, device, dtype):
                    emit(row)
            else:
                run_config(cfg, args, device, dtype, emit, progress.spent)
    rows = writer.rows
    print_table(rows, console)
    goals = section(targets, "moe-bench", meta["gpu"])
    if device.type == "cuda" and goals:  # the targets are about GPU step times: meaningless on a CPU
        for text, passed, numbers in check_targets(rows, goals):
            mark = {True: "[green]PASS[/]", False: "[red]MISS[/]", None: "[yellow]n/a[/]"}[passed]
            console.print(f"{mark} {text}: {numbers}")
    files = writer.files
    if not args.no_plots:
        try:
            files += plot(rows, args.out, writer.csv.stem)
        except ImportError as exc:  # matplotlib (and numpy) are optional: the tables are written anyway
            console.print(f"plots skipped: {exc.name or exc} is not installed (it comes with ragdot's bench extra)")
    print("wrote " + ", ".join(str(f) for f in files))
    return kept.status


def _device_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """--device (default cuda if available and not --quick) and --dtype (default bf16 on CUDA, else fp32)."""
    device = parse_device(args.device or ("cpu" if args.quick or not torch.cuda.is_available() else None))
    return device, parse_dtype(args.dtype, "bf16" if device.type == "cuda" else "fp32")


def _configs(names: list[str], args: argparse.Namespace) -> list[Any]:
    from ragdot.moe.model import get_config

    try:
        return [get_config(n, layers=args.layers, seq_len=args.seq_len, batch=args.batch) for n in names]
    except ValueError as exc:
        raise UsageError(f"--configs: {exc}") from None


def _reject_layer_options(args: argparse.Namespace) -> None:
    if args.variants and "peer" in args.variants:
        raise UsageError("--variants: 'peer' is the layer-level baseline: use it with --layer")
    for name in ("tokens", "modes"):
        if getattr(args, name, None):
            raise UsageError(f"--{name} applies to the layer mode only: add --layer")


def _run_layer(args: argparse.Namespace) -> int:
    from ragdot.bench.moe_layer import run_layer

    if args.routing_only:
        raise UsageError("--routing-only and --layer are two different modes; pick one")
    if args.variants and FLOOR in args.variants:
        raise UsageError(f"--variants: {FLOOR!r} is the train steps' floor: use it without --layer")
    if args.steps is None:
        args.steps = LAYER_STEPS
    if args.quick:
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    device, dtype = _device_dtype(args)
    check_out(args.out)
    return run_layer(args, device, dtype)
