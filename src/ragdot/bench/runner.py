"""One benchmark cell (shape x class x routing): fresh inputs, correctness check, interleaved timing.

For each system the cell records one Result. A system is timed only after its output on the very inputs
of the cell matched the `reference` backend (normalised error ||out - ref|| / ||ref|| within the dtype's
tolerance); a wrong system is reported as "wrong" and never timed. A system that runs out of memory is
"OOM", one that does not serve the case (NotImplementedError) "n/a"; the run goes on after both.
"""

from __future__ import annotations

import gc
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ragdot.bench.ceilings import Ceilings, speed_of_light_s
from ragdot.bench.classes import RaggedClass, flops, min_bytes
from ragdot.bench.systems import Operands, RagdotSystem, System
from ragdot.bench.timing import DEFAULT_ROUNDS, Timed, measure, synchronize
from ragdot.routing import group_sizes
from ragdot.shapes import Shape

__all__ = ["TOLERANCE", "BenchConfig", "Result", "normalised_error", "make_operands", "run_cell"]

TOLERANCE: dict[torch.dtype, float] = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
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
    graphs: bool = False  # time replays of CUDA graphs (device time without launch overhead)


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
    host_ms: float | None = None  # host time to issue one call (CUDA events clock); >= ms: launch-bound
    err: float | None = None
    peak_mem_mb: float | None = None
    warmup: int = 0
    iters: int = 0
    note: str = ""
    speedup_vs_padded: float | None = None
    speedup_vs_torch: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tflops(self) -> float | None:
        return None if not self.ms else self.flops / (self.ms * 1e-3) / 1e12

    @property
    def pct_sol(self) -> float | None:
        return None if not self.ms else 100.0 * self.sol_s / (self.ms * 1e-3)


def normalised_error(out: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 24) -> float:
    """||out - ref|| / ||ref|| in float64 sums, chunked so huge outputs need little extra memory.

    NaN when out holds NaN/Inf; inf when shapes differ or ref is zero but out is not.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    o, r = out.reshape(-1), ref.reshape(-1)
    num = den = 0.0
    for i in range(0, o.numel(), chunk):
        oc, rc = o[i : i + chunk].float(), r[i : i + chunk].to(device=o.device).float()
        num += float((oc - rc).double().square().sum())
        den += float(rc.double().square().sum())
    if math.isnan(num) or math.isinf(num):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return "out of memory" in text.lower() or "RESOURCE_EXHAUSTED" in text


def _classify(exc: BaseException) -> tuple[str, str]:
    if _is_oom(exc):
        return "OOM", ""
    if isinstance(exc, NotImplementedError):
        return "n/a", str(exc)[:200]
    return "error", f"{type(exc).__name__}: {exc}"[:300]


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
        err = normalised_error(out, ref)
        del out
        ok = err <= TOLERANCE.get(cfg.dtype, 1e-4)  # False for NaN
        return ("ok" if ok else "wrong"), err, peak_mb, ""
    except Exception as exc:
        status, note = _classify(exc)
        return status, None, None, note


def run_cell(
    shape: Shape,
    cls: RaggedClass,
    routing: str,
    systems: Sequence[System],
    cfg: BenchConfig,
    reference: System | None = None,
) -> list[Result]:
    """Check and time every system on one cell; always returns one Result per system."""
    itemsize = cfg.dtype.itemsize
    n_flops, n_bytes = flops(shape), min_bytes(cls, shape, itemsize)
    sol = speed_of_light_s(n_flops, n_bytes, cfg.ceilings)
    results = {
        s.name: Result(shape, cls.name, routing, s.name, "error", n_flops, n_bytes, sol) for s in systems
    }
    sets: list[Operands] = []
    calls: dict[str, list[Callable[[], Any]]] = {}
    ref: torch.Tensor | None = None
    try:
        sets = [make_operands(cls, shape, routing, cfg, i) for i in range(_n_sets(cls, shape, cfg))]
    except Exception as exc:  # the inputs themselves do not fit
        status, note = _classify(exc)
        for r in results.values():
            r.status, r.note = status, f"inputs: {note or status}"
        _free(cfg.device)
        return list(results.values())
    reference = reference or RagdotSystem("reference")
    ref_note = ""
    try:
        ref = reference.to_torch(reference.prepare(cls, sets[:1], cfg.dtype)[0]())
    except Exception as exc:  # its systems are then timed as "unchecked"
        ref_note = "reference: " + " ".join(_classify(exc)).strip()
        _free(cfg.device)
    for system in systems:
        r = results[system.name]
        try:
            calls[system.name] = system.prepare(cls, sets, cfg.dtype)
        except Exception as exc:
            r.status, r.note = _classify(exc)
            continue
        r.status, r.err, r.peak_mem_mb, r.note = _check(system, calls[system.name][0], ref, cfg, cls, sets)
        if r.status == "unchecked":
            r.note = ref_note
        if r.status in ("ok", "unchecked") and not r.note:
            r.note = system.describe(cls, sets, cfg.dtype)
        if r.status not in ("ok", "unchecked"):
            calls.pop(system.name)
            _free(cfg.device)
    del ref
    timed = [Timed(s.name, calls[s.name], s.sync, s.graphable) for s in systems if s.name in calls]
    timing_args = dict(
        warmup=cfg.warmup, iters=cfg.iters, max_seconds=cfg.max_seconds, rounds=cfg.rounds, graphs=cfg.graphs
    )
    try:
        timings = measure(timed, cfg.device, **timing_args)
    except Exception:  # one system failed while timing: time them one by one to find which
        _free(cfg.device)
        timings = {}
        for t in timed:
            try:
                timings.update(measure([t], cfg.device, **timing_args))
            except Exception as exc:
                results[t.name].status, results[t.name].note = _classify(exc)
                _free(cfg.device)
    for name, timing in timings.items():
        r = results[name]
        r.ms, r.p20, r.p80, r.host_ms = timing.median, timing.p20, timing.p80, timing.host
        r.warmup, r.iters = timing.warmup, timing.iters
        r.extra["clock"] = timing.clock
    for r in results.values():
        for base, attr in (("padded", "speedup_vs_padded"), ("torch", "speedup_vs_torch")):
            other = results.get(base)
            if r.ms and other is not None and other.ms:
                setattr(r, attr, other.ms / r.ms)
    for system in systems:
        system.release()
    del sets, calls, timed
    _free(cfg.device)
    return list(results.values())
