"""Group sizes with leading dimensions: `jax.lax.ragged_dot_general`'s `[b..., x..., G]` form.

jax accepts, besides one row of group sizes `[G]` shared by every slice of the operands, group sizes with one
row per slice: shape `(lhs.shape[d] for d in prefix) + (G,)`, where `prefix` is the lhs batch dimensions
followed by the lhs dimensions of the ragged dimension's own kind (non-contracting, or contracting) that come
before it (only the batch dimensions before it when the ragged dimension is a batch dimension). This is what
`jax.vmap` of `ragged_dot` produces: a batch of problems, each with its own routing.

ragdot runs such a call as one 1-D-sizes call per slice (each on the fast path, differentiable), stacked back
in jax's output layout; slices over a contracting prefix dimension are summed in float32 or wider. With P
slices this is P launches: one shared `[G]` row stays the fast form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ragdot.dimension_numbers import RaggedDotDimensionNumbers, ShapeError, plan_views

__all__ = ["ArrayOps", "TORCH_OPS", "check_stacked", "prefix_dims", "ragged_dot_stacked"]


def prefix_dims(lhs_ndim: int, dn: RaggedDotDimensionNumbers) -> tuple[str, list[int]]:
    """(mode, the lhs dimensions the leading group-size axes index, in order) for valid dimension numbers."""
    (lc, _), (lb, _) = dn.dot_dimension_numbers
    (r,) = dn.lhs_ragged_dimensions
    free = [d for d in range(lhs_ndim) if d not in lc and d not in lb]
    if r in lb:
        return "batch", list(lb[: lb.index(r)])
    if r in lc:
        return "ragged_k", [*lb, *sorted(d for d in lc if d < r)]
    return "ragged_m", [*lb, *(d for d in free if d < r)]


def _renumber(dims: tuple[int, ...], removed: set[int]) -> tuple[int, ...]:
    return tuple(d - sum(1 for x in removed if x < d) for d in dims if d not in removed)


def _slice_numbers(dn: RaggedDotDimensionNumbers, lhs_removed: set[int], rhs_removed: set[int]):
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    keep_c = [i for i, d in enumerate(lc) if d not in lhs_removed]
    keep_b = [i for i, d in enumerate(lb) if d not in lhs_removed]
    return RaggedDotDimensionNumbers(
        ((_renumber(tuple(lc[i] for i in keep_c), lhs_removed), _renumber(tuple(rc[i] for i in keep_c), rhs_removed)),
         (_renumber(tuple(lb[i] for i in keep_b), lhs_removed), _renumber(tuple(rb[i] for i in keep_b), rhs_removed))),
        _renumber(dn.lhs_ragged_dimensions, lhs_removed),
        _renumber(dn.rhs_group_dimensions, rhs_removed),
    )


@dataclass(frozen=True)
class ArrayOps:
    """The few array operations a stacked call needs, so the PyTorch and JAX front ends share it."""

    select: Callable[[Any, int, int], Any]  # t, dim, index -> t[index at dim], that dimension removed
    stack: Callable[[list], Any]
    sum: Callable[[Any, tuple[int, ...]], Any]
    cast: Callable[[Any, Any], Any]
    movedim: Callable[[Any, int, int], Any]
    zeros_like_row: Callable[[Any, int], Any]  # group_sizes, G -> int zeros [G] like them
    bits: Callable[[Any], int]  # float dtype -> bits
    float32: Any


TORCH_OPS = ArrayOps(
    select=lambda t, d, i: t.select(d, i), stack=torch.stack, sum=lambda t, dims: t.sum(dim=dims),
    cast=lambda t, dt: t.to(dt), movedim=lambda t, a, b: t.movedim(a, b),
    zeros_like_row=lambda gs, g: gs.new_zeros(g), bits=lambda dt: torch.finfo(dt).bits, float32=torch.float32,
)


def _select(ops: ArrayOps, t: Any, dims: list[int], index: tuple[int, ...]) -> Any:
    """t[index at dims] with those dimensions removed."""
    for d, i in sorted(zip(dims, index), reverse=True):
        t = ops.select(t, d, i)
    return t


def check_stacked(lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...], sizes_shape: tuple[int, ...],
                  dn: RaggedDotDimensionNumbers) -> tuple[str, list[int]]:
    """(mode, prefix dims) of a stacked call; ShapeError naming group_sizes when its shape does not fit."""
    groups = sizes_shape[-1]
    plan_views(tuple(lhs_shape), tuple(rhs_shape), groups, dn)  # the dimension numbers' own errors first
    mode, prefix = prefix_dims(len(lhs_shape), dn)
    if not prefix:
        raise ShapeError(
            f"expected group_sizes to have shape ({groups},), got {tuple(sizes_shape)}: group_sizes must be 1-D "
            "[G] with these dimension numbers (no lhs batch dimension and none of the ragged dimension's kind "
            "before it)"
        )
    expected = (*(lhs_shape[d] for d in prefix), groups)
    if tuple(sizes_shape) != expected:
        raise ShapeError(
            f"expected group_sizes to have shape {expected}, got {tuple(sizes_shape)} (group_sizes: one row of "
            f"group sizes per slice of lhs dimensions {tuple(prefix)}, or one row ({groups},) for all)"
        )
    return mode, prefix


def ragged_dot_stacked(
    lhs: Any, rhs: Any, group_sizes: Any, dimension_numbers: Any, call: Callable[..., Any],
    preferred_element_type: Any, out_dtype: Any, ops: ArrayOps = TORCH_OPS, **kwargs: Any,
) -> Any:
    """`call` (a ragged_dot_general) for group sizes with leading dimensions, slice by slice; `out_dtype` is
    the call's output dtype (preferred_element_type or the operands' dtype)."""
    dn = RaggedDotDimensionNumbers.coerce(dimension_numbers)
    groups = group_sizes.shape[-1]
    mode, prefix = check_stacked(tuple(lhs.shape), tuple(rhs.shape), tuple(group_sizes.shape), dn)
    rows = group_sizes.reshape(-1, groups)
    count = rows.shape[0]
    if mode == "batch" or count == 0:  # batch mode reads no group sizes; no slices: an empty or zero result
        first = rows[0] if count else ops.zeros_like_row(group_sizes, groups)
        return call(lhs, rhs, first, dn, preferred_element_type=preferred_element_type, **kwargs)
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    pair = dict(zip(lb, rb)) | dict(zip(lc, rc))
    rhs_dims = [pair[d] for d in prefix if d in pair]
    summed = [d for d in prefix if d in lc]  # contracting prefix dims: their slices add up
    sub = _slice_numbers(dn, set(prefix), set(rhs_dims))
    slice_dtype = ops.float32 if summed and ops.bits(out_dtype) < 32 else preferred_element_type
    sizes = [lhs.shape[d] for d in prefix]
    results = []
    for p in range(count):
        index = _unravel(p, sizes)
        lhs_p = _select(ops, lhs, prefix, index)
        rhs_p = _select(ops, rhs, rhs_dims, tuple(i for d, i in zip(prefix, index) if d in pair))
        results.append(call(lhs_p, rhs_p, rows[p], sub, preferred_element_type=slice_dtype, **kwargs))
    out = ops.stack(results).reshape(*sizes, *results[0].shape)
    if mode == "ragged_m":
        return out
    # ragged_k: slices [batch prefix..., contracting prefix..., G, free...] -> (G, batch..., free...)
    nb = len(prefix) - len(summed)
    if summed:
        out = ops.cast(ops.sum(out, tuple(range(nb, len(prefix)))), out_dtype)
    return ops.movedim(out, nb, 0)


def _unravel(p: int, sizes: list[int]) -> tuple[int, ...]:
    index = []
    for size in reversed(sizes):
        p, i = divmod(p, size)
        index.append(i)
    return tuple(reversed(index))

