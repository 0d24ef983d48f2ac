"""Timing: one call on the device clock, CUDA-graph capture, and several systems on one problem
(warm-up, interleaved rounds, median and spread).

Single calls (`timed_call`, `event_ms`, `loop_ms`, `median_ms`, `sustained_ms`, `capture_graph`, `spans_ms`) serve
the MoE, MXFP8 and kernel benchmarks; `measure_clocks` / `measure` serve ``ragdot bench`` and the tuner.

Clocks (the `clock` of every timing; each one also records the host time per call, see below):
- ``eager`` (CUDA): CUDA events around a batch of back-to-back eager calls (up to EAGER_BATCH, as many as
  span EAGER_SAMPLE_S, fewer when the time budget leaves fewer calls), one sample per batch: the batch's span
  divided by its size; a call of 5 ms or more is a sample of its own, so long calls get as many
  interleaved rounds as on the graph clock (mixtral-8x7b's 6-7 ms calls had three samples of six calls under
  `--max-seconds 0.15`, and one kernel timed as two systems came out up to 11% apart). The device
  waits for the host whenever issuing a call takes longer than running it, so host-bound calls show their
  host cost. This is what an eager training loop sees.
- ``graph`` (CUDA): CUDA events around every replay of a CUDA graph of the call: device time, without
  Python dispatch and launch gaps. A system that cannot be captured (a host synchronisation inside) is
  timed on ``eager`` instead.
- ``wall`` (CPU): wall clock around every call (CPU calls are synchronous); the one clock on a CPU.
- ``batch`` (asynchronous systems such as JAX, whose calls run on a stream we cannot put events on): wall
  clock around a batch of back-to-back calls ending in the system's own `sync`, the batch's span divided by
  its size. A batch is a third of the iterations (SYNC_SAMPLES samples), not one call a round: the wait
  (`block_until_ready`) and the first call's dispatch are a fixed cost per sample, which a batch of one
  adds to every call (ragdot.jax on the H200: 0.47 ms a call in single-call samples, 0.11 ms in batches of
  50, 3840x2048x1408 with 64 groups, whose kernel runs 0.10 ms). Like ``eager`` it includes the host's
  cost; the summaries show it in the eager view.
- ``program`` (asynchronous systems that offer it: the JAX systems): wall clock around one compiled program
  that runs the call n times back to back (a loop inside one jitted program; n as for ``batch``, a third of
  the iterations), ending in the system's `sync`, divided by n: one dispatch per sample instead of one per
  call, so device time wherever a call's own host work inside the program (for ragdot.jax, its callback)
  is shorter than its device work. The JAX counterpart of ``graph``, and shown in the graph view.

Host time per call (`Timing.host_ms`, one value per sample): the wall time the host spends issuing the
sample's calls, without waiting for the device, divided by their number. A timing is host-bound when that
reaches the measured time per call (`is_host_bound`).

The systems are interleaved: each round runs a share of every system's samples on every clock, in a
rotated order, so clock and thermal drift hit them all alike. Rounds are short (DEFAULT_ROUNDS, 25: one or
two calls of each system per round at 50 iterations), because the clocks move with power and heat within
tens of milliseconds: with 5 rounds, two copies of one kernel in one run were once measured 5% apart (H200,
6 ms calls). A system with fewer samples than rounds has them spread evenly over the rounds.
Input sets are rotated call by call (``calls[k % len]``) so inputs that fit in L2 are not served from it.
The iteration count adapts to a time budget per system and clock: slow systems get fewer iterations (never
fewer than MIN_ITERS), fast ones the full count.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Timed",
    "Timing",
    "plan_counts",
    "eager_batch",
    "sync_batch",
    "lane_clocks",
    "measure",
    "measure_clocks",
    "synchronize",
    "free_memory",
    "timed_call",
    "event_ms",
    "loop_ms",
    "median_ms",
    "sustained_ms",
    "capture_graph",
    "warm_off_stream",
    "span",
    "spans_ms",
    "is_host_bound",
    "view_of",
    "rotated",
    "parse_clocks",
    "DEFAULT_ROUNDS",
    "EAGER",
    "GRAPH",
    "WALL",
    "BATCH",
    "PROGRAM",
    "CLOCKS",
    "EAGER_BATCH",
    "HOST_BOUND_SHARE",
]

MIN_ITERS = 3
DEFAULT_ROUNDS = 25  # interleaved rounds per cell (see the module docstring)
EAGER, GRAPH, WALL, BATCH, PROGRAM = "eager", "graph", "wall", "batch", "program"
CLOCKS: tuple[str, ...] = (EAGER, GRAPH)  # the clocks one can ask for (CUDA); a CPU has WALL only
EAGER_BATCH = 10  # most back-to-back eager calls per sample on the eager clock
EAGER_SAMPLE_S = 5e-3  # an eager sample spans at least this long where the batch allows (see eager_batch)
SYNC_SAMPLES = 3  # samples of an asynchronous system on the batch clock: each a third of its iterations
# A fully host-bound batch of B eager calls spans B host issue times plus the device time of its last call
# (nothing overlaps that one), so its host share is just under 1 (B / (B + 1) when both are equal): a
# timing counts as host-bound once the host time per call reaches this share of the measured time.
HOST_BOUND_SHARE = 0.9
CAPTURE_ERROR_MODE = "thread_local"  # which threads' unsafe CUDA calls a capture refuses (see capture_graph)
_VIEWS = {EAGER: EAGER, "event": EAGER, BATCH: EAGER, GRAPH: GRAPH, PROGRAM: GRAPH, WALL: WALL}


def view_of(clock: str) -> str:
    """The view a clock belongs to: ``eager`` (eager, batch, and the older spelling ``event``), ``graph``
    (graph, program), ``wall``. Ratios are only taken between timings of one view."""
    return _VIEWS.get(clock, clock or EAGER)


def is_host_bound(clock: str, ms: float | None, host_ms: float | None) -> bool:
    """Whether the device waited for the host: host time per call >= HOST_BOUND_SHARE x the measured time.

    Only CUDA clocks can say (on the wall clock of a CPU, host and measured time are the same thing)."""
    if view_of(clock) not in (EAGER, GRAPH) or clock in (BATCH, PROGRAM) or not ms or host_ms is None:
        return False
    return host_ms >= HOST_BOUND_SHARE * ms


def parse_clocks(names: Sequence[str]) -> tuple[str, ...]:
    """The asked-for clocks in CLOCKS order, deduplicated; ValueError naming `--clocks` otherwise."""
    bad = [n for n in names if n not in CLOCKS]
    if bad or not names:
        what = ", ".join(bad) or "nothing"
        raise ValueError(f"--clocks: {what} is not a clock; expected some of {', '.join(CLOCKS)}")
    return tuple(c for c in CLOCKS if c in names)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between the nearest ranks (numpy's default rule)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


@dataclass
class Timed:
    """One system to time: a zero-argument call per input set, and for asynchronous ones a sync."""

    name: str
    calls: Sequence[Callable[[], Any]]
    sync: Callable[[Any], None] | None = None  # blocks until a result is ready (JAX); None for torch
    graphable: bool = True  # False for calls that synchronise with the host (cannot be graph-captured)
    # The program clock (asynchronous systems): per input set, `program(n)` runs the call n times in one program
    programs: Sequence[Callable[[int], Any]] = ()


@dataclass
class Timing:
    samples_ms: list[float] = field(default_factory=list)  # time per call, one value per sample
    warmup: int = 0
    iters: int = 0  # timed calls
    clock: str = EAGER  # eager | graph | wall | batch
    host_ms: list[float] = field(default_factory=list)  # host time per call, one value per sample
    batch: int = 1  # calls per sample (eager clock; 1 elsewhere, the round's calls on the batch clock)

    @property
    def host(self) -> float | None:
        return float(statistics.median(self.host_ms)) if self.host_ms else None

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples_ms))

    @property
    def p20(self) -> float:
        return percentile(self.samples_ms, 20)

    @property
    def p80(self) -> float:
        return percentile(self.samples_ms, 80)

    @property
    def host_bound(self) -> bool:
        return bool(self.samples_ms) and is_host_bound(self.clock, self.median, self.host)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    """Collect garbage and, on CUDA, return cached blocks: the next measurement starts from a clean pool."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


