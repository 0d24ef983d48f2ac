"""Public entry points: argument checking, canonicalization, group offsets, dispatch."""

from __future__ import annotations

import os

import torch

from ragdot import ops
from ragdot.backends import BACKEND_NAMES, available_backends
from ragdot.dimension_numbers import RAGGED_DOT_DN, Canonical, RaggedDotDimensionNumbers, canonicalize

__all__ = ["ragged_dot", "ragged_dot_general", "backends", "group_ends_from_sizes"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def backends() -> list[str]:
    """Names of the concrete backends usable on this machine now (pass one as `backend=`)."""
    return available_backends()


def _check_backend(backend: str | None) -> str:
    if backend is None:
        return "auto"
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
    if backend == "auto":
        return backend
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend={backend!r} is unknown; expected one of {', '.join(BACKEND_NAMES)}, 'auto' or None")
    usable = available_backends()
    if backend not in usable:
        raise ValueError(f"backend={backend!r} is not usable on this machine; available: {', '.join(usable)}")
    return backend


def _as_sizes(group_sizes, lhs):
    """Tensors pass through; a list, tuple or numpy array of ints becomes an int64 tensor on lhs's device."""
    if isinstance(group_sizes, torch.Tensor) or not isinstance(lhs, torch.Tensor):
        return group_sizes
    if isinstance(group_sizes, (list, tuple)) or type(group_sizes).__module__ == "numpy":
        try:
            sizes = torch.as_tensor(group_sizes)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"group_sizes must be a 1-D sequence of ints, got {group_sizes!r}") from None
        if sizes.numel() == 0:
            sizes = sizes.to(torch.int64)
        return sizes.to(lhs.device)
    return group_sizes


def _check_operands(lhs, rhs, group_sizes, preferred_element_type) -> torch.dtype:
    for name, t in (("lhs", lhs), ("rhs", rhs), ("group_sizes", group_sizes)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if lhs.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"lhs must be float16, bfloat16, float32 or float64, got {lhs.dtype}")
    if rhs.dtype != lhs.dtype:
        raise TypeError(f"rhs must have lhs's dtype {lhs.dtype}, got {rhs.dtype}; cast one of them first")
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
        raise TypeError(f"group_sizes must be an integer tensor, got {group_sizes.dtype}")
    if group_sizes.ndim != 1:
        raise ValueError(
            f"group_sizes must be 1-D (one size per group), got shape {tuple(group_sizes.shape)}; "
            "per-batch group sizes are not supported"
        )
    if lhs.device != rhs.device:
        raise ValueError(f"lhs and rhs must be on one device, got {lhs.device} and {rhs.device}")
    if preferred_element_type is None:
        return lhs.dtype
    if not isinstance(preferred_element_type, torch.dtype) or preferred_element_type not in _FLOAT_DTYPES:
        raise TypeError(
            "preferred_element_type must be None or one of torch.float16, torch.bfloat16, torch.float32, "
            f"torch.float64, got {preferred_element_type!r}"
        )
    return preferred_element_type


def _validate_sizes(group_sizes: torch.Tensor, extent: int) -> None:
    """Host-side check used with validate=True: names the first offending group."""
    total = 0
    for i, size in enumerate(group_sizes.tolist()):
        if size < 0:
            raise ValueError(f"group_sizes[{i}] = {size} is negative; group sizes must be >= 0")
        total += size
        if total > extent:
            raise ValueError(
                f"group_sizes sum to {total} by group {i}, beyond the ragged dimension's size {extent}"
            )


def group_ends_from_sizes(group_sizes: torch.Tensor, extent: int, scale: int = 1) -> torch.Tensor:
    """Inclusive prefix sums of the sizes (negatives count as 0), times `scale`, clamped to `extent`; int32.

    Stays on the device of `group_sizes`: no host synchronisation. Each size is first clamped to the unscaled
    extent (which leaves every clamped end unchanged), so the running sum stays below G * extent and fits
    int32 whenever that product does: then three small kernels, no widening and narrowing copies.
    """
    rows = extent // scale
    narrow = group_sizes.shape[0] * max(extent, 1) < 2**31
    acc = torch.int32 if narrow else torch.int64
    if group_sizes.dtype not in (torch.int32, torch.int64):  # narrow ints cannot hold the clamp bound
        group_sizes = group_sizes.to(torch.int64)
    ends = torch.cumsum(group_sizes.clamp(0, rows), 0, dtype=acc)
    if scale != 1:
        ends = ends * scale
    ends = ends.clamp_(max=extent)
    return ends if narrow else ends.to(torch.int32)


