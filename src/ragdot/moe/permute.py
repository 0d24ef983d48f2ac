"""Torch-level permute / unpermute of MoE token rows, with autograd and torch.compile support.

    rows, routing = permute(x, experts, num_experts)      # x [T, D], experts int [T, k] -> rows [T*k, D]
    y = unpermute(rows, routing, weights)                  # rows [T*k, D], weights [T, k] -> y [T, D]

``rows`` holds every (token, choice) assignment grouped by expert (``routing.group_sizes [E]``, int32, on
the device), stable in assignment order ``a = t*k + j`` inside each group: exactly the ``lhs`` and
``group_sizes`` that ``ragdot.ragged_dot`` takes. ``unpermute`` is the weighted top-k combine
``y[t] = sum_j weights[t, j] * rows[routing.slots[t*k + j]]`` (float32 sums in a fixed order).

Both differentiate with respect to ``x``, ``rows`` and ``weights``. Under ``torch.compile`` and torch.func
transforms they are ``torch.library`` custom ops (``ragdot::moe_permute``, ``ragdot::moe_combine``,
``ragdot::moe_combine_backward``) with registered autograd and fake kernels, so they trace under
``fullgraph=True``; with grad mode off (compiled inference) they are traced as the ``torch`` implementation's
ops instead, which inductor generates and launches itself. Eager calls skip the custom-op dispatch (its
argument binding and redispatch cost more host time than the kernels' launches): a plain ``autograd.Function``
calls the same kernels with the same arguments, so results are bitwise those of the custom ops; calls that
need no gradient call the kernels directly. Nothing copies metadata to the host. ``impl`` picks the Triton
kernels (default on CUDA) or the torch fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragdot import amp
from ragdot.moe import routing_kernels as _k
from ragdot.ops import _transformed, dispatch_modes, profiled

__all__ = ["Routing", "permute", "unpermute", "default_impl", "IMPLS", "permute_rows", "combine_rows"]

IMPLS: tuple[str, ...] = ("triton", "torch")


def default_impl(device: torch.device) -> str:
    """The routing implementation used when none is named: Triton kernels on GPUs, torch otherwise."""
    return "triton" if _k.HAS_TRITON and device.type == "cuda" else "torch"


@dataclass(frozen=True)
class Routing:
    """Metadata of one permute; everything lives on the device.

    group_sizes int32 [E]: rows per expert (sums to T*k).
    slots       int32 [T*k]: row of assignment ``a = t*k + j`` in the permuted layout (a bijection).
    """

    group_sizes: torch.Tensor
    slots: torch.Tensor
    top_k: int
    impl: str

    @property
    def num_tokens(self) -> int:
        return self.slots.numel() // self.top_k

    def order(self) -> torch.Tensor:
        """int64 [T*k]: the assignment held by each permuted row (the inverse of ``slots``)."""
        inverse = torch.empty_like(self.slots, dtype=torch.int64)
        return inverse.scatter_(
            0, self.slots.long(), torch.arange(self.slots.numel(), device=self.slots.device)
        )


# ------------------------------------------------------------------------------------------ custom ops
@torch.library.custom_op("ragdot::moe_permute", mutates_args=())
def _permute_op(
    x: torch.Tensor, experts: torch.Tensor, num_experts: int, impl: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _k.sort_and_dispatch(x, experts, num_experts, impl)


@_permute_op.register_fake
def _(x, experts, num_experts, impl):
    a = experts.numel()
    return (
        x.new_empty((a, x.shape[1])),
        experts.new_empty((num_experts,), dtype=torch.int32),
        experts.new_empty((a,), dtype=torch.int32),
    )


def _permute_setup(ctx, inputs, output) -> None:
    _, experts, _, impl = inputs
    ctx.save_for_backward(output[2])
    ctx.top_k, ctx.impl = experts.shape[1], impl


@amp.autocast_off
def _permute_backward(ctx, grad_rows, _grad_sizes, _grad_slots):
    (slots,) = ctx.saved_tensors
    if grad_rows is None:
        return None, None, None, None
    return torch.ops.ragdot.moe_combine(grad_rows, slots, None, ctx.top_k, ctx.impl), None, None, None


_permute_op.register_autograd(_permute_backward, setup_context=_permute_setup)


@torch.library.custom_op("ragdot::moe_combine", mutates_args=())
def _combine_op(
    rows: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor | None, top_k: int, impl: str
) -> torch.Tensor:
    return _k.combine(rows, slots, weights, top_k, impl)


@_combine_op.register_fake
def _(rows, slots, weights, top_k, impl):
    return rows.new_empty((slots.numel() // top_k, rows.shape[1]))


def _combine_setup(ctx, inputs, output) -> None:
    rows, slots, weights, top_k, impl = inputs
    ctx.need_grad_w = weights is not None and bool(ctx.needs_input_grad[2])
    ctx.save_for_backward(rows if ctx.need_grad_w else None, slots, weights)
    ctx.top_k, ctx.impl = top_k, impl


@amp.autocast_off
def _combine_backward(ctx, grad):
    rows, slots, weights = ctx.saved_tensors
    if rows is None:
        rows = grad.new_empty((0, grad.shape[1]))
    grad_rows, grad_w = torch.ops.ragdot.moe_combine_backward(
        grad, rows, slots, weights, ctx.top_k, ctx.need_grad_w, ctx.impl
    )
    return grad_rows, None, (grad_w.to(weights.dtype) if ctx.need_grad_w else None), None, None


_combine_op.register_autograd(_combine_backward, setup_context=_combine_setup)


@torch.library.custom_op("ragdot::moe_combine_backward", mutates_args=())
def _combine_backward_op(
    grad: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    weights: torch.Tensor | None,
    top_k: int,
    need_grad_w: bool,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    grad_rows, grad_w = _k.combine_backward(grad.contiguous(), rows, slots, weights, top_k, need_grad_w, impl)
    if grad_w is None:
        grad_w = grad.new_empty((0,), dtype=_acc_dtype(grad))
    return grad_rows, grad_w


@_combine_backward_op.register_fake
def _(grad, rows, slots, weights, top_k, need_grad_w, impl):
    tokens = grad.shape[0]
    grad_w_shape = (tokens, top_k) if need_grad_w else (0,)
    return grad.new_empty((slots.numel(), grad.shape[1])), grad.new_empty(
        grad_w_shape, dtype=_acc_dtype(grad)
    )


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


# ------------------------------------------------------------------------------------------ eager path
def _traced() -> bool:
    """Whether the custom ops must be used: torch.compile is tracing, a torch.func transform or forward-mode AD
    is active (the plain Functions below define no JVP or vmap rule), or a TorchDispatchMode (fake tensors take
    the ops' fake kernels; FLOP counters and checkpointing policies see the ops)."""
    return torch.compiler.is_compiling() or _transformed() or dispatch_modes() > 0


def _inlined() -> bool:
    """Whether a permute or combine is traced as plain torch ops (the `torch` implementation) instead of the
    custom ops: under torch.compile with grad mode off (inference), where inductor then generates and launches
    the argsort, gathers and sums itself, in place of a Python call per op on every step (on the CPU, a tiny
    gpt-oss-like model's compiled decode step: 1.50-1.59x grouped_mm's time with the custom ops, 0.84-1.06x
    inlined). Training keeps the custom ops (ragdot's kernels and their backward)."""
    return torch.compiler.is_compiling() and not torch.is_grad_enabled()


class _Permute(torch.autograd.Function):
    """Eager ``ragdot::moe_permute``: the same kernel, and the same combine (unweighted) as its backward."""

    @staticmethod
    def forward(ctx, x, experts, num_experts, impl):
        rows, sizes, slots = profiled("moe_permute", _k.sort_and_dispatch, x, experts, num_experts, impl)
        ctx.mark_non_differentiable(sizes, slots)
        ctx.set_materialize_grads(False)  # no zero tensors made for sizes' and slots' gradients (or unused rows)
        ctx.save_for_backward(slots)
        ctx.top_k, ctx.impl = experts.shape[1], impl
        return rows, sizes, slots

    @staticmethod
    @amp.autocast_off
    def backward(ctx, grad_rows, _grad_sizes, _grad_slots):
        if grad_rows is None:
            return None, None, None, None
        (slots,) = ctx.saved_tensors
        return _combine(grad_rows, slots, None, ctx.top_k, ctx.impl), None, None, None


class _Combine(torch.autograd.Function):
    """Eager ``ragdot::moe_combine`` with the backward of ``ragdot::moe_combine_backward``."""

    @staticmethod
    def forward(ctx, rows, slots, weights, top_k, impl):
        ctx.need_grad_w = weights is not None and bool(ctx.needs_input_grad[2])
        ctx.save_for_backward(rows if ctx.need_grad_w else None, slots, weights)
        ctx.top_k, ctx.impl = top_k, impl
        return profiled("moe_combine", _k.combine, rows, slots, weights, top_k, impl)

    @staticmethod
    @amp.autocast_off
    def backward(ctx, grad):
        rows, slots, weights = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the custom op's backward, which records its own graph
            return _combine_backward(ctx, grad)
        grad_rows, grad_w = profiled(
            "moe_combine_backward", _k.combine_backward,
            grad.contiguous(), rows, slots, weights, ctx.top_k, ctx.need_grad_w, ctx.impl,
        )  # fmt: skip
        return grad_rows, None, (grad_w.to(weights.dtype) if ctx.need_grad_w else None), None, None


def permute_rows(x, experts, num_experts: int, impl: str):
    """``permute`` without its argument checks and ``Routing``: (rows, group_sizes, slots); ``impl`` is resolved
    ("triton" or "torch"). For callers that checked their arguments already (the MoE layer)."""
    return _permute(x, experts, num_experts, impl)


def combine_rows(rows, slots, weights, top_k: int, impl: str):
    """``unpermute`` without its argument checks, on the slots that ``permute_rows`` returned."""
    return _combine(rows, slots, weights, top_k, impl)


def _permute(x, experts, num_experts: int, impl: str):
    if _inlined():
        return _k.sort_and_dispatch(x, experts, num_experts, "torch")
    if _traced():
        return torch.ops.ragdot.moe_permute(x, experts, num_experts, impl)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Permute.apply(x, experts, num_experts, impl)
    return profiled("moe_permute", _k.sort_and_dispatch, x, experts, num_experts, impl)


def _combine(rows, slots, weights, top_k: int, impl: str):
    if _inlined():
        return _k.combine(rows, slots, weights, top_k, "torch")
    if _traced():
        return torch.ops.ragdot.moe_combine(rows, slots, weights, top_k, impl)
    if torch.is_grad_enabled() and (rows.requires_grad or (weights is not None and weights.requires_grad)):
        return _Combine.apply(rows, slots, weights, top_k, impl)
    return profiled("moe_combine", _k.combine, rows, slots, weights, top_k, impl)


# ------------------------------------------------------------------------------------------ public API
def resolve_impl(impl: str | None, device: torch.device) -> str:
    """The routing implementation that ``impl`` names on ``device`` (None: the default); raises if unusable."""
    return _check_impl(impl, device)


def _check_impl(impl: str | None, device: torch.device) -> str:
    if impl is None:
        return default_impl(device)
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is unknown; expected one of {IMPLS} or None")
    if impl == "triton" and not _k.HAS_TRITON:
        raise ValueError("impl='triton' needs the triton package; use impl='torch' or install triton")
    return impl


def permute(
    x: torch.Tensor,
    experts: torch.Tensor,
    num_experts: int,
    *,
    impl: str | None = None,
    validate: bool = False,
) -> tuple[torch.Tensor, Routing]:
    """Group token rows by expert. x [T, D] float, experts int [T, k] -> (rows [T*k, D], Routing).

    Expert ids outside ``[0, num_experts)`` are clamped (memory safe); ``validate=True`` raises instead,
    at the cost of one host synchronisation.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor [tokens, dim], got {_describe(x)}")
    if not isinstance(experts, torch.Tensor) or experts.dim() != 2 or experts.is_floating_point():
        raise TypeError(f"experts must be an integer tensor [tokens, top_k], got {_describe(experts)}")
    if experts.shape[0] != x.shape[0]:
        raise ValueError(
            f"experts has {experts.shape[0]} rows but x has {x.shape[0]} tokens; they must match"
        )
    if experts.shape[1] < 1:
        raise ValueError("experts must have at least one column (top_k >= 1)")
    if experts.device != x.device:
        raise ValueError(f"experts is on {experts.device} but x is on {x.device}; put both on one device")
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if validate and experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= num_experts):
        raise ValueError(f"experts holds ids outside [0, {num_experts}); check the router's top-k output")
    impl = _check_impl(impl, x.device)
    rows, sizes, slots = _permute(x, experts, num_experts, impl)
    return rows, Routing(group_sizes=sizes, slots=slots, top_k=experts.shape[1], impl=impl)


def unpermute(rows: torch.Tensor, routing: Routing, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted top-k combine back to token order: rows [T*k, D], weights [T, k] or None -> y [T, D].

    With ``weights=None`` every choice counts once (the adjoint of ``permute``).
    """
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be the Routing returned by permute, got {type(routing).__name__}")
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or not rows.is_floating_point():
        raise TypeError(f"rows must be a floating-point tensor [tokens*top_k, dim], got {_describe(rows)}")
    if rows.shape[0] != routing.slots.numel():
        raise ValueError(
            f"rows has {rows.shape[0]} rows but the routing has {routing.slots.numel()} assignments"
        )
    if weights is not None:
        expected = (routing.num_tokens, routing.top_k)
        if not isinstance(weights, torch.Tensor) or tuple(weights.shape) != expected:
            raise ValueError(f"weights must have shape {expected} (tokens, top_k), got {_describe(weights)}")
        if not weights.is_floating_point():
            raise TypeError(f"weights must be floating point, got {weights.dtype}")
    return _combine(rows, routing.slots, weights, routing.top_k, routing.impl)


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)}"
    return type(t).__name__
