"""The router's fused softmax and top-k (`ragdot.moe.router_topk`) against the PyTorch form of
`ragdot.moe.router`: values, logits gradients for any mix of cotangents, ties, determinism, dispatch and bad
input.

Without CUDA the kernels run in Triton's interpreter (float32, small shapes); the `gpu` test runs them compiled
inside `MoELayer` on bf16 inputs.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from ragdot.moe import router as router_mod  # noqa: E402
from ragdot.moe import router_topk  # noqa: E402
from ragdot.moe.router import Router, gate_logits  # noqa: E402
from ragdot.moe.router_topk import fused_softmax_topk, softmax_topk  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FUSED = "_SoftmaxTopK"  # the kernels' autograd node's name starts with this


def _logits(t: int, e: int, seed: int = 0) -> torch.Tensor:
    """float32 [T, E] without ties: each row a random permutation of E levels 6/E apart, plus noise < 1/4 of a
    level, so that the top-k's order is the same under any float32 rounding of the softmax."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    levels = torch.argsort(torch.rand(t, e, device=DEVICE, generator=gen), dim=1).float()
    noise = torch.rand(t, e, device=DEVICE, generator=gen) / 4
    return ((levels + noise) * (6.0 / e) - 3.0).requires_grad_(True)


def _reference(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The PyTorch form, as `Router.forward` wrote it before the kernels."""
    probs = torch.softmax(logits, dim=-1)
    weights, experts = torch.topk(probs, k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return probs, weights, experts


def _logits_grad(outs: tuple, logits: torch.Tensor, cotangents: dict[str, torch.Tensor]) -> torch.Tensor:
    probs, weights, _ = outs
    pairs = [(probs, cotangents.get("probs")), (weights, cotangents.get("weights"))]
    outputs, grads = zip(*[(o, g) for o, g in pairs if g is not None])
    (g,) = torch.autograd.grad(outputs, logits, grads)
    return g


def _assert_grad_close(g: torch.Tensor, g_ref: torch.Tensor) -> None:
    """Within float32 rounding: a relative error of the norm, or rounding noise where the gradient is 0 (one
    renormalised weight is always 1)."""
    assert float((g - g_ref).norm()) <= 2e-6 * float(g_ref.norm()) + 1e-7


SHAPES = [  # (T, E, k): one token, k = 1, 2, 8 and k = E, E not a power of two, T over one block (E=60: 128 rows)
    (1, 4, 1), (1, 5, 5), (37, 8, 2), (300, 60, 8), (129, 3, 3), (70, 24, 24), (40, 1000, 8),
]


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("t,e,k", SHAPES)
def test_fused_values_match_the_pytorch_form(t: int, e: int, k: int, normalize: bool) -> None:
    logits = _logits(t, e, seed=t + e + k)
    probs, weights, experts = fused_softmax_topk(logits, k, normalize)
    ref = _reference(logits, k, normalize)
    assert probs.dtype == weights.dtype == torch.float32 and experts.dtype == torch.int64
    assert probs.shape == (t, e) and weights.shape == experts.shape == (t, k)
    assert torch.equal(experts, ref[2])
    torch.testing.assert_close(probs, ref[0], rtol=4e-6, atol=1e-9)
    torch.testing.assert_close(weights, ref[1], rtol=4e-6, atol=1e-9)
    if not normalize:  # the weights are the written probs' bits
        assert torch.equal(weights, probs.gather(1, experts))
    assert not experts.requires_grad


@pytest.mark.parametrize("which", ["both", "weights", "probs"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("t,e,k", SHAPES)
def test_fused_logits_grad_matches_autograd(t: int, e: int, k: int, normalize: bool, which: str) -> None:
    """The logits' gradient for random cotangents on the probs and/or the weights (a missing one is None in the
    backward) within float32 rounding of autograd through the PyTorch form."""
    logits = _logits(t, e, seed=t * e + k)
    gen = torch.Generator(device=DEVICE).manual_seed(k)
    cotangents = {
        name: torch.randn(shape, device=DEVICE, generator=gen)
        for name, shape in (("probs", (t, e)), ("weights", (t, k)))
        if which in (name, "both")
    }
    g = _logits_grad(fused_softmax_topk(logits, k, normalize), logits, cotangents)
    g_ref = _logits_grad(_reference(logits, k, normalize), logits, cotangents)
    assert g.dtype == torch.float32 and g.shape == (t, e)
    _assert_grad_close(g, g_ref)


def test_fused_grad_of_non_contiguous_cotangents() -> None:
    """Expanded (stride 0) and transposed cotangents are read through their strides."""
    logits = _logits(50, 16, seed=5)
    dw = torch.randn(4, 50, device=DEVICE).t()
    for cot in ({"probs": torch.randn(1, 16, device=DEVICE).expand(50, 16), "weights": dw},
                {"weights": torch.randn(1, 4, device=DEVICE).expand(50, 4)}):
        g = _logits_grad(fused_softmax_topk(logits, 4, True), logits, cot)
        g_ref = _logits_grad(_reference(logits, 4, True), logits, cot)
        _assert_grad_close(g, g_ref)


def test_fused_is_deterministic() -> None:
    """Bitwise repeats of the outputs and the gradient over several blocks of tokens."""
    logits = (3 * torch.randn(700, 64, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(1)))
    logits.requires_grad_(True)
    dp, dw = torch.randn(700, 64, device=DEVICE), torch.randn(700, 6, device=DEVICE)
    runs = []
    for _ in range(2):
        probs, weights, experts = fused_softmax_topk(logits, 6, True)
        (g,) = torch.autograd.grad((probs, weights), logits, (dp, dw))
        runs.append((probs, weights, experts, g))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_fused_ties_go_to_the_lower_index() -> None:
    """Equal logits: the lower expert index first (a fixed rule; torch.topk's order among equals is
    unspecified); the weights are torch's values and the chosen set is a valid top-k."""
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0, 2.0, 2.0], [1.0] * 6, [5.0, 0.0, 5.0, 0.0, 5.0, 5.0]],
                          device=DEVICE)
    probs, weights, experts = fused_softmax_topk(logits, 3, True)
    assert experts.tolist() == [[1, 2, 4], [0, 1, 2], [0, 2, 4]]
    _, ref_w, ref_e = _reference(logits, 3, True)
    torch.testing.assert_close(weights, ref_w, rtol=4e-6, atol=1e-9)
    assert torch.equal(probs.gather(1, experts), probs.gather(1, ref_e).sort(dim=1, descending=True).values)


