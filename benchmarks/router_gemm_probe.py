"""Is the router's bfloat16 gate matmul bitwise stable: repeated eager calls, eager against a CUDA-graph replay (the
eager call on another stream, as a warm-up before capture runs), and what it costs (graph clock)?

    python benchmarks/router_gemm_probe.py [--tokens 8192] [--dim 2048] [--experts 128]

For each way of computing the three products of `ragdot.moe.router_gemm` (logits, dx, dw): torch.mm with a
float32 output (cuBLAS), the float32 matmul of upcast operands (cuBLAS, the router's former path) and ragdot's
Triton batch kernel (`ragdot.ops.run("batch", ..., float32, "triton")`). Prints, per product and way: equal on a
repeat, equal between eager (side stream) and replay, the largest difference to the float64 product, and the
median replay time.
"""

from __future__ import annotations

import argparse
import functools

import torch

from ragdot import ops
from ragdot.measure.timing import capture_graph, median_ms
from ragdot.moe import router_gemm


def _ways():
    def cublas(a, b):
        return torch.mm(a, b, out_dtype=torch.float32)

    def upcast(a, b):
        return torch.mm(a.float(), b.float())

    def triton(a, b):
        return ops.run("batch", a[None], b[None], None, torch.float32, "triton")[0]

    return {"cublas-out-f32": cublas, "upcast-f32": upcast, "triton-batch": triton}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--experts", type=int, default=128)
    args = p.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    t, d, e = args.tokens, args.dim, args.experts
    x = torch.randn(t, d, device=dev, generator=gen).to(torch.bfloat16)
    w = (torch.randn(e, d, device=dev, generator=gen) / d**0.5).to(torch.bfloat16)
    g = torch.randn(t, e, device=dev, generator=gen) * 1e-3
    g3 = router_gemm.split3(g)
    products = {"logits": (x, w.t()), "dx": (g3, w.repeat(3, 1)), "dw": (g3.t(), x)}
    for name, (a, b) in products.items():
        ref = a.double() @ b.double()
        for way, fn in _ways().items():
            print(f"{name:6} {way:15} {_probe(functools.partial(fn, a, b), ref, dev)}", flush=True)


def _probe(call, ref: torch.Tensor, dev: torch.device) -> str:
    first, second = call(), call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm = call()
    torch.cuda.current_stream().wait_stream(side)
    holder: list[torch.Tensor] = []
    replay = capture_graph(lambda: holder.append(call()))
    replay()
    torch.cuda.synchronize()
    err = ((first.double() - ref).abs().max() / ref.abs().max()).item()
    ms = median_ms(call, dev, True, reps=50)
    return (f"repeat-equal={torch.equal(first, second)} side-equal={torch.equal(first, warm)} "
            f"replay-equal={torch.equal(first, holder[-1])} max-rel-err={err:.2e} graph {1e3 * ms:.1f} us")

if __name__ == "__main__":
    main()
