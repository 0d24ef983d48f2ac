"""What the benchmark times: a ragdot backend, `auto`, the raw vendor call, XLA, or any function with the
op's signature.

A system turns one class and a list of input sets into zero-argument calls (one per set, for L2 rotation),
says how to wait for a result (`sync`, None when calls are synchronous or on torch's stream), how to read a
result as a torch tensor and which part of it the correctness check compares.

`vendor` is the baseline of every speed ratio: `torch._grouped_mm` called directly, with only what a user
must add (the group offsets, ``torch.cumsum(group_sizes, 0, dtype=torch.int32)``) and no ragdot code in
its path. How each class maps onto it:

| class    | mat_a                                    | mat_b                           | out       |
|----------|------------------------------------------|---------------------------------|-----------|
| fwd_wi   | lhs [M, K], row-major                    | rhs [E, K, N]                   | [M, N]    |
| dgrad_wo | lhs [M, K], row-major                    | rhs [E, N, K] as view [E, K, N] | [M, N]    |
| wgrad_wi | lhs [M, K] as view [K, M], column-major  | rhs [M, N], row-major           | [E, K, N] |

and fwd_wo, dgrad_wi, wgrad_wo alike with K and N swapped (`offs` are the group ends along M). Rows at or past
sum(group_sizes) of its ragged-M outputs are left uninitialised, so its check compares only the rows inside
groups (`compared`); the benchmark's routings (`ragdot.routing`) always sum to M, so there are none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ragdot.measure.classes import RaggedClass

__all__ = ["Operands", "System", "RagdotSystem", "FunctionSystem", "VendorSystem", "vendor_unavailable_reason",
           "AUTO", "VENDOR", "RAGDOT_JAX", "TOKAMAX", "JAX_SYSTEMS"]

AUTO = "auto"
VENDOR = "vendor"
RAGDOT_JAX = "ragdot-jax"  # ragdot.jax under jax.jit (ragdot.bench.jax_system)
TOKAMAX = "tokamax"  # tokamax.ragged_dot, where its wheel is installed
JAX_SYSTEMS = (RAGDOT_JAX, TOKAMAX)  # asked for by name (--backends), never in the default list
_VENDOR_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what torch._grouped_mm has kernels for


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
    has_programs: bool = False  # offers `programs` (the program clock: asynchronous systems)

    def prepare(
        self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype
    ) -> list[Callable[[], Any]]:
        raise NotImplementedError

    def programs(self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype) -> list[Callable[[int], Any]]:
        """After `prepare`: per input set, `program(n)` running the call n times in one program (the program
        clock, `ragdot.measure.timing`); none by default."""
        return []

    def to_torch(self, out: Any) -> torch.Tensor:
        return out

    def compared(
        self, out: torch.Tensor, ref: torch.Tensor, cls: RaggedClass, operands: Operands
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The parts of (output, reference) the correctness check compares: all of them by default."""
        return out, ref

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


def vendor_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when `torch._grouped_mm` exists and has kernels for `dtype`; else why not (device-specific
    limits, e.g. the GPU architecture or operand alignment, show when it is called: the cell is then n/a)."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if dtype not in _VENDOR_DTYPES:
        return f"torch._grouped_mm has no {str(dtype).removeprefix('torch.')} kernel"
    return None


def _vendor_call(
    mat_a: torch.Tensor,  # [M, K] row-major, or [K, M] column-major for the weight gradient
    mat_b: torch.Tensor,  # [E, K, N], or [M, N] for the weight gradient
    group_sizes: torch.Tensor,  # int32 [E]
    out_dtype: torch.dtype,
) -> Callable[[], torch.Tensor]:
    """The user's two lines: the group offsets, then the grouped GEMM (out_dtype passed only when it
    differs from the inputs', as a user would)."""
    gmm, cumsum, int32 = torch._grouped_mm, torch.cumsum, torch.int32
    if out_dtype == mat_a.dtype:
        return lambda: gmm(mat_a, mat_b, offs=cumsum(group_sizes, 0, dtype=int32))
    return lambda: gmm(mat_a, mat_b, offs=cumsum(group_sizes, 0, dtype=int32), out_dtype=out_dtype)


class VendorSystem(System):
    """`vendor`: raw `torch._grouped_mm` on the class's operands (views only, made once per cell)."""

    name = VENDOR

    def prepare(
        self, cls: RaggedClass, sets: list[Operands], out_dtype: torch.dtype
    ) -> list[Callable[[], Any]]:
        reason = vendor_unavailable_reason(sets[0].lhs.device, sets[0].lhs.dtype)
        if reason:
            raise NotImplementedError(reason)
        calls = [_vendor_call(*self._operands(cls, s), s.group_sizes, out_dtype) for s in sets]
        try:  # its own checks (alignment, architecture, dtypes) raise here: not for this cell
            calls[0]()
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as exc:
            raise NotImplementedError(f"torch._grouped_mm: {exc}"[:200]) from exc
        return calls

    @staticmethod
    def _operands(cls: RaggedClass, s: Operands) -> tuple[torch.Tensor, torch.Tensor]:
        if not cls.rhs_group:  # weight gradient: 2D x 2D -> 3D, the token dim contracted
            return s.lhs.transpose(0, 1), s.rhs
        if cls.contract[1] == (2,):  # data gradient: rhs contracted over its last dim
            return s.lhs, s.rhs.transpose(1, 2)
        return s.lhs, s.rhs

    def compared(
        self, out: torch.Tensor, ref: torch.Tensor, cls: RaggedClass, operands: Operands
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Only the rows inside groups of a ragged-M output (the rest is uninitialised memory)."""
        if not cls.rhs_group:
            return out, ref
        rows = int(operands.group_sizes.clamp_min(0).sum())
        return out[:rows], ref[:rows]
