"""`peer`: the MoE layer a PyTorch user writes by hand on ``torch._grouped_mm``, the layer bench's baseline.

    y = peer_moe(x, layer.router.weight, layer.w_gate_up, layer.w_down, layer.top_k)

Same parameters and the same work as ``MoELayer(path="sparse")`` (normalised top-k weights, SwiGLU with
``w_gate_up`` columns ``[:hidden]`` gate and ``[hidden:]`` up), written the plain way: softmax top-k router,
stable argsort of the expert ids, gather of the token rows, two grouped GEMMs with ``offs`` from the cumsum
of a bincount, the router weight, and ``index_add_`` back to token order. Nothing of ragdot is in its path.
``torch.bincount`` reads its input's maximum on the host (one sync per call on CUDA), as users' code does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["peer_moe"]


def peer_moe(
    x: torch.Tensor,  # [T, D]
    router_weight: torch.Tensor,  # [E, D]
    w_gate_up: torch.Tensor,  # [E, D, 2H]
    w_down: torch.Tensor,  # [E, H, D]
    top_k: int,
) -> torch.Tensor:
    """x [T, D] -> y [T, D] in x.dtype; router in float32 (float64 for float64 x)."""
    num_experts = w_gate_up.shape[0]
    dt = torch.promote_types(x.dtype, torch.float32)
    probs = torch.softmax(F.linear(x.to(dt), router_weight.to(dt)), dim=-1)  # [T, E]
    weights, experts = probs.topk(top_k, dim=-1)  # [T, k], best first
    weights = weights / weights.sum(dim=-1, keepdim=True)
    flat = experts.reshape(-1)  # [T*k]: expert of assignment t*k + j
    order = torch.argsort(flat, stable=True)  # [T*k]: assignments grouped by expert
    token = order // top_k  # [T*k]: token of each grouped row
    offs = torch.bincount(flat, minlength=num_experts).cumsum(0).to(torch.int32)  # [E]: group ends
    h = torch._grouped_mm(x.index_select(0, token), w_gate_up, offs=offs)  # [T*k, 2H]
    gate, up = h.chunk(2, dim=-1)
    out = torch._grouped_mm(F.silu(gate) * up, w_down, offs=offs)  # [T*k, D]
    out = out * weights.reshape(-1)[order, None].to(out.dtype)
    return torch.zeros_like(x).index_add_(0, token, out)
