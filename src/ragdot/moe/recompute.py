"""Activations remade in the backward instead of kept from the forward (`MoELayer(recompute=True)`).

Eager autograd keeps every tensor a backward node saved until that node runs. Some of the sparse path's are
cheap to make again from tensors that stay alive anyway: the permuted rows [T*k, dim] (the up projection's
lhs: one gather of the layer input, which the router keeps) and the SwiGLU output [T*k, hidden] (the down
projection's lhs: one elementwise pass over the pre-activation, which the SwiGLU node keeps). Inside
`remade()`, a saved tensor registered with `keep(t, make)` is stored as `make` and made again when the
backward unpacks it (`torch.autograd.graph.saved_tensors_hooks`); every other saved tensor is kept as usual.

`make` must return the very values of `t` (the same kernels on the same inputs: the gradients are then
bitwise those without recomputation). Eager autograd only: under torch.compile, torch.func transforms or
create_graph (a remade tensor carries no autograd history) the caller does not enter `remade()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

__all__ = ["remade"]


class _Recipe:
    """What a saved tensor was replaced by: the call that makes it again."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], torch.Tensor]):
        self.make = make


class _Kept:
    """The tensors registered in one `remade()` block, each with its recipe."""

    __slots__ = ("recipes",)

    def __init__(self) -> None:
        self.recipes: list[tuple[torch.Tensor, _Recipe]] = []

    def __call__(self, t: torch.Tensor, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.recipes.append((t, _Recipe(make)))
        return t

    def pack(self, t: torch.Tensor) -> object:
        for kept, recipe in self.recipes:
            if t is kept or (t.data_ptr() == kept.data_ptr() and t.shape == kept.shape
                             and t.stride() == kept.stride() and t.dtype == kept.dtype):
                return recipe
        return t

    @staticmethod
    def unpack(saved: object) -> torch.Tensor:
        if isinstance(saved, _Recipe):
            with torch.no_grad():
                return saved.make()
        return saved  # type: ignore[return-value]


@contextlib.contextmanager
def remade(enabled: bool = True) -> Iterator[Callable[[torch.Tensor, Callable[[], torch.Tensor]], torch.Tensor]]:
    """A block whose backward nodes store `keep(t, make)`'s tensors as `make`; yields `keep` (returns `t`).
    With `enabled` False, `keep` registers nothing and every saved tensor is kept as usual."""
    kept = _Kept()
    if not enabled:
        yield lambda t, make: t
        return
    try:
        with torch.autograd.graph.saved_tensors_hooks(kept.pack, kept.unpack):
            yield kept
    finally:  # packing is over; the saved recipes outlive the block, the registered tensors must not
        kept.recipes.clear()
