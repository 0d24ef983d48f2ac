"""`ragdot bench-mxfp8`: the MXFP8 weight gradient against bf16 grouped GEMMs at the MoE shapes.

Per shape and routing it times, interleaved in one process with sustained back-to-back launches (a CUDA event
pair around each window, no per-call synchronisation, several passes in rotated order):
- torch._grouped_mm in bf16 (dY^T [N, T] x X [T, K] -> [G, N, K]), the vendor baseline;
- ragdot's own bf16 weight gradient (ragged_dot_general, contracting mode, backend='triton');
- every MXFP8 kernel variant on pre-quantized operands (path/tile config), checked against the FP32 oracle
  on a few experts first; timing-only strip-downs (scales ignored) bound what each inner step could reach.
Quantization is timed separately. Results go to new files per run, <out>/mxfp8-bench-<gpu>-<date>.csv and .json.

    ragdot bench-mxfp8 --shapes 16B 671B-4096        # (the older '--shapes 16B,671B-4096' works too)
    ragdot bench-mxfp8 --shapes 8192,2048,1408,8     # 'M,K,N,E': M tokens (a multiple of 256), K, N, E experts
    TRITON_INTERPRET=1 ragdot bench-mxfp8 --device cpu --shapes tiny --passes 1 --seconds 0  # CPU smoke run
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ragdot import catalog
from ragdot.cli_common import (
    UsageError,
    add_device,
    add_out,
    add_quiet,
    add_shapes,
    check_out,
    new_stem,
    parse_device,
    parse_shape_args,
    safe_name,
)
from ragdot.measure import records
from ragdot.measure.checks import max_abs_error
from ragdot.measure.timing import sustained_ms

HELP = "benchmark the MXFP8 grouped weight gradient against bf16 grouped GEMMs (GPU)"

#: (N, K, experts, total tokens) by name: the MXFP8 problems of `ragdot.catalog` (the DeepSeek 16B shape and two
#: 671B shapes, the default set; and a tiny one for smoke runs)
SHAPES: dict[str, tuple[int, int, int, int]] = {p.name: p.dims for p in catalog.mxfp8_problems()}
DEFAULT_SHAPES: tuple[str, ...] = tuple(p.name for p in catalog.mxfp8_problems(tiny=False))
ROUTINGS: tuple[str, ...] = ("aligned", "shifted")
#: measured ceilings of one H200 (docs/mxfp8.md, ../anchors): bf16 and fp8 dense GEMM, copy bandwidth
BF16_PEAK, FP8_PEAK, HBM = 720e12, 1440e12, 4.2e12


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "torch" | "ragdot" | "mx"
    path: str = ""
    config: tuple[int, int, int, int, int] | None = None  # block_n, block_k, block_t, warps, stages
    order: str = "auto"


def mx_variants(strip: bool) -> list[Variant]:
    out = [
        Variant("mx-upcast-128x128w4", "mx", "upcast", (128, 128, 64, 4, 3)),
        Variant("mx-upcast-128x256w8", "mx", "upcast", (128, 256, 64, 8, 3)),
        Variant("mx-upcast-bits-128x128w4", "mx", "upcast-bits", (128, 128, 64, 4, 3)),
        Variant("mx-upcast-bits-128x256w8", "mx", "upcast-bits", (128, 256, 64, 8, 3)),
        Variant("mx-promote-128x128w8", "mx", "promote", (128, 128, 64, 8, 4)),
        Variant("mx-scaled-128x256w8", "mx", "scaled", (128, 256, 64, 8, 3)),
        Variant("mx-upcast-bits-256x128w8", "mx", "upcast-bits", (256, 128, 64, 8, 3)),
        Variant("mx-upcast-bits-128x128t32w4", "mx", "upcast-bits", (128, 128, 32, 4, 4)),
        Variant("mx-dequant-gmm", "mx", "dequant-gmm"),
    ]
    if strip:
        out += [
            Variant("strip-fp8-noscale-128x256w8", "mx", "fp8-noscale", (128, 256, 128, 8, 3)),
            Variant("strip-upcast-noscale-128x128w4", "mx", "upcast-noscale", (128, 128, 64, 4, 3)),
        ]
    return out


def routing_sizes(tokens: int, experts: int, kind: str) -> list[int]:
    """Linear ramp, busiest expert 1.5x the mean, multiples of 256; 'shifted' moves 32 tokens first<-last."""
    from ragdot.routing import skewed

    sizes = skewed(tokens, experts, round_to=256).tolist()
    if kind == "shifted":
        sizes[0] += 32
        sizes[-1] -= 32
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shapes(parser, f"{' '.join(DEFAULT_SHAPES)}; this command's own: {', '.join(SHAPES)}")
    parser.add_argument("--routings", nargs="+", default=list(ROUTINGS), metavar="ROUTING",
                        help="aligned (256) and/or shifted (32) (default both)")
    parser.add_argument("--seconds", type=float, default=0.25, help="timed window per variant and pass")
    parser.add_argument("--passes", type=int, default=2, help="interleaved passes over all variants")
    parser.add_argument("--variants", nargs="+", default=[], metavar="TEXT",
                        help="keep the MXFP8 variants whose names contain one of these (default all)")
    parser.add_argument("--strip", action="store_true", help="add the timing-only strip-downs (aligned only)")
    parser.add_argument("--no-baselines", action="store_true", help="skip torch._grouped_mm and ragdot bf16")
    parser.add_argument("--compile-jobs", type=int, default=0, help="compile the kernels in N processes first")
    parser.add_argument("--compile-only", action="store_true", help="only fill the kernel cache (--compile-jobs)")
    parser.add_argument("--budget", type=float, default=0.0, help="stop starting new shapes after this many s")
    add_out(parser, "out/bench-mxfp8", "CSV and JSON")
    add_device(parser, "cuda if available; cpu only smoke-tests the kernels, with TRITON_INTERPRET=1")
    add_quiet(parser)


def _mx_call(v: Variant, ops: dict, sizes: torch.Tensor, order: str | None = None):
    from ragdot.mxfp8.wgrad import WgradConfig, grouped_wgrad_triton

    cfg = WgradConfig(*v.config) if v.config else None
    return lambda: grouped_wgrad_triton(*ops["mx"], sizes, path=v.path, config=cfg, order=order or v.order)


def _compile_one(job: tuple) -> tuple[str, float, str]:
    """Worker: run one variant on a tiny problem with the real launch's specialisation (fills the cache)."""
    from ragdot.mxfp8 import quantize
    from ragdot.mxfp8.wgrad import WgradConfig, grouped_wgrad_triton

    name, path, config, experts, longest = job
    t0 = time.perf_counter()
    try:
        x = torch.randn(256 * 2, 256, device="cuda", dtype=torch.bfloat16)
        aq, as_ = quantize(x)
        sizes = torch.full((experts,), 0, dtype=torch.int32, device="cuda")
        sizes[0] = 256
        grouped_wgrad_triton(aq, as_, aq, as_, sizes, path=path, config=WgradConfig(*config) if config else None,
                             order="longest" if longest else "natural")
        torch.cuda.synchronize()
        return name, time.perf_counter() - t0, ""
    except Exception as exc:  # noqa: BLE001 - reported, the timed run retries and records it
        return name, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:300]


