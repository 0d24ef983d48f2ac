"""The MoE benchmark variants: a compute path of ragdot.moe.MoELayer and, for the sparse path, a backend,
whether the fused expert kernels run (``MoELayer.fused``) and whether the backward remakes the permuted rows
and the SwiGLU output instead of keeping them (``MoELayer.recompute``).

One variant is a floor, never a result: ``no_experts`` runs the layer with no routed-expert work at all (each
token's output is its input scaled by the sum of its routing weights, so the router still gets a gradient and
the rest of the step runs as with experts; the shared experts, the router and its losses stay, and the
optimizer updates the expert weights from zero gradients, as it updates them in every other variant). Its step time
bounds every implementation of the routed experts from below: a baseline's step over it is the largest speedup
any of them could reach on that step (`ragdot moe-bench` reports it)."""

from __future__ import annotations

import types
from typing import NamedTuple

import torch

from ragdot.moe.router import expert_counts

__all__ = ["VARIANTS", "DEFAULT_VARIANTS", "FLOOR", "Variant", "no_routed_experts", "give_floor_grads"]

FLOOR = "no_experts"
FLOOR_GRAD = "_ragdot_floor_grad"  # a floor's expert weight: its zero gradient (`no_routed_experts`)


class Variant(NamedTuple):
    path: str
    backend: str | None
    fused: bool | None
    recompute: bool = False
    experts: bool = True  # False: the floor (no routed-expert work; see the module docstring)

    @property
    def settings(self) -> dict[str, object]:
        """The MoELayer attributes this variant sets (its four layer settings)."""
        return {"path": self.path, "backend": self.backend, "fused": self.fused, "recompute": self.recompute}

    def apply(self, layer) -> None:
        """Set this variant on a ragdot.moe.MoELayer (or anything with the same four settings); the floor
        replaces the layer's routed experts (`no_routed_experts`), any other variant restores them."""
        for key, value in self.settings.items():
            setattr(layer, key, value)
        no_routed_experts(layer, not self.experts)


def _scaled_input(layer, x2: torch.Tensor, r) -> tuple[torch.Tensor, torch.Tensor]:
    """The floor's stand-in for MoELayer._sparse: x2 [T, dim] scaled by each token's summed routing weights
    (one elementwise product, so the router keeps its gradient), and the assignments per expert (its losses)."""
    return x2 * r.weights.sum(-1, keepdim=True).to(x2.dtype), expert_counts(r.experts, layer.num_experts)


def no_routed_experts(layer, on: bool) -> None:
    """Replace (on) or restore (off) a MoELayer's routed experts by the floor's stand-in, on this instance
    only (the class is untouched). With the stand-in the expert weights get no gradient, and an optimizer skips
    a parameter without one; so each holds a zero gradient of its own (`FLOOR_GRAD`), which `give_floor_grads`
    hands it before the optimizer step: the floor's step updates every weight, as a real one does, without
    computing or writing any gradient."""
    weights = (layer.w_gate_up, layer.w_down)
    if on:
        layer._sparse = types.MethodType(_scaled_input, layer)
        for w in weights:
            if getattr(w, FLOOR_GRAD, None) is None:
                setattr(w, FLOOR_GRAD, torch.zeros_like(w))
    else:
        layer.__dict__.pop("_sparse", None)
        for w in weights:
            if hasattr(w, FLOOR_GRAD):
                delattr(w, FLOOR_GRAD)


def give_floor_grads(params) -> None:
    """Before an optimizer step: each parameter without a gradient that holds a floor's zero gradient gets it."""
    for p in params:
        if p.grad is None:
            zero = getattr(p, FLOOR_GRAD, None)
            if zero is not None:
                p.grad = zero


VARIANTS: dict[str, Variant] = {
    "sparse-padded": Variant("sparse", "padded", False),
    "sparse-torch": Variant("sparse", "torch", False),
    "sparse-triton": Variant("sparse", "triton", None),
    "sparse-auto": Variant("sparse", "auto", None),  # the layer's default: the fused block where it is faster
    "sparse-unfused": Variant("sparse", "auto", False),
    "sparse-recompute": Variant("sparse", "auto", None, True),
    "sparse-fused": Variant("sparse", "auto", True),
    "dense_dropless": Variant("dense_dropless", None, None),
    "dense_drop": Variant("dense_drop", None, None),
    FLOOR: Variant("sparse", "auto", False, experts=False),
}

# what a train-step run times unless told: the variants of earlier runs (sparse-recompute on request)
DEFAULT_VARIANTS: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.recompute)
