"""ragdot under torch.autocast: ragged products cast their operands as a matmul does; ragdot's own arithmetic
(backends' accumulation, the router's float32 logits, backwards called inside the region) is not turned 16-bit."""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import GENERAL_BACKENDS, dtypes_for, nerr
from ragdot import amp
from ragdot.moe import MoELayer
from ragdot.moe.router import Router

FWD = ragdot.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (1,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=(0,))
WGRAD = ragdot.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=())


def _low(backend: str, device: torch.device) -> torch.dtype:
    """The 16-bit dtype the backend computes on this device (the Triton interpreter: float16 only)."""
    return next(dt for dt in dtypes_for(backend, device) if dt != torch.float32)


def _leaves(device, gen_seed=0, m=40, k=24, n=16, g=4):
    gen = torch.Generator().manual_seed(gen_seed)
    x = torch.randn(m, k, generator=gen).to(device).requires_grad_()
    w = torch.randn(g, k, n, generator=gen).to(device).requires_grad_()
    sizes = torch.tensor([9, 0, 17, 11], dtype=torch.int32, device=device)  # 37 < m: a tail
    return x, w, sizes


@pytest.mark.parametrize("backend", GENERAL_BACKENDS)
@pytest.mark.parametrize("problem", ["ragged_m", "ragged_k"])
def test_products_in_an_autocast_region_are_the_products_of_the_casts(backend, problem, device):
    """The product is the bits of the call on the 16-bit casts; the float32 leaves are master operands: their
    gradients are float32 products of the 16-bit operands and cotangent (float32-accurate against float64), not
    16-bit gradients cast up (as autograd's cast node would give)."""
    low = _low(backend, device)
    x, w, sizes = _leaves(device)
    y = torch.randn(40, 16, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
    rhs, dn = (w, FWD) if problem == "ragged_m" else (y, WGRAD)
    seen = []
    with torch.autocast(device.type, dtype=low):
        out = ragdot.ragged_dot_general(x, rhs, sizes, dn, backend=backend)
        out.register_hook(seen.append)
        out.float().square().sum().backward()  # a backward inside the region, as many training loops do
    assert out.dtype == low
    x16, r16 = x.detach().to(low), rhs.detach().to(low)
    assert torch.equal(out, ragdot.ragged_dot_general(x16, r16, sizes, dn, backend=backend))
    assert x.grad.dtype == torch.float32 and rhs.grad.dtype == torch.float32  # the leaves' own dtype
    x64, r64 = x16.double().requires_grad_(), r16.double().requires_grad_()
    ragdot.ragged_dot_general(x64, r64, sizes, dn, backend="reference").backward(seen[0].double())
    for got, ref in ((x.grad, x64.grad), (rhs.grad, r64.grad)):
        assert nerr(got, ref) <= 1e-6  # a 16-bit gradient cast up would be about 1e-3 off
        assert not torch.equal(got, got.to(low).float())
    if problem == "ragged_m":
        assert torch.equal(x.grad[37:], torch.zeros_like(x.grad[37:]))  # rows past the groups: zero
        assert torch.equal(w.grad[1], torch.zeros_like(w.grad[1]))  # the empty group: exact zeros


def test_master_operands_only_where_the_cast_path_would_record_a_float32_leaf(device):
    """16-bit operands, grad mode off and float64 operands keep the region's ordinary path (the cast node or
    none); a float32 operand that needs no gradient is cast without one."""
    low = _low("reference", device)
    x, w, sizes = _leaves(device)
    with torch.autocast(device.type, dtype=low):
        out = ragdot.ragged_dot(x.detach().to(low).requires_grad_(), w.detach().to(low), sizes)
        assert type(out.grad_fn).__name__ != "_MasterFunctionBackward"
        assert type(ragdot.ragged_dot(x, w, sizes).grad_fn).__name__ == "_MasterFunctionBackward"
        with torch.no_grad():
            assert ragdot.ragged_dot(x, w, sizes).grad_fn is None
        out = ragdot.ragged_dot(x.detach(), w, sizes)  # x float32 without grad: cast, no gradient for it
        out.float().sum().backward()
        assert w.grad.dtype == torch.float32 and x.grad is None


def test_preferred_element_type_float64_and_disabled_regions(device):
    x, w, sizes = _leaves(device)
    low = _low("reference", device)
    with torch.autocast(device.type, dtype=low):
        wide = ragdot.ragged_dot(x, w, sizes, preferred_element_type=torch.float32, backend="reference")
        exact = ragdot.ragged_dot(x.double(), w.double(), sizes, backend="reference")  # float64 is never cast
        with torch.autocast(device.type, enabled=False):
            plain = ragdot.ragged_dot(x, w, sizes, backend="reference")
    assert wide.dtype == torch.float32 and exact.dtype == torch.float64 and plain.dtype == torch.float32
    ref = ragdot.ragged_dot(x.detach().to(low), w.detach().to(low), sizes, preferred_element_type=torch.float32,
                            backend="reference")
    assert torch.equal(wide, ref)
    assert torch.equal(plain, ragdot.ragged_dot(x, w, sizes, backend="reference"))
    assert not amp.active()


def test_a_region_on_another_device_type_changes_nothing(device):
    if device.type != "cuda":
        pytest.skip("CUDA tensors in a CPU region")
    x, w, sizes = _leaves(device)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ragdot.ragged_dot(x, w, sizes)
    assert out.dtype == torch.float32 and torch.equal(out, ragdot.ragged_dot(x, w, sizes))


def test_compiled_call_in_an_autocast_region(device):
    low = _low("reference", device)
    x, w, sizes = _leaves(device)
    fn = torch.compile(lambda a, b, s: ragdot.ragged_dot(a, b, s), fullgraph=True)
    with torch.autocast(device.type, dtype=low):
        out = fn(x, w, sizes)
    out.float().sum().backward()
    x16, w16 = x.detach().to(low).requires_grad_(), w.detach().to(low).requires_grad_()
    ref = ragdot.ragged_dot(x16, w16, sizes)
    ref.float().sum().backward()
    assert out.dtype == low and torch.equal(out, ref)
    assert torch.equal(x.grad, x16.grad.float()) and torch.equal(w.grad, w16.grad.float())


def test_router_logits_stay_float32_under_autocast(device):
    torch.manual_seed(0)
    router = Router(32, 8, 2, device=device)
    x = torch.randn(20, 32, device=device)
    ref = router(x)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = router(x)
    assert out.logits.dtype == torch.float32 and torch.equal(out.logits, ref.logits)
    assert torch.equal(out.experts, ref.experts)


@pytest.mark.parametrize("path", ["sparse", "dense_dropless", "dense_drop"])
def test_moe_layer_with_float32_weights_computes_its_experts_in_the_autocast_dtype(path, device):
    low = _low("reference", device)
    torch.manual_seed(0)
    layer = MoELayer(32, 24, 8, 2, path=path, device=device, num_shared_experts=1, shared_hidden_dim=16)
    twin = MoELayer(32, 24, 8, 2, path=path, device=device, num_shared_experts=1, shared_hidden_dim=16)
    twin.load_state_dict(layer.state_dict())
    with torch.no_grad():  # the twin holds its experts' weights in `low`
        for p in (twin.w_gate_up, twin.w_down):
            p.data = p.data.to(low)
    x = torch.randn(2, 10, 32, device=device)
    with torch.autocast(device.type, dtype=low):
        y = layer(x)
        y16 = twin(x)
        loss = y.float().square().sum() + layer.aux_loss + layer.z_loss
        loss16 = y16.float().square().sum() + twin.aux_loss + twin.z_loss
    assert y.dtype == low
    assert torch.equal(y, y16)
    loss.backward()
    loss16.backward()
    assert layer.w_gate_up.grad.dtype == torch.float32 and layer.router.weight.grad.dtype == torch.float32
    assert torch.equal(layer.w_gate_up.grad, twin.w_gate_up.grad.float())
    assert torch.equal(layer.w_down.grad, twin.w_down.grad.float())
    assert torch.equal(layer.router.weight.grad, twin.router.weight.grad)
    with torch.autocast(device.type, dtype=low):
        assert layer(x.to(low)).dtype == low  # x itself in `low` with float32 weights: accepted in the region


def test_fused_block_takes_float32_parameters_as_master_weights(device):
    """The layer's fused block in a region with float32 parameters: the bits of a twin holding 16-bit expert
    weights for the output and the gradients of x and the router; the expert weights' gradients in float32 from
    the GEMMs, within a 16-bit rounding of the twin's."""
    from ragdot.moe import routing_kernels

    if not routing_kernels.HAS_TRITON:
        pytest.skip("the fused block needs triton")
    low = torch.bfloat16 if device.type == "cuda" else torch.float16  # the interpreter: float16 dots only
    torch.manual_seed(0)
    layer = MoELayer(32, 24, 8, 2, path="sparse", device=device, fused=True)
    twin = MoELayer(32, 24, 8, 2, path="sparse", device=device, fused=True)
    twin.load_state_dict(layer.state_dict())
    with torch.no_grad():
        for p in (twin.w_gate_up, twin.w_down):
            p.data = p.data.to(low)
    x = torch.randn(2, 10, 32, device=device, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with torch.autocast(device.type, dtype=low):
        y, y16 = layer(x), twin(x2)
        loss = y.float().square().sum() + layer.aux_loss
        loss16 = y16.float().square().sum() + twin.aux_loss
    assert y.dtype == low and torch.equal(y, y16)
    loss.backward()
    loss16.backward()
    assert torch.equal(x.grad, x2.grad) and torch.equal(layer.router.weight.grad, twin.router.weight.grad)
    for p, q in ((layer.w_gate_up, twin.w_gate_up), (layer.w_down, twin.w_down)):
        assert p.grad.dtype == torch.float32 and q.grad.dtype == low
        assert (p.grad - q.grad.float()).norm() <= 1e-2 * q.grad.float().norm()
        assert not torch.equal(p.grad, p.grad.to(low).float())  # float32 from the GEMM, not a cast


def test_moe_layer_outside_autocast_still_refuses_mixed_dtypes(device):
    layer = MoELayer(16, 8, 4, 2, device=device)
    with pytest.raises(TypeError, match="dtype"):
        layer(torch.randn(3, 16, device=device, dtype=torch.bfloat16))


def test_compiled_moe_layer_in_an_autocast_region(device):
    low = _low("reference", device)
    torch.manual_seed(0)
    layer = MoELayer(32, 24, 8, 2, path="sparse", device=device)
    x = torch.randn(20, 32, device=device)
    with torch.autocast(device.type, dtype=low):
        ref = layer(x)
        out = torch.compile(layer, fullgraph=True)(x)
    assert out.dtype == low and ref.dtype == low
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.05, atol=0.05)
    out.float().sum().backward()
    assert layer.w_gate_up.grad.dtype == torch.float32 and layer.router.weight.grad.dtype == torch.float32


def test_master_operand_calls_raise_the_same_clear_errors(device):
    """The master path checks its arguments as every call does: invalid sizes with validate, a bad backend, float
    group sizes, each with the message of the call outside the region."""
    low = _low("reference", device)
    x, w, _ = _leaves(device)
    cases = [
        (dict(group_sizes=torch.tensor([30, 20, 0, 0], device=device), validate=True), ValueError),
        (dict(group_sizes=torch.tensor([-1, 3, 0, 0], device=device), validate=True), ValueError),
        (dict(group_sizes=torch.tensor([3, 3, 0, 0], device=device), backend="nope"), ValueError),
        (dict(group_sizes=torch.tensor([3.0, 3.0, 0.0, 0.0], device=device)), TypeError),
    ]
    for kwargs, error in cases:
        kwargs = dict(kwargs)
        sizes = kwargs.pop("group_sizes")
        with pytest.raises(error) as outside:
            ragdot.ragged_dot(x, w, sizes, **kwargs)
        with torch.autocast(device.type, dtype=low), pytest.raises(error) as inside:
            ragdot.ragged_dot(x, w, sizes, **kwargs)
        assert str(inside.value) == str(outside.value)
