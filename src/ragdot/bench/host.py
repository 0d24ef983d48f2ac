"""`ragdot host-bench`: host time per call of ragdot against the raw `torch._grouped_mm` call.

    ragdot host-bench                       # CUDA: the 8 anchor shapes, bf16; CPU: one tiny fp32 problem
    ragdot host-bench --shapes deepseek3-test --systems raw+cumsum ragdot-triton --phases fwd
    ragdot host-bench --calls 1000 --repeats 7 --out benchmarks/results

Systems, each timed forward only (`fwd`) and forward + backward (`fwdbwd`: `out.backward(dy)` with inputs that
require grad; their `.grad` is reset to None before each call, as a train step's zero_grad does):
- `raw`: `torch._grouped_mm(x, w, offs=offs)`, offs precomputed, no ragdot code in its path;
- `raw+cumsum`: the same with `offs = torch.cumsum(group_sizes, 0, dtype=torch.int32)` in the call: the
  baseline of every ratio and margin (ragdot receives group sizes, so it has that prefix sum to do too);
- `ragdot-torch`, `ragdot-triton`, `ragdot-auto`: `ragdot.ragged_dot(x, w, group_sizes, backend=...)`;
- reference points, forward only: `empty_like` (one `torch.empty_like(x)`) and `cumsum` (one prefix sum).

Clocks (every figure names its own):
- host: wall clock around back-to-back calls without a sync between them (after warm-up and a sync), per call;
  the median of `--repeats` passes of `--calls` calls (fewer calls when `--max-seconds` would be exceeded, at
  least MIN_CALLS; each row records its count). The systems of one shape and phase are timed side by side:
  their passes alternate round by round (`ragdot.measure.host.time_host_interleaved`), so a slow spell of a
  shared host lands on all of them. On CUDA a pass is issued in chunks of at most `--chunk`
  calls, each starting on an idle GPU (the sync before a chunk is not timed): the launch queue then never
  fills, so a slow kernel's back-pressure is never counted as host time;
- eager (CUDA only): CUDA events around the same chunks, per call: the GPU's timeline of eager calls, host
  gaps included;
- device (CUDA only): CUDA events around the chunks issued while a spin kernel holds the GPU, so that every
  launch is queued before the first one runs: device time per call without host gaps (median of up to 3
  passes; a pass in which the GPU reached the calls early is repeated with a longer hold). A row is
  host-bound when its host time reaches its device time.

Writes <out>/ragdot-host-<gpu>-<commit>-<date>.csv and .json (default out: ./ragdot-results).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ragdot.cli_common import (
    add_device,
    add_dtype,
    add_out,
    add_quiet,
    add_shapes,
    check_out,
    count,
    error_line,
    parse_device,
    parse_dtype,
    parse_shape_args,
    seconds,
)
from ragdot.measure import records
from ragdot.measure.host import MIN_CALLS, HostTiming, time_host_interleaved
from ragdot.measure.host import budgeted_calls as _budgeted_calls  # noqa: F401 - part of this module's surface
from ragdot.measure.host import chunk_sizes as _chunk_sizes  # noqa: F401
from ragdot.measure.progress import Progress
from ragdot.measure.records import safe_name

HELP = "host time per call: ragdot.ragged_dot against the raw torch._grouped_mm call, fwd and fwd+bwd"

RAGDOT_SYSTEMS: tuple[str, ...] = ("ragdot-torch", "ragdot-triton", "ragdot-auto")
REFERENCE_POINTS: tuple[str, ...] = ("empty_like", "cumsum")
SYSTEMS: tuple[str, ...] = ("raw", "raw+cumsum", *RAGDOT_SYSTEMS, *REFERENCE_POINTS)
PHASES: tuple[str, ...] = ("fwd", "fwdbwd")
BASELINE = "raw+cumsum"  # ratios and margins of both phases are taken against it

# The first eight columns are the contract; the others add detail.
COLUMNS: tuple[str, ...] = (
    *("gpu", "commit", "date", "shape", "system", "phase", "host_us", "ratio"),
    *("margin_us", "eager_us", "device_us", "host_bound", "calls", "dims", "dtype", "routing"),
)

DEFAULT_CALLS = {"cuda": 300, "cpu": 100}
DEFAULT_WARMUP = {"cuda": 20, "cpu": 5}
DEFAULT_SECONDS = {"cuda": 1.0, "cpu": 0.5}
DEFAULT_CHUNK = 16  # calls per chunk on CUDA: 16 fwd+bwd calls stay far below the ~1000 pending launches
# ------------------------------------------------------------------------------------------------ systems


@dataclass
class Operands:
    """Inputs of one shape: forward operands, leaf copies that require grad, and the backward cotangent."""

    x: torch.Tensor  # [M, K]
    w: torch.Tensor  # [E, K, N]
    group_sizes: torch.Tensor  # int32 [E], on the device
    offs: torch.Tensor  # int32 [E], cumulative group ends (precomputed for `raw`)
    x_leaf: torch.Tensor  # [M, K], requires grad, shares x's storage
    w_leaf: torch.Tensor  # [E, K, N], requires grad, shares w's storage
    dy: torch.Tensor  # [M, N], cotangent of the fwd+bwd calls


def make_operands(shape: Any, dtype: torch.dtype, device: torch.device, routing: str, seed: int) -> Operands:
    """Fresh random operands (never zeros) for `shape` (a ragdot.shapes.Shape) and group sizes by `routing`."""
    from ragdot.routing import group_sizes

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    x = torch.randn(shape.M, shape.K, generator=gen, device=device, dtype=dtype)
    w = torch.randn(shape.E, shape.K, shape.N, generator=gen, device=device, dtype=dtype).mul_(shape.K**-0.5)
    dy = torch.randn(shape.M, shape.N, generator=gen, device=device, dtype=dtype)
    sizes = group_sizes(routing, shape.M, shape.E, device=device)
    offs = torch.cumsum(sizes, 0, dtype=torch.int32)
    leaf = lambda t: t.detach().requires_grad_(True)
    return Operands(x, w, sizes, offs, leaf(x), leaf(w), dy)


def _forward(system: str, ops: Operands) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """The call of `system` on (lhs, rhs); lean closures, so the Python around the op is the same for all."""
    sizes, offs = ops.group_sizes, ops.offs
    cumsum, int32 = torch.cumsum, torch.int32
    if system == "raw":
        mm = torch._grouped_mm
        return lambda a, b: mm(a, b, offs=offs)
    if system == "raw+cumsum":
        mm = torch._grouped_mm
        return lambda a, b: mm(a, b, offs=cumsum(sizes, 0, dtype=int32))
    if system in RAGDOT_SYSTEMS:
        import ragdot

        rd, backend = ragdot.ragged_dot, system.removeprefix("ragdot-")
        return lambda a, b: rd(a, b, sizes, backend=backend)
    if system == "empty_like":
        empty_like = torch.empty_like
        return lambda a, b: empty_like(a)
    if system == "cumsum":
        return lambda a, b: cumsum(sizes, 0, dtype=int32)
    raise ValueError(f"system={system!r} is unknown; expected one of {', '.join(SYSTEMS)}")


def make_call(system: str, phase: str, ops: Operands) -> Callable[[], Any]:
    """A zero-argument call of `system` in `phase` (`fwd` or `fwdbwd`) on `ops`."""
    fwd = _forward(system, ops)
    if phase == "fwd":
        x, w = ops.x, ops.w
        return lambda: fwd(x, w)
    if phase != "fwdbwd" or system in REFERENCE_POINTS:
        raise ValueError(f"phase={phase!r} is not timed for {system!r}; expected one of {', '.join(PHASES)}")
    x, w, dy = ops.x_leaf, ops.w_leaf, ops.dy

    def step() -> None:
        x.grad = None
        w.grad = None
        fwd(x, w).backward(dy)

    return step


def phases_of(system: str, phases: Sequence[str]) -> list[str]:
    return [p for p in phases if p == "fwd" or system not in REFERENCE_POINTS]


def unusable_reason(system: str, device: torch.device, interpreted: bool) -> str | None:
    """Why `system` cannot be timed here (None when it can)."""
    if system in ("raw", "raw+cumsum") and not hasattr(torch, "_grouped_mm"):
        return f"this torch ({torch.__version__}) has no torch._grouped_mm"
    if system not in RAGDOT_SYSTEMS or system == "ragdot-auto":
        return None
    import ragdot

    backend, usable = system.removeprefix("ragdot-"), ragdot.backends()
    if backend not in usable:
        return f"backend {backend!r} is not usable here (usable: {', '.join(usable)})"
    if backend != "triton" or device.type == "cuda":
        return None
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton kernels run on the CPU only in Triton's interpreter (TRITON_INTERPRET=1 and --interpreted)"
    if not interpreted:
        return "runs in Triton's interpreter here, whose launches are not a real launch's host time (--interpreted)"
    return None


# ------------------------------------------------------------------------------------------------ rows


@dataclass(frozen=True)
class Measured:
    shape: Any  # ragdot.shapes.Shape
    system: str
    phase: str
    timing: HostTiming


def _num(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def result_rows(measured: Sequence[Measured], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (shape, system, phase); ratio and margin against BASELINE of the same shape and phase."""
    base = {(m.shape.name, m.phase): m.timing.host_us for m in measured if m.system == BASELINE}
    rows = []
    for m in measured:
        ref = base.get((m.shape.name, m.phase))
        t = m.timing
        row = {key: meta[key] for key in ("gpu", "commit", "date")}
        row.update(shape=m.shape.name, system=m.system, phase=m.phase, host_us=_num(t.host_us))
        row["ratio"] = _num(t.host_us / ref, 4) if ref else None
        row["margin_us"] = _num(t.host_us - ref) if ref is not None else None
        row.update(eager_us=_num(t.eager_us), device_us=_num(t.device_us), host_bound=t.host_bound)
        row.update(calls=t.calls, dims=m.shape.spec, dtype=meta["dtype"], routing=meta["routing"])
        rows.append(row)
    return rows


