"""The six structural ragged-dot classes of an MoE expert block (forward, data and weight gradients).

For a shape (M, K, N, E), with the token axis M ragged over E groups:

| class    | lhs    | rhs       | out       | contract (lhs, rhs) | rhs group dims |
|----------|--------|-----------|-----------|---------------------|----------------|
| fwd_wi   | [M, K] | [E, K, N] | [M, N]    | (1,), (1,)          | (0,)           |
| fwd_wo   | [M, N] | [E, N, K] | [M, K]    | (1,), (1,)          | (0,)           |
| dgrad_wi | [M, N] | [E, K, N] | [M, K]    | (1,), (2,)          | (0,)           |
| dgrad_wo | [M, K] | [E, N, K] | [M, N]    | (1,), (2,)          | (0,)           |
| wgrad_wi | [M, K] | [M, N]    | [E, K, N] | (0,), (0,)          | ()             |
| wgrad_wo | [M, N] | [M, K]    | [E, N, K] | (0,), (0,)          | ()             |

Every class does 2*M*K*N useful FLOPs (M = sum of the group sizes) and must at least read both operands
and write the output once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragdot.shapes import Shape

__all__ = ["RaggedClass", "CLASSES", "CLASS_NAMES", "get_class", "parse_classes", "flops", "min_bytes"]

DotDims = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


@dataclass(frozen=True)
class RaggedClass:
    """One class: operand layouts (as letters over M, K, N, E) and its dimension numbers."""

    name: str
    lhs: str  # e.g. "MK": lhs has shape [M, K]
    rhs: str  # e.g. "EKN"
    out: str
    contract: tuple[tuple[int, ...], tuple[int, ...]]
    rhs_group: tuple[int, ...]
    contraction: str  # the letter contracted over ("K", "N" or "M")

    @property
    def dot_dimension_numbers(self) -> DotDims:
        return (self.contract, ((), ()))

    @property
    def lhs_ragged_dimensions(self) -> tuple[int, ...]:
        return (0,)

    def shapes(self, shape: Shape) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(lhs, rhs, out) tensor shapes of this class for `shape`."""
        dims = {"M": shape.M, "K": shape.K, "N": shape.N, "E": shape.E}
        return tuple(tuple(dims[c] for c in layout) for layout in (self.lhs, self.rhs, self.out))  # type: ignore[return-value]

    def ragdot_dimension_numbers(self) -> Any:
        """This class as ``ragdot.RaggedDotDimensionNumbers``."""
        import ragdot

        return ragdot.RaggedDotDimensionNumbers(
            dot_dimension_numbers=self.dot_dimension_numbers,
            lhs_ragged_dimensions=self.lhs_ragged_dimensions,
            rhs_group_dimensions=self.rhs_group,
        )


CLASSES: tuple[RaggedClass, ...] = (
    RaggedClass("fwd_wi", "MK", "EKN", "MN", ((1,), (1,)), (0,), "K"),
    RaggedClass("fwd_wo", "MN", "ENK", "MK", ((1,), (1,)), (0,), "N"),
    RaggedClass("dgrad_wi", "MN", "EKN", "MK", ((1,), (2,)), (0,), "N"),
    RaggedClass("dgrad_wo", "MK", "ENK", "MN", ((1,), (2,)), (0,), "K"),
    RaggedClass("wgrad_wi", "MK", "MN", "EKN", ((0,), (0,)), (), "M"),
    RaggedClass("wgrad_wo", "MN", "MK", "ENK", ((0,), (0,)), (), "M"),
)
CLASS_NAMES: tuple[str, ...] = tuple(c.name for c in CLASSES)
_BY_NAME = {c.name: c for c in CLASSES}


def get_class(name: str) -> RaggedClass:
    if name not in _BY_NAME:
        raise ValueError(f"class {name!r} is unknown; expected one of {', '.join(CLASS_NAMES)}")
    return _BY_NAME[name]


def parse_classes(names: Sequence[str]) -> list[RaggedClass]:
    out: list[RaggedClass] = []
    for name in names:
        cls = get_class(name)
        if cls not in out:
            out.append(cls)
    return out


def flops(shape: Shape, tokens: int | None = None) -> int:
    """Useful FLOPs of any class: 2 * tokens * K * N (tokens defaults to M, the sum of the group sizes)."""
    m = shape.M if tokens is None else tokens
    return 2 * m * shape.K * shape.N


def min_bytes(cls: RaggedClass, shape: Shape, itemsize: int, out_itemsize: int | None = None) -> int:
    """Fewest bytes moved: both operands read once, the output written once (group sizes ignored)."""
    lhs, rhs, out = cls.shapes(shape)
    out_itemsize = itemsize if out_itemsize is None else out_itemsize
    return (math.prod(lhs) + math.prod(rhs)) * itemsize + math.prod(out) * out_itemsize
