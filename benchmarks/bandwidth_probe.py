"""Write-only, read-only and copy bandwidth of the GPU's memory (CUDA events, median of 20 calls, 4 GiB).

The weight gradient's bytes are mostly output writes; this gives the write ceiling to compare it with.
"""

from __future__ import annotations

import statistics

import torch


def bandwidth(fn, nbytes: float, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return nbytes / statistics.median(times) / 1e12


def main() -> None:
    n = 2 << 30  # bf16 elements: 4 GiB
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(n // 4, device="cuda").to(torch.bfloat16).repeat(4)
    print(f"write (fill_)  {bandwidth(lambda: x.fill_(1.0), 2.0 * n):.2f} TB/s")
    print(f"read (sum)     {bandwidth(lambda: y.sum(dtype=torch.float32), 2.0 * n):.2f} TB/s")
    print(f"copy (r+w)     {bandwidth(lambda: x.copy_(y), 4.0 * n):.2f} TB/s")


if __name__ == "__main__":
    main()
