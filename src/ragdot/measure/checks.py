"""Correctness checks: the normalised error of an output against its reference, and the tolerance per dtype.

The normalised error is ||out - ref|| / ||ref|| (Frobenius norms, float64 sums). A check passes when it is
at most TOLERANCE[dtype]; NaN never passes. The bounds are those of a bf16/fp16/fp32 matmul with float32
accumulation over the reduction lengths of MoE models, with margin.
"""

from __future__ import annotations

import math

import torch

__all__ = ["TOLERANCE", "tolerance", "normalised_error", "within_tolerance", "max_abs_error", "is_oom",
           "failure_status"]  # fmt: skip

TOLERANCE: dict[torch.dtype, float] = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def tolerance(dtype: torch.dtype, default: float = 1e-4) -> float:
    """The bound on the normalised error for outputs computed in `dtype` (`default` for other dtypes)."""
    return TOLERANCE.get(dtype, default)


def normalised_error(out: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 24) -> float:
    """||out - ref|| / ||ref|| in float64 sums, chunked so huge outputs need little extra memory.

    NaN when out holds NaN/Inf; inf when shapes differ or ref is zero but out is not.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    o, r = out.reshape(-1), ref.reshape(-1)
    num = den = 0.0
    for i in range(0, o.numel(), chunk):
        oc, rc = o[i : i + chunk].float(), r[i : i + chunk].to(device=o.device).float()
        num += float((oc - rc).double().square().sum())
        den += float(rc.double().square().sum())
    if math.isnan(num) or math.isinf(num):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def within_tolerance(err: float, dtype: torch.dtype, default: float = 1e-4) -> bool:
    """Whether a normalised error passes the bound of `dtype` (False for NaN)."""
    return err <= tolerance(dtype, default)


def max_abs_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|: the worst element against the largest reference value (inf for NaN or for
    a nonzero output where the reference is all zero)."""
    scale = ref.abs().max().item()
    diff = (out.float() - ref).abs().max().item()
    err = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
    return err if math.isfinite(err) else math.inf


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` says the device ran out of memory (torch's error or XLA's RESOURCE_EXHAUSTED)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return "out of memory" in text.lower() or "RESOURCE_EXHAUSTED" in text


def failure_status(exc: BaseException) -> tuple[str, str]:
    """(status, note) of a failed run: ("OOM", ""), ("n/a", why) for NotImplementedError, else "error"."""
    if is_oom(exc):
        return "OOM", ""
    if isinstance(exc, NotImplementedError):
        return "n/a", str(exc)[:200]
    return "error", f"{type(exc).__name__}: {exc}"[:300]
