"""The router's fused auxiliary losses (`ragdot.moe.router_losses`) against the PyTorch form of
`ragdot.moe.router`: values and logits gradients, determinism, dispatch and bad input.

Without CUDA the kernels run in Triton's interpreter (float32, small shapes); the `gpu` tests run them
compiled, inside `MoELayer` and under CUDA-graph capture.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from ragdot.moe.router import load_balancing_loss, router_z_loss  # noqa: E402
from ragdot.moe.router_losses import fused_router_losses, router_losses  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _case(t: int, e: int, k: int, seed: int = 0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    logits = (3 * torch.randn(t, e, device=DEVICE, generator=gen)).requires_grad_(True)
    experts = torch.topk(torch.softmax(logits, -1), k, -1).indices
    counts = torch.zeros(e, dtype=torch.int32, device=DEVICE)
    counts.scatter_add_(0, experts.reshape(-1), torch.ones(t * k, dtype=torch.int32, device=DEVICE))
    return logits, counts


def _reference(logits, counts, total, aux_coef, z_coef):
    probs = torch.softmax(logits, -1)
    return torch.stack([aux_coef * load_balancing_loss(probs, counts, total), z_coef * router_z_loss(logits)])


@pytest.mark.parametrize("t,e,k", [(1, 4, 1), (37, 8, 2), (300, 64, 6), (129, 3, 2), (700, 256, 8)])
def test_fused_losses_match_the_pytorch_form(t: int, e: int, k: int) -> None:
    """Values and the logits' gradient (any cotangent of the two losses) within float32 rounding of the PyTorch
    form; odd expert counts, a single token, more tokens than one block, experts nobody chose."""
    logits, counts = _case(t, e, k)
    if e > k:
        counts[0] = 0  # an expert with no assignments
    ref = _reference(logits, counts, t * k, 0.01, 0.001)
    grad = torch.tensor([0.7, -1.3], device=DEVICE)
    (g_ref,) = torch.autograd.grad(ref, logits, grad)
    out = fused_router_losses(logits, counts, t * k, 0.01, 0.001)
    (g_out,) = torch.autograd.grad(out, logits, grad)
    assert out.dtype == torch.float32 and out.shape == (2,)
    torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-9)
    assert float((g_out - g_ref).norm() / g_ref.norm()) < 2e-6


def test_fused_losses_are_deterministic_and_respect_the_coefficients() -> None:
    logits, counts = _case(500, 32, 4, seed=3)
    a = fused_router_losses(logits, counts, 2000, 0.01, 0.001)
    b = fused_router_losses(logits, counts, 2000, 0.01, 0.001)
    assert torch.equal(a, b)
    (g1,) = torch.autograd.grad(a.sum(), logits)
    (g2,) = torch.autograd.grad(b.sum(), logits)
    assert torch.equal(g1, g2)
    zero = fused_router_losses(logits, counts, 2000, 0.0, 0.0)
    assert torch.equal(zero, torch.zeros(2, device=DEVICE))
    (g0,) = torch.autograd.grad(zero.sum(), logits)
    assert torch.equal(g0, torch.zeros_like(g0))


def test_dispatch_keeps_the_pytorch_form_where_the_kernels_do_not_apply() -> None:
    """Off CUDA, for float64 logits and without `total` (expert parallelism), `router_losses` is exactly the
    PyTorch form."""
    logits, counts = _case(40, 8, 2)
    probs = torch.softmax(logits, -1)
    cases = [(logits.double(), probs.double(), 80), (logits, probs, None)]
    if DEVICE == "cpu":
        cases.append((logits, probs, 80))
    for lg, pr, total in cases:
        aux, z = router_losses(lg, pr, counts, total, 0.01, 0.001)
        assert torch.equal(aux, 0.01 * load_balancing_loss(pr, counts, total))
        assert torch.equal(z, 0.001 * router_z_loss(lg))


def test_bad_input_names_the_argument() -> None:
    logits, counts = _case(10, 8, 2)
    with pytest.raises(ValueError, match="logits"):
        fused_router_losses(logits.double(), counts, 20, 0.01, 0.001)
    with pytest.raises(ValueError, match="logits"):
        fused_router_losses(logits.t(), counts, 20, 0.01, 0.001)
    with pytest.raises(ValueError, match="counts"):
        fused_router_losses(logits, counts[:4], 20, 0.01, 0.001)
    with pytest.raises(ValueError, match="counts"):
        fused_router_losses(logits, counts.float(), 20, 0.01, 0.001)


@gpu
@needs_cuda
def test_gpu_layer_losses_and_capture() -> None:
    """MoELayer's losses on a GPU take the kernels: the same values as the PyTorch form within float32 rounding,
    the same router gradient, and a forward+backward that captures into a CUDA graph and replays."""
    from ragdot.moe.layer import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(256, 128, 64, 6, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(4, 128, 256, device="cuda", dtype=torch.bfloat16)
    layer(x)
    aux, z = layer.aux_loss, layer.z_loss
    routed = layer.router(x.reshape(-1, 256))
    ref_aux = layer.aux_loss_coef * load_balancing_loss(routed.probs, layer.expert_counts, routed.experts.numel())
    ref_z = layer.z_loss_coef * router_z_loss(routed.logits)
    torch.testing.assert_close(aux, ref_aux, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(z, ref_z, rtol=1e-5, atol=1e-9)
    (g,) = torch.autograd.grad(aux + z, layer.router.weight)
    (g_ref,) = torch.autograd.grad(ref_aux + ref_z, layer.router.weight)
    assert float((g.float() - g_ref.float()).norm() / g_ref.float().norm()) < 1e-2

    # the capture (ragdot.measure.timing's helpers, as the benchmarks use them), on a layer whose eager graphs
    # are all released before it: a live one would carry its parameters' default-stream gradient nodes into it
    from ragdot.measure.timing import capture_graph, warm_off_stream

    layer = MoELayer(256, 128, 64, 6, dtype=torch.bfloat16, device="cuda")  # the graph above keeps the first one's
    static = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    grads: list[torch.Tensor] = []

    def step() -> None:
        layer(static)
        grads[:] = torch.autograd.grad(layer.aux_loss + layer.z_loss, layer.router.weight)

    step()
    eager = grads[0].clone()
    warm_off_stream(step, torch.device("cuda"))
    replay = capture_graph(step)
    grads[0].zero_()
    replay()
    torch.cuda.synchronize()
    assert torch.equal(grads[0], eager)  # deterministic kernels: the replay gives the eager step's bits
