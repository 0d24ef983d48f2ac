"""Per-expert biases on grouped rows (`ragdot.moe.group_bias`) and the group-sum kernel behind their gradient.

Without CUDA the kernel runs in Triton's interpreter (float16/float32 here); with CUDA the same checks run the
compiled kernel (the GPU-marked test adds bfloat16 and a skewed, large case).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ragdot.moe.group_bias import _torch_group_sums, add_group_bias, group_sums  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _reference(x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """float64 sums of each group's rows, groups clipped at the rows there are."""
    out, start = [], 0
    for s in sizes.tolist():
        end = min(start + max(s, 0), x.shape[0])
        out.append(x[start:end].double().sum(0) if end > start else x.new_zeros(x.shape[1], dtype=torch.float64))
        start = end
    return torch.stack(out)


def _kernel():
    pytest.importorskip("triton")
    from ragdot.kernels.group_sums import group_sums as kernel

    return kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("sizes", [[5, 0, 37, 1], [0, 0, 0], [70], [3, -2, 4], [40, 40]],
                         ids=["mixed", "all-empty", "one", "negative", "past-the-rows"])
def test_kernel_sums_each_group_and_ignores_the_tail(dtype, sizes):
    """Group sums against float64; rows past the last group hold NaN and never reach a sum; empty groups are
    exact zeros; a negative size counts as 0; groups that run past the rows are clipped there."""
    kernel = _kernel()
    gen = torch.Generator().manual_seed(len(sizes))
    rows, n = 72, 300  # 300 columns: three column blocks, the last one partial
    x = torch.randn(rows, n, generator=gen).to(dtype)
    covered = min(sum(max(s, 0) for s in sizes), rows)
    x[covered:] = float("nan")
    s = torch.tensor(sizes, dtype=torch.int32)
    got = kernel(x.to(DEV), s.to(DEV), torch.float32).cpu()
    want = _reference(x, s)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    for g, size in enumerate(sizes):
        if size <= 0:
            assert torch.equal(got[g], torch.zeros(n)), "an empty group's sum is not exactly zero"
    again = kernel(x.to(DEV), s.to(DEV), torch.float32).cpu()
    assert torch.equal(got, again), "two runs differ"


def test_kernel_reads_a_row_strided_view_and_refuses_bad_input():
    kernel = _kernel()
    base = torch.randn(10, 40)
    x = base[:, 4:36]  # row stride 40, 32 columns
    s = torch.tensor([4, 6], dtype=torch.int64)
    got = kernel(x.to(DEV), s.to(DEV), torch.float32).cpu().double()
    torch.testing.assert_close(got, _reference(x, s), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="x"):
        kernel(torch.randn(4, 4).t().to(DEV), s.to(DEV))
    with pytest.raises(TypeError, match="sizes"):
        kernel(torch.randn(4, 4).to(DEV), torch.tensor([1.0, 3.0]).to(DEV))
    with pytest.raises(ValueError, match="groups"):
        kernel(torch.randn(4, 4).to(DEV), torch.zeros(0, dtype=torch.int32).to(DEV))


def test_torch_form_matches_the_reference():
    x = torch.randn(20, 7, dtype=torch.float64)
    s = torch.tensor([3, 0, 9, 2])
    torch.testing.assert_close(_torch_group_sums(x, s, torch.float64), _reference(x, s))
    torch.testing.assert_close(group_sums(x, s), _reference(x, s))
    with pytest.raises(TypeError, match="sizes"):
        group_sums(x, s.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_add_group_bias_gradients_match_autograd_of_the_plain_expression(dtype):
    """Output and both gradients against autograd's own `x + bias[row_experts]`; tail rows (past the last
    group, carrying the last expert's id as the transformers path gives them) add nothing to the bias
    gradient."""
    gen = torch.Generator().manual_seed(3)
    sizes = torch.tensor([4, 0, 7, 5], dtype=torch.int32)
    covered, tail = int(sizes.sum()), 3
    row_experts = torch.repeat_interleave(torch.arange(4), sizes.long())
    row_experts = torch.cat([row_experts, torch.full((tail,), 3)])
    x = torch.randn(covered + tail, 6, generator=gen, dtype=dtype, requires_grad=True)
    bias = torch.randn(4, 6, generator=gen, dtype=dtype, requires_grad=True)
    dy = torch.randn(covered + tail, 6, generator=gen, dtype=dtype)
    dy_groups = dy.clone()
    dy_groups[covered:] = 0  # the plain expression's bias gradient without the tail rows
    y = add_group_bias(x, bias, row_experts, sizes)
    y.backward(dy)
    want = x.detach() + bias.detach()[row_experts]
    torch.testing.assert_close(y.detach(), want)
    torch.testing.assert_close(x.grad, dy)
    plain_bias = bias.detach().clone().requires_grad_(True)
    (x.detach() + plain_bias.index_select(0, row_experts)).backward(dy_groups)
    torch.testing.assert_close(bias.grad, plain_bias.grad)
    assert torch.equal(bias.grad[1], torch.zeros(6, dtype=dtype)), "an empty expert's bias gradient is not zero"
    with torch.no_grad():  # no autograd: the plain expression
        torch.testing.assert_close(add_group_bias(x, bias, row_experts, sizes), want)


def test_add_group_bias_under_torch_compile(monkeypatch):
    """fullgraph compile (aot_eager): the sums are traced as the custom op (its implementation then runs on
    real tensors only, never on the tracer's fake ones), same gradients."""
    import ragdot.moe.group_bias as gb

    seen = []
    real = gb._kernel_group_sums
    monkeypatch.setattr(gb, "_kernel_group_sums", lambda x, s, d: seen.append(type(x)) or real(x, s, d))
    sizes = torch.tensor([2, 3, 0], dtype=torch.int32)
    row_experts = torch.repeat_interleave(torch.arange(3), sizes.long())
    x = torch.randn(5, 4, requires_grad=True)
    bias = torch.randn(3, 4, requires_grad=True)

    def f(x, bias):
        return add_group_bias(x, bias, row_experts, sizes).square().sum()

    f(x, bias).backward()
    want = bias.grad.clone()
    bias.grad = None
    seen.clear()
    torch.compile(f, backend="aot_eager", fullgraph=True)(x, bias).backward()
    torch.testing.assert_close(bias.grad, want)
    assert seen == [torch.Tensor]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_bfloat16_skewed_sums_are_exact_to_float32_and_deterministic():
    """bfloat16 rows at gpt-oss widths, one expert holding most rows: sums within float32 rounding of float64,
    bitwise equal over repeats, with the rows past the last group poisoned."""
    from ragdot.kernels.group_sums import group_sums as kernel

    gen = torch.Generator(device="cuda").manual_seed(7)
    sizes = torch.tensor([30000] + [20] * 100 + [0] * 27, dtype=torch.int32, device="cuda")
    rows = int(sizes.sum()) + 64
    x = torch.randn(rows, 5760, generator=gen, device="cuda").to(torch.bfloat16)
    x[-64:] = float("nan")
    got = kernel(x, sizes, torch.float32)
    want = _reference(x.cpu(), sizes.cpu()).to("cuda")
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-2)
    assert torch.equal(got, kernel(x, sizes, torch.float32))
    assert torch.equal(got[101:], torch.zeros_like(got[101:]))