def write_files(rows: Sequence[dict[str, Any]], meta: dict[str, Any], out: Path) -> list[Path]:
    """<out>/ragdot-host-<gpu>-<commit>-<date>.csv and .json (a new file each run)."""
    stem = records.new_stem(out, f"ragdot-host-{safe_name(meta['gpu'])}-{safe_name(meta['commit'])}")
    csv_path, json_path = out / f"{stem}.csv", out / f"{stem}.json"
    records.write_csv(rows, csv_path, COLUMNS)
    records.write_json(json_path, meta, rows, newline=True)
    return [csv_path, json_path]


# ------------------------------------------------------------------------------------------------ tables


def _cell(row: dict[str, Any]) -> str:
    text = f"{row['host_us']:.1f}"
    if row["system"] in RAGDOT_SYSTEMS and row["ratio"] is not None:
        text += f" ({row['ratio']:.2f}x, {row['margin_us']:+.1f})"
    return text + (" *" if row["host_bound"] else "")


def _device_cell(row: dict[str, Any]) -> str:
    if row["eager_us"] is None:
        return "-"
    device = "?" if row["device_us"] is None else f"{row['device_us']:.1f}"
    return f"{device} / {row['eager_us']:.1f}"


def _grid(rows: Sequence[dict[str, Any]], phase: str, cell: Callable[[dict[str, Any]], str]) -> list[list[str]]:
    """Rows of [shape, one cell per system] for one phase, systems in SYSTEMS order."""
    systems = [s for s in SYSTEMS if any(r["system"] == s and r["phase"] == phase for r in rows)]
    shapes = list(dict.fromkeys(r["shape"] for r in rows if r["phase"] == phase))
    lookup = {(r["shape"], r["system"]): r for r in rows if r["phase"] == phase}
    grid = [["shape", *systems]]
    for shape in shapes:
        grid.append([shape, *(cell(lookup[shape, s]) if (shape, s) in lookup else "-" for s in systems)])
    return grid


