"""The torchtitan integration (`ragdot.integrations.torchtitan`) on a stand-in of torchtitan's experts, and on
torchtitan's own MoE layer where torchtitan is installed.

The stand-in has its GroupedExperts' layout and `_grouped_mm` seam (float32, CPU). The last test builds
torchtitan's `MoE` (router, local token dispatcher, GroupedExperts or gpt-oss's biased GptOssGroupedExperts),
written against torchtitan 0.3.0, and runs it patched and unpatched.
"""

from __future__ import annotations

import pytest
import torch

TOL = dict(rtol=1e-4, atol=1e-5)


class _TitanExperts(torch.nn.Module):
    """torchtitan's GroupedExperts in miniature: SwiGLU experts through the ``_grouped_mm`` seam (float32 here)."""

    def __init__(self, experts: int = 4, dim: int = 16, hidden: int = 8) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(14)
        self.w1_EFD = torch.nn.Parameter(0.3 * torch.randn(experts, hidden, dim, generator=gen))
        self.w2_EDF = torch.nn.Parameter(0.3 * torch.randn(experts, dim, hidden, generator=gen))
        self.w3_EFD = torch.nn.Parameter(0.3 * torch.randn(experts, hidden, dim, generator=gen))

    def forward(self, x, num_tokens_per_expert):
        offs = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        h = torch.nn.functional.silu(self._grouped_mm(A=x, B_t=self.w1_EFD.transpose(-2, -1), offs=offs))
        h = h * self._grouped_mm(A=x, B_t=self.w3_EFD.transpose(-2, -1), offs=offs)
        return self._grouped_mm(A=h, B_t=self.w2_EDF.transpose(-2, -1), offs=offs)

    def _grouped_mm(self, *, A, B_t, offs):
        return torch._grouped_mm(A, B_t, offs=offs)


def _titan_step(module, x, sizes):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y = module(x, sizes)
    y.backward(torch.linspace(-1, 1, y.numel()).view_as(y))
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def test_torchtitan_seam_patch_matches_grouped_mm_and_unpatches():
    import ragdot.integrations.torchtitan as tt

    class Sub(_TitanExperts):  # gpt-oss's experts subclass GroupedExperts and inherit the seam
        pass

    module, sizes = Sub(), torch.tensor([3, 0, 5, 2])
    x = torch.randn(int(sizes.sum()), 16, generator=torch.Generator().manual_seed(15))
    want = _titan_step(module, x, sizes)
    tt.patch(_TitanExperts, backend="reference")
    try:
        assert tt.is_patched(_TitanExperts) and tt.is_patched(Sub)
        tt.patch(_TitanExperts)  # again: replaces ragdot's function, keeps the saved original
        got = _titan_step(module, x, sizes)
    finally:
        tt.unpatch(_TitanExperts)
    assert not tt.is_patched(_TitanExperts)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **TOL, msg=name)


def test_torchtitan_legacy_module_function_is_patched():
    import types

    import ragdot.integrations.torchtitan as tt

    legacy = types.ModuleType("legacy_moe")
    titan = _TitanExperts()

    def _run_experts_grouped_mm(w1, w2, w3, x, num_tokens_per_expert):
        return titan(x, num_tokens_per_expert)

    legacy._run_experts_grouped_mm = _run_experts_grouped_mm
    sizes = torch.tensor([2, 4, 0, 1])
    x = torch.randn(7, 16, generator=torch.Generator().manual_seed(16))
    want = legacy._run_experts_grouped_mm(titan.w1_EFD, titan.w2_EDF, titan.w3_EFD, x, sizes)
    tt.patch(legacy, backend="reference")
    got = legacy._run_experts_grouped_mm(titan.w1_EFD, titan.w2_EDF, titan.w3_EFD, x, sizes)
    tt.unpatch(legacy)
    assert legacy._run_experts_grouped_mm is _run_experts_grouped_mm
    # the legacy path casts to bfloat16 as torchtitan does
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


def test_torchtitan_padding_rows_are_zero_and_bad_targets_are_refused():
    import ragdot.integrations.torchtitan as tt

    a, b = torch.randn(6, 4), torch.randn(2, 4, 3)
    out = tt.grouped_mm(a, b, torch.tensor([2, 4], dtype=torch.int32), backend="reference")
    assert torch.equal(out[4:], torch.zeros(2, 3))
    torch.testing.assert_close(out[:2], a[:2] @ b[0])
    with pytest.raises(ValueError, match="target="):
        tt.patch(object)


@pytest.mark.parametrize("experts", ["GroupedExperts", "GptOssGroupedExperts"])
def test_torchtitan_own_moe_layer_runs_ragdot(experts, monkeypatch):
    """torchtitan's MoE layer (bfloat16: its experts cast to it) with ragdot's reference backend in the seam
    (Triton's CPU interpreter has no bfloat16): output, input gradient and every parameter gradient match the
    unpatched layer's torch._grouped_mm, and ragdot.grouped_mm really ran (three calls forward for SwiGLU experts, two
    for gpt-oss's)."""
    titan = pytest.importorskip("torchtitan.models.common.moe")
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

    import ragdot.integrations.torchtitan as tt

    inner = {"GroupedExperts": titan.GroupedExperts, "GptOssGroupedExperts": GptOssGroupedExperts}[experts]
    dim, hidden, num_experts, top_k = 32, 16, 4, 2
    config = titan.MoE.Config(
        num_experts=num_experts,
        routed_experts=titan.RoutedExperts.Config(
            inner_experts=inner.Config(dim=dim, hidden_dim=hidden, num_experts=num_experts),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=num_experts, top_k=top_k)),
        router=titan.TokenChoiceTopKRouter.Config(
            num_experts=num_experts, gate=Linear.Config(in_features=dim, out_features=num_experts), top_k=top_k),
        load_balance_coeff=None,
    )  # fmt: skip
    torch.manual_seed(16)
    layer = config.build()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    layer = layer.to(torch.bfloat16)
    x = torch.randn(2, 12, dim, generator=torch.Generator().manual_seed(17)).to(torch.bfloat16)

    def step():
        layer.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_(True)
        y = layer(xx)
        y.float().pow(2).sum().backward()
        return y.detach().float(), xx.grad.float(), {n: p.grad.float() for n, p in layer.named_parameters()}

    want = step()
    calls = []
    real = tt._grouped_mm  # ragdot.grouped_mm, which the seam calls
    monkeypatch.setattr(tt, "_grouped_mm", lambda *a, **k: calls.append(k.get("backend")) or real(*a, **k))
    tt.patch(backend="reference")
    try:
        assert tt.is_patched() and tt.is_patched(GptOssGroupedExperts)
        got = step()
    finally:
        tt.unpatch()
    assert not tt.is_patched()
    assert calls == ["reference"] * (2 if inner is GptOssGroupedExperts else 3)
    tol = dict(rtol=2e-2, atol=2e-2)  # bfloat16 products, summed in another order than the vendor kernel's
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **tol, msg=f"grad of {name}")
