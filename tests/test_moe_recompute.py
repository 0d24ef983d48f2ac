"""MoELayer(recompute=True): the rows and the SwiGLU output are remade in the backward, with the same bits."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from helpers import TOL, nerr
from ragdot.moe import MoELayer
from ragdot.moe import layer as layer_mod
from ragdot.moe import routing_kernels as rk
from ragdot.moe.recompute import remade

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV.type == "cuda" else [])
ROUTING_IMPLS = ["torch"] + (["triton"] if rk.HAS_TRITON else [])


def _step(layer: MoELayer, x: torch.Tensor, dy: torch.Tensor, recompute: bool) -> list[torch.Tensor]:
    layer.recompute = recompute
    layer.zero_grad(set_to_none=True)
    xg = x.detach().clone().requires_grad_(True)
    y = layer(xg)
    (y * dy).sum().backward()
    return [y.detach(), xg.grad, *(p.grad for p in layer.parameters())]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("top_k", [1, 2, 5])
@pytest.mark.parametrize("impl", ROUTING_IMPLS)
def test_recompute_gives_the_same_bits(dtype, top_k, impl):
    torch.manual_seed(0)
    # 6 experts, 7 tokens of top-5 or 3 of top-1: some experts empty, some with one row
    layer = MoELayer(16, 12, 6, top_k, dtype=dtype, device=DEV, backend="torch" if DEV.type == "cpu" else None,
                     routing_impl=impl)
    tokens = 3 if top_k == 1 else 7
    x = torch.randn(tokens, 16, device=DEV).to(dtype)
    dy = torch.randn(tokens, 16, device=DEV).to(dtype)
    kept, again = _step(layer, x, dy, False), _step(layer, x, dy, True)
    assert len(kept) == len(again) == 5  # y, and the gradients of x, the router and both expert weights
    for a, b in zip(kept, again):
        assert a is not None and b is not None and torch.equal(a, b)


@pytest.mark.parametrize("lean", [True, False])
def test_recompute_gives_the_same_bits_through_either_swiglu(lean, monkeypatch):
    """Large rows take the lean SwiGLU node (saves h only), small ones autograd's own ops: both recompute alike."""
    monkeypatch.setattr(layer_mod, "_LEAN_SWIGLU_BYTES", 0 if lean else 1 << 62)
    torch.manual_seed(0)
    layer = MoELayer(16, 12, 6, 2, dtype=torch.float32, device=DEV, backend="torch" if DEV.type == "cpu" else None)
    x, dy = torch.randn(11, 16, device=DEV), torch.randn(11, 16, device=DEV)
    for a, b in zip(_step(layer, x, dy, False), _step(layer, x, dy, True)):
        assert torch.equal(a, b)


def test_recompute_frees_the_rows_and_the_swiglu_output_until_the_backward(monkeypatch):
    made: list[weakref.ref] = []
    real_permute, real_swiglu = layer_mod.permute_rows, layer_mod._swiglu_rows

    def permute(*args):
        rows, sizes, slots = real_permute(*args)
        made.append(weakref.ref(rows))
        return rows, sizes, slots

    def swiglu_rows(h):
        a = real_swiglu(h)
        made.append(weakref.ref(a))
        return a

    monkeypatch.setattr(layer_mod, "permute_rows", permute)
    monkeypatch.setattr(layer_mod, "_swiglu_rows", swiglu_rows)
    torch.manual_seed(0)
    layer = MoELayer(16, 12, 6, 2, dtype=torch.float32, device=DEV, backend="torch")
    x = torch.randn(9, 16, device=DEV, requires_grad=True)
    for recompute in (False, True):
        made.clear()
        layer.recompute = recompute
        y = layer(x)
        gc.collect()
        alive = [r() is not None for r in made]
        assert alive == [not recompute, not recompute]  # kept for the backward only without recompute
        y.sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
        x.grad = None


def test_recompute_is_skipped_without_grad_and_checked():
    layer = MoELayer(8, 4, 4, 2, dtype=torch.float32, device=DEV, backend="torch", recompute=True)
    x = torch.randn(5, 8, device=DEV)
    with torch.no_grad():
        plain = layer(x)
    layer.recompute = False
    assert torch.equal(plain, layer(x).detach())
    assert "recompute=False" in repr(layer)
    with pytest.raises(ValueError, match="recompute"):
        MoELayer(8, 4, 4, 2, recompute="yes")
    with pytest.raises(ValueError, match="recompute"):
        layer.recompute = 1


def test_remade_block_keeps_what_it_is_not_told_to_remake():
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3, requires_grad=True)
    made = []
    with remade() as keep:
        t = keep(x * 2, lambda: (made.append(1), x.detach() * 2)[1])
        y = (t @ w).sum()  # mm saves t (remade) and w (kept)
    y.backward()
    assert made == [1] and torch.allclose(w.grad, (x.detach() * 2).sum(0)[:, None].expand(3, 3))
    with remade(False) as keep:
        t = keep(x * 2, lambda: pytest.fail("a disabled block remakes nothing"))
        (t @ w).sum().backward()


def test_recompute_under_torch_compile_keeps_what_it_saves():
    """Under torch.compile the layer keeps its tensors as usual (AOTAutograd decides what to save): the same results
    up to float32 rounding (eager `auto` weighs host time and may run another backend than the compiled graph's)."""
    torch.manual_seed(0)
    layer = MoELayer(16, 12, 6, 2, dtype=torch.float32, device=DEV, recompute=True,
                     backend="torch" if DEV.type == "cpu" else None)
    x = torch.randn(9, 16, device=DEV, requires_grad=True)
    y = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    y.sum().backward()
    compiled = (y.detach(), x.grad.clone())
    x.grad = None
    y = layer(x)
    y.sum().backward()
    assert nerr(compiled[0], y.detach()) <= TOL[torch.float32] and nerr(compiled[1], x.grad) <= TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_recompute_holds_less_memory_between_forward_and_backward():
    """On CUDA the memory held for the backward drops by the rows [T*k, dim] and the SwiGLU output [T*k, hidden]."""
    from ragdot.bench.moe_layer import step_memory

    tokens, dim, hidden, experts, top_k = 2048, 256, 128, 8, 2
    torch.manual_seed(0)
    layer = MoELayer(dim, hidden, experts, top_k, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    saved = {}
    for recompute in (False, True):
        layer.recompute = recompute
        step_memory(layer, x, dy)  # warm-up: kernels compiled, caches filled
        layer.zero_grad(set_to_none=True)
        x.grad = None
        saved[recompute] = step_memory(layer, x, dy)["saved_mib"] * 2**20
        layer.zero_grad(set_to_none=True)
        x.grad = None
    freed = tokens * top_k * (dim + hidden) * 2  # bf16 rows and SwiGLU output
    assert saved[True] <= saved[False] - 0.9 * freed
