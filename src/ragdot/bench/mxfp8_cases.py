"""What `ragdot bench-mxfp8` times: the MXFP8 kernel variants, the routings, and one shape's interleaved run.

Per shape: quantization of dY and X (timed alone), then per routing the bf16 baselines (torch._grouped_mm,
ragdot's own bf16 weight gradient) and every MXFP8 variant on pre-quantized operands, checked against the
FP32 oracle on a few experts, then timed in interleaved passes (`ragdot.measure.timing.sustained_ms`).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

from ragdot.measure.checks import max_abs_error
from ragdot.measure.timing import sustained_ms

__all__ = ["Variant", "mx_variants", "routing_sizes", "precompile", "bench_shape"]

Row = dict[str, object]


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


def precompile(jobs: int, shapes: list[str], variants: list[Variant], problems: dict[str, tuple]) -> None:
    todo = {}
    for shape in shapes:
        n, k, experts, _ = problems[shape]
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


def bench_shape(
    shape: str, dims: tuple[int, int, int, int], args: argparse.Namespace, variants: list[Variant],
    emit: Callable[[Row], None], on_routing: Callable[[str], None] | None = None,
    spent: Callable[[], bool] = lambda: False, hbm_gbs: float | None = None,
) -> None:
    """Every row of one shape (N, K, experts, tokens) to `emit`; `on_routing(label)` after each routing. Once
    `spent()` says so (the run's budget), no further routing starts. `hbm_gbs`: the bandwidth a quantization's
    GB/s is compared with, where known."""
    from ragdot.mxfp8.quantize import quantize_triton

    n, k, experts, tokens = dims
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    dy = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16, generator=gen)
    x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16, generator=gen)
    for name, t in (("quantize dY", dy), ("quantize X", x)):
        ms = sustained_ms(lambda t=t: quantize_triton(t), args.seconds / 2)
        gbs = t.numel() * 3.03 / ms / 1e6
        of = "" if hbm_gbs is None else f" of {hbm_gbs:.0f}"
        emit(dict(shape=shape, routing="-", variant=name, ms=ms, tflops=0.0, speedup=0.0, err=0.0,
                  note=f"{gbs:.0f} GB/s{of}"))
    mx = (*quantize_triton(dy), *quantize_triton(x))
    for routing in args.routings:
        if spent():
            break
        for row in _routing_rows(routing, dims, (dy, x, mx), args, variants):
            emit({"shape": shape, **row})
        if on_routing is not None:
            on_routing(f"{shape} {routing}")


def _calls(routing: str, dims: tuple, ops: tuple, args: argparse.Namespace, variants: list[Variant], sizes):
    """The timed callables of one routing by name: the bf16 baselines, then the MXFP8 variants."""
    import ragdot

    n, k, experts, _ = dims
    dy, x, mx = ops
    calls: dict[str, Callable[[], torch.Tensor]] = {}
    if not args.no_baselines:
        ends = torch.cumsum(sizes, 0, dtype=torch.int32)
        dn = ragdot.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])
        calls["torch-bf16"] = lambda: torch._grouped_mm(dy.t(), x, offs=ends, out_dtype=torch.bfloat16)
        calls["ragdot-bf16"] = lambda: ragdot.ragged_dot_general(dy, x, sizes, dn, backend="triton")
    for v in variants:
        if v.name.startswith("strip") and routing != "aligned":
            continue
        calls[v.name] = _mx_call(v, {"mx": mx}, sizes)
        if routing == "aligned" and v.name == variants[0].name:
            other = "natural" if _longest(v, n, k, experts) else "longest"
            calls[f"{v.name}-{other}"] = _mx_call(v, {"mx": mx}, sizes, order=other)
    return calls


def _routing_rows(routing: str, dims: tuple, ops: tuple, args: argparse.Namespace, variants: list[Variant]):
    """Check every call against the oracle, then time them in interleaved passes; one row per call."""
    n, k, experts, tokens = dims
    dev = torch.device(args.device)
    sizes_l = routing_sizes(tokens, experts, routing)
    sizes = torch.tensor(sizes_l, dtype=torch.int32, device=dev)
    flops = 2.0 * sum(sizes_l) * n * k
    calls = _calls(routing, dims, ops, args, variants, sizes)
    errs, notes = {}, {}
    refs = _oracle(ops[2], sizes_l, [0, experts // 2, experts - 1])
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
    del refs
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
        yield dict(routing=routing, variant=name, ms=ms, tflops=flops / ms / 1e9, speedup=base / ms,
                   err=errs.get(name, float("nan")),
                   note=notes.get(name, " ".join(f"{t:.3f}" for t in times.get(name, []))))
