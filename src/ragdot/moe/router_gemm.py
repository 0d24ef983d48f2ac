"""The router's gate matmul on bfloat16 tensor cores, in place of the float32 matmul of upcast operands.

    logits = x @ w^T        x [T, D], w [E, D] bfloat16 -> float32 [T, E]

The product of two bfloat16 numbers is exact in float32 (8 + 8 significant bits), so a bfloat16 GEMM that
accumulates and writes float32 (`torch.mm(..., out_dtype=torch.float32)`) sums the same products as the float32
GEMM of the upcast operands, on tensor cores instead of float32 SIMT and without the float32 [T, D] copy of x.
The sums are not those of float32 SIMT bit for bit: the tensor cores accumulate with fewer guard bits. Measured on
an H200 (`benchmarks/router_gemm_probe.py`, 8192 x 2048 x 128): largest error 2.6e-6 of the largest logit against
float64, where the float32 SIMT GEMM's is 2.8e-7 (a bfloat16 rounding would be 3.9e-3), at 21 instead of 160 µs.
The backward's cotangent g [T, E] is float32; it is split exactly into three bfloat16 parts (each the rounding of
what the previous ones left: g = hi + mid + lo + r, |r| <= 2^-24 |g|), laid side by side as g3 [T, 3E], and

    dx = g3 @ [w; w; w]                       one GEMM, contraction 3E
    dw = sum over s of (g3^T @ x)[s]          one GEMM of 3E rows, then a fixed-order sum of its three blocks

both accumulated in float32 and rounded once to the operands' dtype. Repeats, other streams and CUDA-graph
replays give the same bits (the probe). `ragdot.moe.router.fast_gate = False` restores the float32 SIMT path.

`applies` says where it runs: bfloat16 x and w of one 2-D layout on CUDA (where torch has the float32-output
bfloat16 matmul), outside torch.func transforms; under torch.compile too (the split is then the opaque op
`ragdot::router_split3`, since inductor would fold its casts away; eagerly it is one Triton launch).
"""

from __future__ import annotations

import torch

from ragdot import amp
from ragdot.moe.router_rows import _geometry
from ragdot.moe.routing_kernels import HAS_TRITON, _launch
from ragdot.ops import _transformed, fake_tracing

__all__ = ["applies", "gate_matmul", "split3", "upcast_grads"]

_HAS_MM_DTYPE = "dtype" in torch.ops.aten.mm.overloads()

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _split3_kernel(
        g_ptr,  # float32 [T, E]: the cotangent of the logits, rows of stride stride_t
        out_ptr,  # bfloat16 [T, 3E]: out, [hi | mid | lo] of each row
        T,
        E,
        stride_t,
        BLOCK_T: tl.constexpr,  # rows per program
        E_POW2: tl.constexpr,  # E rounded up to a power of two
    ):
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, E_POW2)
        m = (rows < T)[:, None] & (cols < E)[None, :]
        r64 = rows.to(tl.int64)[:, None]
        g = tl.load(g_ptr + r64 * stride_t + cols[None, :], mask=m, other=0.0)
        hi = g.to(tl.bfloat16, fp_downcast_rounding="rtne")
        rest = g - hi.to(tl.float32)  # exact
        mid = rest.to(tl.bfloat16, fp_downcast_rounding="rtne")
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16, fp_downcast_rounding="rtne")
        base = out_ptr + r64 * (3 * E) + cols[None, :]
        tl.store(base, hi, mask=m)
        tl.store(base + E, mid, mask=m)
        tl.store(base + 2 * E, lo, mask=m)


def applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `gate_matmul` takes x [T, D] and w [E, D]: both bfloat16 and 2-D on one CUDA device, torch's
    float32-output bfloat16 matmul present, no torch.func transform or forward-mode AD active."""
    return (_HAS_MM_DTYPE and x.dtype == w.dtype == torch.bfloat16 and x.dim() == w.dim() == 2 and x.is_cuda
            and w.device == x.device and not _transformed())


def _mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of bfloat16 matrices, accumulated and returned in float32 (exact products)."""
    if a.is_cuda and _HAS_MM_DTYPE:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())  # the same products on devices without the bfloat16 kernel


