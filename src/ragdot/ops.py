"""The three canonical problems as `torch.library` custom ops, with fake (meta) kernels and autograd.

Each op runs one backend on canonical operands. Gradients are again canonical problems on the same
backend, so every backend is differentiable:

    ragged_m:  c = a . b[g]          da = ragged_m(dc, b^T)        db = ragged_k(a, dc)
    ragged_k:  c[g] = a_g^T . b_g    da = ragged_m(b, dc^T)        db = ragged_m(a, dc)
    batch:     c = a . b             da = batch(dc, b^T)           db = batch(a^T, dc)
"""

from __future__ import annotations

import torch

from ragdot.backends import get_backend
from ragdot.tune.select import plan

__all__ = ["ragged_m", "ragged_k", "batch"]

_LIB = "ragdot"


def _run(problem: str, backend: str, a: torch.Tensor, b: torch.Tensor, *rest) -> torch.Tensor:
    num_groups = rest[0].shape[0] if problem != "batch" else 0
    errors = []
    for name, config in plan(problem, backend, a, b, num_groups, rest[-1]):
        fn = getattr(get_backend(name), problem)
        try:
            out = fn(a, b, *rest) if config is None else fn(a, b, *rest, config=config)
        except NotImplementedError as exc:
            if backend != "auto":
                raise NotImplementedError(f"backend {name!r} cannot compute this {problem} problem: {exc}") from exc
            errors.append(f"{name}: {exc}")
            continue
        return out if out.is_contiguous() else out.contiguous()
    raise NotImplementedError(f"no backend can compute this {problem} problem ({'; '.join(errors)})")


def _zeros_if_empty(shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype, *sizes: int):
    if 0 in sizes:
        return like.new_zeros(shape, dtype=dtype)
    return None


# ---------------------------------------------------------------------------------------------------- ragged_m
@torch.library.custom_op(f"{_LIB}::ragged_m", mutates_args=())
def ragged_m(
    a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype, backend: str
) -> torch.Tensor:
    """a [Bt, M, K] x b [Bt, G, K, N] -> [Bt, M, N]; rows >= group_ends[-1] are zero."""
    bt, m, k = a.shape
    g, n = b.shape[1], b.shape[3]
    empty = _zeros_if_empty((bt, m, n), a, out_dtype, bt, m, n, k, g)
    if empty is not None:
        return empty
    return _run("ragged_m", backend, a, b, group_ends, out_dtype)


@ragged_m.register_fake
def _(a, b, group_ends, out_dtype, backend):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[3]), dtype=out_dtype)


# ---------------------------------------------------------------------------------------------------- ragged_k
@torch.library.custom_op(f"{_LIB}::ragged_k", mutates_args=())
def ragged_k(
    a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype, backend: str
) -> torch.Tensor:
    """a [Bt, R, M] x b [Bt, R, N] -> [G, Bt, M, N]; group g contracts rows [ends[g-1], ends[g])."""
    bt, r, m = a.shape
    n, g = b.shape[2], group_ends.shape[0]
    empty = _zeros_if_empty((g, bt, m, n), a, out_dtype, g, bt, m, n, r)
    if empty is not None:
        return empty
    return _run("ragged_k", backend, a, b, group_ends, out_dtype)


@ragged_k.register_fake
def _(a, b, group_ends, out_dtype, backend):
    return a.new_empty((group_ends.shape[0], a.shape[0], a.shape[2], b.shape[2]), dtype=out_dtype)


# ------------------------------------------------------------------------------------------------------- batch
@torch.library.custom_op(f"{_LIB}::batch", mutates_args=())
def batch(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    """a [Bt, M, K] x b [Bt, K, N] -> [Bt, M, N]."""
    bt, m, k = a.shape
    n = b.shape[2]
    empty = _zeros_if_empty((bt, m, n), a, out_dtype, bt, m, n, k)
    if empty is not None:
        return empty
    return _run("batch", backend, a, b, out_dtype)


@batch.register_fake
def _(a, b, out_dtype, backend):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=out_dtype)


# ---------------------------------------------------------------------------------------------------- autograd
def _setup(ctx, inputs, output):
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))
    ctx.backend = inputs[-1]


def _cotangent(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return grad if grad.dtype == dtype else grad.to(dtype)


def _ragged_m_backward(ctx, grad):
    a, b, ends = ctx.saved_tensors
    dc = _cotangent(grad, a.dtype)
    da = db = None
    if ctx.needs_input_grad[0]:
        da = ragged_m(dc, b.transpose(-1, -2), ends, a.dtype, ctx.backend)
    if ctx.needs_input_grad[1]:
        db = ragged_k(a, dc, ends, b.dtype, ctx.backend).transpose(0, 1)
    return da, db, None, None, None


def _ragged_k_backward(ctx, grad):
    a, b, ends = ctx.saved_tensors
    dc = _cotangent(grad, a.dtype)  # [G, Bt, M, N]
    da = db = None
    if ctx.needs_input_grad[0]:
        da = ragged_m(b, dc.permute(1, 0, 3, 2), ends, a.dtype, ctx.backend)
    if ctx.needs_input_grad[1]:
        db = ragged_m(a, dc.transpose(0, 1), ends, b.dtype, ctx.backend)
    return da, db, None, None, None


def _batch_backward(ctx, grad):
    a, b = ctx.saved_tensors
    dc = _cotangent(grad, a.dtype)
    da = db = None
    if ctx.needs_input_grad[0]:
        da = batch(dc, b.transpose(-1, -2), a.dtype, ctx.backend)
    if ctx.needs_input_grad[1]:
        db = batch(a.transpose(-1, -2), dc, b.dtype, ctx.backend)
    return da, db, None, None


torch.library.register_autograd(f"{_LIB}::ragged_m", _ragged_m_backward, setup_context=_setup)
torch.library.register_autograd(f"{_LIB}::ragged_k", _ragged_k_backward, setup_context=_setup)
torch.library.register_autograd(f"{_LIB}::batch", _batch_backward, setup_context=_setup)
