"""Sweep tile configs of the fused MoE kernels at one layer shape: each checked, then timed on CUDA-graph replays.

    python benchmarks/fused_sweep.py --out DIR                                   # deepseek-v3 widths, all kernels
    python benchmarks/fused_sweep.py --tokens 8192 --dim 2048 --hidden 768 --experts 128 --top-k 8 --limit 12
    TRITON_INTERPRET=1 python benchmarks/fused_sweep.py --device cpu --tiny      # CPU smoke run (interpreter)

The fused kernels (`ragdot.kernels.fused_moe`, `fused_moe_bwd`) run one heuristic config each
(`fused_config`: per kernel, from this sweep at deepseek-v3 widths). This probe gives each kernel the
heuristic's config first (its result is the reference), then its config for GPUs with under 160 KB of
shared memory a block (the tiles before the sweep), then candidate tiles (`candidates`): each result
must be within the dtype's normalised-error bound of the reference (`ragdot.measure.checks`), then it is
timed as the median of 20 CUDA-graph replays after warm-up (device time, `ragdot.measure.timing.median_ms`).
Kernels (A = tokens x top-k assignments, balanced random routing, bf16):

- ``up``: gather + [A, D] x [D, 2H] + SwiGLU (`up_swiglu`);
- ``down``: [A, H] x [H, D] + router weight + scatter (`down_scatter`; the input gradient uses the same kernel);
- ``dbwd``: [A, D] x [D, H] (w_down through its transposed view) + dSwiGLU (`down_bwd_swiglu`);
- ``wgrad_up``, ``wgrad_down``: the two weight gradients over gathered rows (`weight_grad`).

Rows: kernel, config, status (ok / wrong / error with its message), ms, TFLOP/s (useful work: 2 x A x the
GEMM's K x N), and the share of the dense-matmul ceiling measured on this GPU (`ragdot.bench.ceilings`).
Writes DIR/fused-sweep-<commit>.csv/.json and prints the best config per kernel.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_SRC = Path(__file__).resolve().parents[1] / "src"
if (_SRC / "ragdot").is_dir():
    sys.path.insert(0, str(_SRC))

KERNELS = ("up", "down", "dbwd", "wgrad_up", "wgrad_down")
SHARED_BYTES = 200 * 1024  # usable shared memory per block budgeted for the operand ring (H200: 227 KB)


def candidates(dtype: torch.dtype, wide_epilogue: bool, limit: int | None) -> list[Any]:
    """Tiles to try: 64/128 rows, 64/128/256 columns, 32/64/128 contraction steps, 4/8 warps, 2-4 stages,
    within the shared-memory ring budget and one 128x256 float32 accumulator per 8 warps (wide-epilogue
    kernels hold two accumulators: half that); the largest tiles first."""
    from ragdot.kernels.fused_moe import FusedConfig

    elem = torch.empty((), dtype=dtype).element_size()
    out = []
    for bm, bn, bk, warps, stages in itertools.product((64, 128), (64, 128, 256), (32, 64, 128), (4, 8), (2, 3, 4)):
        acc = bm * bn * (2 if wide_epilogue else 1)
        if acc > (128 * 256 if warps == 8 else 128 * 128) or stages * (bm * bk + bk * bn) * elem > SHARED_BYTES:
            continue
        out.append(FusedConfig(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=warps, num_stages=stages))
    # likely winners first, so that a --limit keeps them: large tiles, 64-wide steps, 8 warps, 3-4 stages
    out.sort(key=lambda c: (-c.block_m * c.block_n, abs(c.block_k - 64), -c.num_warps, abs(c.num_stages - 3.5)))
    return out[:limit] if limit else out


def _problem(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    from ragdot.moe.fused import sort_experts

    t, d, h, e, k = args.tokens, args.dim, args.hidden, args.experts, args.top_k
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=dtype)

    experts = torch.rand(t, e, generator=gen).topk(k, dim=1).indices.to(device)
    sizes, order = sort_experts(experts, e)
    a = t * k
    return dict(x=rand(t, d), w_gu=rand(e, d, 2 * h, scale=d ** -0.5), w_down=rand(e, h, d, scale=h ** -0.5),
                dy=rand(t, d), act=rand(a, h), pre=rand(a, 2 * h), dpre=rand(a, 2 * h),
                w=torch.rand(a, generator=gen).to(device), sizes=sizes, order=order, k=k, a=a, d=d, h=h)


def _calls(p: dict[str, Any]) -> dict[str, tuple[Callable[[Any], Any], float, bool]]:
    """kernel -> (run with a config, useful FLOPs, wide epilogue)."""
    from ragdot.kernels import fused_moe as fm
    from ragdot.kernels import fused_moe_bwd as fb

    a, d, h, k = p["a"], p["d"], p["h"], p["k"]
    o, s, w = p["order"], p["sizes"], p["w"]
    return {
        "up": (lambda c: fm.up_swiglu(p["x"], p["w_gu"], o, s, k, True, config=c)[0], 2 * a * d * 2 * h, True),
        "down": (lambda c: fm.down_scatter(p["act"], p["w_down"], o, s, w, k, config=c), 2 * a * h * d, False),
        "dbwd": (lambda c: fb.down_bwd_swiglu(p["dy"], p["w_down"], o, s, w, p["pre"], k, config=c)[0],
                 2 * a * d * h, True),
        "wgrad_up": (lambda c: fb.weight_grad(p["x"], p["dpre"], o, s, None, k, gather_left=True, gather_right=False,
                                              config=c), 2 * a * d * 2 * h, False),
        "wgrad_down": (lambda c: fb.weight_grad(p["act"], p["dy"], o, s, w, k, gather_left=False, gather_right=True,
                                                config=c), 2 * a * h * d, False),
    }


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ragdot.kernels.fused_moe import fused_config
    from ragdot.measure.checks import failure_status, normalised_error, within_tolerance
    from ragdot.measure.timing import median_ms

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    peak = None
    if device.type == "cuda":
        from ragdot.bench.ceilings import measure_ceilings

        peak = measure_ceilings(device, dtype).peak_flops
    p = _problem(args, device, dtype)
    rows = []
    for name, (run, flops, wide) in _calls(p).items():
        if name not in args.kernels:
            continue
        heuristic = fused_config(dtype, device, _columns(name, p), name.split("_")[0])  # what the kernel picks
        ref = run(heuristic).float()
        narrow = fused_config(dtype, device, _columns(name, p), name.split("_")[0], wide=False)
        configs = [heuristic] + [c for c in dict.fromkeys([narrow] + (candidates(dtype, wide, args.limit)
                                 if device.type == "cuda" else [])) if c != heuristic]
        for i, cfg in enumerate(configs):
            row = dict(kernel=name, config=_short(cfg), heuristic=i == 0, status="ok", ms=None, tflops=None,
                       pct_peak=None, err=None, note="")
            try:
                err = normalised_error(run(cfg).float(), ref)
                row["err"] = err
                if not within_tolerance(err, dtype):
                    row["status"] = "wrong"
                else:
                    call = lambda cfg=cfg, run=run: run(cfg)  # noqa: E731
                    ms = median_ms(call, device, graph=device.type == "cuda", reps=args.reps)
                    row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
                    if peak:
                        row["pct_peak"] = 100 * flops / (ms * 1e-3) / peak
            except Exception as exc:  # noqa: BLE001 - a config that does not compile or run is a row, not a stop
                row["status"], row["note"] = failure_status(exc)
            rows.append(row)
            if not args.quiet:
                print(f"{name:10s} {row['config']:24s} {row['status']:6s} "
                      + (f"{row['ms']:.3f} ms {row['tflops']:.0f} TFLOP/s" if row["ms"] else row["note"][:80]),
                      flush=True)
    return rows


def _columns(kernel: str, p: dict[str, Any]) -> int:
    """The output columns each kernel's wrapper passes to `fused_config`."""
    return {"up": p["h"], "down": p["d"], "dbwd": p["h"], "wgrad_up": 2 * p["h"], "wgrad_down": p["d"]}[kernel]