def summary_lines(rows: Sequence[dict[str, Any]], phase: str) -> list[str]:
    """Per ragdot system: geometric-mean and worst ratio to the baseline, worst margin."""
    lines = []
    for system in RAGDOT_SYSTEMS:
        picked = [r for r in rows if r["system"] == system and r["phase"] == phase and r["ratio"]]
        if not picked:
            continue
        ratios = [r["ratio"] for r in picked]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        worst = max(picked, key=lambda r: r["margin_us"])
        lines.append(
            f"{phase} {system}: host time {geo:.2f}x {BASELINE} (geomean of {len(picked)}), worst "
            f"{max(ratios):.2f}x; worst margin {worst['margin_us']:+.1f} µs ({worst['shape']})"
        )
    return lines


def _print_grid(grid: list[list[str]], title: str, console: Any) -> None:
    if console is not None:
        from ragdot.measure.console import Table

        table = Table(title=title, title_justify="left")
        for i, name in enumerate(grid[0]):
            table.add_column(name, justify="left" if i == 0 else "right")
        for line in grid[1:]:
            table.add_row(*line)
        console.print(table)
        return
    widths = [max(len(line[i]) for line in grid) for i in range(len(grid[0]))]
    print(title)
    for line in grid:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))


def print_report(rows: Sequence[dict[str, Any]], meta: dict[str, Any], console: Any = None) -> None:
    """Tables per phase (rich when `console` is given, plain text otherwise) and the summary lines."""
    head = f"{meta['gpu']}, {meta['dtype']}, {meta['routing']} routing, {meta['commit']}"
    _say(console, f"host: wall clock around back-to-back calls / calls, median of {meta['repeats']} passes; "
         f"ragdot cells: (ratio to {BASELINE}, margin in µs); * host-bound (host >= device time per call)")
    if any(r["eager_us"] is not None for r in rows):
        _say(console, "device / eager: CUDA events around the chunks of calls, per call; device: the GPU held "
             "until every call of a chunk is queued, eager: as issued")
    for phase in PHASES:
        if not any(r["phase"] == phase for r in rows):
            continue
        _print_grid(_grid(rows, phase, _cell), f"host µs per call, {phase}: {head}", console)
        if any(r["eager_us"] is not None for r in rows if r["phase"] == phase):
            _print_grid(_grid(rows, phase, _device_cell), f"device / eager µs per call, {phase}: {head}", console)
        for line in summary_lines(rows, phase):
            _say(console, line)


