"""Measured ceilings of the device: dense matmul rate and copy bandwidth, and speed of light from them.

Measured at the start of a run on the very device (datasheet numbers are only leads): a large square
matmul of the benchmark's dtype on random data, and a large device-to-device copy counting bytes read plus
bytes written. On a CPU both are small so that a quick run stays quick.

A ceiling measured on a busy machine is too low, and every % of speed of light above it too high; such a
measurement is flagged (`Ceilings.busy` says why): on a CPU, a load average (last minute) above
BUSY_LOAD x the usable cores before the measurement, and on any device, timed repeats whose median is more
than SPREAD x above their fastest.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ragdot.measure.timing import event_ms

__all__ = ["Ceilings", "measure_ceilings", "speed_of_light_s", "busy_reason", "BUSY_LOAD", "SPREAD"]

BUSY_LOAD = 0.5  # load average per usable core above which a CPU counts as busy
SPREAD = 0.2  # repeats of a ceiling whose median is this much above their fastest: the machine was busy


@dataclass(frozen=True)
class Ceilings:
    peak_flops: float  # FLOP/s of a dense matmul in the benchmark dtype
    bandwidth: float  # bytes/s of a device-to-device copy (read + write)
    source: str = "measured"
    busy: str = ""  # why the measurement is not to be trusted (a busy machine); "" when it is

    @property
    def label(self) -> str:
        """``measured``, or ``measured; BUSY: ...`` when flagged."""
        return self.source + (f"; BUSY: {self.busy}" if self.busy else "")

    @property
    def peak_tflops(self) -> float:
        return self.peak_flops / 1e12

    @property
    def bandwidth_gbs(self) -> float:
        return self.bandwidth / 1e9


def speed_of_light_s(flops: float, nbytes: float, ceilings: Ceilings) -> float:
    """The floor on the time of a problem: max(FLOPs / peak, bytes / bandwidth), in seconds."""
    return max(flops / ceilings.peak_flops, nbytes / ceilings.bandwidth)


def _best_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> tuple[float, float]:
    """(fastest seconds, median / fastest - 1) of `fn` in `reps` timed calls after three warm-up calls (a
    ceiling is a best case; the spread says how steady the machine was)."""
    for _ in range(3):
        fn()
    times = [event_ms(fn, device) / 1e3 for _ in range(reps)]
    best = min(times)
    return best, (statistics.median(times) / best - 1 if best > 0 else 0.0)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_reason(cpu: bool, spreads: dict[str, float], load: float | None = None, cores: int | None = None) -> str:
    """Why a ceiling measurement looks disturbed ("" when it does not): a high CPU load, or unsteady repeats."""
    reasons = []
    if cpu:
        if load is None and hasattr(os, "getloadavg"):
            load = os.getloadavg()[0]
        cores = cores or _usable_cores()
        if load is not None and load > BUSY_LOAD * cores:
            reasons.append(f"load average {load:.1f} on {cores} cores")
    for what, spread in spreads.items():
        if spread > SPREAD:
            reasons.append(f"{what} repeats {100 * spread:.0f}% apart (median over fastest)")
    return "; ".join(reasons)


def measure_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    """Matmul rate in `dtype` and copy bandwidth on `device` (about a second on a GPU)."""
    cuda = device.type == "cuda"
    load_before = busy_reason(not cuda, {})  # before our own matmuls add to the load
    n = 8192 if cuda else 512
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    mm_s, mm_spread = _best_seconds(functools.partial(torch.mm, a, b), device, reps=10 if cuda else 5)
    del a, b
    numel = (1 << 29) if cuda else (1 << 22)  # 2 GiB / 16 MiB
    src = torch.randn(numel, device=device, dtype=torch.float32, generator=gen)
    dst = torch.empty_like(src)
    copy_s, copy_spread = _best_seconds(functools.partial(dst.copy_, src), device, reps=10 if cuda else 5)
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    spread = busy_reason(False, {"matmul": mm_spread, "copy": copy_spread})
    busy = "; ".join(r for r in (load_before, spread) if r)
    return Ceilings(peak_flops=2 * n**3 / mm_s, bandwidth=nbytes / copy_s, busy=busy)
