"""Top-k softmax router and its auxiliary losses.

    logits = x @ W^T          (float32 at least, W [E, dim])
    probs  = softmax(logits)
    weights, experts = top_k(probs)         (weights renormalised to sum to 1 unless normalize=False)

On CUDA in eager mode the softmax and top-k run as one kernel forward and one backward
(`ragdot.moe.router_topk`; ties to the lower expert index), elsewhere as the PyTorch ops.

Losses (returned unscaled; the layer multiplies them by its coefficients, and on CUDA in eager mode computes
both with the same results in three kernels instead, `ragdot.moe.router_losses`):
    load balancing  E * sum_e f_e * P_e     f_e: share of the T*k assignments routed to e (no gradient)
                                            P_e: mean router probability of e over the tokens
    router z-loss   mean_t logsumexp(logits_t)^2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ragdot import amp
from ragdot.moe import router_gemm
from ragdot.moe.router_topk import softmax_topk
from ragdot.ops import plain_eager

__all__ = ["Router", "RouterOutput", "load_balancing_loss", "router_z_loss", "expert_counts"]


@dataclass
class RouterOutput:
    weights: torch.Tensor  # float32|float64 [T, k]: combine weight of each choice
    experts: torch.Tensor  # int64 [T, k]: chosen experts, best first
    logits: torch.Tensor  # float32|float64 [T, E]
    probs: torch.Tensor  # float32|float64 [T, E]


class Router(nn.Module):
    """Linear gate to ``num_experts`` logits, softmax and top-k, computed in float32 (or float64)."""

    def __init__(
        self,
        dim: int,
        num_experts: int,
        top_k: int,
        *,
        normalize: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.normalize = num_experts, top_k, normalize
        self.weight = nn.Parameter(torch.empty((num_experts, dim), dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.weight.shape[1] ** -0.5)

    def extra_repr(self) -> str:
        dim = self.weight.shape[1]
        return f"dim={dim}, num_experts={self.num_experts}, top_k={self.top_k}, normalize={self.normalize}"

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """x [T, dim] -> RouterOutput, in float32 (float64) whatever torch.autocast says."""
        with amp.off_for(x):
            logits = gate_logits(x, self.weight)
            probs, weights, experts = softmax_topk(logits, self.top_k, self.normalize)
        return RouterOutput(weights=weights, experts=experts, logits=logits, probs=probs)


class _GateLinear(torch.autograd.Function):
    """logits = x.to(dt) @ w.to(dt)^T that saves x and w in their own (16-bit) dtype and casts them again in the
    backward, where autograd of the plain ops keeps the float32 copy of x [T, D] alive until the router's backward
    (the layer's last): half the bytes saved for it. The casts are exact and the products are the ones autograd
    runs, so the gradients are the same bits."""

    @staticmethod
    def forward(ctx, x, w, dt):  # plain eager only (`gate_logits`): no setup_context, no per-call signature binding
        ctx.save_for_backward(x, w)
        ctx.dt = dt
        return F.linear(x.to(dt), w.to(dt))

    @staticmethod
    @amp.autocast_off
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return (*router_gemm.upcast_grads(grad, x, w, ctx.needs_input_grad, ctx.dt), None)


def gate_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, D] @ weight [E, D]^T in float32 at least -> [T, E]. bfloat16 x and weight on CUDA: bfloat16 tensor
    cores with float32 accumulation and output (``ragdot.moe.router_gemm``: exact products, eager and compiled).
    Otherwise in plain eager autograd with a 16-bit 2-D x the float32 copy of x is not kept for the backward
    (``_GateLinear``); elsewhere (compilers, torch.func, other ranks) the plain ops."""
    if fast_gate and router_gemm.applies(x, weight):
        return router_gemm.gate_matmul(x, weight)
    dt = torch.promote_types(x.dtype, torch.float32)
    if x.dim() == 2 and x.dtype != dt and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad) \
            and plain_eager(x):  # the Function's backward multiplies 2-D matrices
        return _GateLinear.apply(x, weight, dt)
    return F.linear(x.to(dt), weight.to(dt))


# False: bfloat16 logits through the float32 matmul of upcast operands, as before `router_gemm` (A/B measurements)
fast_gate = True


def expert_counts(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int32 [E]: assignments per expert, on the device (no host sync)."""
    flat = experts.reshape(-1)
    counts = torch.zeros((num_experts,), dtype=torch.int32, device=flat.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """Switch/GShard balance loss from probs [T, E] and assignment counts [E]; 1.0 when perfectly balanced.

    ``total``: ``counts.sum()`` where the caller knows it (the layer: every one of the T*k assignments is
    counted); one launch instead of three, the same float32 divisor, so the same bits."""
    num_experts = probs.shape[-1]
    if total is None:
        denominator = counts.sum().clamp_min(1).float()
    else:
        denominator = torch.full((), float(max(total, 1)), dtype=torch.float32, device=counts.device)
    fraction = counts.float() / denominator
    return num_experts * (fraction * probs.mean(dim=0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE z-loss: mean squared log-partition of the router logits [T, E]."""
    return torch.logsumexp(logits, dim=-1).square().mean()
