"""ragdot for JAX: `ragged_dot` and `ragged_dot_general` with `jax.lax`'s signatures, run by ragdot's kernels.

    import ragdot.jax
    out = jax.jit(ragdot.jax.ragged_dot)(tokens, expert_weights, group_sizes)   # [M, K] x [G, K, N] -> [M, N]

Calls work inside `jax.jit` with traced group sizes (no host synchronisation), are differentiable with
`jax.grad`/`jax.vjp` in all three modes, and reach ragdot's PyTorch code through
`jax.experimental.buffer_callback` on XLA's own buffers and stream (docs/jax.md). Needs the `jax` extra.
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
from ragdot.jax._api import ragged_dot, ragged_dot_general

__all__ = ["RaggedDotDimensionNumbers", "ragged_dot", "ragged_dot_general"]
