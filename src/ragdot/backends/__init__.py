"""Backends: one module each, one signature, dispatch by name.

Every backend implements the three canonical problems that `ragdot.dimension_numbers.canonicalize` reduces
any `ragged_dot_general` call to. All tensors arrive as (possibly non-contiguous) strided views on one device;
`Bt` is a leading batch axis (1 for the usual MoE call):

    ragged_m(a, b, group_ends, out_dtype) -> c
        a          [Bt, M, K]    rows in group order
        b          [Bt, G, K, N] one matrix per group
        group_ends int32 [G]     inclusive prefix sums of the group sizes, already clamped: non-decreasing,
                                 each in [0, M]; group g owns rows [group_ends[g-1], group_ends[g])
        c          [Bt, M, N]    contiguous, dtype out_dtype; rows >= group_ends[-1] are exactly zero

    ragged_k(a, b, group_ends, out_dtype) -> c
        a          [Bt, R, M]    R is the ragged contraction (tokens)
        b          [Bt, R, N]
        group_ends int32 [G]     as above, each in [0, R]
        c          [G, Bt, M, N] contiguous; c[g] contracts only rows of group g; an empty group is exactly 0

    batch(a, b, out_dtype) -> c
        a [Bt, M, K], b [Bt, K, N] -> c [Bt, M, N] contiguous

`prepare(problem, a, b, num_groups, out_dtype, config, scale)` resolves once what depends only on the
static signature of the operands (shapes, strides, dtypes, device) and returns the call `(a, b, group_sizes)
-> c` (None for batch): the eager hot path calls that directly. It takes the raw group sizes ([G], any
integer dtype, `scale` rows per unit) and clamps them itself (negatives count as 0, ends clamped to the
ragged extent), so a backend whose kernels can form the prefix sums themselves needs no extra launch.

Rules every backend keeps: accumulation in the widest of float32, the input dtype and the output dtype (a
backend with no float64 kernel raises NotImplementedError for float64); data stored in rows outside every group
(NaN/Inf included) never reaches a result (mask by select, never by multiplying with 0); no value of
group_ends causes an out-of-bounds access; no host synchronisation on the hot path (the `reference` and
`padded` backends are exempt); results bitwise reproducible. Zero-size problems (M, K, N, R, G or Bt == 0)
are handled by the dispatcher and never reach a backend.

A backend that cannot serve a case (dtype, device, layout it cannot copy into) raises NotImplementedError;
`auto` then tries the next candidate.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ragdot.backends.base import Prepared

__all__ = ["Backend", "BACKEND_NAMES", "get_backend", "available_backends", "candidates", "unusable_reason"]


class Backend(Protocol):
    """What the dispatcher, the tuner and `auto` need of a backend (`ragdot.backends.base.BackendBase` has
    the defaults). Configs are the backend's own: the tuner stores `config_to_dict` and asks
    `config_from_dict`, never knowing what a config holds."""

    name: str
    config_type: type | None

    def is_available(self) -> bool: ...

    def default_config(self, problem: str, dims: tuple[int, int, int, int], dtype: torch.dtype) -> Any: ...

    def tuning_configs(
        self, problem: str, dims: tuple[int, int, int, int], dtype: torch.dtype, limit: int,
        device: torch.device | None = None, b_kmajor: bool = False,
    ) -> list[Any]: ...

    def config_to_dict(self, config: Any) -> dict[str, Any] | None: ...

    def config_from_dict(self, data: dict[str, Any] | None) -> Any: ...

    def config_label(self, config: Any) -> str: ...

    def prepare(
        self, problem: str, a: torch.Tensor, b: torch.Tensor, num_groups: int, out_dtype: torch.dtype,
        config: Any = None, scale: int = 1,
    ) -> Prepared: ...

    def ragged_m(
        self, a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype
    ) -> torch.Tensor: ...

    def ragged_k(
        self, a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype
    ) -> torch.Tensor: ...

    def batch(self, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor: ...


@dataclass(frozen=True)
class _Entry:
    module: str
    attr: str = "BACKEND"


_REGISTRY: dict[str, _Entry] = {
    "reference": _Entry("ragdot.backends.reference"),
    "padded": _Entry("ragdot.backends.padded"),
    "torch": _Entry("ragdot.backends.torch_gmm"),
    "triton": _Entry("ragdot.backends.triton_gmm"),
    "gluon": _Entry("ragdot.backends.gluon_gmm"),
}

BACKEND_NAMES: tuple[str, ...] = tuple(_REGISTRY)
_cache: dict[str, Backend | None] = {}


def _load(name: str) -> Backend | None:
    if name not in _cache:
        entry = _REGISTRY[name]
        try:
            module = importlib.import_module(entry.module)
            _cache[name] = getattr(module, entry.attr)
        except ImportError:
            _cache[name] = None
    return _cache[name]


def get_backend(name: str) -> Backend:
    """The backend object for a concrete name; ValueError for unknown names, RuntimeError if unusable."""
    if name not in _REGISTRY:
        raise ValueError(
            f"backend={name!r} is unknown; expected one of {', '.join(BACKEND_NAMES)}, 'auto' or None"
        )
    backend = _load(name)
    if backend is None or not backend.is_available():
        raise RuntimeError(
            f"backend {name!r} is not usable on this machine: {unusable_reason(name)} "
            f"(available: {', '.join(available_backends())})"
        )
    return backend


def unusable_reason(name: str) -> str:
    """Why a known backend cannot run here, and how to make it run where that is possible."""
    if name == "triton":
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install 'ragdot[triton]'; Linux only)"
        return ("no CUDA device; set TRITON_INTERPRET=1 in the environment before starting Python to run its "
                "kernels on the CPU through Triton's interpreter (slow; for tests)")
    if name == "torch":
        return "this torch build has no torch._grouped_mm"
    if name == "gluon":
        from ragdot.kernels.gluon import unavailable_reason as gluon_reason

        return gluon_reason() or "it failed to load"
    return "it failed to load"


@functools.lru_cache(maxsize=8)
def _available(triton_interpret: str) -> tuple[str, ...]:
    names = []
    for name in _REGISTRY:
        backend = _load(name)
        if backend is not None and backend.is_available():
            names.append(name)
    return tuple(names)


def available_backends() -> list[str]:
    """Names of the concrete backends usable on this machine now (checked once per process and setting)."""
    check = _available.__wrapped__ if torch.compiler.is_compiling() else _available
    return list(check(os.environ.get("TRITON_INTERPRET", "")))


@functools.lru_cache(maxsize=8)
def _candidates(device_type: str, usable: tuple[str, ...]) -> tuple[str, ...]:
    # gluon (Hopper only) comes after the kinds that serve every problem: it is chosen where a measurement
    # names it (`ragdot tune`), and only tried first by a caller who asks for it
    order = ("triton", "torch", "gluon", "reference") if device_type == "cuda" else ("torch", "reference")
    return tuple(name for name in order if name in usable)


def candidates(device: torch.device) -> list[str]:
    """`auto`'s order before measurement exists: the fastest kind first, the reference last."""
    return list(_candidates(device.type, tuple(available_backends())))
