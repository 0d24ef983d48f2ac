"""Per-expert biases on rows grouped by expert: ``y = x + bias[expert of row]``.

The bias gradient is each expert's rows summed, ``d_bias[e] = sum of dy over expert e's rows``. Autograd's own
backward of ``bias.index_select(0, row_experts)`` scatters every row into its expert with atomic adds
(``index_add_``): on the H200 that took 8.7-8.9 ms of a gpt-oss-like train step (4 layers, 32768 rows of
width 5760 and 2880 into 128 biases), eager and compiled alike. Here the rows are already grouped (the
permuted layout), so one program per (expert, column block) adds its expert's rows in float32 and in row
order (`ragdot.kernels.group_sums`): no atomics, the same bits on every run, exact zeros for empty experts,
rows past the last group (off-rank choices under expert parallelism) never read.

    y = add_group_bias(x, bias, row_experts, group_sizes)     # x [R, N], bias [E, N], group_sizes int [E]
"""

from __future__ import annotations

import torch

from ragdot import amp
from ragdot.groups import group_ends_from_sizes
from ragdot.ops import _transformed

__all__ = ["add_group_bias", "group_sums"]


def _torch_group_sums(x: torch.Tensor, sizes: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The same sums with torch ops (CPU, or CUDA without Triton, where index_add_'s atomics reorder them)."""
    groups, rows = sizes.shape[0], x.shape[0]
    ends = group_ends_from_sizes(sizes, rows)  # negatives as 0, clamped to the rows
    # each row's group; rows past the last group get `groups`, a slot dropped below
    group = torch.searchsorted(ends, torch.arange(rows, device=x.device, dtype=ends.dtype), right=True)
    acc = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for float64 rows
    out = torch.zeros((groups + 1, x.shape[1]), dtype=acc, device=x.device)
    return out.index_add_(0, group, x.to(acc))[:groups].to(out_dtype)


def _kernel_group_sums(x: torch.Tensor, sizes: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if x.is_cuda:
        try:
            from ragdot.kernels.group_sums import MAX_GROUPS
            from ragdot.kernels.group_sums import group_sums as kernel
        except ImportError:
            pass
        else:
            row_major = x.shape[1] <= 1 or x.stride(1) == 1
            if 0 < sizes.shape[0] <= MAX_GROUPS and row_major and x.dtype != torch.float64:
                return kernel(x, sizes, out_dtype)
    return _torch_group_sums(x, sizes, out_dtype)


@torch.library.custom_op("ragdot::group_sums", mutates_args=())
def _group_sums_op(x: torch.Tensor, sizes: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return _kernel_group_sums(x, sizes, out_dtype)


@_group_sums_op.register_fake
def _(x, sizes, out_dtype):
    return x.new_empty((sizes.shape[0], x.shape[1]), dtype=out_dtype)


def group_sums(x: torch.Tensor, sizes: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [R, N] with rows grouped (sizes[g] rows of group g, in order), sizes int [G] -> [G, N] in out_dtype
    (default x's): each group's rows summed in float32 (float64 rows: in float64). Rows past the last group are
    ignored."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a [R, N] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if not isinstance(sizes, torch.Tensor) or sizes.dim() != 1 or sizes.dtype not in (torch.int32, torch.int64):
        raise TypeError("sizes must be a 1-D int32 or int64 tensor")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if torch.compiler.is_compiling():
        return _group_sums_op(x, sizes, out_dtype)
    return _kernel_group_sums(x, sizes, out_dtype)


class _GroupBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, row_experts, sizes):
        ctx.save_for_backward(sizes)
        ctx.bias_dtype = bias.dtype
        return x + bias.index_select(0, row_experts)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @amp.autocast_off
    def backward(ctx, grad):
        (sizes,) = ctx.saved_tensors
        d_bias = group_sums(grad, sizes, ctx.bias_dtype) if ctx.needs_input_grad[1] else None
        return (grad if ctx.needs_input_grad[0] else None), d_bias, None, None


def add_group_bias(
    x: torch.Tensor, bias: torch.Tensor, row_experts: torch.Tensor, group_sizes: torch.Tensor
) -> torch.Tensor:
    """x [R, N] + bias[row_experts] (bias [E, N], row_experts int [R]), where x's rows are grouped by expert
    (group_sizes[e] rows of expert e, in order, as `ragdot.moe.permute` lays them out; rows past the last
    group may carry any valid id). The bias gradient is `group_sums` of the output gradient over those groups,
    so rows past the last group add nothing to it. Without autograd (or under torch.func transforms) it is
    the plain expression."""
    if torch.is_grad_enabled() and bias.requires_grad and not _transformed():
        return _GroupBias.apply(x, bias, row_experts, group_sizes)
    return x + bias.index_select(0, row_experts)
