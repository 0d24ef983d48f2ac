"""What the benchmark times: a ragdot backend, `auto`, XLA, or any function with the op's signature.

A system turns one class and a list of input sets into zero-argument calls (one per set, for L2 rotation),
says how to wait for a result (`sync`, None when calls are synchronous or on torch's stream) and how to
read a result as a torch tensor for the correctness check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ragdot.bench.classes import RaggedClass

__all__ = ["Operands", "System", "RagdotSystem", "FunctionSystem", "AUTO"]

AUTO = "auto"


@dataclass
class Operands:
    """One input set of a cell."""

    lhs: torch.Tensor  # class layout, e.g. [M, K]
    rhs: torch.Tensor  # class layout, e.g. [E, K, N] or [M, N]
    group_sizes: torch.Tensor  # int32 [E]


class System:
    """Base class: subclasses implement `prepare`."""

    name: str = "?"
    sync: Callable[[Any], None] | None = None
    graphable: bool = True  # calls can be captured in a CUDA graph (no host synchronisation inside)

    def prepare(
        self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype
    ) -> list[Callable[[], Any]]:
        raise NotImplementedError

    def to_torch(self, out: Any) -> torch.Tensor:
        return out

    def peak_bytes(self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype) -> int | None:
        """Extra device bytes of one call when the system knows them itself (None: measure them)."""
        return None

    def describe(self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype) -> str:
        """A note for the results (e.g. what `auto` chose); empty by default."""
        return ""

    def release(self) -> None:
        """Drop whatever the system holds for the current cell."""


class RagdotSystem(System):
    """`ragdot.ragged_dot_general` with one backend (`auto` means ragdot's own choice, backend=None)."""

    def __init__(self, backend: str) -> None:
        self.name = backend
        self.backend = None if backend == AUTO else backend
        self.graphable = backend != "reference"  # the reference reads group offsets on the host

    def prepare(
        self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype
    ) -> list[Callable[[], Any]]:
        import ragdot

        dims = cls.ragdot_dimension_numbers()
        return [
            functools.partial(
                ragdot.ragged_dot_general,
                s.lhs,
                s.rhs,
                s.group_sizes,
                dims,
                preferred_element_type=out_dtype,
                backend=self.backend,
            )
            for s in sets
        ]


    def describe(self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype) -> str:
        """For `auto`: the backend (and Triton tile) it runs for set 0, and whether a measured entry chose it."""
        if self.backend is not None:
            return ""
        import ragdot

        s = sets[0]
        info = ragdot.explain(s.lhs, s.rhs, s.group_sizes, cls.ragdot_dimension_numbers(),
                              preferred_element_type=out_dtype)
        name, cfg = info["plan"][0]
        chosen = name if cfg is None else f"{name}:{cfg.short()}"
        return f"auto: {chosen} ({'tuned' if info['tuned'] else 'heuristic'})"


class FunctionSystem(System):
    """Any function fn(lhs, rhs, group_sizes, cls, out_dtype) -> torch.Tensor (tests, experiments)."""

    def __init__(self, name: str, fn: Callable[..., torch.Tensor]) -> None:
        self.name = name
        self.fn = fn

    def prepare(
        self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype
    ) -> list[Callable[[], Any]]:
        return [functools.partial(self.fn, s.lhs, s.rhs, s.group_sizes, cls, out_dtype) for s in sets]