def test_fused_nan_row_still_names_distinct_experts() -> None:
    logits = torch.randn(3, 10, device=DEVICE)
    logits[1, 7] = float("nan")
    _, weights, experts = fused_softmax_topk(logits, 4, True)
    assert experts.min() >= 0 and experts.max() < 10
    assert all(len(set(row)) == 4 for row in experts.tolist())
    assert torch.isnan(weights[1]).all() and not torch.isnan(weights[[0, 2]]).any()


def test_dispatch_keeps_the_pytorch_form_where_the_kernels_do_not_apply() -> None:
    """float64 logits, logits on the CPU, and torch.compile take exactly the PyTorch form."""
    logits = _logits(40, 8)
    cases = [logits.double()] + ([logits] if DEVICE == "cpu" else [])
    for lg in cases:
        out = softmax_topk(lg, 2, True)
        assert FUSED not in type(out[0].grad_fn).__name__
        for a, b in zip(out, _reference(lg, 2, True)):
            assert torch.equal(a, b)
    compiled = torch.compile(lambda lg: softmax_topk(lg, 2, True), backend="eager", fullgraph=True)
    for a, b in zip(compiled(logits), _reference(logits, 2, True)):
        assert torch.equal(a, b)


def test_router_takes_the_kernels_where_they_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """Router.forward goes through softmax_topk: with the kernels made to apply here (the interpreter on the
    CPU), the same outputs and router gradient as the PyTorch form within float32 rounding."""
    torch.manual_seed(0)
    router = Router(32, 12, 3, device=DEVICE)
    x = torch.randn(90, 32, device=DEVICE)
    dw = torch.randn(90, 3, device=DEVICE)
    monkeypatch.setattr(router_topk, "_fused_applies", lambda logits: False)
    ref = router(x)
    (g_ref,) = torch.autograd.grad((ref.weights * dw).sum() + ref.probs[:, 0].sum(), router.weight)
    assert FUSED not in type(ref.probs.grad_fn).__name__
    monkeypatch.setattr(router_topk, "_fused_applies", lambda logits: logits.dtype == torch.float32)
    out = router(x)
    assert type(out.probs.grad_fn).__name__.startswith(FUSED)
    (g,) = torch.autograd.grad((out.weights * dw).sum() + out.probs[:, 0].sum(), router.weight)
    assert torch.equal(out.experts, ref.experts) and torch.equal(out.logits, ref.logits)
    torch.testing.assert_close(out.probs, ref.probs, rtol=4e-6, atol=1e-9)
    torch.testing.assert_close(out.weights, ref.weights, rtol=4e-6, atol=1e-9)
    _assert_grad_close(g, g_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gate_keeps_the_16_bit_input_and_gives_the_plain_ops_bits(dtype: torch.dtype,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's gate saves x and its weight in their own 16-bit dtype (the plain ops keep float32 copies:
    twice x's bytes) and gives the same logits and the same gradient bits (the float32 path: on CUDA bfloat16
    takes `router_gemm`, tested in test_router_gemm.py)."""
    monkeypatch.setattr(router_mod, "fast_gate", False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=gen).to(DEVICE, dtype).requires_grad_(True)
    w = torch.randn(12, 48, generator=gen).to(DEVICE, dtype).requires_grad_(True)
    dl = torch.randn(64, 12, generator=gen).to(DEVICE)

    def run(fn):
        saved = []

        def pack(t):
            saved.append(t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = fn()
        return logits, torch.autograd.grad(logits, (x, w), dl), sum(saved)

    logits, grads, saved = run(lambda: gate_logits(x, w))
    ref_logits, ref_grads, ref_saved = run(lambda: torch.nn.functional.linear(x.float(), w.float()))
    assert logits.dtype == torch.float32 and torch.equal(logits, ref_logits)
    for g, ref in zip(grads, ref_grads):
        assert g.dtype == dtype and torch.equal(g, ref)
    assert saved == (x.numel() + w.numel()) * 2 and ref_saved == 2 * saved
    with torch.no_grad():  # nothing to save: the plain ops
        assert torch.equal(gate_logits(x, w), ref_logits)
    x32 = x.detach().float().requires_grad_(True)
    assert torch.equal(gate_logits(x32, w.float()), ref_logits)  # float32 input: no cast, the plain ops
    x3 = x.detach().reshape(4, 16, 48).requires_grad_(True)  # a batch axis: the plain ops, which take any rank
    (g3,) = torch.autograd.grad(gate_logits(x3, w), x3, dl.reshape(4, 16, 12))
    assert torch.equal(g3.reshape(64, 48), ref_grads[0])


def test_bad_input_names_the_argument() -> None:
    logits = _logits(10, 8)
    with pytest.raises(ValueError, match="logits"):
        fused_softmax_topk(logits.double(), 2, True)
    with pytest.raises(ValueError, match="logits"):
        fused_softmax_topk(logits.t(), 2, True)
    with pytest.raises(ValueError, match="logits"):
        fused_softmax_topk(logits[:0], 2, True)
    with pytest.raises(ValueError, match="logits"):
        fused_softmax_topk(torch.zeros(2, 1025, device=DEVICE), 2, True)
    for k in (0, 9):
        with pytest.raises(ValueError, match="k must"):
            fused_softmax_topk(logits, k, True)


@gpu
@needs_cuda
def test_gpu_layer_takes_the_kernels_and_matches_the_pytorch_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """MoELayer on bf16 inputs on a GPU: the router takes the compiled kernels; its outputs, the layer's output,
    losses and gradients match the same layer with the PyTorch form."""
    from ragdot.moe.layer import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(256, 128, 64, 6, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(4, 128, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step() -> tuple:
        routed = layer.router(x.detach().reshape(-1, 256))
        y = layer(x)
        grads = torch.autograd.grad([y, layer.aux_loss + layer.z_loss], [x, layer.router.weight, layer.w_down],
                                    [dy, torch.ones((), device="cuda")])
        return routed, y, layer.aux_loss.detach(), layer.z_loss.detach(), grads

    routed, y, aux, z, grads = step()
    assert type(routed.probs.grad_fn).__name__.startswith(FUSED)
    monkeypatch.setattr(router_topk, "_fused_applies", lambda logits: False)
    ref_routed, ref_y, ref_aux, ref_z, ref_grads = step()
    assert FUSED not in type(ref_routed.probs.grad_fn).__name__
    assert torch.equal(routed.experts, ref_routed.experts)
    torch.testing.assert_close(routed.probs, ref_routed.probs, rtol=4e-6, atol=1e-9)
    torch.testing.assert_close(routed.weights, ref_routed.weights, rtol=4e-6, atol=1e-9)
    torch.testing.assert_close(y, ref_y, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(aux, ref_aux, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(z, ref_z, rtol=1e-5, atol=1e-9)
    for g, g_ref in zip(grads, ref_grads):
        assert float((g.float() - g_ref.float()).norm() / g_ref.float().norm()) < 1e-2