def _prepare(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: object,
    dimension_numbers: object,
    preferred_element_type: torch.dtype | None,
    backend: str | None,
) -> tuple[Canonical, torch.Tensor, torch.dtype, str]:
    """Checked arguments of a call: (canonical problem, group sizes tensor, output dtype, backend name)."""
    dn = RaggedDotDimensionNumbers.coerce(dimension_numbers)
    group_sizes = _as_sizes(group_sizes, lhs)
    out_dtype = _check_operands(lhs, rhs, group_sizes, preferred_element_type)
    name = _check_backend(backend)
    can: Canonical = canonicalize(lhs, rhs, group_sizes.shape[0], dn)
    return can, group_sizes, out_dtype, name


def ragged_dot_general(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    ragged_dot_dimension_numbers: RaggedDotDimensionNumbers,
    *,
    preferred_element_type: torch.dtype | None = None,
    backend: str | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """`jax.lax.ragged_dot_general` for PyTorch tensors, differentiable in lhs and rhs.

    Modes (by where the lhs ragged dimension sits): non-contracting (rhs has a group dimension; output is the
    dot_general shape without it), contracting (output `(G,) + dot shape`; group g contracts only over its
    slice), batch (a plain batched dot; group_sizes is not read). Indices at or past sum(group_sizes) belong
    to no group: their output rows are zero and they contribute to no group, whatever they hold.
    """
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
    can, group_sizes, out_dtype, name = _prepare(
        lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type, backend
    )
    if can.mode == "batch":
        return can.finish(ops.batch(can.a, can.b, out_dtype, name))
    if validate or os.environ.get("RAGDOT_VALIDATE", "") not in ("", "0"):
        _validate_sizes(group_sizes, can.extent // can.group_scale)
    ends = group_ends_from_sizes(group_sizes.to(lhs.device), can.extent, can.group_scale)
    if can.mode == "ragged_m":
        return can.finish(ops.ragged_m(can.a, can.b, ends, out_dtype, name))
    return can.finish(ops.ragged_k(can.a, can.b, ends, out_dtype, name))


def explain(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    ragged_dot_dimension_numbers: RaggedDotDimensionNumbers = RAGGED_DOT_DN,
    *,
    preferred_element_type: torch.dtype | None = None,
    backend: str | None = None,
) -> dict[str, object]:
    """What `ragged_dot_general` with these arguments would run (forward only), without running it.

    Returns {"problem", "key", "tuned", "plan"}: the canonical problem (ragged_m / ragged_k / batch), the
    tuning-cache key of the call (None off CUDA), whether a measured entry exists for it, and the ordered
    (backend, Triton config or None) pairs the call tries, the first one being what normally runs.
    """
    from ragdot.tune.cache import CACHE
    from ragdot.tune.key import key_for
    from ragdot.tune.select import plan

    can, group_sizes, out_dtype, name = _prepare(
        lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type, backend
    )
    groups = 0 if can.mode == "batch" else group_sizes.shape[0]
    key = key_for(can.mode, can.a, can.b, groups, out_dtype) if can.a.device.type == "cuda" else None
    return {
        "problem": can.mode,
        "key": key.text() if key is not None else None,
        "tuned": key is not None and CACHE.get(key.text(), key.device) is not None,
        "plan": plan(can.mode, name, can.a, can.b, groups, out_dtype),
    }


def ragged_dot(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    *,
    preferred_element_type: torch.dtype | None = None,
    backend: str | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """`jax.lax.ragged_dot`: lhs [M, K], rhs [G, K, N], group_sizes int [G] -> [M, N].

    Rows of lhs are split into consecutive groups; row i of group g is multiplied by rhs[g]. Rows at or past
    sum(group_sizes) produce zeros.
    """
    for name, t, rank in (("lhs", lhs, 2), ("rhs", rhs, 3)):
        if isinstance(t, torch.Tensor) and t.ndim != rank:
            raise ValueError(
                f"ragged_dot expects {name} of rank {rank} (lhs [M, K], rhs [G, K, N]), got shape "
                f"{tuple(t.shape)}; use ragged_dot_general for other layouts"
            )
    return ragged_dot_general(
        lhs,
        rhs,
        group_sizes,
        RAGGED_DOT_DN,
        preferred_element_type=preferred_element_type,
        backend=backend,
        validate=validate,
    )