# ------------------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add_shapes(parser, "tag:anchor on CUDA, 64,32,32,4 on a CPU")
    add("--systems", nargs="+", metavar="NAME", help=f"systems to time (default all: {' '.join(SYSTEMS)})")
    add("--phases", nargs="+", metavar="PHASE", help="fwd and/or fwdbwd (default both)")
    add_dtype(parser, "bf16 on CUDA, fp32 on a CPU")
    add("--routing", default="balanced", help="group sizes: balanced, skewed or empty (default balanced)")
    add("--calls", type=count(1), help="back-to-back calls per pass (default 300 on CUDA, 100 on CPU)")
    add("--repeats", type=count(1), default=5, help="passes per system and phase, the median is kept (default 5)")
    add("--warmup", type=count(0), help="warm-up calls (default 20 on CUDA, 5 on CPU)")
    add("--chunk", type=count(0),
        help=f"CUDA: calls per chunk between untimed syncs (default {DEFAULT_CHUNK}; 0 = a whole pass at once)")
    add("--max-seconds", type=seconds,
        help=f"budget per system, phase and shape: slow calls get fewer calls per pass, at least {MIN_CALLS} "
        "(default 1.0 on CUDA, 0.5 on CPU; 0 = unbounded)")
    add("--interpreted", action="store_true",
        help="CPU: time ragdot-triton through Triton's interpreter too (not a real launch's host time)")
    add_device(parser)
    add_out(parser, "ragdot-results", "CSV and JSON")
    add_quiet(parser)
    add("--commit", help="commit id for the records (default: git rev-parse --short HEAD)")
    add("--seed", type=int, default=0, help="seed of the random operands")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ValueError as exc:  # a bad option value: one line naming it, no traceback
        return error_line("host-bench", exc)


def _pick(flag: str, given: Sequence[str] | None, known: Sequence[str]) -> list[str]:
    for name in given or ():
        if name not in known:
            raise ValueError(f"{flag}: {name!r} is unknown; expected some of {', '.join(known)}")
    return [k for k in known if k in given] if given else list(known)


def _shapes(specs: Sequence[str] | None, cuda: bool) -> list[Any]:
    from ragdot.shapes import Shape, shapes_with_tag

    if not specs:
        return shapes_with_tag("anchor") if cuda else [Shape("64,32,32,4", 64, 32, 32, 4)]
    return parse_shape_args(specs)


@dataclass(frozen=True)
class Plan:
    """The checked options of one run."""

    device: torch.device
    dtype: torch.dtype
    shapes: list[Any]
    systems: list[str]
    phases: list[str]
    routing: str
    calls: int
    repeats: int
    warmup: int
    chunk: int
    max_seconds: float


