"""The `xla` system: `jax.lax.ragged_dot_general` on the same device as the torch inputs.

This measures XLA's own lowering of ragged dot (on NVIDIA GPUs today: the padded rewrite, XLA's default
baseline) in the same process and on the same GPU as ragdot's backends. Inputs are
shared with torch through DLPack (no copy); calls are asynchronous, so they are timed by wall clock around
a batch ending in `block_until_ready` (the batch clock) and, on a GPU where the graph clock is asked for,
around one jitted program that makes the call n times (the program clock, the device-time view: one
dispatch for n calls). The extra device memory of a call is XLA's own account of the
compiled program (temporaries + output).

Before JAX is imported we ask it not to grab most of the GPU up front (`XLA_PYTHON_CLIENT_PREALLOCATE`)
and to grow to at most `XLA_PYTHON_CLIENT_MEM_FRACTION` (0.30 unless set), leaving the rest to torch (in a run
with 0.45 every torch backend reported OOM on the mixtral-8x7b weight gradient while JAX held its pool);
XLA's C++ log is silenced (`TF_CPP_MIN_LOG_LEVEL=3` unless set): its errors still reach us as exceptions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ragdot.bench.systems import Operands, System
from ragdot.measure.classes import RaggedClass

__all__ = ["XlaSystem", "xla_unavailable_reason", "import_jax", "looped", "us_per_turn", "PROGRAM_TURNS"]

_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def import_jax() -> Any:
    """jax, imported with the environment above (shared by every JAX system)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.30")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # XLA's C++ log floods the output on OOM
    import jax

    return jax


def _jax_device(jax: Any, device: torch.device) -> Any:
    platform = "gpu" if device.type == "cuda" else "cpu"
    devices = jax.devices(platform)  # RuntimeError when JAX has no such backend
    # JAX and torch number the CUDA devices alike when both see the same CUDA_VISIBLE_DEVICES.
    index = (device.index or 0) if device.type == "cuda" else 0
    return devices[index]


def xla_unavailable_reason(device: torch.device) -> str | None:
    """None when JAX imports and has a device matching `device`; else why not."""
    try:
        jax = import_jax()
    except Exception as exc:  # ImportError, or a broken jaxlib
        return f"jax does not import ({type(exc).__name__}: {exc})"
    try:
        _jax_device(jax, device)
    except Exception as exc:
        return f"jax has no {device.type} device ({exc})"
    return None


def looped(jax: Any, op: Callable[..., Any]) -> Any:
    """`op(lhs, rhs, sizes)` n times in one jitted program, called as `program(lhs, rhs, sizes, n=n)`: the
    program clock's program (`ragdot.measure.timing`). Each turn passes the operands through an optimization
    barrier, so XLA can hoist no part of a call out of the loop as loop-invariant (the weights' layout
    changes, the group sizes' masks) nor fold the turns together; XLA may copy the loop-carried operands once
    per program (spread over n calls).

    n is static (one program per n; the timing uses one n per cell): XLA then knows the loop's trip count
    and runs the turns back to back. A traced n made it read the loop predicate back to the host every turn,
    a wait per call that serialised the host's work with the device's (H200, 4a19b62: ragdot.jax's program
    clock at 0.70x of triton's graph time where its batch clock gave 0.84x)."""

    def run(lhs: Any, rhs: Any, sizes: Any, n: int) -> Any:
        def turn(_: Any, carry: tuple) -> tuple:
            operands = jax.lax.optimization_barrier(carry[0])
            return operands, op(*operands)

        out = jax.eval_shape(op, lhs, rhs, sizes)
        return jax.lax.fori_loop(0, n, turn, ((lhs, rhs, sizes), jax.numpy.zeros(out.shape, out.dtype)))[1]

    return jax.jit(run, static_argnames="n")


PROGRAM_TURNS = 100  # turns of the probes' loops (`us_per_turn`)


def us_per_turn(jax: Any, op: Callable[..., Any], args: tuple, turns: int = PROGRAM_TURNS) -> float:
    """Host µs per turn of `looped(jax, op)` run `turns` turns on `args`: one program per sample, ending in one
    wait, median of 5 (`ragdot.measure.host.async_us_per_call`). Where the device keeps up, the host work of one
    call made inside a jitted program, with no dispatch per call."""
    from ragdot.measure.host import async_us_per_call

    program = looped(jax, op)
    return async_us_per_call(lambda *a: program(*a, n=turns), [args], 1) / turns


