"""ragdot: fast, exact ragged matrix multiplications (Group-GEMM) for Mixture-of-Experts models.

    import ragdot
    out = ragdot.ragged_dot(tokens, expert_weights, group_sizes)        # [M, K] x [G, K, N] -> [M, N]

`ragged_dot_general` has the semantics of `jax.lax.ragged_dot_general` (non-contracting, contracting and
batch modes); `grouped_mm` takes `torch._grouped_mm`'s call (cumulative group ends `offs`, its four operand
forms); every call is differentiable in both operands and can run on several backends (`ragdot.backends()`).
"""

from ragdot._version import __version__
from ragdot.api import backends, explain, ragged_dot, ragged_dot_general
from ragdot.dimension_numbers import RaggedDotDimensionNumbers, ShapeError
from ragdot.grouped import grouped_mm

__all__ = [
    "RaggedDotDimensionNumbers", "ShapeError", "backends", "explain", "grouped_mm", "ragged_dot", "ragged_dot_general",
    "__version__",
]