def split3(g: torch.Tensor) -> torch.Tensor:
    """bfloat16 [T, 3E] = [hi | mid | lo] of float32 g [T, E] with hi + mid + lo = g to 2^-24 relative (see the
    module). One Triton launch eagerly on CUDA; torch ops elsewhere, fake tensors included (the same bits: round
    to nearest even)."""
    t, e = g.shape
    if HAS_TRITON and g.is_cuda and g.stride(1) == 1 and t > 0 and not torch.compiler.is_compiling() \
            and not fake_tracing():
        out = torch.empty((t, 3 * e), dtype=torch.bfloat16, device=g.device)
        e_pow2, block_t, nb = _geometry(t, e)
        _launch(_split3_kernel, (nb,), {"BLOCK_T": block_t, "E_POW2": e_pow2}, 4, g, out, t, e, g.stride(0))
        return out
    return _split3_ops(g)


def _split3_ops(g: torch.Tensor) -> torch.Tensor:
    """`split3` as torch ops (round to nearest even, as the kernel)."""
    hi = g.to(torch.bfloat16)
    rest = g - hi.float()
    mid = rest.to(torch.bfloat16)
    return torch.cat((hi, mid, (rest - mid.float()).to(torch.bfloat16)), dim=1)


def upcast_grads(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, needs: tuple[bool, ...],
                 dt: torch.dtype = torch.float32) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx, dw) of logits = x.to(dt) @ w.to(dt)^T from its cotangent: products of the operands cast to dt
    (differentiable), each gradient in its operand's dtype; None where `needs` says no."""
    dx = grad.mm(w.to(dt)).to(x.dtype) if needs[0] else None
    dw = grad.t().mm(x.to(dt)).to(w.dtype) if needs[1] else None
    return dx, dw


@torch.library.custom_op("ragdot::router_split3", mutates_args=())
def _split3_op(g: torch.Tensor) -> torch.Tensor:
    """`split3` as one opaque op for compiled graphs: inductor treats a float32 -> bfloat16 -> float32 round trip
    inside a fused kernel as the identity (it does not emulate the narrower dtype), which would leave mid and lo
    zero; through the op the parts are the eager bits."""
    return split3(g)


@_split3_op.register_fake
def _(g):
    return g.new_empty((g.shape[0], 3 * g.shape[1]), dtype=torch.bfloat16)


class _GateMatmul(torch.autograd.Function):
    """(x [T, D], w [E, D]) bfloat16 -> float32 logits [T, E]; see the module. Never under torch.func
    (`applies`), so the forward takes ctx itself: a Function with `setup_context` binds its arguments through
    inspect.signature on every call (35 µs a call on a CPU host)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return _mm32(x, w.t())

    @staticmethod
    @amp.autocast_off
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiable float32 products (the split is not)
            return upcast_grads(grad, x, w, ctx.needs_input_grad)
        grad = grad.contiguous()
        g3 = _split3_op(grad) if torch.compiler.is_compiling() else split3(grad)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = _mm32(g3, w.repeat(3, 1)).to(x.dtype)
        if ctx.needs_input_grad[1]:
            e = w.shape[0]
            dw = _mm32(g3.t(), x).view(3, e, -1).sum(0).to(w.dtype)
        return dx, dw


def gate_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 logits [T, E] = x [T, D] @ w [E, D]^T for bfloat16 x and w (`applies`), differentiable."""
    if not applies(x, w):
        raise ValueError(f"gate_matmul takes bfloat16 2-D x and w on one CUDA device; got x {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}, w {w.dtype} {tuple(w.shape)} on {w.device}")
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return _GateMatmul.apply(x, w)
    return _mm32(x, w.t())
