"""MXFP8 (OCP MX: float8_e4m3fn elements, one E8M0 scale per 32 values) weight gradient of MoE experts.

    from ragdot import mxfp8
    q, s = mxfp8.quantize(x, dim=0)     # x [T, C] -> q float8_e4m3fn [T, C] (token-contiguous), s uint8 [T // 32, C]
    x2 = mxfp8.dequantize(q, s, dim=0)  # float32
    dw = mxfp8.grouped_wgrad(a_q, a_s, b_q, b_s, group_sizes, out_dtype=torch.bfloat16)
         # a = dY [T, N], b = X [T, K], both quantized along tokens; dw [G, N, K], dw[g] = a_g^T . b_g

On CUDA the weight gradient runs the measured default path of `ragdot.mxfp8.wgrad` (block-scaled MMA through
tl.dot_scaled on sm100 / gfx950; on Hopper an exact bf16 dequantization pass plus the vendor bf16 grouped GEMM,
with the Triton kernel as fallback); elsewhere the torch oracle (`ragdot.mxfp8.reference`). Design, rounding
rule and measurements: docs/mxfp8.md.
"""

from __future__ import annotations

import torch

from ragdot.groups import validate_requested
from ragdot.mxfp8.quantize import BLOCK, dequantize, quantize
from ragdot.mxfp8.reference import grouped_wgrad_reference

__all__ = ["BLOCK", "quantize", "dequantize", "grouped_wgrad", "check_wgrad_inputs"]

_OUT_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def _operand(name: str, q: torch.Tensor, s: torch.Tensor, tokens: int | None) -> tuple[int, int]:
    if not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn or q.ndim != 2:
        raise TypeError(f"{name}_q must be a 2-D float8_e4m3fn tensor [T, C], got "
                        f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
    if not isinstance(s, torch.Tensor) or s.dtype != torch.uint8:
        raise TypeError(f"{name}_s must be a uint8 (E8M0) tensor, got {getattr(s, 'dtype', type(s).__name__)}")
    t, c = q.shape
    if tokens is not None and t != tokens:
        raise ValueError(f"{name}_q has {t} tokens but a_q has {tokens}: both operands share the token axis")
    if t % BLOCK:
        raise ValueError(f"the token count T={t} must be a multiple of {BLOCK} (pad the operands)")
    if tuple(s.shape) != (t // BLOCK, c):
        raise ValueError(f"{name}_s must have shape [T // {BLOCK}, C] = [{t // BLOCK}, {c}], got {tuple(s.shape)}")
    return t, c


def check_wgrad_inputs(
    a_q: torch.Tensor,
    a_s: torch.Tensor,
    b_q: torch.Tensor,
    b_s: torch.Tensor,
    group_sizes: torch.Tensor,
    out_dtype: torch.dtype,
    validate: bool,
) -> None:
    """Shape/dtype/device checks (always); with `validate`, also the group sizes (a host synchronisation)."""
    tokens, _ = _operand("a", a_q, a_s, None)
    _operand("b", b_q, b_s, tokens)
    if not isinstance(group_sizes, torch.Tensor) or group_sizes.ndim != 1:
        raise TypeError("group_sizes must be a 1-D integer tensor [G]")
    if group_sizes.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"group_sizes must be int32 or int64, got {group_sizes.dtype}")
    devices = {t.device for t in (a_q, a_s, b_q, b_s, group_sizes)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of bfloat16, float32, float16, got {out_dtype}")
    if validate:
        sizes = group_sizes.to("cpu", torch.int64).tolist()
        for g, size in enumerate(sizes):
            if size < 0 or size % BLOCK:
                raise ValueError(f"group_sizes[{g}]={size} must be a non-negative multiple of {BLOCK}")
        if sum(sizes) > tokens:
            raise ValueError(f"sum(group_sizes)={sum(sizes)} exceeds the token count T={tokens}")


def grouped_wgrad(
    a_q: torch.Tensor,
    a_s: torch.Tensor,
    b_q: torch.Tensor,
    b_s: torch.Tensor,
    group_sizes: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    validate: bool = False,
) -> torch.Tensor:
    """MXFP8 grouped weight gradient: dw[g] = a[rows of g]^T . b[rows of g], dw [G, N, K].

    a_q float8_e4m3fn logically [T, N] (dY) with a_s uint8 [T // 32, N]; b_q [T, K] (X) with b_s [T // 32, K];
    both quantized along tokens (`quantize(x, dim=0)`, whose token-contiguous layout is the fast one).
    group_sizes int [G]: multiples of 32 summing to at most T; tokens past the sum are ignored, whatever they
    hold. `validate=True` (or RAGDOT_VALIDATE=1) checks the sizes on the host and raises ValueError naming the
    group. Float32 accumulation; the result is rounded once to `out_dtype`; bitwise reproducible.
    """
    validate = validate or validate_requested()
    check_wgrad_inputs(a_q, a_s, b_q, b_s, group_sizes, out_dtype, validate)
    if a_q.is_cuda:
        from ragdot.mxfp8.wgrad import grouped_wgrad_triton

        return grouped_wgrad_triton(a_q, a_s, b_q, b_s, group_sizes, out_dtype=out_dtype)
    return grouped_wgrad_reference(a_q, a_s, b_q, b_s, group_sizes, out_dtype=out_dtype)
