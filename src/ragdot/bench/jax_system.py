"""The JAX systems beside `xla`: `ragdot-jax` (`ragdot.jax.ragged_dot_general`) and `tokamax`.

Both are timed like `xla` (`ragdot.bench.xla.XlaSystem`): operands shared with torch through DLPack, one
jitted program per class and shape compiled ahead of time, asynchronous calls timed on the batch clock
around a batch ending in `block_until_ready`, and, where the graph clock is asked for, on the program clock
(`XlaSystem.programs`: n calls in one jitted program).

`ragdot-jax` runs ragdot's own kernels inside XLA's program (ragdot.jax's custom call on XLA's stream), with
ragdot's choice of backend; its extra memory is XLA's account (the output buffer and the call's workspace,
16 bytes a group twice over; with the Triton kernels the output is written in place and nothing else is
allocated). With $RAGDOT_JAX_SWITCH_INTERVAL set (seconds),
its cells run under that CPython switch interval (the interpreter's own is restored after each cell).
Its calls go through the jitted function (jax's C++ fast path), not the ahead-of-time compiled object
(which jax dispatches in Python when the program holds a host callback; $RAGDOT_JAX_BENCH_CALL=aot times
that instead).

`tokamax` has only `ragged_dot` ([M, K] x [G, K, N]): the forward classes call it as is, the data-gradient
classes swap the rhs's last two axes first (inside the jitted program, as a user of that API must), and the
weight-gradient classes are tokamax's own gradient of `ragged_dot` with respect to rhs (`jax.vjp`, the
forward part left to XLA's dead-code elimination).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from ragdot.bench.systems import RAGDOT_JAX, TOKAMAX, Operands
from ragdot.bench.xla import XlaSystem, import_jax, xla_unavailable_reason
from ragdot.measure.classes import RaggedClass

__all__ = ["RagdotJaxSystem", "TokamaxSystem", "jax_system", "SWITCH_ENV", "CALL_ENV"]

# Seconds: CPython's switch interval while `ragdot-jax` cells run (unset: the interpreter's, 5 ms by default).
# For measuring whether XLA's thread waits for the GIL while the timing loop holds it (docs/jax.md).
SWITCH_ENV = "RAGDOT_JAX_SWITCH_INTERVAL"
# "aot": time the ahead-of-time compiled program itself, as `xla` is timed. A compiled program that holds a
# host callback gets no C++ fast path from jax (`MeshExecutable.create_cpp_call` declines it), so each of its
# calls runs jax's Python dispatch; the jitted function keeps the fast path. Default "jit", what a user calls.
CALL_ENV = "RAGDOT_JAX_BENCH_CALL"


def switch_interval() -> float | None:
    """$RAGDOT_JAX_SWITCH_INTERVAL as seconds, or None when unset."""
    text = os.environ.get(SWITCH_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{SWITCH_ENV} must be a positive number of seconds, got {text!r}")
    return value


class RagdotJaxSystem(XlaSystem):
    """`ragdot.jax.ragged_dot_general` under `jax.jit` (ragdot's backend choice, as `auto`), called through the
    jitted function."""

    name = RAGDOT_JAX

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self._saved_interval: float | None = None

    def prepare(self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype) -> list[Callable[[], Any]]:
        interval = switch_interval()
        if interval is not None and self._saved_interval is None:  # restored by release()
            self._saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(interval)
        compiled = super().prepare(cls, sets, out_dtype)  # compiled ahead of time: XLA's memory account
        if os.environ.get(CALL_ENV, "jit") == "aot":
            return compiled
        fn = self._fn(cls, sets[0].lhs.dtype, out_dtype)
        return [lambda a=args: fn(*a) for args in self._args]

    def release(self) -> None:
        super().release()
        if self._saved_interval is not None:
            sys.setswitchinterval(self._saved_interval)
            self._saved_interval = None

    def _op(self, cls: RaggedClass, dims: Any, precision: Any, out: Any) -> Callable[[Any, Any, Any], Any]:
        import ragdot.jax

        def call(lhs: Any, rhs: Any, sizes: Any) -> Any:
            return ragdot.jax.ragged_dot_general(lhs, rhs, sizes, dims, precision, preferred_element_type=out)

        return call


class TokamaxSystem(XlaSystem):
    """`tokamax.ragged_dot` with its default implementation choice."""

    name = TOKAMAX

    def _op(self, cls: RaggedClass, dims: Any, precision: Any, out: Any) -> Callable[[Any, Any, Any], Any]:
        import tokamax

        jnp = self.jax.numpy
        if cls.rhs_group and cls.contract[1] == (1,):  # forward: [M, K] x [E, K, N]
            return lambda lhs, rhs, sizes: tokamax.ragged_dot(lhs, rhs, sizes, precision, out)
        if cls.rhs_group:  # data gradient: rhs [E, N, K] contracted over its last axis
            return lambda lhs, rhs, sizes: tokamax.ragged_dot(lhs, jnp.swapaxes(rhs, 1, 2), sizes, precision, out)

        def wgrad(lhs: Any, dout: Any, sizes: Any) -> Any:  # lhs [M, K], dout [M, N] -> [E, K, N]
            weights = jnp.zeros((sizes.shape[0], lhs.shape[1], dout.shape[1]), lhs.dtype)
            _, pullback = self.jax.vjp(lambda w: tokamax.ragged_dot(lhs, w, sizes, precision), weights)
            (grad,) = pullback(dout.astype(lhs.dtype))
            return grad.astype(out)

        return wgrad


def _unavailable(name: str, device: torch.device) -> str | None:
    reason = xla_unavailable_reason(device)
    if reason:
        return reason
    try:
        if name == RAGDOT_JAX:
            import_jax()
            import ragdot.jax  # noqa: F401
        else:
            import tokamax  # noqa: F401
    except Exception as exc:  # ImportError, or a package built for another jax
        module = "ragdot.jax" if name == RAGDOT_JAX else "tokamax"
        return f"{module} does not import ({type(exc).__name__}: {exc})"
    return None


def jax_system(name: str, device: torch.device) -> tuple[XlaSystem | None, str | None]:
    """(the system, None), or (None, why it cannot run here)."""
    reason = _unavailable(name, device)
    if reason:
        return None, reason
    return (RagdotJaxSystem if name == RAGDOT_JAX else TokamaxSystem)(device), None
