"""Named MoE shapes for tests and benchmarks.

Each row is one expert-GEMM problem of an MoE layer: M routed tokens (batch x seq x top-k, the ragged
dimension), K the embedding (contraction) width, N the expert MLP width and E the number of experts.

Tags:
- ``seed``: every distinct (M, K, N, E) of the MaxText ragged-dot micro-benchmark over MoE models, named by model;
- ``anchor``: the eight shapes with reference numbers measured on an H200 on 2026-11-29
  (``benchmarks/targets-h200.json`` holds the vendor's);
- ``tiny``: small shapes for ``--quick`` runs and CI on a CPU.

The rows are derived from the models of `ragdot.catalog` (add a model there, not here).
Look a shape up by name (``"mixtral-8x7b"``) or give it inline as ``"M,K,N,E"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ragdot.catalog import MODELS, MoEModel

__all__ = ["Shape", "SHAPES", "TAGS", "get_shape", "parse_shapes", "shapes_from", "shapes_with_tag"]


@dataclass(frozen=True)
class Shape:
    """One MoE expert-GEMM problem: lhs [M, K] routed to E experts of weight [K, N]."""

    name: str
    M: int
    K: int
    N: int
    E: int
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("M", "K", "N", "E"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"shape {self.name!r}: {field} must be a positive int, got {value!r}")

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return (self.M, self.K, self.N, self.E)

    @property
    def spec(self) -> str:
        """The inline form ``"M,K,N,E"``."""
        return f"{self.M},{self.K},{self.N},{self.E}"


TAGS: tuple[str, ...] = ("seed", "anchor", "tiny")


def shapes_from(models: Iterable[MoEModel]) -> tuple[Shape, ...]:
    """The GEMM shapes of catalog `models` (their gemm_tokens), in catalog order, tagged with their TAGS."""
    return tuple(
        Shape(name, m, k, n, e, tuple(t for t in model.tags if t in TAGS))
        for model in models
        for name, m, k, n, e in model.shapes()
    )


SHAPES: tuple[Shape, ...] = shapes_from(MODELS)

_BY_NAME: dict[str, Shape] = {s.name: s for s in SHAPES}


def shapes_with_tag(tag: str) -> list[Shape]:
    """All table rows carrying `tag` (one of TAGS), in table order."""
    if tag not in TAGS:
        raise ValueError(f"tag={tag!r} is unknown; expected one of {', '.join(TAGS)}")
    return [s for s in SHAPES if tag in s.tags]


def get_shape(spec: str | Shape) -> Shape:
    """A shape by table name, or from an inline ``"M,K,N,E"`` string (named by that string)."""
    if isinstance(spec, Shape):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"shape must be a name or an 'M,K,N,E' string, got {type(spec).__name__}")
    text = spec.strip()
    if text in _BY_NAME:
        return _BY_NAME[text]
    if "," in text:
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise ValueError(f"shape {spec!r}: expected four positive integers 'M,K,N,E'")
        m, k, n, e = (int(p) for p in parts)
        return Shape(",".join(parts), m, k, n, e)
    raise ValueError(f"shape {spec!r} is unknown; expected 'M,K,N,E' or one of: {', '.join(_BY_NAME)}")


def parse_shapes(specs: Iterable[str | Shape]) -> list[Shape]:
    """Shapes for a list of names / ``M,K,N,E`` strings / tags (``tag:anchor``), duplicates dropped."""
    out: list[Shape] = []
    for spec in specs:
        if isinstance(spec, str) and spec.startswith("tag:"):
            found = shapes_with_tag(spec[4:])
        else:
            found = [get_shape(spec)]
        out.extend(s for s in found if s not in out)
    return out
