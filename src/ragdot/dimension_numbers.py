"""Dimension numbers and canonicalization.

Any `ragged_dot_general` call is mapped once, here, onto one of three canonical problems, as strided views of
the operands (no copies unless several free or contracting dimensions must be merged and the strides do
not allow a view):

    ragged_m   a [Bt, M, K] x b [Bt, G, K, N] -> c [Bt, M, N]      lhs ragged dim is a free (row) dim
    ragged_k   a [Bt, R, M] x b [Bt, R, N]    -> c [G, Bt, M, N]   lhs ragged dim is contracted
    batch      a [Bt, M, K] x b [Bt, K, N]    -> c [Bt, M, N]      lhs ragged dim is a batch dim

`Canonical.finish` turns the canonical result back into the `jax.lax.ragged_dot_general` output layout:
dot_general's (batch, lhs free, rhs free) order, with the group dimension prepended in contracting mode.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = ["RaggedDotDimensionNumbers", "Canonical", "canonicalize", "plan_views", "Mode", "ShapeError"]

Mode = Literal["ragged_m", "ragged_k", "batch"]


class ShapeError(ValueError, TypeError):
    """Operand shapes, group sizes and dimension numbers that do not fit together. A ValueError, as ragdot
    raises for bad argument values, and a TypeError, as `jax.lax.ragged_dot_general` raises for the same
    mistakes (its shape rule), so code written against either catches it."""


def _int_tuple(value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, got {value!r}") from None
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"{what} must contain ints, got {item!r} in {value!r}")
    return items


@dataclass(frozen=True, init=False)
class RaggedDotDimensionNumbers:
    """Same fields and meaning as `jax.lax.RaggedDotDimensionNumbers`.

    dot_dimension_numbers = ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch));
    lhs_ragged_dimensions has exactly one entry; rhs_group_dimensions has one entry (non-contracting mode)
    or none (contracting and batch modes).
    """

    dot_dimension_numbers: tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]
    lhs_ragged_dimensions: tuple[int, ...]
    rhs_group_dimensions: tuple[int, ...]

    def __init__(self, dot_dimension_numbers: Any, lhs_ragged_dimensions: Any, rhs_group_dimensions: Any):
        try:
            (lc, rc), (lb, rb) = dot_dimension_numbers
        except (TypeError, ValueError):
            raise TypeError(
                "dot_dimension_numbers must be ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), "
                f"got {dot_dimension_numbers!r}"
            ) from None
        ddn = (
            (_int_tuple(lc, "lhs contracting dimensions"), _int_tuple(rc, "rhs contracting dimensions")),
            (_int_tuple(lb, "lhs batch dimensions"), _int_tuple(rb, "rhs batch dimensions")),
        )
        object.__setattr__(self, "dot_dimension_numbers", ddn)
        object.__setattr__(self, "lhs_ragged_dimensions", _int_tuple(lhs_ragged_dimensions, "lhs_ragged_dimensions"))
        object.__setattr__(self, "rhs_group_dimensions", _int_tuple(rhs_group_dimensions, "rhs_group_dimensions"))

    def __hash__(self) -> int:
        """Hashed once, at the first use as a key (the dimension numbers are part of every eager call's dispatch
        key), not in __init__: torch 2.11's dynamo cannot trace hash() of a tuple, and code compiled with
        fullgraph=True may build dimension numbers inside the compiled function."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.dot_dimension_numbers, self.lhs_ragged_dimensions, self.rhs_group_dimensions))
            object.__setattr__(self, "_hash", cached)
        return cached

    @classmethod
    def coerce(cls, value: Any) -> RaggedDotDimensionNumbers:
        """Accept our own type or anything with the same three attributes (e.g. jax's)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value.dot_dimension_numbers, value.lhs_ragged_dimensions, value.rhs_group_dimensions)
        except AttributeError:
            raise TypeError(
                "ragged_dot_dimension_numbers must be a ragdot.RaggedDotDimensionNumbers, "
                f"got {type(value).__name__}"
            ) from None


# The dimension numbers of jax.lax.ragged_dot: lhs [M, K], rhs [G, K, N].
RAGGED_DOT_DN = RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (0,), (0,))


@dataclass(frozen=True)
class Canonical:
    """One canonical problem plus what is needed to restore the user's output layout."""

    mode: Mode
    a: torch.Tensor
    b: torch.Tensor
    extent: int  # the ragged extent group_ends are clamped to (M for ragged_m, R for ragged_k)
    group_scale: int  # merged extra contracting dims multiply each group's size (ragged_k only)
    view_shape: tuple[int, ...]  # canonical output reshaped to this ...
    perm: tuple[int, ...] | None  # ... then permuted by this (None: already in output order)

    def finish(self, c: torch.Tensor) -> torch.Tensor:
        c = c.reshape(self.view_shape)
        return c.permute(self.perm) if self.perm is not None else c


def _check_dims(dims: Sequence[int], ndim: int, what: str, lead: str = "") -> None:
    for d in dims:
        if not 0 <= d < ndim:
            raise ShapeError(f"{lead}{what} {d} is out of range for an operand of rank {ndim}")


