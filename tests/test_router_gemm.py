"""The router's bfloat16 gate matmul (`ragdot.moe.router_gemm`) against a float64 reference: the exact three-part
split of the cotangent, logits and both gradients at float32 accuracy, where it applies, bad input, and on the GPU
the Triton split's bits, determinism, the layer's router and torch.compile.

On the CPU the matmuls run on upcast operands (the same exact products) and the split as torch ops; the `gpu`
tests run the CUDA kernels.
"""

from __future__ import annotations

import pytest
import torch

from ragdot.moe import router as router_mod
from ragdot.moe import router_gemm
from ragdot.moe.router import gate_logits

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _operands(t: int, d: int, e: int, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
    w = (torch.randn(e, d, generator=gen) / d**0.5).to(device, torch.bfloat16).requires_grad_(True)
    g = torch.randn(t, e, generator=gen).to(device)  # float32 cotangent of the logits
    return x, w, g


def _reference(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor):
    """float64 logits, dx, dw of the same operands."""
    x64, w64, g64 = x.detach().double(), w.detach().double(), g.double()
    return x64 @ w64.t(), g64 @ w64, g64.t() @ x64


def _assert_float32_accurate(got: torch.Tensor, ref: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """|got - ref| within the float32 summation bound of a @ b (k products: k * 2^-24 * |a| @ |b|), plus one
    rounding to got's own dtype."""
    bound = (a.abs() @ b.abs()) * (a.shape[1] * 2.0**-24) + ref.abs() * torch.finfo(got.dtype).eps / 2
    assert ((got.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize("scale", [1.0, 1e-30, 1e20])
def test_split3_parts_sum_to_the_cotangent(scale: float) -> None:
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(33, 20, generator=gen) * scale
    g[0, :4] = torch.tensor([0.0, -0.0, 1.0, -3.0])
    parts = router_gemm.split3(g)
    assert parts.dtype == torch.bfloat16 and parts.shape == (33, 60)
    total = parts[:, :20].double() + parts[:, 20:40].double() + parts[:, 40:].double()
    assert ((total - g.double()).abs() <= g.double().abs() * 2.0**-23 + 1e-300).all()
    assert torch.equal(parts[:, :20], g.to(torch.bfloat16))  # hi is g rounded to nearest


def test_gate_matmul_values_and_gradients_match_float64() -> None:
    """The autograd Function itself (on the CPU its matmuls take upcast copies: the same exact products)."""
    x, w, g = _operands(70, 96, 12, "cpu")
    logits = router_gemm._GateMatmul.apply(x, w)
    dx, dw = torch.autograd.grad(logits, (x, w), g)
    ref_logits, ref_dx, ref_dw = _reference(x, w, g)
    assert logits.dtype == torch.float32 and dx.dtype == dw.dtype == torch.bfloat16
    _assert_float32_accurate(logits, ref_logits, x.detach().double(), w.detach().double().t())
    _assert_float32_accurate(dx, ref_dx, g.double(), w.detach().double())
    _assert_float32_accurate(dw, ref_dw, g.double().t(), x.detach().double())
    (only_w,) = torch.autograd.grad(router_gemm._GateMatmul.apply(x.detach(), w), w, g)
    assert torch.equal(only_w, dw)
    # before the rounding to bfloat16: the three parts carry g to float32 accuracy (hi alone would be 2^-9 off)
    w64 = w.detach().double()
    pre = router_gemm._mm32(router_gemm.split3(g), w.detach().repeat(3, 1))
    _assert_float32_accurate(pre, ref_dx, g.double(), w64)
    hi_only = router_gemm._mm32(g.to(torch.bfloat16), w.detach())
    with pytest.raises(AssertionError):
        _assert_float32_accurate(hi_only, ref_dx, g.double(), w64)


def test_compiled_backward_keeps_the_three_parts() -> None:
    """Under inductor the split is an opaque op: written as casts inside a fused kernel, the round trip through
    bfloat16 would be folded away and leave the cotangent's bfloat16 rounding alone (2^-9 relative)."""
    x, w, g = _operands(40, 64, 8, "cpu", seed=5)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: router_gemm._GateMatmul.apply(a, b), fullgraph=True)
    logits = compiled(x, w)
    dx, dw = torch.autograd.grad(logits, (x, w), g)
    ref_logits, ref_dx, ref_dw = _reference(x, w, g)
    _assert_float32_accurate(logits, ref_logits, x.detach().double(), w.detach().double().t())
    _assert_float32_accurate(dx, ref_dx, g.double(), w.detach().double())
    _assert_float32_accurate(dw, ref_dw, g.double().t(), x.detach().double())
    eager = torch.autograd.grad(router_gemm._GateMatmul.apply(x, w), (x, w), g)
    assert torch.equal(dx, eager[0])


def test_double_backward_goes_through_differentiable_products() -> None:
    """With create_graph the backward is the float32 matmuls of upcast operands (differentiable), so a second
    derivative through the gate is that of the plain ops, never a silent zero."""
    x, w, g = _operands(12, 16, 4, "cpu", seed=7)

    def second(fn):
        (dx,) = torch.autograd.grad(fn(x, w), x, g, create_graph=True)
        return torch.autograd.grad(dx.float().square().sum(), w)[0]

    got = second(router_gemm._GateMatmul.apply)
    want = second(lambda a, b: torch.nn.functional.linear(a.float(), b.float()))
    assert got.abs().sum() > 0 and torch.equal(got, want)


def test_applies_only_to_bfloat16_on_cuda() -> None:
    x, w, _ = _operands(8, 16, 4, "cpu")
    assert not router_gemm.applies(x, w)  # not CUDA
    with pytest.raises(ValueError, match="x .* w"):
        router_gemm.gate_matmul(x, w)
    assert torch.equal(gate_logits(x, w), torch.nn.functional.linear(x.float(), w.float()))  # the plain ops


@gpu
@needs_cuda
def test_gpu_split_kernel_gives_the_torch_bits_and_gradients_are_float32_accurate() -> None:
    x, w, g = _operands(1000, 256, 64, "cuda")
    g[3, 5] = 0.0
    g[7] *= 1e-25
    assert torch.equal(router_gemm.split3(g), router_gemm._split3_ops(g))  # the Triton launch, the torch ops' bits
    assert router_gemm.applies(x, w)
    logits = gate_logits(x, w)
    assert type(logits.grad_fn).__name__.startswith("_GateMatmul")
    dx, dw = torch.autograd.grad(logits, (x, w), g)
    ref_logits, ref_dx, ref_dw = _reference(x, w, g)
    _assert_float32_accurate(logits, ref_logits, x.detach().double(), w.detach().double().t())
    _assert_float32_accurate(dx, ref_dx, g.double(), w.detach().double())
    _assert_float32_accurate(dw, ref_dw, g.double().t(), x.detach().double())
    again = torch.autograd.grad(gate_logits(x, w), (x, w), g)
    assert torch.equal(again[0], dx) and torch.equal(again[1], dw)  # bitwise repeats
    with torch.no_grad():
        assert torch.equal(gate_logits(x, w), logits.detach())


@gpu
@needs_cuda
def test_gpu_gate_compiles_and_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, g = _operands(300, 128, 32, "cuda", seed=3)
    eager = gate_logits(x, w)
    grads = torch.autograd.grad(eager, (x, w), g)
    compiled = torch.compile(gate_logits, fullgraph=True)
    out = compiled(x, w)
    cgrads = torch.autograd.grad(out, (x, w), g)
    torch.testing.assert_close(out, eager, rtol=1e-6, atol=1e-6)
    for a, b in zip(cgrads, grads):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)  # bfloat16 results: one rounding apart at most
    monkeypatch.setattr(router_mod, "fast_gate", False)  # the float32 path: the same values within its rounding
    slow = gate_logits(x, w)
    torch.testing.assert_close(slow, eager, rtol=1e-5, atol=1e-5)