Span = tuple[Any, Any]  # (start, end) CUDA events around some calls, not yet waited for


def span(fn: Callable[[], Any]) -> Span:
    """Record CUDA events around fn() without waiting: read them with `spans_ms` once all are issued."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start, end


def spans_ms(spans: Sequence[Span]) -> list[float]:
    """Milliseconds of every span, after waiting for the last one."""
    if spans:
        spans[-1][1].synchronize()
    return [start.elapsed_time(end) for start, end in spans]


def timed_call(fn: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """(ms, host ms) of one fn() call: CUDA events around it on a GPU (host ms: issuing it, without a
    wait), the wall clock elsewhere (both values the same)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        ms = 1e3 * (time.perf_counter() - t0)
        return ms, ms
    host: list[float] = []

    def issue() -> None:
        t0 = time.perf_counter()
        fn()
        host.append(1e3 * (time.perf_counter() - t0))

    torch.cuda.synchronize(device)
    (ms,) = spans_ms([span(issue)])
    return ms, host[0]


def loop_ms(fn: Callable[[], Any], device: torch.device, calls: int, repeats: int = 3) -> float:
    """Milliseconds per call of `calls` fn() calls issued back to back, as a training loop issues its steps:
    CUDA events around the whole run and no wait inside it, so the host issues a call while the device still
    runs the ones before (the `loop` clock; a call that synchronises inside itself stops that there); median of
    `repeats` runs, each after a synchronisation. The wall clock off CUDA."""
    if calls < 1 or repeats < 1:
        raise ValueError(f"calls and repeats must be >= 1, got {calls} and {repeats}")

    def run() -> None:
        for _ in range(calls):
            fn()

    return statistics.median(event_ms(run, device) / calls for _ in range(repeats))