class XlaSystem(System):
    """`jax.lax.ragged_dot_general`, jitted once per class and dtype (compiled once per shape)."""

    name = "xla"
    has_programs = True

    def __init__(self, device: torch.device) -> None:
        self.jax = import_jax()
        self.device = device
        self.jax_device = _jax_device(self.jax, device)
        self._fns: dict[tuple[str, torch.dtype, torch.dtype], Any] = {}
        self._args: list[tuple[Any, Any, Any]] = []
        self._compiled: Any = None
        self._programs: dict[tuple[Any, ...], Any] = {}
        self._looped: dict[tuple[str, torch.dtype, torch.dtype], Any] = {}
        self.sync = lambda out: out.block_until_ready()

    def _fn(self, cls: RaggedClass, in_dtype: torch.dtype, out_dtype: torch.dtype) -> Any:
        key = (cls.name, in_dtype, out_dtype)
        if key not in self._fns:
            jax, lax = self.jax, self.jax.lax
            dims = lax.RaggedDotDimensionNumbers(
                dot_dimension_numbers=cls.dot_dimension_numbers,
                lhs_ragged_dimensions=list(cls.lhs_ragged_dimensions),
                rhs_group_dimensions=list(cls.rhs_group),
            )
            # float32 in full precision, as ragdot does with TF32 off
            precision = lax.Precision.HIGHEST if in_dtype == torch.float32 else None
            out = self.jax.numpy.dtype(_DTYPES[out_dtype])
            self._fns[key] = jax.jit(self._op(cls, dims, precision, out))
        return self._fns[key]

    def _op(self, cls: RaggedClass, dims: Any, precision: Any, out: Any) -> Callable[[Any, Any, Any], Any]:
        """The function jitted for a class (subclasses time other JAX ops on the same footing)."""
        lax = self.jax.lax

        def call(lhs: Any, rhs: Any, sizes: Any) -> Any:
            return lax.ragged_dot_general(lhs, rhs, sizes, dims, precision=precision, preferred_element_type=out)

        return call

    def _to_jax(self, t: torch.Tensor) -> Any:
        t = t.contiguous()
        try:
            return self.jax.dlpack.from_dlpack(t)
        except Exception:  # fall back to a host round trip (slow, but only once per cell)
            host = t.detach().float().cpu().numpy()
            return self.jax.device_put(host, self.jax_device).astype(_DTYPES.get(t.dtype, "int32"))

    def prepare(
        self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype
    ) -> list[Callable[[], Any]]:
        if sets[0].lhs.dtype not in _DTYPES or out_dtype not in _DTYPES:
            raise NotImplementedError(f"xla: dtype {sets[0].lhs.dtype} is not benchmarked")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # torch's writes done before JAX reads the buffers
        self._args = [(self._to_jax(s.lhs), self._to_jax(s.rhs), self._to_jax(s.group_sizes)) for s in sets]
        # Compile ahead of time once per class and shape; the compiled program also reports its memory.
        key = (cls.name, tuple(sets[0].lhs.shape), tuple(sets[0].rhs.shape), sets[0].lhs.dtype, out_dtype)
        if key not in self._programs:
            fn = self._fn(cls, sets[0].lhs.dtype, out_dtype)
            self._programs[key] = fn.lower(*self._args[0]).compile()
        compiled = self._compiled = self._programs[key]
        return [lambda a=args: compiled(*a) for args in self._args]

    def programs(self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype) -> list[Callable[[int], Any]]:
        """Per input set of the prepared cell, `program(n)`: one jitted program calling the op n times in a
        loop (`looped`)."""
        key = (cls.name, sets[0].lhs.dtype, out_dtype)
        program = self._looped.get(key)
        if program is None:
            program = self._looped[key] = looped(self.jax, self._fn(cls, sets[0].lhs.dtype, out_dtype))
        return [lambda n, a=args: program(*a, n=n) for args in self._args]

    def to_torch(self, out: Any) -> torch.Tensor:
        out.block_until_ready()
        try:
            return torch.from_dlpack(out)
        except Exception:
            host = self.jax.numpy.asarray(out, dtype="float32")
            return torch.from_numpy(self.jax.device_get(host).copy()).to(self.device)

    def peak_bytes(self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype) -> int | None:
        try:
            stats = self._compiled.memory_analysis()
            return int(stats.temp_size_in_bytes + stats.output_size_in_bytes)
        except Exception:  # not every jaxlib reports it
            return None

    def release(self) -> None:
        self._args = []
        self._compiled = None