def make_plan(args: argparse.Namespace) -> Plan:
    """The run's options with their defaults filled in; ValueError naming the option for a bad one."""
    from ragdot.routing import ROUTINGS

    device = parse_device(args.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    dtype = parse_dtype(args.dtype, "bf16" if kind == "cuda" else "fp32")
    check_out(args.out)
    if args.routing not in ROUTINGS:
        raise ValueError(f"--routing: {args.routing!r} is unknown; expected one of {', '.join(ROUTINGS)}")
    calls = DEFAULT_CALLS[kind] if args.calls is None else args.calls
    warmup = DEFAULT_WARMUP[kind] if args.warmup is None else args.warmup
    chunk = (DEFAULT_CHUNK if kind == "cuda" else 0) if args.chunk is None else args.chunk
    budget = DEFAULT_SECONDS[kind] if args.max_seconds is None else args.max_seconds
    systems = _pick("--systems", args.systems, SYSTEMS)
    phases = _pick("--phases", args.phases, PHASES)
    shapes = _shapes(args.shapes, kind == "cuda")
    return Plan(device, dtype, shapes, systems, phases, args.routing, calls, args.repeats, warmup,
                chunk, budget)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]


def measure_shape(
    shape: Any, plan: Plan, systems: Sequence[str], seed: int, failed: dict[str, str]
) -> list[Measured]:
    """Every (system, phase) of one shape; one whose first call fails goes to `failed` and is not timed."""
    ops = make_operands(shape, plan.dtype, plan.device, plan.routing, seed)
    done = []
    for phase in plan.phases:  # the systems of a phase are timed side by side, their passes interleaved
        named: dict[str, Callable[[], Any]] = {}
        for system in systems:
            if phase not in phases_of(system, plan.phases):
                continue
            call = make_call(system, phase, ops)
            try:
                call()
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:  # OOM is a RuntimeError
                failed[f"{shape.name} {system} {phase}"] = _first_line(exc)
                continue
            named[system] = call
        if not named:
            continue
        timings = time_host_interleaved(
            named, plan.device, calls=plan.calls, repeats=plan.repeats, warmup=plan.warmup,
            chunk=plan.chunk, max_seconds=plan.max_seconds,
        )
        done.extend(Measured(shape, system, phase, timings[system]) for system in named)
    del ops
    if plan.device.type == "cuda":
        torch.cuda.empty_cache()
    return done


def _console() -> Any:
    from ragdot.measure.console import Console  # plain text where rich is not installed

    return Console(width=None if sys.stdout.isatty() else 200)


def _say(console: Any, text: str) -> None:
    if console is None:
        print(text)
    else:
        console.print(text, markup=False, highlight=False)


def _meta(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    now = datetime.datetime.now()
    base = records.run_meta(plan.device, commit_id=args.commit)
    return {
        "gpu": base["gpu"],
        "commit": base["commit"],
        "date": now.isoformat(timespec="seconds"),
        "stamp": now.strftime("%Y%m%d-%H%M%S"),
        "dtype": str(plan.dtype).removeprefix("torch."),
        "routing": plan.routing,
        "device": str(plan.device),
        "torch": base["torch"],
        "calls": plan.calls,
        "repeats": plan.repeats,
        "warmup": plan.warmup,
        "chunk": plan.chunk,
        "max_seconds": plan.max_seconds,
        "baseline": BASELINE,
        "clocks": "host_us: wall clock of back-to-back calls / calls; eager_us: CUDA events around them; "
        "device_us: CUDA events, GPU held while the calls queue",
        "argv": sys.argv[1:],
    }


def _run(args: argparse.Namespace) -> int:
    plan = make_plan(args)
    quiet = getattr(args, "quiet", False)
    console = None if quiet else _console()
    say = (lambda text: None) if quiet else (lambda text: _say(console, text))
    warn = (lambda text: print(text, file=sys.stderr)) if quiet else say
    left_out = {s: r for s in plan.systems if (r := unusable_reason(s, plan.device, args.interpreted))}
    systems = [s for s in plan.systems if s not in left_out]
    for system, reason in left_out.items():
        warn(f"{system} left out: {reason}")
    meta = _meta(plan, args)
    failed: dict[str, str] = {}
    measured: list[Measured] = []
    progress = Progress(len(plan.shapes), say=say)
    for shape in plan.shapes:
        measured += measure_shape(shape, plan, systems, args.seed, failed)
        progress.done(shape.name)
    meta.update(seconds=round(progress.elapsed, 1), left_out=left_out, failed=failed)
    rows = result_rows(measured, meta)
    files = write_files(rows, meta, args.out)
    if not quiet:
        print_report(rows, meta, console)
    for what, reason in failed.items():
        warn(f"not timed: {what}: {reason}")
    _say(None if quiet else console, f"done in {meta['seconds']} s; wrote " + ", ".join(str(f) for f in files))
    return 0