def event_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one fn() call: CUDA events around it on GPUs, the host clock otherwise."""
    return timed_call(fn, device)[0]


def capture_graph(fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn() captured once in a CUDA graph; returns the graph's replay. Raises where fn cannot be captured
    (a host synchronisation inside, too little memory).

    Python's cyclic garbage collector is held off during the capture (torch no longer collects before one):
    a dead reference cycle collected mid-capture runs destructors that may release CUDA resources (another
    graph, the memory it holds), calls a global-mode capture does not allow, and the capture then fails on an
    unrelated line. The cycles are collected after it as usual.

    The capture refuses unsafe CUDA calls (a synchronisation, a free) made by this thread only
    (`CAPTURE_ERROR_MODE`): in torch's default global mode any thread's such call fails the capture and fails
    itself, and another runtime in the process (JAX, whose threads free and wait on its own streams while
    `ragdot bench` times torch systems beside it) would lose both, the capture and its stream (the likely cause of
    benchmarks/results/h100-20261206r's failures; with this mode every GPU test passed in that order,
    h100-20261206s). Kernels launched into the captured stream from other threads (autograd's device thread) are
    captured either way.

    A capture that fails is undone as far as torch leaves it undone (`_after_failed_capture`), so that the process
    can go on: benchmarks time such a call on the eager clock instead, and later calls draw random numbers."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, capture_error_mode=CAPTURE_ERROR_MODE):
            fn()
    except BaseException:
        _after_failed_capture(stream)
        raise
    finally:
        if collecting:
            gc.enable()
    return graph.replay


def _after_failed_capture(stream: torch.cuda.Stream) -> None:
    """What a failed `torch.cuda.graph` capture leaves behind, undone: when ending the capture raises (a capture
    invalidated by a forbidden call), torch's context manager neither restores the current stream (it stays the
    capture's side stream) nor takes the CUDA generators out of their capture state, and on torch releases that
    keep that state as a flag (2.11 among them) every later random draw on the device then raises "Offset
    increment outside graph capture encountered unexpectedly". Each default generator gets a copy of its own
    state (the same seed and offset, out of capture), where torch offers the two calls."""
    torch.cuda.set_stream(stream)
    for gen in torch.cuda.default_generators:
        with contextlib.suppress(AttributeError, RuntimeError):  # a torch without graph-safe generator states
            gen.graphsafe_set_state(gen.clone_state())


def warm_off_stream(fn: Callable[[], Any], device: torch.device, calls: int = 2) -> None:
    """`calls` warm-up calls of fn(), on a side stream on CUDA (as graph capture wants)."""
    side = torch.cuda.Stream(device) if device.type == "cuda" else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for _ in range(calls):
            fn()
    if side is not None:
        torch.cuda.current_stream(device).wait_stream(side)


def median_ms(fn: Callable[[], Any], device: torch.device, graph: bool, reps: int = 20) -> float:
    """Median milliseconds of fn() after two warm-up calls; with graph=True, of CUDA-graph replays of it."""
    warm_off_stream(fn, device)
    if graph and device.type == "cuda":
        fn = capture_graph(fn)
    return statistics.median(event_ms(fn, device) for _ in range(reps))


def sustained_ms(fn: Callable[[], Any], seconds: float) -> float:
    """Mean ms per call over back-to-back launches filling about `seconds` (no per-call sync); one call on
    the wall clock without CUDA."""
    if not torch.cuda.is_available():  # smoke runs on the CPU: wall clock
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = max(3, min(200, int(seconds / max(time.perf_counter() - t0, 1e-5))))

    def batch() -> None:
        for _ in range(reps):
            fn()

    (ms,) = spans_ms([span(batch)])
    return ms / reps


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


def eager_batch(n_iter: int, t_call: float = 0.0) -> int:
    """Calls per eager sample for `n_iter` timed calls of about `t_call` seconds each: enough back-to-back calls
    to span EAGER_SAMPLE_S, at most EAGER_BATCH, fewer to keep MIN_ITERS samples. A sample's first call pays
    the launch gap after the wait that ends its round, so a sample of many short calls spreads that gap over
    them (EAGER_BATCH for every call under 0.5 ms); a call of EAGER_SAMPLE_S or more is a sample alone, the gap
    a fraction of a percent of it, and more samples make more interleaved rounds."""
    fill = max(1, math.ceil(EAGER_SAMPLE_S / t_call)) if t_call > 0 else EAGER_BATCH
    return max(1, min(EAGER_BATCH, fill, n_iter // MIN_ITERS))


def sync_batch(n_iter: int) -> int:
    """Calls per sample on the batch clock: n_iter split into SYNC_SAMPLES batches (one wait each)."""
    return max(1, n_iter // SYNC_SAMPLES)


def lane_clocks(system: Timed, device: torch.device, clocks: Sequence[str]) -> list[str]:
    """The clocks `system` is timed on when `clocks` are asked for: WALL on a CPU, BATCH for an
    asynchronous system (and PROGRAM for one with programs, when GRAPH is asked), else each asked clock,
    EAGER in place of GRAPH for calls that cannot be captured (no clock twice)."""
    if device.type != "cuda":
        return [WALL]
    if system.sync is not None:
        return [BATCH, PROGRAM] if system.programs and GRAPH in clocks else [BATCH]
    out: list[str] = []
    for clock in clocks:
        got = GRAPH if clock == GRAPH and system.graphable else EAGER
        if got not in out:
            out.append(got)
    return out


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
    """One CUDA graph per input set, as replay calls (each replayed once, untimed); None when a call
    cannot be captured."""
    try:
        replays = [capture_graph(call) for call in system.calls]
    except Exception:  # e.g. a host synchronisation inside the call
        torch.cuda.synchronize()
        return None
    for replay in replays:
        replay()
    torch.cuda.synchronize()
    return replays


def _round(
    calls: Sequence[Callable[[], Any]],
    sync: Callable[[Any], None] | None,
    start: int,
    count: int,
    device: torch.device,
    batch: int = 1,
) -> tuple[list[float], list[float]]:
    """Run `count` samples of `batch` calls each from call index `start`: (ms per call, host ms per call),
    one value per sample. An asynchronous system (`sync`): each sample is its batch's wall time up to the
    `sync` of its last call (the host time is that same mean: the two cannot be told apart there)."""
    if sync is not None:
        means = []
        for i in range(count):
            synchronize(device)
            t0 = time.perf_counter()
            out = None
            for k in range(start + i * batch, start + (i + 1) * batch):
                out = calls[k % len(calls)]()
            sync(out)
            means.append((time.perf_counter() - t0) * 1e3 / batch)
        return means, list(means)
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        hosts = []
        events[0].record()
        for i in range(count):
            hosts.append(_issue(calls, start + i * batch, batch))  # issue time only: no wait for the GPU
            events[i + 1].record()
        events[-1].synchronize()
        return [events[i].elapsed_time(events[i + 1]) / batch for i in range(count)], hosts
    samples = [_issue(calls, start + i * batch, batch) for i in range(count)]
    return samples, list(samples)


def _issue(calls: Sequence[Callable[[], Any]], first: int, batch: int) -> float:
    """Wall ms per call of issuing calls[first], ... (`batch` of them, rotating over the input sets)."""
    t0 = time.perf_counter()
    for k in range(first, first + batch):
        calls[k % len(calls)]()
    return (time.perf_counter() - t0) * 1e3 / batch


@dataclass
class _Lane:
    """One system on one clock: what to call, how many samples of how many calls."""

    system: Timed
    clock: str
    runs: Sequence[Callable[[], Any]]
    samples: int
    batch: int
    cursor: int
    timing: Timing


def _warm(system: Timed, device: torch.device, warmup: int, iters: int,
          max_seconds: float | None) -> tuple[int, int, float]:
    """The estimate calls and the warm-up calls of `system`, each synchronised and timed (at least two); returns
    (calls made, iterations, seconds of the fastest). The first calls of a signature may do one-time work (a
    launch recorded for replay, a kernel variant compiled), ten times a 0.12 ms call on the H200, so the fastest
    call, not the first, sizes the warm-up, the iterations and the eager batch."""
    fastest = min(_call_once(system, 0, device), _call_once(system, 1, device))
    n_warm, _ = plan_counts(fastest, warmup, iters, max_seconds)
    for k in range(2, n_warm):
        fastest = min(fastest, _call_once(system, k, device))
    return max(n_warm, 2), plan_counts(fastest, warmup, iters, max_seconds)[1], fastest


def _lanes(system: Timed, device: torch.device, clocks: Sequence[str], warm: int, n_iter: int,
           t_call: float) -> list[_Lane]:
    lanes: list[_Lane] = []
    for clock in lane_clocks(system, device, clocks):
        runs = _capture(system) if clock == GRAPH else system.calls
        if runs is None:  # the capture failed: eager calls, unless they are timed already
            if EAGER in clocks:
                continue
            clock, runs = EAGER, system.calls
        batch = 1
        if clock == EAGER:
            batch = eager_batch(n_iter, t_call)
        elif clock in (BATCH, PROGRAM):
            batch = sync_batch(n_iter)
        if clock == PROGRAM:
            runs = _programs(system, batch)
        samples = max(1, n_iter // batch)
        timing = Timing(warmup=warm, iters=samples * batch, clock=clock, batch=batch)
        lanes.append(_Lane(system, clock, runs, samples, batch, warm, timing))
    return lanes


def _programs(system: Timed, n: int) -> list[Callable[[], Any]]:
    """The system's programs of n calls each, each run once untimed (compiled and warm)."""
    runs = [lambda program=program: program(n) for program in system.programs]
    for run in runs:
        system.sync(run())
    return runs


