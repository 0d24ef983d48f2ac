"""Differentiation of a ragdot.jax call: a `jax.custom_jvp` whose tangent and backward are JAX primitives, and
the typing jax asks of their results (sharding with explicit mesh axes, varying manual axes in shard_map)."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ragdot.jax._bridge import Signature
from ragdot.jax._calls import _callbacks, _jax_dtype


def _forward(sig: Signature, out_shape: tuple[int, ...], lhs: Any, rhs: Any, sizes: Any) -> Any:
    if math.prod(out_shape) == 0:  # nothing to write: XLA would not run the call
        out = jnp.zeros(out_shape, _jax_dtype(sig.out_dtype))
    else:
        out = _callbacks(sig, out_shape)[0](lhs, rhs, sizes)
    return _vary(out, _varying(jax.typeof(lhs)))


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
    """vmap of `prim`: one bind per slice of the mapped axis in a `jax.lax.map` loop (as the custom calls' own
    "sequential" vmap), so each stays a primitive jax can differentiate and transpose, and the program does not
    grow with the batch (jax.jacfwd maps over every input element)."""
    def batch(args, dims, **params):
        moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
        mapped = [d is not None for d in dims]

        def one(slices):
            it = iter(slices)
            return prim.bind(*(next(it) if m else a for a, m in zip(moved, mapped)), **params)

        out = jax.lax.map(one, tuple(a for a, m in zip(moved, mapped) if m))
        return (out, [0] * len(out)) if prim.multiple_results else (out, 0)
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

