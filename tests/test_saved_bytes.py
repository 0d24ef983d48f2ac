"""What the experts paths keep for the backward (benchmarks/saved_bytes.py), against fixed bounds and baselines."""

from __future__ import annotations

import pytest
import torch

from helpers import benchmark_script, needs_fused_block

sb = benchmark_script("saved_bytes")

# Measured (float32, benchmarks/saved_bytes.py shapes: 64 tokens, dim 32, hidden 16, 8 experts, top-2): bytes of
# the storages the layer's forward allocated and autograd keeps for the backward.
SPARSE_NEW_BYTES = 72768  # peer_moe: 88352
SPARSE_LEAN_NEW_BYTES = SPARSE_NEW_BYTES - sb.TOKENS * sb.TOP_K * sb.HIDDEN * 4  # silu(gate) [T*k, H] not kept


def _transformers():
    return pytest.importorskip("transformers")


def _needs_triton():
    needs_fused_block()  # the saved bytes are counted on the CPU


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_ragdot_experts_save_no_more_than_grouped_mm(family):
    _transformers()
    base = sb.hf_experts_saved(family, "grouped_mm").total("new")
    ragdot = sb.hf_experts_saved(family, "ragdot").total("new")
    assert 0 < ragdot <= base, f"ragdot keeps {ragdot} B for the backward, grouped_mm {base} B"


def test_default_gate_keeps_only_the_pre_activation():
    _transformers()
    saved = sb.hf_experts_saved("qwen3_moe", "ragdot")
    base = sb.hf_experts_saved("qwen3_moe", "grouped_mm")
    rows = sb.TOKENS * sb.TOP_K
    assert not [e for e in saved.new() if e["shape"] == (rows, sb.HIDDEN) and "SiluBackward0" in e["nodes"]]
    assert base.total("new") - saved.total("new") >= rows * sb.HIDDEN * 4  # silu(gate) in float32


@pytest.mark.parametrize("impl", ["ragdot", "ragdot_fused"])
def test_experts_weight_gradients_come_in_the_parameters_layout(impl):
    """[E, out, in] weights: a gradient in another layout is copied by AccumulateGrad (a weight-sized
    transient); both ragdot paths compute it in the parameter's layout."""
    _transformers()
    if impl == "ragdot_fused":
        _needs_triton()
    saved = sb.hf_experts_saved("qwen3_moe", impl)
    assert saved.step["grad_copies"] == 0


def test_fused_experts_save_no_more_than_grouped_mm():
    _transformers()
    _needs_triton()
    base = sb.hf_experts_saved("qwen3_moe", "grouped_mm").total("new")
    assert sb.hf_experts_saved("qwen3_moe", "ragdot_fused").total("new") <= base


def test_moe_layer_sparse_saves_less_than_peer():
    peer = sb.layer_saved("peer").total("new")
    sparse = sb.layer_saved("sparse").total("new")
    assert sparse <= SPARSE_NEW_BYTES < peer


def test_moe_layer_lean_swiglu_keeps_only_h(monkeypatch):
    from ragdot.moe import layer as layer_mod

    monkeypatch.setattr(layer_mod, "_LEAN_SWIGLU_BYTES", 0)
    assert sb.layer_saved("sparse").total("new") <= SPARSE_LEAN_NEW_BYTES


def test_lean_swiglu_is_bitwise_autograd_swiglu():
    from ragdot.moe.layer import _SwiGLU, swiglu

    h = torch.randn(40, 2 * 24, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(40, 24, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    a, b = h.clone().requires_grad_(), h.clone().requires_grad_()
    ya, yb = _SwiGLU.apply(a), swiglu(b)
    ya.backward(grad)
    yb.backward(grad)
    assert torch.equal(ya, yb) and torch.equal(a.grad, b.grad)


def test_measure_saved_counts_a_storage_once():
    x = torch.randn(8, 4, requires_grad=True)

    def fn() -> torch.Tensor:
        y = x * 2
        return (y[:4] * y[4:]).sum()  # two views of y saved: one storage

    saved = sb.measure_saved(fn, [], [x])
    assert saved.total("new") == 8 * 4 * 4


@pytest.mark.parametrize("impl", ["ragdot", "ragdot_fused"])
def test_compiled_experts_weight_gradients_need_no_copy(impl):
    """Under torch.compile, too, the [E, out, in] weights' gradients come in the parameters' layout: with the
    gradient in the transposed view's order the compiled step copied each weight gradient (15.5 ms of a 61 ms
    Qwen3-MoE train step on the H200)."""
    _transformers()
    if impl == "ragdot_fused":
        _needs_triton()
    model = sb.hf_model("qwen3_moe")
    model.set_experts_implementation(impl)
    experts = sb.experts_module(model)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(sb.TOKENS, sb.DIM, generator=gen).requires_grad_()
    ids, weights = sb._routing(sb.TOKENS, experts.num_experts, sb.TOP_K, torch.float32)
    weights.requires_grad_()
    run = torch.compile(lambda x, w: experts(x, ids, w), backend="aot_eager", fullgraph=True)
    step = sb._step_of(lambda: run(x, weights), [*experts.parameters(), x, weights])
    step()  # compiles
    assert sb.step_memory(step)["grad_copies"] == 0
    for p in (experts.gate_up_proj, experts.down_proj):
        assert p.grad is not None and p.grad.is_contiguous()
