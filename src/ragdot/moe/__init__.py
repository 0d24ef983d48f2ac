"""Mixture-of-Experts layer built on ragdot's ragged matmuls.

    from ragdot.moe import MoELayer
    layer = MoELayer(dim, hidden_dim, num_experts, top_k, path="sparse")
    y = layer(x)                               # x [..., dim] -> y [..., dim]

``permute`` / ``unpermute`` expose the sparse path's token routing (counting-sort grouping by expert and the
weighted top-k combine) for use outside the layer.
"""

from ragdot.moe.layer import PATHS, MoELayer, SwiGLU
from ragdot.moe.permute import Routing, permute, unpermute
from ragdot.moe.router import Router, RouterOutput

__all__ = ["MoELayer", "PATHS", "Router", "RouterOutput", "Routing", "SwiGLU", "permute", "unpermute"]
