"""ragdot for JAX: `ragged_dot` and `ragged_dot_general` with `jax.lax`'s signatures, run by ragdot's kernels.

    import ragdot.jax
    out = jax.jit(ragdot.jax.ragged_dot)(tokens, expert_weights, group_sizes)   # [M, K] x [G, K, N] -> [M, N]

Calls work inside `jax.jit` with traced group sizes (no host synchronisation), are differentiable with
`jax.grad`/`jax.vjp` and in forward mode (`jax.jvp`, `jax.jacfwd`) in all three modes. Each is an XLA FFI
custom call on XLA's own buffers and stream whose C handler replays the Triton launches ragdot recorded on
the signature's first call, or runs ragdot's PyTorch code where that is not possible
(`jax.experimental.buffer_callback` where the handler cannot be built); docs/jax.md. `clear_plans()`
forgets the recorded launches (after changing the tuning cache or torch's TF32 setting); `bridge_stats()`
says per traced call whether it runs from C. Needs the `jax` extra.
"""

from __future__ import annotations

try:
    import jax as _jax  # noqa: F401
    from jax.experimental import buffer_callback as _buffer_callback  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"ragdot.jax needs jax with jax.experimental.buffer_callback (pip install 'ragdot[jax]'): {exc}"
    ) from exc

from ragdot.dimension_numbers import RaggedDotDimensionNumbers
from ragdot.jax._api import UnsupportedArgument, ragged_dot, ragged_dot_general
from ragdot.jax._ffi import clear_plans
from ragdot.jax._ffi import stats as bridge_stats

__all__ = [
    "RaggedDotDimensionNumbers", "UnsupportedArgument", "ragged_dot", "ragged_dot_general", "clear_plans",
    "bridge_stats",
]