def _longest(v: Variant, n: int, k: int, experts: int) -> bool:
    from ragdot.mxfp8.wgrad import LONGEST_FIRST_MAX_BLOCKS

    if v.order != "auto":
        return v.order == "longest"
    if v.config is None:
        return False
    bn, bk = v.config[0], v.config[1]
    return experts * math.ceil(n / bn) * math.ceil(k / bk) < LONGEST_FIRST_MAX_BLOCKS


def precompile(jobs: int, shapes: list[str], variants: list[Variant], problems: dict | None = None) -> None:
    todo = {}
    for shape in shapes:
        n, k, experts, _ = (problems or SHAPES)[shape]
        for v in variants:
            if v.kind == "mx":
                both = v is variants[0]  # bench_shape times both block orders of the first variant
                for longest in {_longest(v, n, k, experts), *([True, False] if both else [])}:
                    todo[(v.name, experts, longest)] = (v.name, v.path, v.config, experts, longest)
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        for name, sec, err in pool.map(_compile_one, todo.values()):
            print(f"  compiled {name:32s} {sec:5.1f}s {err}", flush=True)
    print(f"precompile: {len(todo)} kernels in {time.perf_counter() - t0:.1f}s", flush=True)


def _oracle(mx: tuple, sizes: list[int], experts: list[int]) -> dict[int, torch.Tensor]:
    """FP32 oracle (dequantize, matmul without TF32) of the weight gradient of a few experts."""
    from ragdot.mxfp8 import dequantize

    aq, as_, bq, bs = mx
    starts = [sum(sizes[:g]) for g in range(len(sizes) + 1)]
    torch.backends.cuda.matmul.allow_tf32 = False
    refs = {}
    for g in experts:
        t0, t1 = starts[g], starts[g + 1]
        a = dequantize(aq[t0:t1], as_[t0 // 32:t1 // 32])
        refs[g] = a.t() @ dequantize(bq[t0:t1], bs[t0 // 32:t1 // 32])
    return refs


def _max_rel_err(out: torch.Tensor, refs: dict[int, torch.Tensor]) -> float:
    """max over the checked experts of max|out - ref| / max|ref| (inf for any NaN or a wrong empty slab)."""
    return max((max_abs_error(out[g], ref) for g, ref in refs.items()), default=0.0)


def bench_shape(shape: str, args, variants: list[Variant], rows: list[dict], dims: tuple | None = None) -> None:
    import ragdot
    from ragdot.mxfp8.quantize import quantize_triton

    n, k, experts, tokens = dims or SHAPES[shape]
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    dy = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16, generator=gen)
    x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16, generator=gen)
    q_ms = {}
    for name, t in (("quantize dY", dy), ("quantize X", x)):
        q_ms[name] = sustained_ms(lambda t=t: quantize_triton(t), args.seconds / 2)
        gbs = t.numel() * 3.03 / q_ms[name] / 1e6
        rows.append(dict(shape=shape, routing="-", variant=name, ms=q_ms[name], tflops=0.0,
                         speedup=0.0, err=0.0, note=f"{gbs:.0f} GB/s of {HBM / 1e9:.0f}"))
    mx = (*quantize_triton(dy), *quantize_triton(x))
    dn = ragdot.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])
    for routing in args.routings:
        sizes_l = routing_sizes(tokens, experts, routing)
        sizes = torch.tensor(sizes_l, dtype=torch.int32, device=dev)
        ends = torch.cumsum(sizes, 0, dtype=torch.int32)
        flops = 2.0 * sum(sizes_l) * n * k
        calls: dict[str, object] = {}
        if not args.no_baselines:
            calls["torch-bf16"] = lambda e=ends: torch._grouped_mm(dy.t(), x, offs=e, out_dtype=torch.bfloat16)
            calls["ragdot-bf16"] = lambda s=sizes: ragdot.ragged_dot_general(dy, x, s, dn, backend="triton")
        for v in variants:
            if v.name.startswith("strip") and routing != "aligned":
                continue
            calls[v.name] = _mx_call(v, {"mx": mx}, sizes)
            if routing == "aligned" and v.name == variants[0].name:
                other = "natural" if _longest(v, n, k, experts) else "longest"
                calls[f"{v.name}-{other}"] = _mx_call(v, {"mx": mx}, sizes, order=other)
        errs, notes = {}, {}
        refs = _oracle(mx, sizes_l, [0, experts // 2, experts - 1])
        for name, fn in list(calls.items()):
            try:
                out = fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                if not (name.startswith(("torch", "ragdot", "strip"))):
                    errs[name] = _max_rel_err(out, refs)
                del out
            except Exception as exc:  # noqa: BLE001 - a failing variant is recorded, the others still run
                notes[name] = f"{type(exc).__name__}: {exc}"[:200]
                calls.pop(name)
        times: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for p in range(args.passes):
            for name in names[p % len(names):] + names[:p % len(names)]:
                try:
                    times[name].append(sustained_ms(calls[name], args.seconds))
                except Exception as exc:  # noqa: BLE001
                    notes[name] = f"{type(exc).__name__}: {exc}"[:200]
        times = {name: t for name, t in times.items() if t and name not in notes}
        base = sum(times["torch-bf16"]) / args.passes if "torch-bf16" in times else float("nan")
        for name in list(times) + list(notes):
            ms = sum(times[name]) / len(times[name]) if name in times else float("nan")
            rows.append(dict(shape=shape, routing=routing, variant=name, ms=ms, tflops=flops / ms / 1e9,
                             speedup=base / ms, err=errs.get(name, float("nan")),
                             note=notes.get(name, " ".join(f"{t:.3f}" for t in times.get(name, [])))))
        del refs
        if not getattr(args, "quiet", False):
            print(f"{shape} {routing}: done at {time.strftime('%H:%M:%S')}", flush=True)


def _table(rows: list[dict]) -> None:
    from ragdot.bench.text import Console, Table

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


def _write(rows: list[dict], variants: list[Variant], args: argparse.Namespace, out: Path) -> list[Path]:
    stem = new_stem(out, f"mxfp8-bench-{safe_name(records.gpu_name())}")
    csv_path, json_path = out / f"{stem}.csv", out / f"{stem}.json"
    records.write_csv(rows, csv_path, None if rows else ["shape"])
    meta = dict(gpu=records.gpu_name(), torch=torch.__version__, python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M:%S"),
                args={k: v for k, v in vars(args).items() if not k.startswith("_")},
                variants=[asdict(v) for v in variants])
    records.write_json(json_path, meta, rows)
    return [csv_path, json_path]


def run(args: argparse.Namespace) -> int:
    args.device = str(_check_device(args.device))
    out = check_out(args.out)
    problems = _problems(args.shapes)
    shapes = list(problems)
    args.routings = _split(args.routings)
    for routing in args.routings:
        if routing not in ROUTINGS:
            raise UsageError(f"--routings: {routing!r} is unknown; expected some of {', '.join(ROUTINGS)}")
    variants = mx_variants(args.strip)
    if args.variants:
        keep = _split(args.variants)
        variants = [v for v in variants if any(w in v.name for w in keep)]
    if args.compile_jobs > 0 or args.compile_only:
        precompile(max(1, args.compile_jobs), shapes, variants, problems)
        if args.compile_only:
            return 0
    rows: list[dict] = []
    t_start = time.perf_counter()
    for shape in shapes:
        if args.budget and time.perf_counter() - t_start > args.budget:
            print(f"budget spent: skipping {shape}", file=sys.stderr)
            continue
        bench_shape(shape, args, variants, rows, problems[shape])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if not args.quiet:
        _table(rows)
    print("wrote " + ", ".join(str(p) for p in _write(rows, variants, args, out)))
    return 0
