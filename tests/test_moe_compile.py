"""torch.compile of the sparse MoE layer: fake kernels of the routing ops agree with the real ones (shape,
dtype, strides), and the layer compiles with fullgraph=True on the default inductor backend."""

from __future__ import annotations

import pytest
import torch

from helpers import nerr
from ragdot.moe import MoELayer
from ragdot.moe import routing_kernels as rk
from ragdot.moe.permute import permute

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
IMPLS = ["torch"] + (["triton"] if rk.HAS_TRITON else [])


def _routing_inputs(tokens: int = 9, dim: int = 16, experts: int = 5, top_k: int = 2):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, dim, generator=gen).to(DEV).requires_grad_(True)
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(DEV)
    weights = torch.rand(tokens, top_k, generator=gen).to(DEV).requires_grad_(True)
    return x, chosen, weights, experts


@pytest.mark.parametrize("impl", IMPLS)
def test_routing_ops_pass_opcheck(impl):
    """opcheck compares each op's fake outputs with its real ones (sizes, strides, storage offset, dtype)."""
    x, chosen, weights, experts = _routing_inputs()
    ops = torch.ops.ragdot
    torch.library.opcheck(ops.moe_permute.default, (x, chosen, experts, impl))
    rows, routing = permute(x.detach(), chosen, experts, impl=impl)
    rows.requires_grad_(True)
    torch.library.opcheck(ops.moe_combine.default, (rows, routing.slots, weights, 2, impl))
    torch.library.opcheck(ops.moe_combine.default, (rows, routing.slots, None, 2, impl))
    grad = torch.randn(x.shape[0], x.shape[1], device=DEV)
    for need_w in (True, False):
        args = (grad, rows.detach(), routing.slots, weights.detach(), 2, need_w, impl)
        torch.library.opcheck(ops.moe_combine_backward.default, args)


@pytest.mark.parametrize("impl", IMPLS)
def test_permute_metadata_is_contiguous(impl):
    """The fake kernel declares contiguous group sizes and slots: the real op must return them so."""
    x, chosen, _, experts = _routing_inputs()
    _, routing = permute(x.detach(), chosen, experts, impl=impl)
    assert routing.group_sizes.is_contiguous() and routing.group_sizes.storage_offset() == 0
    assert routing.slots.is_contiguous() and routing.slots.storage_offset() == 0


def test_inductor_fullgraph_sparse_layer_matches_eager():
    """The default backend (inductor), fullgraph: forward and backward agree with eager."""
    torch.manual_seed(0)
    layer = MoELayer(16, 8, 4, 2, path="sparse", dtype=torch.float32, device=DEV)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 16, generator=gen).to(DEV)
    cot = torch.randn(2, 5, 16, generator=gen).to(DEV)

    def run(fn) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        y = fn(xg)
        ((y * cot).sum() + layer.aux_loss + layer.z_loss).backward()
        return y.detach(), {"x": xg.grad} | {n: p.grad for n, p in layer.named_parameters()}

    y_eager, g_eager = run(layer)
    torch._dynamo.reset()
    y, g = run(torch.compile(layer, fullgraph=True))
    assert nerr(y, y_eager) <= 1e-5
    for name, ref in g_eager.items():
        assert g[name] is not None and nerr(g[name], ref) <= 1e-5, name


@pytest.mark.parametrize("impl", IMPLS)
def test_compiled_inference_traces_routing_as_torch_ops_and_training_keeps_the_custom_ops(impl):
    """Grad mode off under torch.compile: permute and combine are plain torch ops in the graph (inductor
    generates them), with the eager results; grad mode on: the custom ops (ragdot's kernels, their backward)."""
    from torch._inductor.utils import run_and_get_code

    from ragdot.moe.permute import unpermute

    x, chosen, weights, experts = _routing_inputs(tokens=11)

    def route(x, chosen, weights):
        rows, routing = permute(x, chosen, experts, impl=impl)
        return unpermute(rows * 2.0, routing, weights), routing.group_sizes

    torch._dynamo.reset()
    compiled = torch.compile(route, fullgraph=True)
    with torch._inductor.config.patch(force_disable_caches=True):
        with torch.no_grad():
            (y, sizes), codes = run_and_get_code(compiled, x, chosen, weights)
            want_y, want_sizes = route(x, chosen, weights)
        code = "\n".join(codes)
        assert "moe_permute" not in code and "moe_combine" not in code
        assert torch.equal(sizes, want_sizes)
        torch.testing.assert_close(y, want_y)
        (y, _), codes = run_and_get_code(compiled, x, chosen, weights)
        assert "ragdot.moe_permute" in "\n".join(codes) and y.requires_grad


def test_exporting_is_true_under_export_only():
    """The layer returns y alone when torch.export traces it and keeps its losses otherwise: torch 2.11's dynamo
    folds torch.compiler.is_exporting() to True under torch.compile too, so ragdot reads export's own flag."""
    from ragdot.ops import exporting

    class Probe(torch.nn.Module):
        def forward(self, x):
            return x + (1.0 if exporting() else 0.0)

    x = torch.zeros(3)
    assert not exporting()
    torch._dynamo.reset()
    assert torch.equal(torch.compile(Probe(), fullgraph=True)(x), x)
    for strict in (False, True):
        program = torch.export.export(Probe(), (x,), strict=strict)
        assert torch.equal(program.module()(x), x + 1)


def test_compiled_layer_keeps_its_losses_and_counts():
    torch.manual_seed(0)
    layer = MoELayer(16, 8, 4, 2, path="sparse", dtype=torch.float32, device=DEV)
    x = torch.randn(10, 16, device=DEV)
    torch._dynamo.reset()
    torch.compile(layer, fullgraph=True)(x)
    compiled = (layer.aux_loss.detach().clone(), layer.z_loss.detach().clone(), layer.expert_counts.clone())
    layer(x)
    assert torch.equal(compiled[2], layer.expert_counts)
    assert nerr(compiled[0], layer.aux_loss.detach()) <= 1e-6 and nerr(compiled[1], layer.z_loss.detach()) <= 1e-6
