"""torchtitan: its grouped experts run through ``ragdot.ragged_dot``.

    import ragdot.integrations.torchtitan as ragdot_tt
    ragdot_tt.patch()                  # before the model runs (building it before or after does not matter)
    ...                                # train as usual; ragdot_tt.unpatch() restores torch._grouped_mm

torchtitan's routed experts (``torchtitan.models.common.moe.GroupedExperts``, also the base of gpt-oss's
``GptOssGroupedExperts``) do every expert matmul through one method, ``GroupedExperts._grouped_mm(self, *, A,
B_t, offs)``, documented there as the overridable seam for other grouped GEMMs (its MXFP8 converter replaces it
the same way). ``patch`` replaces that method on the class: ``A [R, K] x B_t [E, K, N]`` with cumulative int32
``offs [E]`` becomes ``ragged_dot(A, B_t, group_sizes)`` with ``group_sizes = diff(offs)``. Rows past
``offs[-1]`` (torchtitan's alignment padding) come out as exact zeros, where ``torch._grouped_mm`` leaves them
undefined; everything torchtitan does around the seam (routing, token dispatch, expert parallelism's
all-to-all, the bfloat16 casts, SwiGLU) is unchanged, so its EP runs as before with ragdot computing each rank's
local experts.

Older torchtitan releases (``torchtitan.models.moe.moe``) have no such method; their ``GroupedExperts.forward``
calls the module function ``_run_experts_grouped_mm(w1, w2, w3, x, num_tokens_per_expert)``, which ``patch``
replaces there instead (same computation, one ``ragged_dot`` per projection, no offsets round trip).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from ragdot.api import _check_backend, ragged_dot
from ragdot.grouped import grouped_mm as _grouped_mm
from ragdot.grouped import sizes_from_offsets

__all__ = ["patch", "unpatch", "is_patched", "sizes_from_offsets", "grouped_mm", "run_experts"]

SEAM = "_grouped_mm"
LEGACY = "_run_experts_grouped_mm"
_ORIGINALS: dict[tuple[int, str], tuple[Any, Callable]] = {}  # (id(target), attribute) -> (target, original)
_MARK = "_ragdot_backend"


def grouped_mm(A: torch.Tensor, B_t: torch.Tensor, offs: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """``torch._grouped_mm(A, B_t, offs=offs)`` for 2-D ``A [R, K]`` and 3-D ``B_t [E, K, N]`` on ragdot (the form
    torchtitan's experts use; ``ragdot.grouped_mm`` takes all four)."""
    if not isinstance(A, torch.Tensor) or not isinstance(B_t, torch.Tensor) or A.dim() != 2 or B_t.dim() != 3:
        raise ValueError(f"A must be [rows, K] and B_t [E, K, N], got {getattr(A, 'shape', A)} and "
                         f"{getattr(B_t, 'shape', B_t)}")
    return _grouped_mm(A, B_t, offs, backend=backend)


def run_experts(
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    x: torch.Tensor,
    num_tokens_per_expert: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """The SwiGLU experts of older torchtitan: w1, w3 [E, F, D], w2 [E, D, F], x [R, D] -> [R, D] in x.dtype."""
    sizes = num_tokens_per_expert.to(torch.int32)
    xb = x.bfloat16()
    h = F.silu(ragged_dot(xb, w1.bfloat16().transpose(-2, -1), sizes, backend=backend))
    h = h * ragged_dot(xb, w3.bfloat16().transpose(-2, -1), sizes, backend=backend)
    return ragged_dot(h, w2.bfloat16().transpose(-2, -1), sizes, backend=backend).type_as(x)


def _seam(backend: str | None) -> Callable:
    def _grouped_mm(self: torch.nn.Module, *, A: torch.Tensor, B_t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return grouped_mm(A, B_t, offs, backend)

    _grouped_mm.__doc__ = f"ragdot's grouped matmul (ragged_dot backend {backend or 'auto'!r})."
    setattr(_grouped_mm, _MARK, backend)
    return _grouped_mm


def _legacy(backend: str | None) -> Callable:
    def _run_experts_grouped_mm(w1, w2, w3, x, num_tokens_per_expert):
        return run_experts(w1, w2, w3, x, num_tokens_per_expert, backend)

    setattr(_run_experts_grouped_mm, _MARK, backend)
    return _run_experts_grouped_mm


def _default_target() -> Any:
    try:
        return importlib.import_module("torchtitan.models.common.moe").GroupedExperts
    except (ImportError, AttributeError):
        pass
    try:
        return importlib.import_module("torchtitan.models.moe.moe")
    except ImportError as e:
        hint = "pip install 'ragdot[torchtitan]'"
        raise ImportError(f"ragdot.integrations.torchtitan needs torchtitan ({hint}): {e}") from None


def _attribute(target: Any) -> str:
    if isinstance(target, type) and callable(getattr(target, SEAM, None)):
        return SEAM
    if isinstance(target, ModuleType) and callable(getattr(target, LEGACY, None)):
        return LEGACY
    raise ValueError(
        f"target={target!r} has neither a {SEAM}(self, *, A, B_t, offs) method (a class, as torchtitan's "
        f"GroupedExperts) nor a module function {LEGACY}; pass torchtitan's GroupedExperts class or its moe module"
    )


def patch(target: Any = None, *, backend: str | None = None) -> Any:
    """Route torchtitan's grouped experts through ragdot; returns the patched class or module.

    ``target``: a GroupedExperts-like class with the ``_grouped_mm`` seam (default torchtitan's
    ``GroupedExperts``, whose subclasses inherit the patch), or an older torchtitan moe module with
    ``_run_experts_grouped_mm``. ``backend``: the ragged_dot backend (None: ``auto``). Patching again replaces
    the ragdot function, never the saved original."""
    _check_backend(backend)
    target = _default_target() if target is None else target
    name = _attribute(target)
    current = getattr(target, name)
    key = (id(target), name)
    if key not in _ORIGINALS and not hasattr(current, _MARK):
        _ORIGINALS[key] = (target, current)
    setattr(target, name, _seam(backend) if name == SEAM else _legacy(backend))
    return target


def unpatch(target: Any = None) -> None:
    """Put back what ``patch`` replaced on ``target`` (default: every target patched so far)."""
    keys = list(_ORIGINALS) if target is None else [(id(target), _attribute(target))]
    for key in keys:
        if key in _ORIGINALS:
            owner, original = _ORIGINALS.pop(key)
            setattr(owner, key[1], original)


def is_patched(target: Any = None) -> bool:
    """Whether ``target`` (default torchtitan's GroupedExperts or moe module) runs ragdot now."""
    target = _default_target() if target is None else target
    return hasattr(getattr(target, _attribute(target)), _MARK)
