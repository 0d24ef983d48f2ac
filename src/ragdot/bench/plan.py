"""A rough time estimate of a benchmark run, printed before it starts (and used for the ETA).

Per call: the padded rewrites (`padded`, `xla`) do E times the useful FLOPs, and are counted as a quick OOM
when their E-fold temporaries exceed the memory they may use; the reference does the useful FLOPs in
float32 with a launch per group; every other backend is modelled at 60% of the speed of light.
Per system and cell: a check call, an estimate call, warm-up, then the iterations `plan_counts` allows
on each clock. First calls that compile (XLA, Triton autotuning) get a flat cost per shape and class. It is a plan,
not a measurement: the run prints the real times.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragdot.bench.ceilings import Ceilings, speed_of_light_s
from ragdot.measure.classes import RaggedClass, flops, min_bytes
from ragdot.measure.timing import plan_counts
from ragdot.shapes import Shape

__all__ = ["call_seconds", "cell_seconds", "run_seconds"]

COMPILE_S = {"xla": 1.0, "triton": 1.0}
CELL_OVERHEAD_S = 0.05
MEMORY_SHARE = {"padded": 0.9, "xla": 0.45}  # of the device memory (xla: JAX's default cap in bench.xla)


def padded_temp_bytes(shape: Shape, itemsize: int) -> int:
    """Rough temporaries of the padded rewrite: E masked copies of both token-sized operands, 1.5x."""
    return int(1.5 * shape.E * shape.M * (shape.K + shape.N) * itemsize)


def call_seconds(
    system: str,
    shape: Shape,
    cls: RaggedClass,
    ceilings: Ceilings,
    itemsize: int,
    cuda: bool = True,
    memory_bytes: int | None = None,
) -> float:
    """Modelled seconds of one call of `system` on (shape, class); ~0 for a predicted OOM."""
    n_flops = flops(shape)
    launch = 20e-6 if cuda else 100e-6
    if system in ("padded", "xla"):
        if memory_bytes and padded_temp_bytes(shape, itemsize) > MEMORY_SHARE[system] * memory_bytes:
            return launch
        return shape.E * n_flops / (0.8 * ceilings.peak_flops) + launch
    if system == "reference":
        return n_flops / (0.07 * ceilings.peak_flops if cuda else ceilings.peak_flops) + shape.E * launch
    sol = speed_of_light_s(n_flops, min_bytes(cls, shape, itemsize), ceilings)
    return sol / 0.6 + launch


def cell_seconds(
    systems: Sequence[str],
    shape: Shape,
    cls: RaggedClass,
    ceilings: Ceilings,
    itemsize: int,
    warmup: int,
    iters: int,
    max_seconds: float | None,
    cuda: bool = True,
    memory_bytes: int | None = None,
    clocks: int = 1,
) -> float:
    total = CELL_OVERHEAD_S + call_seconds("reference", shape, cls, ceilings, itemsize, cuda)
    for name in systems:
        t = call_seconds(name, shape, cls, ceilings, itemsize, cuda, memory_bytes)
        n_warm, n_iter = plan_counts(t, warmup, iters, max_seconds)
        total += (2 + max(n_warm - 1, 0) + clocks * n_iter) * t
    return total


def run_seconds(
    systems: Sequence[str],
    shapes: Sequence[Shape],
    classes: Sequence[RaggedClass],
    n_routings: int,
    ceilings: Ceilings,
    itemsize: int,
    warmup: int,
    iters: int,
    max_seconds: float | None,
    cuda: bool = True,
    memory_bytes: int | None = None,
    clocks: int = 1,
) -> float:
    """Modelled seconds of the whole run (`memory_bytes`: the device's, to foresee padded OOMs; `clocks`:
    how many clocks each system is timed on)."""
    total = 0.0
    for shape in shapes:
        for cls in classes:
            total += n_routings * cell_seconds(
                systems, shape, cls, ceilings, itemsize, warmup, iters, max_seconds, cuda, memory_bytes, clocks
            )
            total += sum(COMPILE_S.get(name, 0.0) for name in systems)
    return total
