"""Does Triton's Hopper warp specialization run here? A plain TMA matmul (4096^3, bf16) with
`tl.range(..., warp_specialize=True)`, checked against torch and timed against the same kernel without it;
case `zero` also gives every other row of tiles an empty contraction loop (trip count 0), as the ragged
kernel's tail tiles have. Run each case in its own process under a timeout: a hang is the answer too.

    timeout 30 python3 benchmarks/ws_probe.py plain|zero
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _mm(a_desc, b_desc, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        WS: tl.constexpr, ZERO: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    k_end = tl.where((pid_m % 2 == 1) & ZERO, 0, K)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, k_end, BK, warp_specialize=WS):
        acc = tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([k, pid_n * BN]), acc)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


def main(case: str) -> None:
    m = n = k = 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = (a.float() @ b.float())
    for bm, bn in ((128, 128), (128, 256)):
        for ws in (False, True):
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            ad = TensorDescriptor(a, [m, k], [k, 1], [bm, 64])
            bd = TensorDescriptor(b, [k, n], [n, 1], [64, bn])
            grid = (m // bm, n // bn)

            def run(c=c, ad=ad, bd=bd, grid=grid, bm=bm, bn=bn, ws=ws):
                _mm[grid](ad, bd, c, m, n, k, BM=bm, BN=bn, BK=64, WS=ws, ZERO=case == "zero",
                          num_warps=4 if ws else (4 if bn == 128 else 8), num_stages=3)

            run()
            torch.cuda.synchronize()
            rows = torch.arange(m, device="cuda") // bm % 2 == 1
            want = torch.where(rows[:, None] & (case == "zero"), torch.zeros_like(ref), ref)
            err = float((c.float() - want).norm() / want.norm())
            ms = triton.testing.do_bench(run, warmup=5, rep=50)
            print(f"{case} {bm}x{bn} ws={ws}: err {err:.1e}, {ms * 1e3:.0f} us, "
                  f"{2 * m * n * k / ms / 1e9:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
