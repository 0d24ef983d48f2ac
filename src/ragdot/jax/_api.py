"""The JAX side's public calls: argument checks at trace time, then the differentiable call of `_rules`.

A call is checked while it is traced (shapes, dtypes, dimension numbers through ragdot's own planner, the
backend name), so every mistake raises at once with the PyTorch side's message. The traced program holds
one custom call for the forward and, under `jax.grad`/`jax.vjp`, one for the backward (`jax.jvp`: two more
forwards for the tangent): the XLA FFI target
"ragdot_launch" (`ragdot.jax._ffi`: a C handler that replays ragdot's recorded Triton launches, or runs
ragdot's PyTorch code on XLA's buffers through `ragdot.jax._bridge`), or, where its library cannot be
built or RAGDOT_JAX_BRIDGE=callback or general, a `buffer_callback` running the same bridge.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ragdot.api import _check_backend
from ragdot.dimension_numbers import RAGGED_DOT_DN, RaggedDotDimensionNumbers, ShapeError, plan_views
from ragdot.jax._bridge import Signature
from ragdot.jax._calls import _jax_dtype
from ragdot.jax._rules import _ragged, _vary, _varying
from ragdot.stacked import ArrayOps, ragged_dot_stacked

__all__ = ["UnsupportedArgument", "ragged_dot", "ragged_dot_general"]

_FLOATS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
_SIGNED = ("int8", "int16", "int32", "int64")


class UnsupportedArgument(NotImplementedError, ValueError):
    """An argument of jax's signature that ragdot does not implement: a NotImplementedError, as jax raises for
    `group_offset`, and a ValueError, as ragdot raises for argument values it does not take."""


def _float_dtype(dtype: Any, what: str) -> torch.dtype:
    name = np.dtype(dtype).name
    if name not in _FLOATS:
        raise TypeError(f"{what} must be float16, bfloat16, float32 or float64, got {name}")
    return _FLOATS[name]


def _out_dtype(preferred_element_type: Any, dtype: torch.dtype) -> torch.dtype:
    """The output dtype as jax would make it (float64 becomes float32 unless x64 is enabled)."""
    if preferred_element_type is None:
        return dtype
    try:
        name = np.dtype(jax.dtypes.canonicalize_dtype(preferred_element_type)).name
    except TypeError:
        raise TypeError(f"preferred_element_type must be None or a float dtype, got {preferred_element_type!r}") \
            from None
    if name not in _FLOATS:
        raise TypeError(f"preferred_element_type must be None or float16, bfloat16, float32 or float64, got {name}")
    return _FLOATS[name]


def _sizes(group_sizes: Any) -> Any:
    if not hasattr(group_sizes, "dtype") or not hasattr(group_sizes, "shape"):
        try:
            group_sizes = jnp.asarray(group_sizes)
        except (TypeError, ValueError):
            raise TypeError(f"group_sizes must be a 1-D array of ints, got {group_sizes!r}") from None
    name = np.dtype(group_sizes.dtype).name
    if not np.issubdtype(np.dtype(group_sizes.dtype), np.integer):
        raise TypeError(f"group_sizes must be an integer array, got {name}")
    if len(group_sizes.shape) == 0:
        raise ShapeError("group_sizes must be 1-D [G] or jax's [slices..., G], got a scalar")
    return group_sizes if name in _SIGNED else jnp.asarray(group_sizes, jnp.int32)


def _check_arrays(lhs: Any, rhs: Any) -> None:
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be a jax array, got {type(x).__name__}")


def _signature(lhs: Any, rhs: Any, sizes: Any, dn: Any, preferred_element_type: Any, backend: str | None):
    dtype = _float_dtype(lhs.dtype, "lhs")
    if np.dtype(rhs.dtype) != np.dtype(lhs.dtype):  # the caller promotes mixed floats first
        raise TypeError(f"rhs must have lhs's dtype {np.dtype(lhs.dtype).name}, got {np.dtype(rhs.dtype).name}")
    dn = RaggedDotDimensionNumbers.coerce(dn)
    plan = plan_views(tuple(lhs.shape), tuple(rhs.shape), sizes.shape[0], dn)  # raises on bad dims or shapes
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
    _check_backend(backend)
    sig = Signature(tuple(lhs.shape), tuple(rhs.shape), sizes.shape[0], dtype, dn,
                    _out_dtype(preferred_element_type, dtype), backend)
    return sig, plan


def _out_shape(plan: Any) -> tuple[int, ...]:
    shape = plan.view_shape
    return shape if plan.perm is None else tuple(shape[p] for p in plan.perm)


def ragged_dot_general(
    lhs: Any,
    rhs: Any,
    group_sizes: Any,
    ragged_dot_dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: Any = None,
    out_sharding: Any = None,
    *,
    backend: str | None = None,
) -> Any:
    """`jax.lax.ragged_dot_general` computed by ragdot's kernels, differentiable in lhs and rhs in all three
    modes (non-contracting, contracting, batch).

    Same values, shapes and dtypes as jax's for every dimension-number case ragdot supports, plus ragdot's
    contract: indices at or past sum(group_sizes) belong to no group (their output rows are exactly zero
    and whatever they hold, NaN included, reaches no other element). `precision` is accepted for drop-in
    use and ignored: ragdot accumulates in float32 and computes float32 without TF32 unless torch's matmul
    setting allows it. `group_offset` is accepted as None only (jax itself raises for it). `out_sharding`
    places the result as jax does (`jax.sharding.reshard`: a NamedSharding, or a PartitionSpec under a mesh
    with explicit axes); ragdot computes the whole product, so operands sharded over several devices are
    gathered first. `backend` picks ragdot's backend (None: ragdot's own choice).
    """
    if group_offset is not None:  # jax itself raises NotImplementedError for it; this is both
        raise UnsupportedArgument("group_offset is not supported by ragdot.jax, as by jax.lax (pass None)")
    out_sharding = _out_sharding(out_sharding)
    _check_arrays(lhs, rhs)
    lhs, rhs = _promoted(lhs, rhs)
    sizes = _sizes(group_sizes)
    if len(sizes.shape) > 1:  # jax's [slices..., G] form: one call per slice (ragdot.stacked)
        dn = RaggedDotDimensionNumbers.coerce(ragged_dot_dimension_numbers)
        out_dtype = _jax_dtype(_out_dtype(preferred_element_type, _float_dtype(lhs.dtype, "lhs")))
        one = functools.partial(_one_row_call, precision=precision, backend=backend)
        out = ragged_dot_stacked(lhs, rhs, sizes, dn, one, preferred_element_type, out_dtype, JAX_OPS)
    else:
        sig, plan = _signature(lhs, rhs, sizes, ragged_dot_dimension_numbers, preferred_element_type, backend)
        axes = frozenset().union(*(_varying(jax.typeof(x)) for x in (lhs, rhs, sizes)))
        lhs, rhs, sizes = (_vary(x, axes) for x in (lhs, rhs, sizes))  # inside shard_map (see _vary)
        out = _ragged(sig, _out_shape(plan), lhs, rhs, sizes)
    return out if out_sharding is None else jax.sharding.reshard(out, out_sharding)


def _out_sharding(out_sharding: Any) -> Any:
    """jax's rule for `out_sharding`: None, a NamedSharding (one on an empty mesh is None) or a PartitionSpec
    (resolved against the mesh in context by `jax.sharding.reshard`, which raises jax's own errors)."""
    if isinstance(out_sharding, jax.sharding.NamedSharding) and out_sharding.mesh.empty:
        return None
    if out_sharding is None or isinstance(out_sharding, (jax.sharding.NamedSharding, jax.sharding.PartitionSpec)):
        return out_sharding
    raise TypeError(
        f"out_sharding must be a jax.sharding.NamedSharding or PartitionSpec (or None), got "
        f"{type(out_sharding).__name__}"
    )


def _one_row_call(lhs, rhs, sizes, dn, *, preferred_element_type, precision, backend):
    return ragged_dot_general(lhs, rhs, sizes, dn, precision, preferred_element_type, backend=backend)


def _promoted(lhs: Any, rhs: Any) -> tuple[Any, Any]:
    """Mixed floating operands cast to their common dtype, as jax.lax.ragged_dot_general does."""
    if np.dtype(lhs.dtype) == np.dtype(rhs.dtype):
        return lhs, rhs
    if not all(jnp.issubdtype(x.dtype, jnp.floating) for x in (lhs, rhs)):
        return lhs, rhs
    common = jnp.promote_types(lhs.dtype, rhs.dtype)
    return lhs.astype(common), rhs.astype(common)


JAX_OPS = ArrayOps(
    select=lambda t, d, i: jnp.take(t, i, axis=d), stack=jnp.stack, sum=lambda t, dims: jnp.sum(t, axis=dims),
    cast=lambda t, dt: t.astype(dt), movedim=jnp.moveaxis,
    zeros_like_row=lambda gs, g: jnp.zeros((g,), gs.dtype), bits=lambda dt: jnp.finfo(dt).bits, float32=jnp.float32,
)


def ragged_dot(
    lhs: Any,
    rhs: Any,
    group_sizes: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: Any = None,
    out_sharding: Any = None,
    *,
    backend: str | None = None,
) -> Any:
    """`jax.lax.ragged_dot`: lhs [M, K], rhs [G, K, N], group_sizes int [G] -> [M, N], by ragdot's kernels.

    Rows of lhs are split into consecutive groups; row i of group g is multiplied by rhs[g]. Rows at or past
    sum(group_sizes) produce zeros.
    """
    for name, x, rank in (("lhs", lhs, 2), ("rhs", rhs, 3)):
        if hasattr(x, "shape") and len(x.shape) != rank:
            raise ValueError(
                f"ragged_dot expects {name} of rank {rank} (lhs [M, K], rhs [G, K, N]), got shape "
                f"{tuple(x.shape)}; use ragged_dot_general for other layouts"
            )
    return ragged_dot_general(lhs, rhs, group_sizes, RAGGED_DOT_DN, precision, preferred_element_type, group_offset,
                              out_sharding, backend=backend)
