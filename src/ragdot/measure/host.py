"""Host time per call: back-to-back calls on the wall clock, and on CUDA their eager and device time.

A pass issues `calls` calls in chunks (all at once with chunk 0), a sync before each chunk. Host time is the
wall time of issuing them; eager time, CUDA events around each chunk; device time, the same events with the
GPU held by a spin kernel long enough that every launch of the chunk is queued before the first one runs
(a pass whose hold ran out early is retried with a longer hold, and given up after four tries).

`time_host_interleaved` times several calls side by side: their passes alternate round by round, so a slow
phase of a shared host (host times move by 10-30% over seconds on a virtual machine) lands on every system
alike instead of on whichever one happened to run then.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ragdot.measure.timing import synchronize

__all__ = ["HostTiming", "time_host", "time_host_interleaved", "async_batch", "async_us_per_call", "budgeted_calls",
           "chunk_sizes", "MIN_CALLS"]

MIN_CALLS = 10  # the time budget never cuts a pass below this many calls
PILOT_CALLS = 10
DEVICE_REPEATS = 3  # at most this many device-time passes (device time varies less than host time)
HOLD_CYCLES_PER_US = 2000  # spin-kernel cycles per microsecond (about the SM clock of current GPUs)


@dataclass(frozen=True)
class HostTiming:
    """Per-call times of one system in one phase, microseconds (eager and device: CUDA only)."""

    host_us: float
    calls: int
    eager_us: float | None = None
    device_us: float | None = None

    @property
    def host_bound(self) -> bool | None:
        return None if self.device_us is None else self.host_us >= self.device_us


def chunk_sizes(calls: int, chunk: int) -> Iterator[int]:
    step = chunk if chunk > 0 else calls
    for start in range(0, calls, step):
        yield min(step, calls - start)


def _pass(
    call: Callable[[], Any], calls: int, chunk: int, device: torch.device, hold_cycles: int = 0
) -> tuple[float, float | None, bool]:
    """(host µs per call, event µs per call or None, whether a hold covered every chunk's launches)."""
    cuda = device.type == "cuda"
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
    host_s, event_ms, covered = 0.0, 0.0, True
    for n in chunk_sizes(calls, chunk):
        synchronize(device)
        if events is not None:
            if hold_cycles:
                torch.cuda._sleep(hold_cycles)
            events[0].record()
        start = time.perf_counter()
        for _ in range(n):
            call()
        host_s += time.perf_counter() - start
        if events is not None:
            if hold_cycles and events[0].query():  # the GPU got to the calls before all were queued
                covered = False
            events[1].record()
            events[1].synchronize()
            event_ms += events[0].elapsed_time(events[1])
    return host_s * 1e6 / calls, (event_ms * 1e3 / calls if cuda else None), covered


def budgeted_calls(per_call_us: float, calls: int, passes: int, max_seconds: float) -> int:
    """The call count per pass that keeps `passes` passes within `max_seconds` (0: no bound)."""
    if max_seconds <= 0 or per_call_us <= 0:
        return calls
    fit = int(max_seconds * 1e6 / (passes * per_call_us))
    return max(min(calls, fit), min(MIN_CALLS, calls))


def _device_us(call: Callable[[], Any], calls: int, chunk: int, device: torch.device, host_us: float) -> float | None:
    """Device time per call: chunks issued behind a spin kernel long enough to cover their launches."""
    if not hasattr(torch.cuda, "_sleep"):
        return None
    chunk_calls = min(chunk if chunk > 0 else calls, calls)
    hold_us = 1.5 * host_us * chunk_calls + 100.0
    for _ in range(4):
        _, event_us, covered = _pass(call, calls, chunk, device, int(hold_us * HOLD_CYCLES_PER_US))
        if covered:
            return event_us
        hold_us *= 4
    return None


def time_host(
    call: Callable[[], Any],
    device: torch.device,
    *,
    calls: int,
    repeats: int,
    warmup: int,
    chunk: int = 0,
    max_seconds: float = 0.0,
) -> HostTiming:
    """Host time per call of `call` and, on CUDA, its eager and device time per call (medians over passes).

    Warm-up calls and a sync first, then a short pilot pass whose time per call sets the calls per pass so
    that all passes fit `max_seconds` (0: no bound), then `repeats` passes (host and eager time) and on CUDA
    up to DEVICE_REPEATS passes with the GPU held (device time).
    """
    return time_host_interleaved({"call": call}, device, calls=calls, repeats=repeats, warmup=warmup,
                                 chunk=chunk, max_seconds=max_seconds)["call"]


def time_host_interleaved(
    named: Mapping[str, Callable[[], Any]],
    device: torch.device,
    *,
    calls: int,
    repeats: int,
    warmup: int,
    chunk: int = 0,
    max_seconds: float = 0.0,
) -> dict[str, HostTiming]:
    """`time_host` of several calls, their passes interleaved: warm-up and pilot of each, then `repeats` rounds
    of one pass per call (host and eager time), then on CUDA the device-time rounds the same way. Each call
    keeps its own calls per pass (its pilot and `max_seconds`, which bounds each call's passes)."""
    device_repeats = min(repeats, DEVICE_REPEATS) if device.type == "cuda" else 0
    counts: dict[str, int] = {}
    for name, call in named.items():
        for _ in range(warmup):
            call()
        synchronize(device)
        pilot_host, pilot_event, _ = _pass(call, min(calls, PILOT_CALLS), chunk, device)
        counts[name] = budgeted_calls(max(pilot_host, pilot_event or 0.0), calls, repeats + device_repeats,
                                      max_seconds)
    samples: dict[str, list] = {name: [] for name in named}
    for _ in range(repeats):
        for name, call in named.items():
            samples[name].append(_pass(call, counts[name], chunk, device))
    host = {name: statistics.median(s[0] for s in samples[name]) for name in named}
    if device.type != "cuda":
        return {name: HostTiming(host[name], counts[name]) for name in named}
    held: dict[str, list] = {name: [] for name in named}
    for _ in range(device_repeats):
        for name, call in named.items():
            held[name].append(_device_us(call, counts[name], chunk, device, host[name]))
    out = {}
    for name in named:
        eager_us = statistics.median(s[1] for s in samples[name])
        device_us = None if None in held[name] else statistics.median(held[name])
        out[name] = HostTiming(host[name], counts[name], eager_us, device_us)
    return out


def async_batch(
    fn: Callable[..., Any], arg_sets: Sequence[tuple], calls: int, wait: str = "block"
) -> Callable[[], None]:
    """One timed unit of an asynchronous system (JAX: jitted functions, whose results have
    `block_until_ready`): `calls` calls rotating over `arg_sets`, then one wait for the last result ("block":
    `block_until_ready`; "spin": a Python loop on `is_ready()` first; "each": every call waited for in turn).
    Time it with `time_host` / `time_host_interleaved` on the CPU device (its stream is not torch's) and
    divide by `calls`."""
    if wait not in ("block", "spin", "each"):
        raise ValueError(f"wait must be 'block', 'spin' or 'each', got {wait!r}")
    if calls < 1 or not arg_sets:
        raise ValueError(f"calls must be >= 1 and arg_sets not empty, got calls={calls}, {len(arg_sets)} sets")

    def batch() -> None:
        out = None
        for i in range(calls):
            out = fn(*arg_sets[i % len(arg_sets)])
            if wait == "each":
                out.block_until_ready()
        leaf = out[-1] if isinstance(out, (tuple, list)) else out
        if wait == "spin":
            while not leaf.is_ready():
                pass
        leaf.block_until_ready()

    return batch


def async_us_per_call(
    fn: Callable[..., Any], arg_sets: Sequence[tuple], calls: int, *, repeats: int = 5, warmup: int = 1,
    wait: str = "block",
) -> float:
    """Host µs per call of `async_batch(fn, arg_sets, calls, wait)`: the median of `repeats` batches on the
    wall clock, after `warmup` batches."""
    batch = async_batch(fn, arg_sets, calls, wait)
    return time_host(batch, torch.device("cpu"), calls=1, repeats=repeats, warmup=warmup).host_us / calls
