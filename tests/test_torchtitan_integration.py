"""The torchtitan integration (`ragdot.integrations.torchtitan`) on a stand-in of torchtitan's experts.

torchtitan is not needed: the stand-in has its GroupedExperts' layout and `_grouped_mm` seam (float32, CPU).
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
