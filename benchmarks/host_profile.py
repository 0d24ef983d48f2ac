"""Where the host time of one eager ragdot call goes: each piece of the call path timed alone, then cProfile.

    PYTHONPATH=src python3 benchmarks/host_profile.py [--shape M,K,N,E] [--calls 300]

Clock: host (wall time of N back-to-back calls without a sync, after warm-up and a sync, divided by N;
median of 5 passes). The default problem is small, so the GPU never becomes the bottleneck of the loop.
It times private pieces of the call path (`ragdot.ops`, `ragdot.api`) and follows them as they change; the
`host` suite of benchmarks/suite.py runs it after `ragdot host-bench`. CUDA only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

import ragdot
from ragdot import api, ops
from ragdot.groups import group_ends_from_sizes


def host_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    passes = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        passes.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(passes)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="1024,512,512,8")
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    m, k, n, e = (int(x) for x in args.shape.split(","))
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(e, k, n, device=dev, dtype=torch.bfloat16)
    gs = torch.full((e,), m // e, device=dev, dtype=torch.int32)
    offs = torch.cumsum(gs, 0, dtype=torch.int32)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    a, b = x.unsqueeze(0), w.unsqueeze(0)
    ends = group_ends_from_sizes(gs, m)  # what the tail kernel reads
    rows = {}
    rows["torch.empty"] = host_us(lambda: torch.empty((m, n), device=dev, dtype=torch.bfloat16), args.calls)
    rows["torch.cumsum"] = host_us(lambda: torch.cumsum(gs, 0, dtype=torch.int32), args.calls)
    rows["raw _grouped_mm"] = host_us(lambda: torch._grouped_mm(x, w, offs=offs), args.calls)
    rows["group_ends_from_sizes"] = host_us(lambda: group_ends_from_sizes(gs, m), args.calls)
    rows["ops._state"] = host_us(lambda: ops._state(a), args.calls)
    rows["ops.plain_call"] = host_us(lambda: ops.plain_call(a, b), args.calls)
    for backend in ("torch", "triton"):
        r = ops.runner("ragged_m", backend, a, b, e, torch.bfloat16)
        rows[f"runner ragged_m {backend} ({r.label})"] = host_us(lambda r=r: r(a, b, gs), args.calls)
        rk = ops.runner("ragged_k", backend, a, dy.unsqueeze(0), e, torch.bfloat16)
        rows[f"runner ragged_k {backend} ({rk.label})"] = host_us(lambda r=rk: r(a, dy.unsqueeze(0), gs), args.calls)
        rows[f"ragged_dot {backend}"] = host_us(lambda b_=backend: ragdot.ragged_dot(x, w, gs, backend=b_), args.calls)

        def fwdbwd(b_=backend):
            xr.grad = wr.grad = None
            ragdot.ragged_dot(xr, wr, gs, backend=b_).backward(dy)

        rows[f"ragged_dot fwd+bwd {backend}"] = host_us(fwdbwd, args.calls // 3)

    def raw_fwdbwd():
        xr.grad = wr.grad = None
        torch._grouped_mm(xr, wr, offs=torch.cumsum(gs, 0, dtype=torch.int32)).backward(dy)

    rows["raw+cumsum fwd+bwd"] = host_us(raw_fwdbwd, args.calls // 3)
    from ragdot.kernels.configs import host_descriptor

    rows["host_descriptor"] = host_us(lambda: host_descriptor(a, [1, m, k], [m * k, k, 1], [1, 64, 64]), args.calls)
    from ragdot.kernels.tail import zero_tail_rows_

    c3 = torch.empty(1, m, n, device=dev, dtype=torch.bfloat16)
    rows["zero_tail_rows_"] = host_us(lambda: zero_tail_rows_(c3, ends), args.calls)
    print(f"host us per call (M,K,N,E = {m},{k},{n},{e}; bf16; {len(api._CALLS)} cached calls)")
    for name, us in rows.items():
        print(f"  {name:48s} {us:8.1f}")
    for label, fn in (("fwd triton", lambda: ragdot.ragged_dot(x, w, gs, backend="triton")),
                      ("fwd torch", lambda: ragdot.ragged_dot(x, w, gs, backend="torch")),
                      ("fwd+bwd triton", lambda: ragdot.ragged_dot(xr, wr, gs, backend="triton").backward(dy))):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(f"---- cProfile {label}, 200 calls")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])
    op_table(x, w, gs, dy)


def op_table(x, w, gs, dy) -> None:
    """torch.profiler's CPU-side table of 20 fwd+bwd calls (the backward runs on autograd's device thread,
    which cProfile does not see)."""
    from torch.profiler import ProfilerActivity, profile

    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    for _ in range(3):
        ragdot.ragged_dot(xr, wr, gs, backend="triton").backward(dy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            xr.grad = wr.grad = None
            ragdot.ragged_dot(xr, wr, gs, backend="triton").backward(dy)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
