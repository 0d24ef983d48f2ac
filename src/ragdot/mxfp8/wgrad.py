"""Triton kernels of the MXFP8 grouped weight gradient: dw[g] = a[window g]^T . b[window g].

One program per (expert, output tile) owns its [BLOCK_N, BLOCK_K] tile for life: it walks its expert's
tokens BLOCK_T at a time, accumulates in float32 registers and stores once (bf16 or fp32, rounded in the
register). No atomics, so results are bitwise reproducible. Token count and group sizes are runtime values
(a new routing reuses the compiled kernel); every program derives its window from the sizes itself.
Out-of-window tokens are masked at the load (data -> 0, scale -> neutral), so neither NaN data nor a 0xFF
scale in the padding or in another expert's tokens can reach a result; empty windows store exact zeros.
Below LONGEST_FIRST_MAX_BLOCKS programs, slot d takes the expert with the d-th longest window.

Inner steps (`PATHS`), all with the same walk and masking:
- "upcast"       fp8 -> bf16 in registers, times the scale (exact), one bf16 MMA per step (Hopper);
- "upcast-bits"  the same, converting by moving bits (PTX) instead of the conversion unit (CUDA only);
- "promote"      one fp8 MMA per 32-token block into a scratch tile, added with the scale outer product;
- "scaled"       tl.dot_scaled: native block-scaled MMA on sm100 / gfx950 (Triton decomposes it elsewhere);
- "fp8-noscale", "upcast-noscale": timing-only strip-downs that ignore the scales (wrong numerics).
Beside them, "dequant-gmm" (not this kernel): one exact bf16 dequantization pass per operand, then
torch._grouped_mm; measured the fastest exact path on Hopper (docs/mxfp8.md), hence HOPPER_PATH.
The non-native paths take scale planes pre-decoded to their multiply dtype (`_decode_scales`, one small
launch per operand, part of the call).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional
    triton = None

__all__ = ["PATHS", "TIMING_ONLY", "WgradConfig", "default_config", "default_path", "grouped_wgrad_triton"]

PATHS: dict[str, int] = {
    "upcast": 0, "promote": 1, "scaled": 2, "fp8-noscale": 3, "upcast-noscale": 4, "upcast-bits": 5,
    "dequant-gmm": -1,  # not a kernel step: exact bf16 dequantization pass + torch._grouped_mm (vendor bf16)
}
TIMING_ONLY = frozenset({"fp8-noscale", "upcast-noscale"})
#: block-order rule: longest window first below this many programs, plain order from it on.
#: On the H200 the two orders differ by less than run-to-run noise at 1,408 and 57,344 programs (docs/mxfp8.md).
LONGEST_FIRST_MAX_BLOCKS = 1024
#: the rank computation is a [G, G] comparison in every program: only for modest expert counts
_LONGEST_FIRST_MAX_GROUPS = 128
#: Hopper's path, chosen by measurement (docs/mxfp8.md): exact bf16 dequantization + the vendor bf16 grouped
#: GEMM; "upcast-bits" is the fastest single kernel and the fallback where torch._grouped_mm is missing
HOPPER_PATH = "dequant-gmm"


@dataclass(frozen=True)
class WgradConfig:
    block_n: int = 128  # output rows (dY channels) per program
    block_k: int = 128  # output columns (X channels) per program
    block_t: int = 64  # tokens per step, a multiple of 32
    num_warps: int = 4
    num_stages: int = 3
    group_n: int = 8  # tile rows walked together inside an expert (L2 reuse)

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "block_t", "num_warps", "num_stages", "group_n"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"WgradConfig.{name} must be a positive int, got {value!r}")
        if self.block_t % 32:
            raise ValueError(f"WgradConfig.block_t must be a multiple of 32, got {self.block_t}")


_DEFAULT_CONFIGS: dict[str, WgradConfig] = {
    "upcast": WgradConfig(128, 128, 64, 4, 3),
    "upcast-bits": WgradConfig(128, 128, 64, 4, 3),
    "promote": WgradConfig(128, 64, 64, 4, 4),
    "scaled": WgradConfig(128, 256, 64, 8, 3),
    "fp8-noscale": WgradConfig(128, 256, 128, 8, 3),
    "upcast-noscale": WgradConfig(128, 128, 64, 4, 3),
}


def default_config(path: str) -> WgradConfig:
    return _DEFAULT_CONFIGS[path]


def default_path(device: torch.device) -> str:
    """'scaled' where the GPU has block-scaled MMA (sm100+, gfx950), the measured path on Hopper, else 'upcast'."""
    if device.type != "cuda":
        return "upcast"
    if getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(device).gcnArchName
        return "scaled" if arch.startswith("gfx95") else "upcast"
    major = torch.cuda.get_device_capability(device)[0]
    if major >= 10:
        return "scaled"
    if major == 9:
        return HOPPER_PATH if hasattr(torch, "_grouped_mm") else "upcast-bits"
    return "upcast"


if triton is not None:

    @triton.jit
    def _e8m0(s, BF16: tl.constexpr):
        """E8M0 bytes -> bfloat16 (BF16) or float32 powers of two, from bits: 0x00 is 2**-127, 0xFF NaN."""
        si = s.to(tl.int32)
        if BF16:
            bits = tl.where(si == 255, 0x7FC0, tl.where(si == 0, 0x40, si << 7))
            return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            bits = tl.where(si == 255, 0x7FC00000, tl.where(si == 0, 0x400000, si << 23))
            return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _decode_scales_kernel(
        s_ptr,  # uint8 [numel] E8M0, contiguous
        o_ptr,  # bfloat16/float32 [numel]
        numel,
        BF16: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < numel
        tl.store(o_ptr + offs, _e8m0(tl.load(s_ptr + offs, mask=ok, other=127), BF16), mask=ok)

    @triton.jit
    def _e4m3_bits_to_bf16(x):
        """e4m3 -> bfloat16 by moving bits (PTX, 4 values per call) instead of the conversion unit: exponent
        and mantissa land in the bf16 fields unbiased (value * 2**-120; zero and subnormals included), then
        one bf16x2 multiply by 2**120. An e4m3 NaN byte becomes 480 (`quantize` writes NaN only into blocks
        whose scale is 0xFF, which stays NaN)."""
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 y, t, s, c;
            mov.b32 c, 0x7B807B80;
            and.b32 y, $2, 0x7F7F7F7F;
            prmt.b32 t, y, 0, 0x4140;
            shl.b32 t, t, 4;
            prmt.b32 s, $2, 0, 0x9484;
            lop3.b32 t, t, s, 0x80008000, 0xF8;
            mul.rn.bf16x2 $0, t, c;
            prmt.b32 t, y, 0, 0x4342;
            shl.b32 t, t, 4;
            prmt.b32 s, $2, 0, 0xB4A4;
            lop3.b32 t, t, s, 0x80008000, 0xF8;
            mul.rn.bf16x2 $1, t, c;
            }""",
            constraints="=r,=r,r",
            args=[x.to(tl.uint8, bitcast=True)],
            dtype=tl.bfloat16,
            is_pure=True,
            pack=4,
        )

    @triton.jit
    def _upcast(x, BF16: tl.constexpr, BITS: tl.constexpr):
        if BITS:
            return _e4m3_bits_to_bf16(x)
        elif BF16:
            return x.to(tl.bfloat16)
        else:
            return x.to(tl.float32)

    @triton.jit
    def _step(
        acc,  # float32 [BLOCK_N, BLOCK_K] accumulator
        t0,  # first token of this step (a multiple of 32)
        t_end,  # end of the expert's window (a multiple of 32)
        a_rows,  # pointers [BLOCK_N, 1]: a at token 0 of each row
        b_cols,  # pointers [1, BLOCK_K]: b at token 0 of each column
        as_rows,  # pointers [BLOCK_N, 1]: a's scales at block 0 of each row
        bs_cols,  # pointers [1, BLOCK_K]: b's scales at block 0 of each column
        n_ok,  # [BLOCK_N] rows inside N
        k_ok,  # [BLOCK_K] columns inside K
        stride_at,
        stride_ast,
        stride_bt,
        stride_bst,
        PATH: tl.constexpr,
        BF16: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        """acc + the products of tokens [t0, min(t0 + BLOCK_T, t_end)); other tokens masked at the load."""
        NB: tl.constexpr = BLOCK_T // 32
        if PATH == 1:  # promote: fp8 MMA per 32-token block, float32 scales (pre-decoded), scaled add
            for j in tl.static_range(NB):
                tt = (t0 + j * 32 + tl.arange(0, 32)).to(tl.int64)
                t_ok = tt < t_end
                a = tl.load(a_rows + tt[None, :] * stride_at, mask=n_ok[:, None] & t_ok[None, :], other=0.0)
                b = tl.load(b_cols + tt[:, None] * stride_bt, mask=t_ok[:, None] & k_ok[None, :], other=0.0)
                blk = t0 // 32 + j
                b_in = blk < t_end // 32
                sa = tl.load(as_rows + blk * stride_ast, mask=n_ok[:, None] & b_in, other=1.0)  # [BLOCK_N, 1]
                sb = tl.load(bs_cols + blk * stride_bst, mask=k_ok[None, :] & b_in, other=1.0)  # [1, BLOCK_K]
                acc += tl.dot(a, b) * (sa * sb)
        else:
            tt = (t0 + tl.arange(0, BLOCK_T)).to(tl.int64)
            t_ok = tt < t_end
            a = tl.load(a_rows + tt[None, :] * stride_at,
                        mask=n_ok[:, None] & t_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_T] fp8
            b = tl.load(b_cols + tt[:, None] * stride_bt,
                        mask=t_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_T, BLOCK_K] fp8
            blk = t0 // 32 + tl.arange(0, NB)
            b_in = blk < t_end // 32
            if PATH == 2:  # dot_scaled: E8M0 bytes straight to the block-scaled MMA
                sa = tl.load(as_rows + blk[None, :] * stride_ast,
                             mask=n_ok[:, None] & b_in[None, :], other=127)  # [BLOCK_N, NB] uint8
                sb = tl.load(tl.trans(bs_cols) + blk[None, :] * stride_bst,
                             mask=k_ok[:, None] & b_in[None, :], other=127)  # [BLOCK_K, NB] uint8
                acc = tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3", acc)
            elif PATH == 0 or PATH == 5:  # upcast: exact dequantization in registers, one 16-bit MMA
                sa = tl.load(as_rows + blk[None, :] * stride_ast,
                             mask=n_ok[:, None] & b_in[None, :], other=1.0)  # [BLOCK_N, NB] bf16/fp32
                sb = tl.load(bs_cols + blk[:, None] * stride_bst,
                             mask=b_in[:, None] & k_ok[None, :], other=1.0)  # [NB, BLOCK_K] bf16/fp32
                af = tl.reshape(_upcast(a, BF16, PATH == 5), (BLOCK_N, NB, 32)) * sa[:, :, None]
                bf = tl.reshape(_upcast(b, BF16, PATH == 5), (NB, 32, BLOCK_K)) * sb[:, None, :]
                acc = tl.dot(tl.reshape(af, (BLOCK_N, BLOCK_T)), tl.reshape(bf, (BLOCK_T, BLOCK_K)), acc)
            elif PATH == 3:  # timing only: fp8 MMA, scales ignored
                acc = tl.dot(a, b, acc)
            else:  # timing only: upcast without the scale multiply
                acc = tl.dot(_upcast(a, BF16, False), _upcast(b, BF16, False), acc)
        return acc

    @triton.jit
    def _wgrad_kernel(
        a_ptr,  # float8_e4m3fn [T, N] (dY), strides (stride_at, stride_an); fastest with stride_at == 1
        as_ptr,  # [T // 32, N] scales of a: uint8 E8M0 ("scaled"), else decoded bf16/fp32; (stride_ast, stride_asn)
        b_ptr,  # float8_e4m3fn [T, K] (X), strides (stride_bt, stride_bk)
        bs_ptr,  # [T // 32, K] scales of b, as for a; strides (stride_bst, stride_bsk)
        sizes_ptr,  # int32/int64 [G] tokens per expert (negative -> 0, prefix sums capped at T)
        out_ptr,  # bfloat16/float32 [G, N, K] contiguous
        T,  # tokens (a multiple of 32)
        N,
        K,
        G,
        stride_at,
        stride_an,
        stride_ast,
        stride_asn,
        stride_bt,
        stride_bk,
        stride_bst,
        stride_bsk,
        PATH: tl.constexpr,  # index into PATHS
        BF16: tl.constexpr,  # upcast paths: bfloat16 MMA operands (GPUs), else float32 (interpreter)
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_T: tl.constexpr,  # multiple of 32
        GROUP_N: tl.constexpr,
        G_POW2: tl.constexpr,  # next power of two >= G
        LONGEST_FIRST: tl.constexpr,
        INTERPRET: tl.constexpr,  # running in Triton's interpreter
    ):
        pid = tl.program_id(0)
        tiles_n = tl.cdiv(N, BLOCK_N)
        tiles_k = tl.cdiv(K, BLOCK_K)
        tiles = tiles_n * tiles_k
        slot = pid // tiles
        tile = pid % tiles
        width = GROUP_N * tiles_k
        first_n = (tile // width) * GROUP_N
        rows = tl.minimum(tiles_n - first_n, GROUP_N)
        pid_n = first_n + (tile % width) % rows
        pid_k = (tile % width) // rows

        # Every expert's window, in 32-token blocks: a block belongs to the group owning its first token.
        ge = tl.arange(0, G_POW2)
        size = tl.maximum(tl.load(sizes_ptr + ge, mask=ge < G, other=0).to(tl.int64), 0)
        incl = tl.cumsum(size, axis=0)
        end_b = ((tl.minimum(incl, T) + 31) // 32).to(tl.int32)
        start_b = ((tl.minimum(incl - size, T) + 31) // 32).to(tl.int32)
        if LONGEST_FIRST:
            blen = tl.where(ge < G, end_b - start_b, -1)
            ahead = (blen[None, :] > blen[:, None]) | ((blen[None, :] == blen[:, None]) & (ge[None, :] < ge[:, None]))
            rank = tl.sum(ahead.to(tl.int32), axis=1)
            g = tl.sum(tl.where(rank == slot, ge, 0), axis=0)
        else:
            g = slot
        t_start = tl.sum(tl.where(ge == g, start_b, 0), axis=0) * 32
        t_end = tl.sum(tl.where(ge == g, end_b, 0), axis=0) * 32

        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        n_ok = offs_n < N
        k_ok = offs_k < K
        a_rows = a_ptr + offs_n.to(tl.int64)[:, None] * stride_an  # [BLOCK_N, 1]
        b_cols = b_ptr + offs_k.to(tl.int64)[None, :] * stride_bk  # [1, BLOCK_K]
        as_rows = as_ptr + offs_n[:, None] * stride_asn  # [BLOCK_N, 1]
        bs_cols = bs_ptr + offs_k[None, :] * stride_bsk  # [1, BLOCK_K]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        if INTERPRET:  # the interpreter cannot take loop bounds read from memory: same steps, while loop
            t_cur = t_start
            while t_cur < t_end:
                acc = _step(acc, t_cur, t_end, a_rows, b_cols, as_rows, bs_cols, n_ok, k_ok, stride_at,
                            stride_ast, stride_bt, stride_bst, PATH, BF16, BLOCK_N, BLOCK_K, BLOCK_T)
                t_cur += BLOCK_T
        else:
            for t0 in range(t_start, t_end, BLOCK_T):
                acc = _step(acc, t0, t_end, a_rows, b_cols, as_rows, bs_cols, n_ok, k_ok, stride_at,
                            stride_ast, stride_bt, stride_bst, PATH, BF16, BLOCK_N, BLOCK_K, BLOCK_T)

        out_rows = out_ptr + g.to(tl.int64) * N * K + offs_n.to(tl.int64)[:, None] * K
        tl.store(out_rows + offs_k[None, :], acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & k_ok[None, :])


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _decode_scales(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """E8M0 plane -> a contiguous plane of `dtype` (bfloat16 or float32) powers of two, one launch."""
    s = s.contiguous()
    out = torch.empty(s.shape, dtype=dtype, device=s.device)
    if s.numel():
        block = 4096
        _decode_scales_kernel[(triton.cdiv(s.numel(), block),)](
            s, out, s.numel(), BF16=dtype == torch.bfloat16, BLOCK=block
        )
    return out


def _block_ends(group_sizes: torch.Tensor, tokens: int) -> torch.Tensor:
    """int32 cumulative window ends under the kernels' rule (clamped prefix sums, rounded up to 32)."""
    ends = group_sizes.to(torch.int64).clamp(min=0).cumsum(0).clamp(max=tokens)
    return ((ends + 31) // 32 * 32).to(torch.int32)


def _dequant_gmm(a_q, a_s, b_q, b_s, group_sizes, out_dtype: torch.dtype) -> torch.Tensor:
    """Exact bf16 dequantization of both operands (token-contiguous), then the vendor bf16 grouped GEMM.

    torch._grouped_mm reads only tokens inside [0, ends[-1]) and returns zeros for empty groups."""
    from ragdot.mxfp8.quantize import dequantize_tokens_triton

    if not hasattr(torch, "_grouped_mm"):
        raise NotImplementedError("path='dequant-gmm' needs torch._grouped_mm")
    a = dequantize_tokens_triton(a_q, a_s)  # [T, N], storage [N, T]
    b = dequantize_tokens_triton(b_q, b_s)  # [T, K], storage [K, T]
    if out_dtype != torch.bfloat16:
        # The vendor kernel writes its input dtype; a wider output needs wider (still exact) operands.
        a, b = a.float(), b.float()
    # Offsets are multiples of 32 tokens, so the token axis may be the contiguous one here.
    out = torch._grouped_mm(a.t(), b, offs=_block_ends(group_sizes, a_q.shape[0]))
    return out.to(out_dtype).contiguous()


def grouped_wgrad_triton(
    a_q: torch.Tensor,
    a_s: torch.Tensor,
    b_q: torch.Tensor,
    b_s: torch.Tensor,
    group_sizes: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    path: str | None = None,
    config: WgradConfig | None = None,
    order: str = "auto",
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Launch the kernel on checked inputs (see `ragdot.mxfp8.grouped_wgrad` for the contract).

    path: a key of PATHS (None: `default_path`); order: 'auto' (the block-count rule), 'longest' or
    'natural'; compute_dtype: the upcast paths' MMA dtype (None: bfloat16 on GPUs, float32 in the
    interpreter, whose bfloat16 dot is wrong).
    """
    if triton is None:
        raise RuntimeError("the MXFP8 weight-gradient kernels need triton")
    path = default_path(a_q.device) if path is None else path
    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, got {path!r}")
    if order not in ("auto", "longest", "natural"):
        raise ValueError(f"order must be 'auto', 'longest' or 'natural', got {order!r}")
    if not a_q.is_cuda and not _interpreting():
        raise RuntimeError("Triton kernels need a CUDA device or TRITON_INTERPRET=1")
    if path in ("scaled", "upcast-bits") and not a_q.is_cuda:
        raise NotImplementedError(f"Triton's interpreter cannot run path={path!r}; use path='upcast' on the CPU")
    if compute_dtype is None:
        compute_dtype = torch.bfloat16 if a_q.is_cuda else torch.float32
    if compute_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"compute_dtype must be bfloat16 or float32, got {compute_dtype}")
    if path == "upcast-bits" and compute_dtype != torch.bfloat16:
        raise ValueError("path='upcast-bits' computes in bfloat16 only")
    tokens, n = a_q.shape
    k = b_q.shape[1]
    g = group_sizes.shape[0]
    if path == "dequant-gmm" and g and n and k and tokens:
        return _dequant_gmm(a_q, a_s, b_q, b_s, group_sizes, out_dtype)
    cfg = config or default_config(path)
    out = torch.empty((g, n, k), dtype=out_dtype, device=a_q.device)
    if out.numel() == 0:
        return out
    if tokens == 0:
        return out.zero_()
    if path != "scaled":  # the other paths multiply by decoded scales
        scale_dtype = torch.float32 if path == "promote" else compute_dtype
        a_s, b_s = _decode_scales(a_s, scale_dtype), _decode_scales(b_s, scale_dtype)
    tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(k, cfg.block_k)
    blocks = g * tiles
    g_pow2 = max(16, triton.next_power_of_2(g))
    longest = blocks < LONGEST_FIRST_MAX_BLOCKS if order == "auto" else order == "longest"
    longest = longest and g_pow2 <= _LONGEST_FIRST_MAX_GROUPS
    _wgrad_kernel[(blocks,)](
        a_q, a_s, b_q, b_s, group_sizes, out,
        tokens, n, k, g,
        a_q.stride(0), a_q.stride(1), a_s.stride(0), a_s.stride(1),
        b_q.stride(0), b_q.stride(1), b_s.stride(0), b_s.stride(1),
        PATH=PATHS[path], BF16=compute_dtype == torch.bfloat16,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_T=cfg.block_t, GROUP_N=cfg.group_n,
        G_POW2=g_pow2, LONGEST_FIRST=longest, INTERPRET=_interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
