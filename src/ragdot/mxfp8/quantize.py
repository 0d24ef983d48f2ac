"""MXFP8 quantization along one axis: float8_e4m3fn elements, one E8M0 power-of-two scale per 32 values.

Scale rule (OCP MX v1.0): for a block with largest magnitude `amax`, the shared exponent is
``floor(log2(amax)) - 8`` (8 = largest exponent of e4m3), clamped to E8M0's range; each element is
``x / 2**exp`` rounded to nearest, ties to even, and saturated to +-448. The exponent is read from the bits
of `amax` (exact, no log2 rounding), the division by a power of two is exact, so the only rounding is the
element's RNE: unbiased, so it adds no systematic drift to a weight gradient that sums a hundred thousand
tokens. A block holding Inf or NaN gets the NaN scale 0xFF and NaN elements; an all-zero block gets 0x00.

Layout: ``quantize(x, dim=0)`` on x [T, C] returns q with logical shape [T, C] stored token-contiguous
(storage [C, T], strides (1, T)), the layout the weight-gradient kernel reads with 16-byte loads, and the
scales s [T // 32, C] row-major. Two implementations with bitwise-identical results: a Triton kernel
(CUDA, or the interpreter) and a torch fallback (any device).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional
    triton = None

__all__ = ["BLOCK", "quantize", "dequantize", "dequantize_tokens_triton", "quantize_torch", "quantize_triton"]

#: values that share one scale
BLOCK = 32
_E4M3_MAX = 448.0
_NAN_E4M3 = 0x7F
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_x(x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D [T, C], got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (0, 1, -1, -2):
        raise ValueError(f"dim must be 0 or 1 (blocks of {BLOCK} along that axis), got {dim!r}")
    dim %= 2
    if x.shape[dim] % BLOCK:
        raise ValueError(f"x.shape[{dim}]={x.shape[dim]} must be a multiple of {BLOCK} (the MX block size)")
    return dim


def quantize_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch implementation of ``quantize(x, dim=0)`` (any device): the reference for the Triton kernel."""
    t, c = x.shape
    xb = x.float().reshape(t // BLOCK, BLOCK, c)
    amax_bits = (xb.view(torch.int32) & 0x7FFFFFFF).amax(dim=1)  # NaN/Inf compare above every finite
    biased = amax_bits >> 23
    nonfinite = biased == 255
    scale = torch.where(nonfinite, 255, (biased - 8).clamp(min=0))
    inv = ((254 - scale.clamp(max=254)) << 23).view(torch.float32)  # 2**(127 - scale), always normal
    v = (xb * inv[:, None, :]).clamp(-_E4M3_MAX, _E4M3_MAX)
    q = v.to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(nonfinite[:, None, :], _NAN_E4M3, q).to(torch.uint8)
    storage = q.reshape(t, c).t().contiguous()  # [C, T]: token-contiguous
    return storage.view(torch.float8_e4m3fn).t(), scale.to(torch.uint8)


if triton is not None:

    @triton.jit
    def _quantize_tokens_kernel(
        x_ptr,  # [T, C] float32/bfloat16/float16, strides (stride_xt, stride_xc)
        q_ptr,  # uint8 [C, T] contiguous: e4m3 bit patterns, token-contiguous
        s_ptr,  # uint8 [T // 32, C] contiguous: E8M0 scales
        T,  # tokens (multiple of 32)
        C,  # channels
        stride_xt,
        stride_xc,
        BLOCK_T: tl.constexpr,  # tokens per program, a multiple of 32
        BLOCK_C: tl.constexpr,  # channels per program
    ):
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        t_ok = offs_t < T
        c_ok = offs_c < C
        mask = t_ok[:, None] & c_ok[None, :]
        x_ptrs = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt + offs_c.to(tl.int64)[None, :] * stride_xc
        x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)

        nb: tl.constexpr = BLOCK_T // 32
        bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        amax_bits = tl.max(tl.reshape(bits, (nb, 32, BLOCK_C)), axis=1)  # [nb, BLOCK_C]
        biased = amax_bits >> 23
        nonfinite = biased == 255
        scale = tl.where(nonfinite, 255, tl.maximum(biased - 8, 0))
        inv = ((254 - tl.minimum(scale, 254)) << 23).to(tl.float32, bitcast=True)
        v = tl.reshape(tl.reshape(x, (nb, 32, BLOCK_C)) * inv[:, None, :], (BLOCK_T, BLOCK_C))
        bad = tl.reshape(tl.broadcast_to(nonfinite[:, None, :], (nb, 32, BLOCK_C)), (BLOCK_T, BLOCK_C))

        # Round |v| to the e4m3 grid, ties to even: adding 2**(e + 23) (e = the quantum's exponent) makes
        # float32's own RNE addition drop exactly the bits below the quantum.
        mag = tl.abs(v)
        e_v = tl.maximum((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF, 121)  # 121: e4m3's min normal 2**-6
        magic = ((e_v + 20) << 23).to(tl.float32, bitcast=True)
        r = tl.minimum((mag + magic) - magic, 448.0)  # saturate to the largest e4m3 value
        r_bits = r.to(tl.int32, bitcast=True)
        e_r = r_bits >> 23
        code = tl.where(e_r >= 121, ((e_r - 120) << 3) | ((r_bits >> 20) & 7), (r * 512.0).to(tl.int32))
        code = code | ((v.to(tl.int32, bitcast=True) >> 24) & 0x80)  # sign, -0.0 included
        code = tl.where(bad, 0x7F, code)  # e4m3 NaN

        q_ptrs = q_ptr + offs_c.to(tl.int64)[None, :] * T + offs_t[:, None]
        tl.store(q_ptrs, code.to(tl.uint8), mask=mask)
        offs_b = pid_t * nb + tl.arange(0, nb)
        s_mask = (offs_b < T // 32)[:, None] & c_ok[None, :]
        s_ptrs = s_ptr + offs_b.to(tl.int64)[:, None] * C + offs_c[None, :]
        tl.store(s_ptrs, scale.to(tl.uint8), mask=s_mask)


if triton is not None:

    @triton.jit
    def _dequantize_tokens_kernel(
        q_ptr,  # float8_e4m3fn [T, C] logical, strides (stride_qt, stride_qc); token-contiguous is fastest
        s_ptr,  # uint8 [T // 32, C] E8M0, strides (stride_st, stride_sc)
        o_ptr,  # bfloat16/float32 [C, T] contiguous (token-contiguous)
        T,
        C,
        stride_qt,
        stride_qc,
        stride_st,
        stride_sc,
        BLOCK_C: tl.constexpr,
        BLOCK_T: tl.constexpr,  # multiple of 32
    ):
        offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        mask = (offs_c < C)[:, None] & (offs_t < T)[None, :]
        q = tl.load(q_ptr + offs_c.to(tl.int64)[:, None] * stride_qc + offs_t.to(tl.int64)[None, :] * stride_qt,
                    mask=mask, other=0.0)  # [BLOCK_C, BLOCK_T]
        nb: tl.constexpr = BLOCK_T // 32
        offs_b = tl.program_id(0) * nb + tl.arange(0, nb)
        s = tl.load(s_ptr + offs_b.to(tl.int64)[None, :] * stride_st + offs_c[:, None] * stride_sc,
                    mask=(offs_c < C)[:, None] & (offs_b < T // 32)[None, :], other=127).to(tl.int32)
        scale = tl.where(s == 255, 0x7FC00000, tl.where(s == 0, 0x400000, s << 23)).to(tl.float32, bitcast=True)
        v = tl.reshape(tl.reshape(q.to(tl.float32), (BLOCK_C, nb, 32)) * scale[:, :, None], (BLOCK_C, BLOCK_T))
        tl.store(o_ptr + offs_c.to(tl.int64)[:, None] * T + offs_t[None, :], v.to(o_ptr.dtype.element_ty), mask=mask)


def dequantize_tokens_triton(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dequantize a dim-0 MXFP8 pair to `dtype` [T, C], stored token-contiguous (storage [C, T]).

    bfloat16 holds every MXFP8 value exactly (3-bit mantissas times powers of two), except values below
    2**-133 that only the smallest scales produce. One memory-bound pass; CUDA or the interpreter.
    """
    t, c = q.shape
    out = torch.empty((c, t), dtype=dtype, device=q.device)
    if t and c:
        grid = (triton.cdiv(t, 128), triton.cdiv(c, 64))
        _dequantize_tokens_kernel[grid](
            q, s, out, t, c, q.stride(0), q.stride(1), s.stride(0), s.stride(1), BLOCK_C=64, BLOCK_T=128
        )
    return out.t()


def quantize_triton(
    x: torch.Tensor, *, block_t: int = 64, block_c: int = 128, num_warps: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton implementation of ``quantize(x, dim=0)``; bitwise equal to `quantize_torch`."""
    if triton is None:
        raise RuntimeError("quantize_triton needs triton")
    if block_t % BLOCK or block_t <= 0:
        raise ValueError(f"block_t must be a positive multiple of {BLOCK}, got {block_t}")
    t, c = x.shape
    storage = torch.empty((c, t), dtype=torch.uint8, device=x.device)
    scale = torch.empty((t // BLOCK, c), dtype=torch.uint8, device=x.device)
    if t and c:
        grid = (triton.cdiv(t, block_t), triton.cdiv(c, block_c))
        _quantize_tokens_kernel[grid](
            x, storage, scale, t, c, x.stride(0), x.stride(1),
            BLOCK_T=block_t, BLOCK_C=block_c, num_warps=num_warps,
        )
    return storage.view(torch.float8_e4m3fn).t(), scale


def _use_triton(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda


def quantize(x: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize x [T, C] in blocks of 32 along `dim`.

    Returns (q, s): q float8_e4m3fn with x's logical shape, stored contiguous along `dim` (for dim=0:
    storage [C, T], strides (1, T)); s uint8 E8M0 with shape [T // 32, C] (dim=0) or [T, C // 32] (dim=1).
    Runs the Triton kernel on CUDA and the bitwise-identical torch code elsewhere.
    """
    dim = _check_x(x, dim)
    if dim == 1:
        q, s = quantize(x.t(), 0)
        return q.t(), s.t()
    if _use_triton(x):
        return quantize_triton(x)
    return quantize_torch(x)


def e8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 2**(s - 127); 0xFF -> NaN, 0x00 -> 2**-127 (a float32 subnormal)."""
    si = s.to(torch.int32)
    f = (si.clamp(min=1) << 23).view(torch.float32)
    f = torch.where(si == 0, torch.tensor(2.0**-127, dtype=torch.float32, device=s.device), f)
    return torch.where(si == 255, torch.tensor(float("nan"), device=s.device), f)


def dequantize(q: torch.Tensor, s: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """float32 values of an MXFP8 pair from `quantize` (blocks of 32 along `dim`)."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn or q.ndim != 2:
        raise TypeError(f"q must be a 2-D float8_e4m3fn tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    if not isinstance(s, torch.Tensor) or s.dtype != torch.uint8:
        raise TypeError(f"s must be a uint8 (E8M0) tensor, got {getattr(s, 'dtype', type(s).__name__)}")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (0, 1, -1, -2):
        raise ValueError(f"dim must be 0 or 1, got {dim!r}")
    dim %= 2
    if dim == 1:
        return dequantize(q.t(), s.t(), 0).t()
    t, c = q.shape
    if t % BLOCK or tuple(s.shape) != (t // BLOCK, c):
        raise ValueError(
            f"s must have shape [T // {BLOCK}, C] = [{t // BLOCK}, {c}] for q of shape [{t}, {c}] "
            f"(T a multiple of {BLOCK}), got {tuple(s.shape)}"
        )
    if s.device != q.device:
        raise ValueError(f"q and s must be on one device, got {q.device} and {s.device}")
    values = q.float().reshape(t // BLOCK, BLOCK, c) * e8m0_to_float(s)[:, None, :]
    return values.reshape(t, c)
