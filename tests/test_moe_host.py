"""The eager sparse MoE path's host-time cuts change no result: outputs, losses and gradients are bitwise those of
the custom-op path (the path torch.compile traces, and the eager path before the cuts), and calls that need no
gradient give the same bits too."""

from __future__ import annotations

import importlib

import pytest
import torch

from helpers import benchmark_script
from ragdot.moe import MoELayer
from ragdot.moe import routing_kernels as rk

layer_mod = importlib.import_module("ragdot.moe.layer")
permute_mod = importlib.import_module("ragdot.moe.permute")  # the module: ragdot.moe.permute is a function
IMPLS = ["torch"] + (["triton"] if rk.HAS_TRITON else [])


def _layer(dtype: torch.dtype, impl: str, experts: int = 8, top_k: int = 2) -> MoELayer:
    torch.manual_seed(0)
    return MoELayer(32, 16, experts, top_k, backend="torch", routing_impl=impl, dtype=dtype)


def _step(layer: MoELayer, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    layer.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_()
    y = layer(xg)
    (y * dy).sum().add(layer.aux_loss + layer.z_loss).backward()
    out = {"y": y.detach(), "aux": layer.aux_loss.detach(), "z": layer.z_loss.detach(), "dx": xg.grad}
    out.update({f"d{name}": p.grad for name, p in layer.named_parameters()})
    return out


def _inputs(dtype: torch.dtype, tokens: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(tokens, 32, generator=gen).to(dtype), torch.randn(tokens, 32, generator=gen).to(dtype)


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] is not None and b[name] is not None, name
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_path_is_bitwise_the_custom_op_path(monkeypatch, impl, dtype):
    layer = _layer(dtype, impl)
    x, dy = _inputs(dtype)
    eager = _step(layer, x, dy)
    monkeypatch.setattr(permute_mod, "_traced", lambda: True)  # force the custom ops, as torch.compile sees them
    custom = _step(layer, x, dy)
    _assert_bitwise(eager, custom)


@pytest.mark.parametrize("impl", IMPLS)
def test_repeated_eager_steps_are_bitwise_equal(impl):
    """Per-signature caches (plans, bound launches) give the first call's bits on later calls."""
    layer = _layer(torch.float32, impl, experts=16, top_k=4)
    x, dy = _inputs(torch.float32, tokens=40)
    first = _step(layer, x, dy)
    for _ in range(2):
        _assert_bitwise(first, _step(layer, x, dy))


@pytest.mark.parametrize("impl", IMPLS)
def test_no_grad_forward_is_bitwise_the_grad_forward(impl):
    layer = _layer(torch.float32, impl)
    x, dy = _inputs(torch.float32)
    with_grad = _step(layer, x, dy)
    with torch.no_grad():
        y = layer(x)
    assert torch.equal(y, with_grad["y"])


def test_permute_and_unpermute_direct_match_custom_ops(monkeypatch):
    x, _ = _inputs(torch.float32, tokens=10)
    experts = torch.randint(0, 6, (10, 3), generator=torch.Generator().manual_seed(3))
    weights = torch.rand(10, 3, generator=torch.Generator().manual_seed(4))
    rows, routing = permute_mod.permute(x, experts, 6, impl="torch")
    y = permute_mod.unpermute(rows, routing, weights)
    monkeypatch.setattr(permute_mod, "_traced", lambda: True)
    rows_c, routing_c = permute_mod.permute(x, experts, 6, impl="torch")
    y_c = permute_mod.unpermute(rows_c, routing_c, weights)
    assert torch.equal(rows, rows_c) and torch.equal(y, y_c)
    assert torch.equal(routing.group_sizes, routing_c.group_sizes) and torch.equal(routing.slots, routing_c.slots)


def test_double_backward_through_the_eager_combine():
    """create_graph=True: the permute's backward (an unweighted combine) is itself differentiable."""
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    experts = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2], [1, 1], [2, 2]])
    rows, _ = permute_mod.permute(x, experts, 3, impl="torch")
    (g,) = torch.autograd.grad(rows.square().sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    assert torch.allclose(gg, torch.full_like(x, 4.0))  # d/dx of sum_j 2*x over the 2 choices


def _previous_step(layer: MoELayer, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sparse forward as written before the host-time cuts: public permute/unpermute (custom ops), and the
    balance loss's divisor from counts.sum()."""
    import ragdot
    from ragdot.moe.layer import swiglu
    from ragdot.moe.router import router_z_loss
    from ragdot.moe.router_losses import router_losses

    layer.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_()
    r = layer.router(xg)
    rows, routing = permute_mod.permute(xg, r.experts, layer.num_experts, impl=layer.routing_impl)
    sizes = routing.group_sizes
    h = ragdot.ragged_dot(rows, layer.w_gate_up, sizes, backend=layer.backend)
    out = ragdot.ragged_dot(swiglu(h), layer.w_down, sizes, backend=layer.backend)
    y = torch.ops.ragdot.moe_combine(out, routing.slots, r.weights, routing.top_k, routing.impl)
    if r.logits.is_cuda:  # the losses' kernels, as the layer takes them on CUDA (float32 rounding apart the ops)
        aux, z = router_losses(r.logits, r.probs, sizes, r.experts.numel(), layer.aux_loss_coef, layer.z_loss_coef)
    else:
        fraction = sizes.float() / sizes.sum().clamp_min(1).float()
        aux = layer.aux_loss_coef * (layer.num_experts * (fraction * r.probs.mean(dim=0)).sum())
        z = layer.z_loss_coef * router_z_loss(r.logits)
    (y * dy).sum().add(aux + z).backward()
    result = {"y": y.detach(), "aux": aux.detach(), "z": z.detach(), "dx": xg.grad}
    result.update({f"d{name}": p.grad for name, p in layer.named_parameters()})
    return result


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lean_swiglu", [False, True])
def test_layer_is_bitwise_the_previous_code_path(monkeypatch, impl, dtype, lean_swiglu):
    if lean_swiglu:  # the lean SwiGLU backward at any size
        monkeypatch.setattr(layer_mod, "_LEAN_SWIGLU_BYTES", 0)
    layer = _layer(dtype, impl, experts=16, top_k=4)
    x, dy = _inputs(dtype, tokens=40)
    now = _step(layer, x, dy)
    monkeypatch.setattr(permute_mod, "_traced", lambda: True)  # the custom ops throughout, as before
    _assert_bitwise(now, _previous_step(layer, x, dy))


def test_balance_loss_with_known_total_is_bitwise_the_counted_one():
    from ragdot.moe.router import load_balancing_loss

    probs = torch.softmax(torch.randn(37, 12, generator=torch.Generator().manual_seed(5)), dim=-1)
    counts = torch.randint(0, 40, (12,), dtype=torch.int32, generator=torch.Generator().manual_seed(6))
    total = int(counts.sum())
    assert torch.equal(load_balancing_loss(probs, counts, total), load_balancing_loss(probs, counts))
    zeros = torch.zeros(12, dtype=torch.int32)
    assert torch.equal(load_balancing_loss(probs, zeros, 0), load_balancing_loss(probs, zeros))


def test_host_profile_benchmark_quick(tmp_path, capsys):
    bench = benchmark_script("moe_host_profile")
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    (rows,) = tmp_path.glob("moe-host-*.json")
    assert list(tmp_path.glob("moe-host-cprofile-*.txt"))
    text = capsys.readouterr().out
    assert "fwdbwd_ops=" in text and "cProfile" in text and rows.stat().st_size > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_swiglu_backward_is_bitwise_autograds(monkeypatch, dtype):
    from ragdot.moe.layer import _swiglu_rows, swiglu

    monkeypatch.setattr(layer_mod, "_LEAN_SWIGLU_BYTES", 0)
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(33, 2 * 24, generator=gen).to(dtype)
    grad = torch.randn(33, 24, generator=gen).to(dtype)
    grads = []
    for fn in (swiglu, _swiglu_rows):
        hg = h.clone().requires_grad_()
        y = fn(hg)
        assert (fn is swiglu) != ("_SwiGLU" in type(y.grad_fn).__name__)  # the lean node where asked
        y.backward(grad)
        grads.append((y.detach(), hg.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_swiglu_double_backward_is_autograds(monkeypatch):
    from ragdot.moe.layer import _swiglu_rows, swiglu

    monkeypatch.setattr(layer_mod, "_LEAN_SWIGLU_BYTES", 0)
    h = torch.randn(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    out = []
    for fn in (swiglu, _swiglu_rows):
        hg = h.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(hg).sum(), hg, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), hg)
        out.append((g.detach(), gg))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def _gpu_layer(backend: str, lean: bool, monkeypatch) -> MoELayer:
    if lean:
        monkeypatch.setattr(layer_mod, "_LEAN_SWIGLU_BYTES", 0)
    torch.manual_seed(0)
    return MoELayer(64, 32, 8, 2, dtype=torch.bfloat16, device="cuda", backend=backend)


@pytest.mark.gpu
@pytest.mark.parametrize("lean", [False, True])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_sparse_layer_step_has_no_host_sync(monkeypatch, backend, lean):
    """After a warm-up step, the eager sparse layer's forward and backward never synchronise with the host."""
    layer = _gpu_layer(backend, lean, monkeypatch)
    x = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    layer(x).backward(dy)  # compiles, fills caches and bound launches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = layer(x)
        (y * dy).sum().add(layer.aux_loss + layer.z_loss).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert x.grad is not None and not y.isnan().any()


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("lean", [False, True])
def test_sparse_layer_step_replays_bitwise_in_a_cuda_graph(monkeypatch, lean, fused):
    """Eager and replayed steps of one compute path give the same bits. The path is fixed: by default
    (``fused=None``) a layer this small runs the unfused path eagerly and the fused block under capture, where
    host time is not paid (`ragdot.moe.fused.preferred`), and the two paths round differently."""
    from ragdot.measure.timing import capture_graph, warm_off_stream

    layer = _gpu_layer("auto", lean, monkeypatch)
    layer.fused = fused
    x = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cot = torch.randn_like(x)
    out: list[torch.Tensor] = []

    def step() -> None:
        y = layer(x)
        loss = (y * cot).sum() + layer.aux_loss + layer.z_loss
        out[:] = [y, *torch.autograd.grad(loss, (x, *layer.parameters()))]

    warm_off_stream(step, torch.device("cuda"))
    eager = [t.clone() for t in out]
    replay = capture_graph(step)
    replay()
    torch.cuda.synchronize()
    for a, b in zip(out, eager, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("lean", [False, True])
def test_gpu_layer_is_bitwise_the_previous_code_path(monkeypatch, lean):
    """On the GPU (Triton routing, backend auto, bound launches): the same bits as the custom-op path."""
    layer = _gpu_layer("auto", lean, monkeypatch)
    x, dy = (t.cuda() for t in _inputs(torch.bfloat16, tokens=96))
    x, dy = torch.cat([x, x], 1), torch.cat([dy, dy], 1)  # width 64
    now = _step(layer, x, dy)
    again = _step(layer, x, dy)
    monkeypatch.setattr(permute_mod, "_traced", lambda: True)
    _assert_bitwise(now, _previous_step(layer, x, dy))
    _assert_bitwise(now, again)


def _one_hot_sort(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch routing's former counting sort (dense one-hot prefix sums): (sizes int32, slots int32)."""
    flat = experts.reshape(-1).long().clamp(0, num_experts - 1)
    onehot = (torch.arange(num_experts)[:, None] == flat[None, :]).to(torch.int32)
    inclusive = onehot.cumsum(1, dtype=torch.int32)
    sizes = inclusive[:, -1].contiguous() if flat.numel() else onehot.sum(1, dtype=torch.int32)
    rank = inclusive.gather(0, flat[None, :]).squeeze(0) - 1
    starts = sizes.cumsum(0, dtype=torch.int32) - sizes
    return sizes, (starts[flat] + rank).to(torch.int32)


@pytest.mark.parametrize("tokens,top_k,experts", [(0, 2, 4), (1, 1, 1), (37, 3, 5), (200, 8, 64), (64, 4, 300)])
def test_torch_sort_matches_the_one_hot_counting_sort(tokens, top_k, experts):
    gen = torch.Generator().manual_seed(tokens + experts)
    ids = torch.randint(-2, experts + 2, (tokens, top_k), generator=gen)  # out-of-range ids are clamped
    x = torch.randn(tokens, 6, generator=gen)
    rows, sizes, slots = rk.sort_and_dispatch(x, ids, experts, "torch")
    want_sizes, want_slots = _one_hot_sort(ids, experts)
    assert sizes.dtype == slots.dtype == torch.int32 and sizes.is_contiguous()
    assert torch.equal(sizes, want_sizes) and torch.equal(slots, want_slots)
    want_rows = torch.empty_like(rows).index_copy_(0, want_slots.long(), x.repeat_interleave(top_k, 0))
    assert torch.equal(rows, want_rows)
    order_sizes, order = rk.sort_order(ids, experts, "torch")
    assert torch.equal(order_sizes, want_sizes) and order.dtype == torch.int32
    assert torch.equal(order[want_slots.long()], torch.arange(tokens * top_k, dtype=torch.int32))


def test_the_permute_backward_makes_no_zero_gradients_for_its_integer_outputs():
    """The eager permute's backward gets None for group sizes and slots (no materialised zero tensors: two
    allocations and fills per layer and step on the device) and is the unweighted combine alone."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
    experts = torch.randint(0, 6, (10, 3), generator=torch.Generator().manual_seed(3))
    rows, _ = permute_mod.permute(x, experts, 6, impl="torch")
    grad = torch.randn_like(rows)
    with Ops() as ops:
        rows.backward(grad)
    assert ops.seen.count("zeros") + ops.seen.count("zeros_like") + ops.seen.count("fill_") <= 1  # the combine's sum
    want = torch.zeros_like(x).index_add_(0, torch.arange(10).repeat_interleave(3)[
        torch.argsort(experts.reshape(-1), stable=True)], grad)
    assert torch.allclose(x.grad, want)