def _short(cfg: Any) -> str:
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}w{cfg.num_warps}s{cfg.num_stages}g{cfg.group_m}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=7168)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--limit", type=int, default=None, help="candidate configs per kernel (default all)")
    parser.add_argument("--reps", type=int, default=20, help="timed replays per config")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny layer (CPU smoke run)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.tiny:
        args.tokens, args.dim, args.hidden, args.experts, args.top_k = 24, 32, 16, 4, 2
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("fused_sweep: --device cpu needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
        return 2
    if args.device != "cpu" and not torch.cuda.is_available():
        print("fused_sweep: no CUDA device (use --device cpu with TRITON_INTERPRET=1 for a smoke run)", file=sys.stderr)
        return 2
    rows = sweep(args)
    best: dict[str, dict] = {}
    for r in rows:
        if r["status"] == "ok" and r["ms"] and (r["kernel"] not in best or r["ms"] < best[r["kernel"]]["ms"]):
            best[r["kernel"]] = r
    for name, r in best.items():
        base = next(x for x in rows if x["kernel"] == name and x["heuristic"])
        gain = f", {base['ms'] / r['ms']:.2f}x the heuristic's {base['config']}" if base["ms"] else ""
        print(f"best {name}: {r['config']} {r['ms']:.3f} ms, {r['tflops']:.0f} TFLOP/s{gain}")
    if args.out is not None:
        from ragdot.measure import records

        args.out.mkdir(parents=True, exist_ok=True)
        meta = records.run_meta(torch.device(args.device), getattr(torch, args.dtype), with_triton=True) | {
            "shape": dict(tokens=args.tokens, dim=args.dim, hidden=args.hidden, experts=args.experts,
                          top_k=args.top_k)}
        stem = args.out / f"fused-sweep-{records.safe_name(meta['commit'])}"
        records.write_csv(rows, stem.with_suffix(".csv"))
        records.write_json(stem.with_suffix(".json"), meta, rows)
        print(f"wrote {stem}.csv, {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