def _share(total: int, n_rounds: int, r: int) -> int:
    """Samples of round r when `total` are spread evenly over `n_rounds`."""
    return total * (r + 1) // n_rounds - total * r // n_rounds


def measure_clocks(
    systems: Sequence[Timed],
    device: torch.device,
    *,
    clocks: Sequence[str] = CLOCKS,
    warmup: int,
    iters: int,
    max_seconds: float | None = None,
    rounds: int = DEFAULT_ROUNDS,
) -> dict[tuple[str, str], Timing]:
    """Time every system on every asked clock (`lane_clocks`) on `device`, all interleaved.

    Returns a Timing per (system name, clock). Each system is called once untimed first (its estimate,
    counted as warm-up), so compile time stays out of the samples as long as the caller has already run
    it once (the correctness check does). On a CPU the one clock is WALL, whatever is asked.
    """
    lanes: list[_Lane] = []
    for system in systems:
        warm, n_iter, t_call = _warm(system, device, warmup, iters, max_seconds)
        lanes += _lanes(system, device, clocks, warm, n_iter, t_call)
    n_rounds = max(1, min(rounds, max((lane.samples for lane in lanes), default=1)))
    for r in range(n_rounds):
        for lane in rotated(lanes, r):
            count = _share(lane.samples, n_rounds, r)
            if count == 0:
                continue
            sync = lane.system.sync if lane.clock in (BATCH, PROGRAM) else None
            if lane.clock == PROGRAM:  # a sample is one program of `batch` calls: one run, one wait
                samples, _ = _round(lane.runs, sync, lane.cursor, count, device, 1)
                samples = [ms / lane.batch for ms in samples]
                hosts = list(samples)
                lane.cursor += count
            else:
                samples, hosts = _round(lane.runs, sync, lane.cursor, count, device, lane.batch)
                lane.cursor += count * lane.batch
            lane.timing.samples_ms += samples
            lane.timing.host_ms += hosts
    return {(lane.system.name, lane.clock): lane.timing for lane in lanes}


def interleaved_ms(calls: dict[str, Callable[[], Any]], device: torch.device, rounds: int, reps: int
                   ) -> dict[str, list[float]]:
    """Per name of `calls` (each warmed up and, for the graph clock, a CUDA-graph replay already), one value per
    round: the median of `reps` timed calls (`event_ms`). Rounds alternate the order, forward then backward, so
    that no call always runs after the same one (the probes' A/B form)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(statistics.median(event_ms(calls[name], device) for _ in range(reps)))
    return times


def rotated(items: Sequence[Any], r: int) -> list[Any]:
    """`items` starting at index r mod len (round r of interleaved timing visits them in this order, so that
    each one goes first in turn); [] for no items."""
    shift = r % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


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
    """One clock per system, a Timing per system name: GRAPH with `graphs` (CUDA; EAGER for calls that
    cannot be captured), else EAGER (WALL on a CPU, BATCH for asynchronous systems)."""
    timings = measure_clocks(
        systems, device, clocks=(GRAPH,) if graphs else (EAGER,), warmup=warmup, iters=iters,
        max_seconds=max_seconds, rounds=rounds,
    )
    return {name: timing for (name, _), timing in timings.items()}
