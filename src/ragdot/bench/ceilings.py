"""Measured ceilings of the device: dense matmul rate and copy bandwidth, and speed of light from them.

Measured at the start of a run on the very device (datasheet numbers are only leads): a large square
matmul of the benchmark's dtype on random data, and a large device-to-device copy counting bytes read plus
bytes written. On a CPU both are small so that a quick run stays quick.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ragdot.measure.timing import event_ms

__all__ = ["Ceilings", "measure_ceilings", "speed_of_light_s"]


@dataclass(frozen=True)
class Ceilings:
    peak_flops: float  # FLOP/s of a dense matmul in the benchmark dtype
    bandwidth: float  # bytes/s of a device-to-device copy (read + write)
    source: str = "measured"

    @property
    def peak_tflops(self) -> float:
        return self.peak_flops / 1e12

    @property
    def bandwidth_gbs(self) -> float:
        return self.bandwidth / 1e9


def speed_of_light_s(flops: float, nbytes: float, ceilings: Ceilings) -> float:
    """The floor on the time of a problem: max(FLOPs / peak, bytes / bandwidth), in seconds."""
    return max(flops / ceilings.peak_flops, nbytes / ceilings.bandwidth)


def _best_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Fastest seconds of `fn` in `reps` timed calls after three warm-up calls (a ceiling is a best case)."""
    for _ in range(3):
        fn()
    times = [event_ms(fn, device) / 1e3 for _ in range(reps)]
    return min(times)


def measure_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    """Matmul rate in `dtype` and copy bandwidth on `device` (about a second on a GPU)."""
    cuda = device.type == "cuda"
    n = 8192 if cuda else 512
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    mm_s = _best_seconds(functools.partial(torch.mm, a, b), device, reps=10 if cuda else 5)
    del a, b
    numel = (1 << 29) if cuda else (1 << 22)  # 2 GiB / 16 MiB
    src = torch.randn(numel, device=device, dtype=torch.float32, generator=gen)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(functools.partial(dst.copy_, src), device, reps=10 if cuda else 5)
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    return Ceilings(peak_flops=2 * n**3 / mm_s, bandwidth=nbytes / copy_s)
