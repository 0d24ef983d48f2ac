"""The MoE benchmark variants: a compute path of ragdot.moe.MoELayer and, for the sparse path, a backend,
whether the fused expert kernels run (``MoELayer.fused``) and whether the backward remakes the permuted rows
and the SwiGLU output instead of keeping them (``MoELayer.recompute``)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["VARIANTS", "DEFAULT_VARIANTS", "Variant"]


class Variant(NamedTuple):
    path: str
    backend: str | None
    fused: bool | None
    recompute: bool = False

    def apply(self, layer) -> None:
        """Set this variant on a ragdot.moe.MoELayer (or anything with the same four settings)."""
        layer.path, layer.backend, layer.fused, layer.recompute = self


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
}

# what a train-step run times unless told: the variants of earlier runs (sparse-recompute on request)
DEFAULT_VARIANTS: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.recompute)