# jax.lax.ragged_dot_general's wording of the errors it shares with ragdot, which begins ragdot's messages for
# them (callers written against jax match its messages)
_JAX_LRAG_RANGE = ("ragged_dot_general requires lhs ragged dimension numbers to be nonnegative and less than the "
                   "number of axes of the lhs: ")
_JAX_ONE_LRAG = "ragged_dot_general expects exactly one lhs ragged dimension: "
_JAX_GROUP_DISTINCT = ("ragged_dot_general requires rhs group dimension numbers to be distinct from contracting "
                       "and batch dimensions: ")
_JAX_NO_GROUP = ("ragged_dot_general requires zero group dimensions in the rhs when lhs ragged dimension is "
                 "contracting or batch: ")
_JAX_ONE_GROUP = ("ragged_dot_general requires exactly one rhs group dimension when lhs ragged dimension is "
                  "noncontracting: ")


def _prod(sizes: Sequence[int]) -> int:
    return math.prod(sizes) if sizes else 1


@dataclass(frozen=True)
class _Plan:
    """How to view the operands canonically; depends on shapes and dimension numbers only."""

    mode: Mode
    lperm: tuple[int, ...]
    lshape: tuple[int, ...]
    rperm: tuple[int, ...]
    rshape: tuple[int, ...]
    broadcast: int  # > 1: rhs is repeated over this many extra lhs free slices (bt_b, bt_x)
    extent: int
    group_scale: int
    view_shape: tuple[int, ...]
    perm: tuple[int, ...] | None

    def __post_init__(self) -> None:
        # lperm and rperm, None where they are the identity: computed once per plan, not per call
        perms = tuple(None if p == tuple(range(len(p))) else p for p in (self.lperm, self.rperm))
        object.__setattr__(self, "_perms", perms)

    def views(self, lhs: torch.Tensor, rhs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The canonical operands (a, b) as views of lhs and rhs (a copy only where no view exists)."""
        lperm, rperm = self._perms
        a = lhs if lperm is None else lhs.permute(lperm)
        if a.shape != self.lshape:
            a = a.reshape(self.lshape)
        b = rhs if rperm is None else rhs.permute(rperm)
        if b.shape != self.rshape:
            b = b.reshape(self.rshape)
        if self.broadcast > 1:
            bt_b = b.shape[0]
            b = b.unsqueeze(1).expand(bt_b, self.broadcast, *b.shape[1:]).reshape(bt_b * self.broadcast, *b.shape[1:])
        return a, b

    def finish(self, c: torch.Tensor) -> torch.Tensor:
        """The canonical result in jax.lax.ragged_dot_general's output layout."""
        c = c.reshape(self.view_shape)
        return c.permute(self.perm) if self.perm is not None else c


class _Shape:
    """Just enough of a tensor for planning: its shape and rank."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.ndim = len(shape)


def _view(t: torch.Tensor, perm: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    if perm != tuple(range(t.ndim)):
        t = t.permute(perm)
    return t if tuple(t.shape) == shape else t.reshape(shape)


def plan_views(lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...], num_groups: int,
               dn: RaggedDotDimensionNumbers) -> _Plan:
    """Validate dimension numbers against the operand shapes; the canonical problem and how to view it."""
    planner = _plan.__wrapped__ if torch.compiler.is_compiling() else _plan  # dynamo traces the plain function
    return planner(tuple(lhs_shape), tuple(rhs_shape), num_groups, dn)


def canonicalize(
    lhs: torch.Tensor, rhs: torch.Tensor, num_groups: int, dn: RaggedDotDimensionNumbers
) -> Canonical:
    """Validate dimension numbers against the operand shapes and build the canonical views."""
    p = plan_views(lhs.shape, rhs.shape, num_groups, dn)
    a, b = p.views(lhs, rhs)
    return Canonical(p.mode, a, b, p.extent, p.group_scale, p.view_shape, p.perm)


@functools.lru_cache(maxsize=1024)
def _plan(lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...], num_groups: int, dn: RaggedDotDimensionNumbers):
    lhs, rhs = _Shape(lhs_shape), _Shape(rhs_shape)
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    lrag, rgrp = dn.lhs_ragged_dimensions, dn.rhs_group_dimensions
    _check_dims(lc, lhs.ndim, "lhs contracting dimension")
    _check_dims(lb, lhs.ndim, "lhs batch dimension")
    _check_dims(rc, rhs.ndim, "rhs contracting dimension")
    _check_dims(rb, rhs.ndim, "rhs batch dimension")
    _check_dims(rgrp, rhs.ndim, "rhs group dimension")
    _check_dims(lrag, lhs.ndim, "lhs ragged dimension", _JAX_LRAG_RANGE)
    if len(lc) != len(rc):
        raise ShapeError(f"lhs and rhs must name as many contracting dimensions, got {lc} and {rc}")
    if len(lb) != len(rb):
        raise ShapeError(f"lhs and rhs must name as many batch dimensions, got {lb} and {rb}")
    if len(set(lc) | set(lb)) != len(lc) + len(lb):
        raise ShapeError(f"lhs contracting {lc} and batch {lb} dimensions must be distinct")
    if len(set(rc) | set(rb) | set(rgrp)) != len(rc) + len(rb) + len(rgrp):
        lead = _JAX_GROUP_DISTINCT if set(rgrp) & (set(rc) | set(rb)) else ""
        raise ShapeError(f"{lead}rhs contracting {rc}, batch {rb} and group {rgrp} dimensions must be distinct")
    for l_dim, r_dim in zip(lc, rc):
        if lhs.shape[l_dim] != rhs.shape[r_dim]:
            raise ShapeError(
                f"contracting dimensions differ in size: lhs dim {l_dim} has {lhs.shape[l_dim]}, "
                f"rhs dim {r_dim} has {rhs.shape[r_dim]}"
            )
    for l_dim, r_dim in zip(lb, rb):
        if lhs.shape[l_dim] != rhs.shape[r_dim]:
            raise ShapeError(
                f"batch dimensions differ in size: lhs dim {l_dim} has {lhs.shape[l_dim]}, "
                f"rhs dim {r_dim} has {rhs.shape[r_dim]}"
            )
    if len(lrag) != 1:
        raise ShapeError(f"{_JAX_ONE_LRAG}lhs_ragged_dimensions must name exactly one dimension, got {lrag}")
    if len(rgrp) > 1:
        raise ShapeError(f"rhs_group_dimensions must name at most one dimension, got {rgrp}")
    (r,) = lrag
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb and d not in rgrp]
    bsz = [lhs.shape[d] for d in lb]
    csz = [lhs.shape[d] for d in lc]
    msz = [lhs.shape[d] for d in lf]
    nsz = [rhs.shape[d] for d in rf]

    if r in lb:
        if rgrp:
            raise ShapeError(
                f"{_JAX_NO_GROUP}rhs_group_dimensions must be empty when the lhs ragged dimension is a batch dimension"
            )
        return _Plan("batch", (*lb, *lf, *lc), (_prod(bsz), _prod(msz), _prod(csz)), (*rb, *rc, *rf),
                     (_prod(bsz), _prod(csz), _prod(nsz)), 1, 0, 1, (*bsz, *msz, *nsz), None)

    if r in lc:
        if rgrp:
            raise ShapeError(
                f"{_JAX_NO_GROUP}rhs_group_dimensions must be empty when the lhs ragged dimension is contracted "
                "(the output gets a leading group dimension instead)"
            )
        i = lc.index(r)
        other_l = [d for d in lc if d != r]
        other_r = [d for j, d in enumerate(rc) if j != i]
        extra = _prod([lhs.shape[d] for d in other_l])
        rows = lhs.shape[r] * extra
        return _Plan("ragged_k", (*lb, r, *other_l, *lf), (_prod(bsz), rows, _prod(msz)),
                     (*rb, rc[i], *other_r, *rf), (_prod(bsz), rows, _prod(nsz)), 1, rows, extra,
                     (num_groups, *bsz, *msz, *nsz), None)

    # Non-contracting: the ragged dim is a row dim of lhs; rhs must carry the group dim.
    if not rgrp:
        raise ShapeError(
            f"{_JAX_ONE_GROUP}rhs_group_dimensions must name rhs's group dimension when the lhs ragged dimension "
            "is a non-contracting dimension"
        )
    (g,) = rgrp
    if rhs.shape[g] != num_groups:
        raise ShapeError(
            f"expected rhs group dimension size to be {num_groups}, got {rhs.shape[g]}: rhs group dimension {g} "
            f"has size {rhs.shape[g]} but group_sizes has {num_groups} entries"
        )
    # Other lhs free dims (rare) travel with the batch: rows of every such slice share the group partition.
    others = [d for d in lf if d != r]
    xsz = [lhs.shape[d] for d in others]
    bt_b, bt_x = _prod(bsz), _prod(xsz)
    # Canonical output order: batch, others, ragged, rhs free. The user's order puts the ragged dim at its
    # place among lhs's free dims.
    nb, nx, nn = len(bsz), len(xsz), len(nsz)
    view_shape = (*bsz, *xsz, lhs.shape[r], *nsz)
    pos = lf.index(r)  # the ragged dim's place among the free dims
    free_order = list(range(nb, nb + nx))
    free_order.insert(pos, nb + nx)
    perm = (*range(nb), *free_order, *range(nb + nx + 1, nb + nx + 1 + nn))
    identity = perm == tuple(range(len(perm)))
    return _Plan("ragged_m", (*lb, *others, r, *lc), (bt_b * bt_x, lhs.shape[r], _prod(csz)),
                 (*rb, g, *rc, *rf), (bt_b, num_groups, _prod(csz), _prod(nsz)), bt_x, lhs.shape[r], 1,
                 view_shape, None if identity else perm)
