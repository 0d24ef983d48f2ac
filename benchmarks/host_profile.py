"""Where the host time of one eager ragdot call goes: each piece of the call path timed alone, then profiles.

    PYTHONPATH=src python3 benchmarks/host_profile.py [--shapes SPEC ...] [--calls 300] [--no-profiles]

SPEC is a catalog shape name (e.g. gemma4-26b) or M,K,N,E; default one small problem (1024,512,512,8), where
the GPU never becomes the bottleneck of the loop. Clock: host, from `ragdot.measure.host.time_host` (wall
time of back-to-back calls without a sync, chunks of 16 with a sync between them, median of 5 passes);
the eager column is CUDA events around the same chunks. It times private pieces of the call path
(`ragdot.ops`, `ragdot.api`) and follows them as they change; the `host` suite of benchmarks/suite.py runs
it after `ragdot host-bench`. CUDA only.

`--split-only` times only the forward+backward split: for ragdot (triton, auto, torch) and a minimal Python
autograd.Function around torch._grouped_mm, with autograd's device threads and without, the forward, the
engine's hand-off up to the backward's first line, the backward's body, and the rest up to `.backward()`
returning (synced calls, medians).

Forward+backward rows are split three ways to tell the autograd engine's share from ragdot's:
`raw+cumsum` (torch._grouped_mm's own C++ autograd), `py-function raw` (a minimal Python
autograd.Function whose forward and backward call torch._grouped_mm directly: the floor for any
Python-level op), and ragdot per backend; `vjp` rows call ragdot's backward products on the main thread
without the engine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable

import torch

import ragdot
from ragdot import api, ops
from ragdot.groups import group_ends_from_sizes
from ragdot.inductor_lowering import direct_out_name
from ragdot.measure.host import time_host
from ragdot.measure.timing import synchronize
from ragdot.shapes import get_shape

DEV = torch.device("cuda")


class _PyRaw(torch.autograd.Function):
    """The smallest Python-level grouped GEMM op: torch._grouped_mm forward and backward, offsets given."""

    @staticmethod
    def forward(ctx, x, w, offs):
        ctx.save_for_backward(x, w, offs)
        return torch._grouped_mm(x, w, offs=offs)

    @staticmethod
    def backward(ctx, dy):
        x, w, offs = ctx.saved_tensors
        dx = torch._grouped_mm(dy, w.transpose(-1, -2), offs=offs)
        dw = torch._grouped_mm(x.transpose(0, 1), dy, offs=offs)
        return dx, dw, None


def _us(fn, calls: int) -> tuple[float, float | None]:
    t = time_host(fn, DEV, calls=calls, repeats=5, warmup=20, chunk=16)
    return t.host_us, t.eager_us


def _operands(m: int, k: int, n: int, e: int) -> tuple[torch.Tensor, ...]:
    """x [M, K], w [E, K, N], balanced group sizes [E], leaf copies of x and w, and a cotangent dy [M, N]."""
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(e, k, n, device=DEV, dtype=torch.bfloat16).mul_(k**-0.5)
    gs = torch.full((e,), m // e, device=DEV, dtype=torch.int32)
    dy = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
    return x, w, gs, x.clone().requires_grad_(), w.clone().requires_grad_(), dy


def pieces(m: int, k: int, n: int, e: int, calls: int) -> dict[str, tuple[float, float | None]]:
    x, w, gs, xr, wr, dy = _operands(m, k, n, e)
    offs = torch.cumsum(gs, 0, dtype=torch.int32)
    a, b, dc = x.unsqueeze(0), w.unsqueeze(0), dy.unsqueeze(0)
    ends = group_ends_from_sizes(gs, m)  # what the tail kernel reads
    rows: dict[str, tuple[float, float | None]] = {}
    rows["torch.empty"] = _us(lambda: torch.empty((m, n), device=DEV, dtype=torch.bfloat16), calls)
    rows["torch.cumsum"] = _us(lambda: torch.cumsum(gs, 0, dtype=torch.int32), calls)
    rows["raw _grouped_mm"] = _us(lambda: torch._grouped_mm(x, w, offs=offs), calls)
    rows["group_ends_from_sizes"] = _us(lambda: group_ends_from_sizes(gs, m), calls)
    rows["ops._state"] = _us(lambda: ops._state(a), calls)
    # the torch backend's forward, piece by piece: its bound group-ends and tail-zeroing launches, the raw call
    # between them, and its prepared call (which adds the layout checks)
    prep = ops.runner("ragged_m", "torch", a, b, e, torch.bfloat16).fn
    if getattr(prep, "ends", None) is not None and getattr(prep, "tail", None) is not None:
        bound_ends = prep.ends(gs)
        c2 = torch._grouped_mm(x, w, offs=bound_ends)
        rows["torch backend: ends launch"] = _us(lambda: prep.ends(gs), calls)
        rows["torch backend: tail launch"] = _us(lambda: prep.tail(c2, bound_ends), calls)
        rows["torch backend: ends + raw + tail"] = _us(
            lambda: prep.tail(torch._grouped_mm(x, w, offs=prep.ends(gs)), bound_ends), calls)
        rows["torch backend: prepared call"] = _us(lambda: prep.direct(x, w, gs, None), calls)
    for backend in ("torch", "triton", "auto"):  # auto: the kernels it picks (e.g. gluon on sm_90) in the label
        r = ops.runner("ragged_m", backend, a, b, e, torch.bfloat16)
        rows[f"runner ragged_m {backend} ({r.label})"] = _us(lambda r=r: r(a, b, gs), calls)
        bt = b.transpose(-1, -2)
        rd = ops.runner("ragged_m", backend, dc, bt, e, torch.bfloat16)
        rows[f"runner ragged_m dgrad {backend} ({rd.label})"] = _us(lambda r=rd, bt=bt: r(dc, bt, gs), calls)
        rk = ops.runner("ragged_k", backend, a, dc, e, torch.bfloat16)
        rows[f"runner ragged_k {backend} ({rk.label})"] = _us(lambda r=rk: r(a, dc, gs), calls)
        rows[f"vjp main thread {backend}"] = _us(
            lambda b_=backend: ops.vjp("ragged_m", a, b, gs, dc, b_, 1, (True, True)), calls)
        rows[f"ragged_dot {backend}"] = _us(lambda b_=backend: ragdot.ragged_dot(x, w, gs, backend=b_), calls)
        # what compiled code calls for a forward product: the `.out` overload through the dispatcher, and its
        # implementation directly (`inductor_lowering.direct_out_name`, what the lowering emits)
        c = torch.empty(1, m, n, device=DEV, dtype=torch.bfloat16)
        args = (a, b, gs, torch.bfloat16, backend, 1)
        rows[f"compiled .out via dispatcher {backend}"] = _us(
            lambda args=args, c=c: torch.ops.ragdot.ragged_m.out(*args, out=c), calls)
        direct = getattr(torch.ops.ragdot, direct_out_name("ragged_m"))
        rows[f"compiled .out direct {backend}"] = _us(lambda args=args, c=c, f=direct: f(*args, out=c), calls)

        def fwdbwd(b_=backend):
            xr.grad = wr.grad = None
            ragdot.ragged_dot(xr, wr, gs, backend=b_).backward(dy)

        rows[f"ragged_dot fwd+bwd {backend}"] = _us(fwdbwd, calls // 3)
        with torch.autograd.set_multithreading_enabled(False):
            rows[f"ragged_dot fwd+bwd {backend}, engine single-threaded"] = _us(fwdbwd, calls // 3)

    def raw_fwdbwd():
        xr.grad = wr.grad = None
        torch._grouped_mm(xr, wr, offs=torch.cumsum(gs, 0, dtype=torch.int32)).backward(dy)

    def py_raw_fwdbwd():
        xr.grad = wr.grad = None
        _PyRaw.apply(xr, wr, torch.cumsum(gs, 0, dtype=torch.int32)).backward(dy)

    rows["raw+cumsum fwd+bwd"] = _us(raw_fwdbwd, calls // 3)
    rows["py-function raw+cumsum fwd+bwd"] = _us(py_raw_fwdbwd, calls // 3)
    with torch.autograd.set_multithreading_enabled(False):
        rows["raw+cumsum fwd+bwd, engine single-threaded"] = _us(raw_fwdbwd, calls // 3)
        rows["py-function raw+cumsum fwd+bwd, engine single-threaded"] = _us(py_raw_fwdbwd, calls // 3)
    from ragdot.kernels.configs import host_descriptor
    from ragdot.kernels.tail import zero_tail_rows_

    rows["host_descriptor"] = _us(lambda: host_descriptor(a, [1, m, k], [m * k, k, 1], [1, 64, 64]), calls)
    c3 = torch.empty(1, m, n, device=DEV, dtype=torch.bfloat16)
    rows["zero_tail_rows_"] = _us(lambda: zero_tail_rows_(c3, ends), calls)
    return rows


def profiles(m: int, k: int, n: int, e: int) -> None:
    x, w, gs, xr, wr, dy = _operands(m, k, n, e)
    for label, fn in (("fwd triton", lambda: ragdot.ragged_dot(x, w, gs, backend="triton")),
                      ("fwd torch", lambda: ragdot.ragged_dot(x, w, gs, backend="torch"))):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        print(f"---- cProfile {label}, 200 calls")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:5000])
    from torch.profiler import ProfilerActivity, profile

    for backend in ("triton", "torch"):
        for _ in range(3):
            ragdot.ragged_dot(xr, wr, gs, backend=backend).backward(dy)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                xr.grad = wr.grad = None
                ragdot.ragged_dot(xr, wr, gs, backend=backend).backward(dy)
            torch.cuda.synchronize()
        print(f"---- torch.profiler CPU ops, 20 fwd+bwd calls, {backend} (the backward runs on autograd's device "
              "thread, which cProfile does not see)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))


def _timed_backward(cls: type, marks: list[float]) -> Callable[[], None]:
    """Wrap `cls.backward` so each call appends (entry, exit) perf_counter stamps to `marks`; returns the undo."""
    original = cls.__dict__["backward"]

    def backward(ctx, *grads):
        marks.append(time.perf_counter())
        out = original.__func__(ctx, *grads)
        marks.append(time.perf_counter())
        return out

    cls.backward = staticmethod(backward)
    return lambda: setattr(cls, "backward", original)


def backward_split(m: int, k: int, n: int, e: int, calls: int) -> dict[str, tuple[float, float, float, float]]:
    """Where one forward+backward's host time goes, per thread mode: (forward, engine entry up to the Python
    backward's first line, the backward's body, its last line up to `.backward()` returning), µs, medians over
    `calls` calls each after a sync (host clock). Tells the engine's hand-off from the Python body's own cost."""
    _, _, gs, xr, wr, dy = _operands(m, k, n, e)
    cases = {f"ragdot {b}": (api._CallFunction, lambda b=b: ragdot.ragged_dot(xr, wr, gs, backend=b))
             for b in ("triton", "auto", "torch")}
    cases["py-function raw"] = (_PyRaw, lambda: _PyRaw.apply(xr, wr, torch.cumsum(gs, 0, dtype=torch.int32)))
    rows = {}
    for name, (cls, forward) in cases.items():
        for threaded in (True, False):
            marks: list[float] = []
            undo = _timed_backward(cls, marks)
            parts: list[tuple[float, float, float, float]] = []
            try:
                with torch.autograd.set_multithreading_enabled(threaded):
                    for i in range(calls + 10):
                        xr.grad = wr.grad = None
                        synchronize(DEV)
                        marks.clear()
                        t0 = time.perf_counter()
                        out = forward()
                        t1 = time.perf_counter()
                        out.backward(dy)
                        t2 = time.perf_counter()
                        if i >= 10 and len(marks) == 2:
                            parts.append((t1 - t0, marks[0] - t1, marks[1] - marks[0], t2 - marks[1]))
            finally:
                undo()
            med = [sorted(p[j] for p in parts)[len(parts) // 2] * 1e6 for j in range(4)]
            rows[f"{name}, {'device thread' if threaded else 'engine single-threaded'}"] = tuple(med)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["1024,512,512,8"])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--no-profiles", action="store_true")
    p.add_argument("--split-only", action="store_true", help="only the forward+backward split by thread mode")
    args = p.parse_args()
    for i, spec in enumerate(args.shapes):
        m, k, n, e = get_shape(spec).dims
        split = backward_split(m, k, n, e, args.calls // 3)
        print(f"fwd+bwd split (host clock, µs, median of {args.calls // 3} synced calls) M,K,N,E = {m},{k},{n},{e}: "
              "forward / engine entry to the backward's first line / backward body / its end to backward() return")
        for name, parts in split.items():
            print(f"  {name:46s} " + " / ".join(f"{v:7.1f}" for v in parts) + f"   sum {sum(parts):7.1f}")
        if args.split_only:
            continue
        rows = pieces(m, k, n, e, args.calls)
        print(f"host µs per call (host clock; eager = CUDA events per call) M,K,N,E = {m},{k},{n},{e}; bf16; "
              f"{len(api._CALLS)} cached calls")
        for name, (host, eager) in rows.items():
            print(f"  {name:58s} {host:8.1f}   eager {eager:8.1f}")
        if i == 0 and not args.no_profiles:
            profiles(m, k, n, e)


if __name__ == "__main__":
    main()
