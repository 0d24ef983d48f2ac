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
from typing import Any

import torch

from ragdot.dimension_numbers import RaggedDotDimensionNumbers, ShapeError, plan_views

__all__ = ["prefix_dims", "ragged_dot_stacked"]


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


def _select(t: torch.Tensor, dims: list[int], index: tuple[int, ...]) -> torch.Tensor:
    """t[index at dims] with those dimensions removed (a view)."""
    for d, i in sorted(zip(dims, index), reverse=True):
        t = t.select(d, i)
    return t


def ragged_dot_stacked(
    lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, dimension_numbers: Any,
    call: Callable[..., torch.Tensor], preferred_element_type: torch.dtype | None, **kwargs: Any,
) -> torch.Tensor:
    """`call` (ragdot's ragged_dot_general) for group sizes with leading dimensions, slice by slice."""
    dn = RaggedDotDimensionNumbers.coerce(dimension_numbers)
    if not isinstance(lhs, torch.Tensor) or not isinstance(rhs, torch.Tensor):
        raise TypeError(f"lhs and rhs must be torch.Tensors, got {type(lhs).__name__} and {type(rhs).__name__}")
    groups = group_sizes.shape[-1]
    plan_views(lhs.shape, rhs.shape, groups, dn)  # the dimension numbers' own errors first
    mode, prefix = prefix_dims(lhs.ndim, dn)
    expected = (*(lhs.shape[d] for d in prefix), groups)
    if not prefix:
        raise ShapeError(
            f"group_sizes must be 1-D [G] with these dimension numbers (no lhs batch dimension and none of the "
            f"ragged dimension's kind before it), got shape {tuple(group_sizes.shape)}"
        )
    if tuple(group_sizes.shape) != expected:
        raise ShapeError(
            f"group_sizes: expected shape (G,) or {expected} (one row of group sizes per slice of lhs "
            f"dimensions {tuple(prefix)}), got {tuple(group_sizes.shape)}"
        )
    rows = group_sizes.reshape(-1, groups)
    count = rows.shape[0]
    if mode == "batch" or count == 0:  # batch mode reads no group sizes; no slices: an empty or zero result
        first = rows[0] if count else group_sizes.new_zeros(groups)
        return call(lhs, rhs, first, dn, preferred_element_type=preferred_element_type, **kwargs)
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    pair = dict(zip(lb, rb)) | dict(zip(lc, rc))
    rhs_dims = [pair[d] for d in prefix if d in pair]
    summed = [d for d in prefix if d in lc]  # contracting prefix dims: their slices add up
    sub = _slice_numbers(dn, set(prefix), set(rhs_dims))
    out_dtype = preferred_element_type or lhs.dtype
    slice_dtype = out_dtype
    if summed and torch.finfo(out_dtype).bits < 32:
        slice_dtype = torch.float32
    sizes = [lhs.shape[d] for d in prefix]
    results = []
    for p in range(count):
        index = _unravel(p, sizes)
        lhs_p = _select(lhs, prefix, index)
        rhs_p = _select(rhs, rhs_dims, tuple(i for d, i in zip(prefix, index) if d in pair))
        results.append(call(lhs_p, rhs_p, rows[p], sub, preferred_element_type=slice_dtype, **kwargs))
    out = torch.stack(results).reshape(*sizes, *results[0].shape)
    if mode == "ragged_m":
        return out
    # ragged_k: slices [batch prefix..., contracting prefix..., G, free...] -> (G, batch..., free...)
    nb = len(prefix) - len(summed)
    if summed:
        out = out.sum(dim=tuple(range(nb, len(prefix)))).to(out_dtype)
    return out.movedim(nb, 0)


def _unravel(p: int, sizes: list[int]) -> tuple[int, ...]:
    index = []
    for size in reversed(sizes):
        p, i = divmod(p, size)
        index.append(i)
    return tuple(reversed(index))

