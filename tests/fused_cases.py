"""What the fused expert block's test files share: the device, dtypes and bounds, the fixture over the block's
forward and backward kinds, random operands, the block and the unfused path it is checked against, and one layer
step's values and gradients."""

from __future__ import annotations

import pytest
import torch

import ragdot
from ragdot.moe import fused as fused_mod
from ragdot.moe.fused import fused_experts, sort_experts
from ragdot.moe.layer import swiglu
from ragdot.moe.permute import permute, unpermute

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# The Triton interpreter computes bf16 dots wrongly: bf16 runs on GPUs only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV.type == "cuda" else [])
TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


# (forward_kind, backward_kind): every forward and every backward of the fused block at least once
KINDS = [("gemms", "gemms"), ("fused", "fused")]
assert {f for f, _ in KINDS} == set(fused_mod.FORWARDS) and {b for _, b in KINDS} == set(fused_mod.BACKWARDS)


@pytest.fixture(params=KINDS, ids=["-".join(k) for k in KINDS], name="backward")
def backward_kinds(request, monkeypatch):
    """The fused block's forward and backward: ragdot's ragged GEMMs on gathered rows, or the index-reading kernels."""
    monkeypatch.setattr(fused_mod, "forward_kind", request.param[0])
    monkeypatch.setattr(fused_mod, "backward_kind", request.param[1])
    return request.param[1]


def _operands(tokens, dim, hidden, experts, top_k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(DEV, dtype).requires_grad_(True)

    x = rand(tokens, dim)
    wgu = rand(experts, dim, 2 * hidden, scale=dim**-0.5)
    wd = rand(experts, hidden, dim, scale=hidden**-0.5)
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(DEV)
    weights = torch.rand(tokens, top_k, generator=gen).to(DEV).requires_grad_(True)
    return x, chosen, weights, wgu, wd


def _unfused(x, chosen, weights, wgu, wd):
    rows, routing = permute(x, chosen, wgu.shape[0], impl="torch")
    sizes = routing.group_sizes
    h = ragdot.ragged_dot(rows, wgu, sizes)
    out = ragdot.ragged_dot(swiglu(h), wd, sizes)
    return unpermute(out, routing, weights)


def _fused(x, chosen, weights, wgu, wd, **kw):
    sizes, order = sort_experts(chosen, wgu.shape[0])
    return fused_experts(x, order, sizes, weights, wgu, wd, **kw)


def _value_and_grads(fn, operands, cot):
    x, chosen, weights, wgu, wd = operands
    y = fn(x, chosen, weights, wgu, wd)
    grads = torch.autograd.grad(y, (x, weights, wgu, wd), cot)
    return y.detach(), grads


def _layer_run(layer, x, cot, fn=None):
    layer.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_(True)
    y = (layer if fn is None else fn)(xg)
    ((y * cot).sum() + layer.aux_loss + layer.z_loss).backward()
    return y.detach(), {"x": xg.grad} | {n: p.grad for n, p in layer.named_parameters()}
