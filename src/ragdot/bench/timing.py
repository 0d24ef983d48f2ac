"""Timing of several systems on one problem: warm-up, interleaved rounds, median and spread.

Clocks, picked per system:
- CUDA events around every call (torch on a CUDA device): one sample per call, device time only;
- CUDA events around replays of CUDA graphs of the calls (opt-in): device time without launch gaps;
- wall clock around every call (torch on the CPU, where calls are synchronous);
- wall clock around a batch of calls ending in the system's own `sync` (JAX, whose calls are
  asynchronous on a stream we cannot put events on): one sample per round, the batch mean.

The systems are interleaved: each round runs a share of every system's iterations, in a rotated order, so
clock and thermal drift hit them all alike. Rounds are short (DEFAULT_ROUNDS, 25: one or two calls of each system
per round at 50 iterations), because the clocks move with power and heat within tens of milliseconds: with
5 rounds, two copies of one kernel in one run were once measured 5% apart (H200, 6 ms calls).
Input sets are rotated call by call (``calls[k % len]``) so inputs that fit in L2 are not served from it.
The iteration count adapts to a time budget per system: slow systems get fewer iterations (never fewer than
MIN_ITERS), fast ones the full count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["Timed", "Timing", "plan_counts", "measure", "synchronize", "DEFAULT_ROUNDS"]

MIN_ITERS = 3
DEFAULT_ROUNDS = 25  # interleaved rounds per cell (see the module docstring)


@dataclass
class Timed:
    """One system to time: a zero-argument call per input set, and for asynchronous ones a sync."""

    name: str
    calls: Sequence[Callable[[], Any]]
    sync: Callable[[Any], None] | None = None  # blocks until a result is ready (JAX); None for torch
    graphable: bool = True  # False for calls that synchronise with the host (cannot be graph-captured)


@dataclass
class Timing:
    samples_ms: list[float] = field(default_factory=list)
    warmup: int = 0
    iters: int = 0
    clock: str = "event"  # event | graph | wall | batch
    host_ms: list[float] = field(default_factory=list)  # per round: host time per call

    @property
    def host(self) -> float | None:
        return float(np.median(self.host_ms)) if self.host_ms else None

    @property
    def median(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def p20(self) -> float:
        return float(np.percentile(self.samples_ms, 20))

    @property
    def p80(self) -> float:
        return float(np.percentile(self.samples_ms, 80))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plan_counts(t_call: float, warmup: int, iters: int, max_seconds: float | None) -> tuple[int, int]:
    """(warm-up, iterations) for a call of `t_call` seconds within `max_seconds` (None: no bound).

    Warm-up gets at most a fifth of the budget (at least one call), iterations the rest, never fewer
    than MIN_ITERS (nor more than asked for).
    """
    if warmup < 0 or iters < 1:
        raise ValueError(f"warmup must be >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    if max_seconds is None or max_seconds <= 0 or t_call <= 0:
        return warmup, iters
    n_warm = min(warmup, max(1, int(0.2 * max_seconds / t_call)))
    n_iter = int((max_seconds - n_warm * t_call) / t_call)
    return n_warm, max(min(iters, n_iter), min(MIN_ITERS, iters))


def _call_once(system: Timed, index: int, device: torch.device) -> float:
    """Seconds of one synchronous call (wall clock)."""
    synchronize(device)
    start = time.perf_counter()
    out = system.calls[index % len(system.calls)]()
    if system.sync is not None:
        system.sync(out)
    synchronize(device)
    return time.perf_counter() - start


def _capture(system: Timed) -> list[Callable[[], Any]] | None:
    """One CUDA graph per input set, as replay calls; None when a call cannot be captured."""
    graphs = []
    try:
        for call in system.calls:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            graphs.append(graph)
    except Exception:  # e.g. a host synchronisation inside the call
        torch.cuda.synchronize()
        return None
    return [g.replay for g in graphs]


def _round(
    calls: Sequence[Callable[[], Any]],
    sync: Callable[[Any], None] | None,
    start: int,
    count: int,
    device: torch.device,
) -> tuple[list[float], float]:
    """Run `count` calls from call index `start`: (samples in ms, host ms per call)."""
    if sync is not None:  # asynchronous system: one batch, one sample
        synchronize(device)
        t0 = time.perf_counter()
        out = None
        for k in range(start, start + count):
            out = calls[k % len(calls)]()
        sync(out)
        mean = (time.perf_counter() - t0) * 1e3 / count
        return [mean], mean
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        events[0].record()
        t0 = time.perf_counter()
        for i, k in enumerate(range(start, start + count)):
            calls[k % len(calls)]()
            events[i + 1].record()
        host = (time.perf_counter() - t0) * 1e3 / count  # time to enqueue: launch-bound when >= ms
        events[-1].synchronize()
        return [events[i].elapsed_time(events[i + 1]) for i in range(count)], host
    samples = []
    for k in range(start, start + count):
        t0 = time.perf_counter()
        calls[k % len(calls)]()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples, sum(samples) / len(samples)


def measure(
    systems: Sequence[Timed],
    device: torch.device,
    *,
    warmup: int,
    iters: int,
    max_seconds: float | None = None,
    rounds: int = DEFAULT_ROUNDS,
    graphs: bool = False,
) -> dict[str, Timing]:
    """Time every system on `device`, interleaved; returns a Timing per system name.

    Each system is called once untimed first (its estimate, counted as warm-up), so compile time stays out
    of the samples as long as the caller has already run it once (the correctness check does). With
    `graphs` (CUDA only), each system's calls are captured as CUDA graphs and replayed: device time without
    host launch overhead; a system that cannot be captured is timed eagerly (its clock says which).
    """
    plans: dict[str, tuple[int, int]] = {}
    cursor: dict[str, int] = {}
    runs: dict[str, Sequence[Callable[[], Any]]] = {}
    results: dict[str, Timing] = {}
    for system in systems:
        t_call = _call_once(system, 0, device)
        plans[system.name] = plan_counts(t_call, warmup, iters, max_seconds)
        n_warm = plans[system.name][0]
        out = None
        for k in range(1, n_warm):
            out = system.calls[k % len(system.calls)]()
        if system.sync is not None and out is not None:
            system.sync(out)
        del out
        synchronize(device)
        cursor[system.name] = max(n_warm, 1)
        clock = "batch" if system.sync else ("event" if device.type == "cuda" else "wall")
        replays = None
        if graphs and clock == "event" and system.graphable:
            replays = _capture(system)
        runs[system.name] = replays or system.calls
        results[system.name] = Timing(
            warmup=max(n_warm, 1), iters=plans[system.name][1], clock="graph" if replays else clock
        )
    n_rounds = max(1, min(rounds, min((plans[s.name][1] for s in systems), default=1)))
    for r in range(n_rounds):
        order = list(systems[r % len(systems) :]) + list(systems[: r % len(systems)]) if systems else []
        for system in order:
            total = plans[system.name][1]
            count = total // n_rounds + (1 if r < total % n_rounds else 0)
            if count == 0:
                continue
            sync = None if results[system.name].clock == "graph" else system.sync
            samples, host = _round(runs[system.name], sync, cursor[system.name], count, device)
            results[system.name].samples_ms += samples
            results[system.name].host_ms.append(host)
            cursor[system.name] += count
    return results
