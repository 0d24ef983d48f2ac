"""The JAX side: argument checks at trace time, the custom calls, and the custom_jvp with its two primitives.

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
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.experimental.buffer_callback import buffer_callback
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ragdot.api import _check_backend
from ragdot.dimension_numbers import RAGGED_DOT_DN, RaggedDotDimensionNumbers, ShapeError, plan_views
from ragdot.jax import _bridge, _ffi
from ragdot.jax._bridge import Bridge, Signature
from ragdot.native import plan as _plan
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


def _jax_dtype(dtype: torch.dtype) -> Any:
    return jnp.dtype(str(dtype).removeprefix("torch."))


def _callbacks(sig: Signature, out_shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The forward and backward of one signature: the FFI custom call where its library builds and the
    bridge is the prepared one (`ragdot.jax._ffi`), else buffer callbacks. Both take (lhs, rhs, sizes[, dout])."""
    return _directions(sig, out_shape, _bridge.PREPARED and _ffi.available())


@functools.lru_cache(maxsize=1024)
def _directions(sig: Signature, out_shape: tuple[int, ...], ffi: bool) -> tuple[Any, Any]:
    jdt = _jax_dtype(sig.dtype)
    out = jax.ShapeDtypeStruct(out_shape, _jax_dtype(sig.out_dtype))
    grads = (jax.ShapeDtypeStruct(sig.lhs_shape, jdt), jax.ShapeDtypeStruct(sig.rhs_shape, jdt))
    bridge = Bridge(sig)
    if ffi:
        return _ffi_call(bridge, (out,)), _ffi_call(bridge, grads)
    fwd = buffer_callback(bridge.forward, out, vmap_method="sequential")
    bwd = buffer_callback(bridge.backward, grads, vmap_method="sequential")
    return fwd, bwd


def _ffi_call(bridge: Bridge, results: tuple[Any, ...]) -> Any:
    """One direction of `bridge` as the "ragdot_launch" custom call: its results plus a workspace (bytes)."""
    sig = bridge.sig
    backward = len(results) == 2
    workspace = jax.ShapeDtypeStruct((_plan.workspace_bytes(sig.groups),), jnp.uint8)
    call = jax.ffi.ffi_call(_ffi.TARGET, (*results, workspace), vmap_method="sequential")

    def run(lhs: Any, rhs: Any, sizes: Any, *dout: Any) -> Any:
        arrays = (lhs, rhs, sizes, *dout)
        specs = tuple((tuple(a.shape), _torch_dtype(a.dtype)) for a in arrays) + tuple(
            (tuple(r.shape), _torch_dtype(r.dtype)) for r in (*results, workspace))
        got = call(*arrays, slot=np.int64(_ffi.slot(bridge, backward, specs)))
        return got[0] if not backward else (got[0], got[1])

    return run


def _torch_dtype(dtype: Any) -> torch.dtype:
    return getattr(torch, np.dtype(dtype).name)


