"""Fused MoE layer on a GPU: fused == unfused on real shapes, then layer fwd+bwd times and peak memory.

    PYTHONPATH=src python3 benchmarks/fused_gpu.py --out DIR [--tokens 8192,32768] [--models a,b] [--budget-s 360]
        [--variants fused,unfused,peer] [--layout layer|transposed]

For every model (qwen3-30b-a3b, deepseek2-16b, gpt-oss-like, the deepseek3-671b slice; routed experts only, no
shared expert, bf16) and token count:
1. check: one fwd+bwd of ``MoELayer(path="sparse")`` with ``fused=True`` (each fused variant asked for) and
   ``fused=False`` on the same parameters and input; normalised error of y and of every gradient (x, router,
   w_gate_up, w_down) against the unfused path;
2. time: fwd+bwd (``torch.autograd.grad`` of y against x and the parameters, one fixed cotangent) of the
   variants: ``fused`` (the block's defaults: forward and backward through ragdot's ragged GEMMs on gathered
   rows), ``fused-fwd-kernels`` (the index-reading forward kernels: gather in the up projection's loads, SwiGLU
   in its epilogue, the weighted scatter in the down projection's), ``fused-kernels`` (those and the index-reading
   backward kernels), ``unfused`` and ``peer`` (the plain-PyTorch layer, ``ragdot.moe.peer``) on two clocks of
   ``ragdot.measure.timing``: ``eager`` (CUDA events around every call) and ``graph`` (CUDA events around
   replays of a CUDA graph of the call; ``peer`` syncs on the host in bincount, so it has no graph time);
3. memory: peak allocated bytes of one fwd+bwd above what is allocated before it (parameters, input).

``--layout transposed`` stores both expert weights as transformers does, ``[E, out, in]``, and hands the layer
(and ``peer``) transposed views of them.

TFLOP/s count useful work, 18 * T * k * dim * hidden per fwd+bwd (three GEMM-sized products per direction
pair: 6 forward, 12 backward), without the router; ``sol_pct`` is that rate over the dense bf16 matmul rate
measured at the start (``ragdot.bench.ceilings``). Rows are written as they finish to
``DIR/fused-gpu-<date>.csv`` and ``.json``; token counts beyond the first are skipped once half the budget is
spent, and a watchdog ends the run (rows so far kept, exit status 3) at the budget plus 60 s, so it never
hangs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ragdot.bench.ceilings import measure_ceilings
from ragdot.catalog import get_model
from ragdot.measure.checks import normalised_error
from ragdot.measure.records import RowWriter, run_meta
from ragdot.measure.timing import free_memory, median_ms
from ragdot.measure.watchdog import Watchdog
from ragdot.moe import MoELayer, fused
from ragdot.moe.peer import peer_moe

MODELS = ("qwen3-30b-a3b", "deepseek2-16b", "gpt-oss-like", "deepseek3-671b-reduced")
# fused variants: (ragdot.moe.fused.forward_kind, backward_kind)
FUSED = {"fused": ("gemms", "gemms"), "fused-fwd-kernels": ("fused", "gemms"), "fused-kernels": ("fused", "fused")}
VARIANTS = (*FUSED, "unfused", "peer")
DEFAULT_VARIANTS = ("fused", "fused-fwd-kernels", "unfused", "peer")
COLUMNS = ("model", "tokens", "layout", "variant", "clock", "ms", "tflops", "sol_pct", "peak_mib", "max_err", "status")
TOL = 3e-2  # bf16 normalised error allowed between fused and unfused


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the CSV and JSON")
    p.add_argument("--tokens", default="8192,32768", help="comma-separated token counts")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated catalog names")
    p.add_argument("--budget-s", type=float, default=360.0, help="seconds for the whole run (watchdog +60 s)")
    p.add_argument("--reps", type=int, default=10, help="timed calls per clock")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--layout", choices=("layer", "transposed"), default="layer",
                   help="expert weights as MoELayer stores them, or [E, out, in] as transformers does (views)")
    args = p.parse_args(argv)
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; expected some of {', '.join(VARIANTS)}")
    return args


def _layer(name: str, device: torch.device, layout: str) -> MoELayer:
    m = get_model(name)
    torch.manual_seed(0)
    layer = MoELayer(m.dim, m.moe_hidden, m.experts, m.top_k, path="sparse", dtype=torch.bfloat16, device=device)
    return with_layout(layer, layout)


def with_layout(layer: MoELayer, layout: str) -> MoELayer:
    """The layer with its expert weights stored as `layout` says: "layer" as built, "transposed" [E, out, in]
    (transformers' layout) and used through transposed views; the same values."""
    if layout == "transposed":
        for attr in ("w_gate_up", "w_down"):
            view = getattr(layer, attr).detach().transpose(1, 2).contiguous().transpose(1, 2)
            setattr(layer, attr, torch.nn.Parameter(view))
            if getattr(layer, attr).stride() != view.stride():
                raise RuntimeError(f"the parameter {attr} did not keep the transposed view's strides")
    return layer


def _step(layer: MoELayer, variant: str, x: torch.Tensor, cot: torch.Tensor):
    params = (layer.router.weight, layer.w_gate_up, layer.w_down)

    def run() -> tuple[torch.Tensor, ...]:
        if variant == "peer":
            y = peer_moe(x, layer.router.weight, layer.w_gate_up, layer.w_down, layer.top_k)
            return (y.detach(), *torch.autograd.grad(y, (x, *params), cot))
        layer.fused = variant in FUSED
        kinds = fused.forward_kind, fused.backward_kind
        if layer.fused:  # this variant's kernels, for this step only (the module's defaults stay as they were)
            fused.forward_kind, fused.backward_kind = FUSED[variant]
        try:
            y = layer(x)
            return (y.detach(), *torch.autograd.grad(y, (x, *params), cot))
        finally:
            fused.forward_kind, fused.backward_kind = kinds

    return run


def _check(layer: MoELayer, x: torch.Tensor, cot: torch.Tensor, variants: list[str]) -> float:
    """The largest normalised error of the fused variants' outputs and gradients against the unfused path."""
    unfused = _step(layer, "unfused", x, cot)()
    errs = [0.0]
    for variant in (v for v in variants if v in FUSED):
        errs += [normalised_error(a, b) for a, b in zip(_step(layer, variant, x, cot)(), unfused)]
    return max(errs)


def _peak_mib(fn, device: torch.device) -> float:
    if device.type != "cuda":
        fn()
        return float("nan")
    free_memory(device)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _rows_for(layer, name, tokens, device, peak, args):
    dtype = layer.w_gate_up.dtype
    x = torch.randn(tokens, layer.dim, device=device, dtype=dtype, requires_grad=True)
    cot = torch.randn(tokens, layer.dim, device=device, dtype=dtype)
    try:
        err = _check(layer, x, cot, args.variants)
        status = "ok" if err <= TOL else "MISMATCH"
    except Exception as exc:  # noqa: BLE001 - the timings of the other variants still come
        err, status = float("nan"), f"check failed: {type(exc).__name__}: {exc}"[:200]
    flops = 18 * tokens * layer.top_k * layer.dim * layer.hidden_dim
    for variant in args.variants:
        fn = _step(layer, variant, x, cot)
        base = dict(model=name, tokens=tokens, layout=args.layout, variant=variant, max_err=f"{err:.2e}")
        try:
            mib = _peak_mib(fn, device)
        except Exception as exc:  # noqa: BLE001 - a failed variant is a row, not the end of the run
            yield {**base, "clock": "-", "status": f"error: {type(exc).__name__}: {exc}"[:200]}
            continue
        for clock in ("eager", "graph") if device.type == "cuda" else ("eager",):
            if variant == "peer" and clock == "graph":  # bincount syncs on the host: no capture
                yield {**base, "clock": clock, "peak_mib": f"{mib:.0f}", "status": "n/a: host sync"}
                continue
            try:
                ms = median_ms(fn, device, graph=clock == "graph", reps=args.reps)
            except Exception as exc:  # noqa: BLE001 - a failed clock is a row, not the end of the run
                yield {**base, "clock": clock, "peak_mib": f"{mib:.0f}", "status": f"n/a: {type(exc).__name__}"}
                continue
            tflops = flops / ms / 1e9
            yield {**base, "clock": clock, "ms": f"{ms:.3f}", "tflops": f"{tflops:.1f}",
                   "sol_pct": f"{100 * tflops * 1e12 / peak:.1f}", "peak_mib": f"{mib:.0f}", "status": status}
        free_memory(device)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if not torch.cuda.is_available():
        print("fused_gpu: needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    ceilings = measure_ceilings(device, torch.bfloat16)
    meta = {**run_meta(device, torch.bfloat16, with_triton=True), "bf16_matmul_tflops": ceilings.peak_tflops}
    writer = RowWriter(args.out, "fused-gpu", meta, COLUMNS)
    Watchdog("fused_gpu", writer.files).arm("the run", args.budget_s + 60)
    token_counts = [int(t) for t in args.tokens.split(",")]
    for i, tokens in enumerate(token_counts):
        if i and time.monotonic() - start > args.budget_s / 2:
            print(f"fused_gpu: skipping {tokens} tokens (half the budget spent)", flush=True)
            continue
        for name in args.models.split(","):
            if time.monotonic() - start > args.budget_s:
                print(f"fused_gpu: budget spent, skipping {name} at {tokens}", flush=True)
                continue
            try:
                layer = _layer(name, device, args.layout)
                for row in _rows_for(layer, name, tokens, device, ceilings.peak_flops, args):
                    writer.add(row)
                    print(" ".join(f"{k}={row.get(k, '')}" for k in COLUMNS), flush=True)
            except Exception as exc:  # noqa: BLE001 - one model failing (memory) leaves the others
                writer.add(dict(model=name, tokens=tokens, status=f"error: {type(exc).__name__}: {exc}"[:200]))
            layer = None
            free_memory(device)
    print(f"fused_gpu: wrote {writer.csv} and {writer.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
