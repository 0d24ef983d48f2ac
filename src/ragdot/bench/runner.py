"""One benchmark cell (shape x class x routing): fresh inputs, correctness check, interleaved timing.

For each system the cell records one Result per clock it is timed on (`timing.lane_clocks`: on CUDA
`eager` and `graph` by default, `wall` on a CPU, `batch` for XLA); speed ratios (`speedup_vs_vendor`, the
baseline, and `speedup_vs_padded`, `speedup_vs_torch`) are taken between results of one view
(`timing.view_of`). A system is timed only after its output on the very inputs
of the cell matched the `reference` backend (normalised error ||out - ref|| / ||ref|| within the dtype's
tolerance); a wrong system is reported as "wrong" and never timed. A system that runs out of memory is
"OOM", one that does not serve the case (NotImplementedError) "n/a"; the run goes on after both.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ragdot.bench.ceilings import Ceilings, speed_of_light_s
from ragdot.bench.systems import VENDOR, Operands, RagdotSystem, System
from ragdot.measure.checks import failure_status, normalised_error, tolerance
from ragdot.measure.classes import RaggedClass, flops, min_bytes
from ragdot.measure.timing import (
    CLOCKS,
    DEFAULT_ROUNDS,
    PROGRAM,
    Timed,
    Timing,
    free_memory,
    is_host_bound,
    lane_clocks,
    measure_clocks,
    synchronize,
    view_of,
)
from ragdot.routing import group_sizes
from ragdot.shapes import Shape

__all__ = ["BenchConfig", "Result", "normalised_error", "make_operands", "run_cell"]

L2_BYTES = 60 * 2**20  # rotate input sets when one set fits in L2 (H200: 60 MB)
MAX_SETS = 32


@dataclass
class BenchConfig:
    device: torch.device
    dtype: torch.dtype
    ceilings: Ceilings
    warmup: int = 10
    iters: int = 50
    max_seconds: float | None = None  # time budget per system and cell (None: no bound)
    rounds: int = DEFAULT_ROUNDS
    seed: int = 0
    clocks: tuple[str, ...] = CLOCKS  # CUDA: eager calls and/or CUDA-graph replays (a CPU has one clock)


@dataclass
class Result:
    shape: Shape
    cls: str
    routing: str
    backend: str
    status: str  # ok | unchecked | wrong | OOM | n/a | error
    flops: int
    bytes: int
    sol_s: float
    ms: float | None = None
    p20: float | None = None
    p80: float | None = None
    host_ms: float | None = None  # host time to issue one call, without waiting for the device
    err: float | None = None
    peak_mem_mb: float | None = None
    warmup: int = 0
    iters: int = 0
    note: str = ""
    speedup_vs_padded: float | None = None
    speedup_vs_torch: float | None = None
    clock: str = ""  # eager | graph | wall | batch (see ragdot.measure.timing)
    speedup_vs_vendor: float | None = None  # vendor's time / this one's, same cell and view
    batch: int = 0  # calls per timing sample
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def host_bound(self) -> bool:
        """The device waited for the host: host time per call reached the measured time (CUDA clocks)."""
        return is_host_bound(self.clock, self.ms, self.host_ms)

    @property
    def tflops(self) -> float | None:
        return None if not self.ms else self.flops / (self.ms * 1e-3) / 1e12

    @property
    def pct_sol(self) -> float | None:
        return None if not self.ms else 100.0 * self.sol_s / (self.ms * 1e-3)


def make_operands(cls: RaggedClass, shape: Shape, routing: str, cfg: BenchConfig, index: int = 0) -> Operands:
    """Fresh random normal operands (never zeros), scaled so products stay near unit size."""
    key = f"{cfg.seed}/{shape.name}/{cls.name}/{routing}/{index}".encode()
    gen = torch.Generator(device=cfg.device).manual_seed(zlib.crc32(key))
    lhs_shape, rhs_shape, _ = cls.shapes(shape)
    contraction = {"K": shape.K, "N": shape.N, "M": max(1, shape.M // shape.E)}[cls.contraction]
    scale = contraction**-0.25
    lhs = torch.randn(lhs_shape, generator=gen, device=cfg.device, dtype=cfg.dtype).mul_(scale)
    rhs = torch.randn(rhs_shape, generator=gen, device=cfg.device, dtype=cfg.dtype).mul_(scale)
    sizes = group_sizes(routing, shape.M, shape.E, device=cfg.device)
    return Operands(lhs, rhs, sizes)


def _n_sets(cls: RaggedClass, shape: Shape, cfg: BenchConfig) -> int:
    if cfg.device.type != "cuda":
        return 1
    lhs, rhs, _ = cls.shapes(shape)
    nbytes = (math.prod(lhs) + math.prod(rhs)) * cfg.dtype.itemsize
    return 1 if nbytes >= L2_BYTES else min(MAX_SETS, math.ceil(3 * L2_BYTES / nbytes))


def _check(
    system: System,
    call: Callable[[], Any],
    ref: torch.Tensor | None,
    cfg: BenchConfig,
    cls: RaggedClass,
    sets: list[Operands],
) -> tuple[str, float | None, float | None, str]:
    """(status, err, peak extra MB, note) of one call on input set 0."""
    cuda = cfg.device.type == "cuda"
    try:
        synchronize(cfg.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(cfg.device)
            base = torch.cuda.memory_allocated(cfg.device)
        out = system.to_torch(call())
        synchronize(cfg.device)
        own = system.peak_bytes(cls, sets, cfg.dtype)
        peak = (
            own if own is not None else (torch.cuda.max_memory_allocated(cfg.device) - base if cuda else None)
        )
        peak_mb = None if peak is None else peak / 2**20
        if ref is None:
            return "unchecked", None, peak_mb, ""
        err = normalised_error(*system.compared(out, ref, cls, sets[0]))
        del out
        ok = err <= tolerance(cfg.dtype)  # False for NaN
        return ("ok" if ok else "wrong"), err, peak_mb, ""
    except Exception as exc:
        status, note = failure_status(exc)
        return status, None, None, note


def _cell_inputs(
    shape: Shape, cls: RaggedClass, routing: str, cfg: BenchConfig, reference: System
) -> tuple[list[Operands], torch.Tensor | None, str]:
    """(input sets, the reference output on set 0 or None, a note when the reference failed)."""
    sets = [make_operands(cls, shape, routing, cfg, i) for i in range(_n_sets(cls, shape, cfg))]
    try:
        return sets, reference.to_torch(reference.prepare(cls, sets[:1], cfg.dtype)[0]()), ""
    except Exception as exc:  # its systems are then timed as "unchecked"
        free_memory(cfg.device)
        return sets, None, "reference: " + " ".join(failure_status(exc)).strip()


def _time(timed: list[Timed], cfg: BenchConfig, failed: dict[str, tuple[str, str]]) -> dict[tuple[str, str], Timing]:
    """Timings per (system, clock); a system failing while timed goes to `failed` (status, note)."""
    args = dict(warmup=cfg.warmup, iters=cfg.iters, max_seconds=cfg.max_seconds, rounds=cfg.rounds, clocks=cfg.clocks)
    try:
        return measure_clocks(timed, cfg.device, **args)
    except Exception:  # one system failed while timing: time them one by one to find which
        free_memory(cfg.device)
    timings: dict[tuple[str, str], Timing] = {}
    for t in timed:
        try:
            timings.update(measure_clocks([t], cfg.device, **args))
        except Exception as exc:
            failed[t.name] = failure_status(exc)
            free_memory(cfg.device)
    return timings


def _rows(
    base: Result, clocks: list[str], timings: dict[tuple[str, str], Timing], failed: tuple[str, str] | None
) -> list[Result]:
    """One Result per clock of a system, from its checked `base` result (a clock it was timed on in
    place of an asked one, e.g. eager for a graph that could not be captured, takes that one's place)."""
    spare = [c for (name, c) in timings if name == base.backend and c not in clocks]
    clocks = [spare.pop(0) if (base.backend, c) not in timings and spare else c for c in clocks]
    rows = []
    for clock in clocks:
        r = dataclasses.replace(base, clock=clock, extra=dict(base.extra, clock=clock))
        timing = timings.get((base.backend, clock))
        if timing is not None:
            r.ms, r.p20, r.p80, r.host_ms = timing.median, timing.p20, timing.p80, timing.host
            r.warmup, r.iters, r.batch = timing.warmup, timing.iters, timing.batch
        elif failed is not None:
            r.status, r.note = failed
        elif r.status in ("ok", "unchecked"):  # checked, but this clock could not time it
            r.status, r.note = "n/a", f"not timed on the {clock} clock (the call could not be captured)"
        rows.append(r)
    return rows


def _ratios(results: list[Result]) -> None:
    """speedup_vs_vendor / _padded / _torch: the baseline's time over each result's, within one view."""
    by_view: dict[tuple[str, str], Result] = {(r.backend, view_of(r.clock)): r for r in results if r.ms}
    for r in results:
        for base, attr in ((VENDOR, "speedup_vs_vendor"), ("padded", "speedup_vs_padded"),
                           ("torch", "speedup_vs_torch")):
            other = by_view.get((base, view_of(r.clock)))
            if r.ms and other is not None:
                setattr(r, attr, other.ms / r.ms)


def run_cell(
    shape: Shape,
    cls: RaggedClass,
    routing: str,
    systems: Sequence[System],
    cfg: BenchConfig,
    reference: System | None = None,
) -> list[Result]:
    """Check and time every system on one cell; one Result per system and clock (cfg.clocks as
    `timing.lane_clocks` maps them), in clock order, then system order."""
    itemsize = cfg.dtype.itemsize
    n_flops, n_bytes = flops(shape), min_bytes(cls, shape, itemsize)
    sol = speed_of_light_s(n_flops, n_bytes, cfg.ceilings)
    checked = {
        s.name: Result(shape, cls.name, routing, s.name, "error", n_flops, n_bytes, sol) for s in systems
    }
    # the clocks of each system (a stand-in program says whether it has the program clock: only its presence counts)
    lanes = {s.name: lane_clocks(Timed(s.name, [], s.sync, s.graphable, (None,) if s.has_programs else ()),
                                 cfg.device, cfg.clocks) for s in systems}
    calls: dict[str, list[Callable[[], Any]]] = {}
    programs: dict[str, list[Callable[[int], Any]]] = {}
    try:
        sets, ref, ref_note = _cell_inputs(shape, cls, routing, cfg, reference or RagdotSystem("reference"))
    except Exception as exc:  # the inputs themselves do not fit
        status, note = failure_status(exc)
        for r in checked.values():
            r.status, r.note = status, f"inputs: {note or status}"
        free_memory(cfg.device)
        return _ordered([row for s in systems for row in _rows(checked[s.name], lanes[s.name], {}, None)])
    for system in systems:
        r = checked[system.name]
        try:
            calls[system.name] = system.prepare(cls, sets, cfg.dtype)
        except Exception as exc:
            r.status, r.note = failure_status(exc)
            continue
        r.status, r.err, r.peak_mem_mb, r.note = _check(system, calls[system.name][0], ref, cfg, cls, sets)
        if r.status == "unchecked":
            r.note = ref_note
        if r.status in ("ok", "unchecked") and not r.note:
            r.note = system.describe(cls, sets, cfg.dtype)
        if r.status not in ("ok", "unchecked"):
            calls.pop(system.name)
            free_memory(cfg.device)
        elif system.has_programs and PROGRAM in lanes[system.name]:
            try:
                programs[system.name] = system.programs(cls, sets, cfg.dtype)
            except Exception as exc:  # its program-clock row says why; the other clocks are timed as usual
                r.note = f"{r.note}; " if r.note else ""
                r.note += f"no program clock: {failure_status(exc)[1] or type(exc).__name__}"
    del ref
    timed = [Timed(s.name, calls[s.name], s.sync, s.graphable, programs.get(s.name, ()))
             for s in systems if s.name in calls]
    failed: dict[str, tuple[str, str]] = {}
    timings = _time(timed, cfg, failed)
    results = _ordered(
        [row for s in systems for row in _rows(checked[s.name], lanes[s.name], timings, failed.get(s.name))]
    )
    _ratios(results)
    for system in systems:
        system.release()
    del sets, calls, timed, timings
    free_memory(cfg.device)
    return results


def _ordered(results: list[Result]) -> list[Result]:
    """Clock order (eager-like first, then graph), keeping system order within a clock."""
    rank = {"eager": 0, "batch": 0, "wall": 0, "graph": 1}
    return sorted(results, key=lambda r: rank.get(view_of(r.clock), 2))