def _forward(sig: Signature, out_shape: tuple[int, ...], lhs: Any, rhs: Any, sizes: Any) -> Any:
    if math.prod(out_shape) == 0:  # nothing to write: XLA would not run the call
        return _vary(jnp.zeros(out_shape, _jax_dtype(sig.out_dtype)), _varying(jax.typeof(lhs)))
    return _vary(_callbacks(sig, out_shape)[0](lhs, rhs, sizes), _varying(jax.typeof(lhs)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _ragged(sig: Signature, out_shape: tuple[int, ...], lhs: Any, rhs: Any, sizes: Any) -> Any:
    return _forward(sig, out_shape, lhs, rhs, sizes)


@_ragged.defjvp
def _ragged_jvp(sig, out_shape, primals, tangents):
    lhs, rhs, sizes = primals
    dlhs, drhs, _ = tangents
    out = _ragged(sig, out_shape, lhs, rhs, sizes)  # itself differentiable again (forward over forward)
    return out, _tangent_p.bind(dlhs, drhs, lhs, rhs, sizes, sig=sig, out_shape=out_shape)


# The tangent of a ragged product P, out' = P(lhs', rhs) + P(lhs, rhs'), is linear in (lhs', rhs'): jax.grad
# linearizes to it and transposes it into ragdot's backward (one custom call giving both gradients), while
# jax.jvp evaluates it as two forward calls. The backward, (ct rhs^T, lhs^T ct) = B(ct, lhs, rhs), is a
# primitive too, so that it can be differentiated again (jax.hessian, jvp of grad, grad of grad): it is
# bilinear in ct and (lhs, rhs), and so is each tangent, hence every derivative and every transpose is more
# of the same two primitives.
_tangent_p = Primitive("ragdot_ragged_dot_tangent")
_cotangent_p = Primitive("ragdot_ragged_dot_cotangent")
_cotangent_p.multiple_results = True


def _tangent_impl(dlhs, drhs, lhs, rhs, sizes, *, sig, out_shape):
    return _forward(sig, out_shape, dlhs, rhs, sizes) + _forward(sig, out_shape, lhs, drhs, sizes)


def _tangent_abstract(dlhs, drhs, lhs, rhs, sizes, *, sig, out_shape):
    return _typed_like(lhs, out_shape, _jax_dtype(sig.out_dtype))


def _tangent_transpose(ct, dlhs, drhs, lhs, rhs, sizes, *, sig, out_shape):
    if type(ct) is ad.Zero:
        grads = _zero_grads(sig)
    else:
        grads = _cotangent_p.bind(ct.astype(_jax_dtype(sig.out_dtype)), lhs, rhs, sizes, sig=sig,
                                  out_shape=out_shape)
    linear = (ad.is_undefined_primal(dlhs), ad.is_undefined_primal(drhs))
    return [_placed_like(g, x.aval) if want else None for g, x, want in zip(grads, (dlhs, drhs), linear)] + [
        None, None, None]


def _tangent_jvp(primals, tangents, *, sig, out_shape):
    dlhs, drhs, lhs, rhs, sizes = primals
    t_dlhs, t_drhs, t_lhs, t_rhs = (ad.instantiate_zeros(t) for t in tangents[:4])
    bind = functools.partial(_tangent_p.bind, sig=sig, out_shape=out_shape)
    return bind(*primals), bind(t_dlhs, t_drhs, lhs, rhs, sizes) + bind(t_lhs, t_rhs, dlhs, drhs, sizes)


def _zero_grads(sig: Signature) -> tuple[Any, Any]:
    return jnp.zeros(sig.lhs_shape, _jax_dtype(sig.dtype)), jnp.zeros(sig.rhs_shape, _jax_dtype(sig.dtype))


def _cotangent_impl(dout, lhs, rhs, sizes, *, sig, out_shape):
    if lhs.size == 0 or rhs.size == 0 or dout.size == 0:
        return _zero_grads(sig)
    return _callbacks(sig, out_shape)[1](lhs, rhs, sizes, dout)


def _cotangent_abstract(dout, lhs, rhs, sizes, *, sig, out_shape):
    dtype = _jax_dtype(sig.dtype)
    return _typed_like(dout, sig.lhs_shape, dtype), _typed_like(dout, sig.rhs_shape, dtype)


def _typed_like(aval: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """A result's type: `shape` and `dtype`, the default sharding, and `aval`'s varying manual axes (inside
    `jax.shard_map` a ragged product of operands that vary over an axis varies over it)."""
    if not _varying(aval):
        return jax.core.ShapedArray(shape, dtype)
    replicated = jax.sharding.NamedSharding(aval.sharding.mesh, jax.sharding.PartitionSpec(*[None] * len(shape)))
    return aval.update(shape=shape, dtype=dtype, sharding=replicated, weak_type=False)


def _cotangent_jvp(primals, tangents, *, sig, out_shape):
    dout, lhs, rhs, sizes = primals
    t_dout, t_lhs, t_rhs = (ad.instantiate_zeros(t) for t in tangents[:3])
    bind = functools.partial(_cotangent_p.bind, sig=sig, out_shape=out_shape)
    first, second = bind(t_dout, lhs, rhs, sizes), bind(dout, t_lhs, t_rhs, sizes)
    return bind(*primals), [a + b for a, b in zip(first, second)]


def _cotangent_transpose(cts, dout, lhs, rhs, sizes, *, sig, out_shape):
    """Reverse over reverse. B is linear in dout alone (its transpose is the tangent P(g_l, rhs) + P(lhs, g_r))
    or in (lhs, rhs) alone (its transpose is B(dout, g_l, g_r)): the two ways the rule above binds it."""
    g_lhs, g_rhs = (ad.instantiate_zeros(c) for c in cts)
    if ad.is_undefined_primal(dout):
        return [_tangent_p.bind(g_lhs, g_rhs, lhs, rhs, sizes, sig=sig, out_shape=out_shape), None, None, None]
    grads = _cotangent_p.bind(dout, g_lhs, g_rhs, sizes, sig=sig, out_shape=out_shape)
    return [None] + [_placed_like(g, x.aval) if ad.is_undefined_primal(x) else None
                     for g, x in zip(grads, (lhs, rhs))] + [None]


def _per_slice(prim: Any) -> Any:
    """vmap of `prim`: one bind per slice of the mapped axis (as the custom calls' own "sequential" vmap), so
    each stays a primitive jax can differentiate and transpose."""
    def batch(args, dims, **params):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
        if size == 0:  # nothing to run: empty results of the slices' shapes
            avals = prim.abstract_eval(*(jax.core.ShapedArray(a.shape[1:] if d is not None else a.shape, a.dtype)
                                         for a, d in zip(moved, dims)), **params)[0]
            empty = [jnp.zeros((0, *v.shape), v.dtype) for v in (avals if prim.multiple_results else [avals])]
            return (empty, [0] * len(empty)) if prim.multiple_results else (empty[0], 0)
        outs = [prim.bind(*(a if d is None else a[i] for a, d in zip(moved, dims)), **params) for i in range(size)]
        if prim.multiple_results:
            return [jnp.stack(o) for o in zip(*outs)], [0] * len(outs[0])
        return jnp.stack(outs), 0
    return batch


for _prim, _impl, _abstract, _jvp in ((_tangent_p, _tangent_impl, _tangent_abstract, _tangent_jvp),
                                      (_cotangent_p, _cotangent_impl, _cotangent_abstract, _cotangent_jvp)):
    _prim.def_impl(_impl)
    _prim.def_abstract_eval(_abstract)
    mlir.register_lowering(_prim, mlir.lower_fun(_impl, multiple_results=_prim.multiple_results))
    ad.primitive_jvps[_prim] = _jvp
    batching.primitive_batchers[_prim] = _per_slice(_prim)
ad.primitive_transposes[_tangent_p] = _tangent_transpose
ad.primitive_transposes[_cotangent_p] = _cotangent_transpose


def _placed_like(grad: Any, aval: Any) -> Any:
    """A gradient typed as its primal: the same sharding (operands typed with explicit mesh axes) and the same
    varying manual axes (inside `jax.shard_map`). The custom calls' results carry neither, and jax requires
    both of a cotangent."""
    sharding = aval.sharding
    if not sharding.mesh.empty and jax.typeof(grad).sharding != sharding:
        grad = jax.sharding.reshard(grad, sharding)
    return _vary(grad, _varying(aval))


def _vary(x: Any, axes: frozenset) -> Any:
    """`x` typed to vary over the manual mesh `axes` too (a no-op outside shard_map). ragdot's custom calls
    compute each device's own product, so inside shard_map their operands are first cast to vary alike (an
    invariant operand, such as replicated weights, then gets the sum over devices of its per-device gradients
    from the cast's transpose) and their results typed as varying (the custom calls' results carry no type)."""
    missing = tuple(a for a in axes if a not in _varying(jax.typeof(x)))
    if not missing:
        return x
    cast = getattr(jax.lax, "pcast", None)
    return cast(x, missing, to="varying") if cast else jax.lax.pvary(x, missing)


def _varying(aval: Any) -> frozenset:
    """The manual mesh axes a value varies over inside shard_map (`vma` in some jax releases, `mat.varying`
    in others); empty outside."""
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "mat", None), "varying", None)
    return frozenset(vma or ())


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
