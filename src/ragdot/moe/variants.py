"""The MoE benchmark variants: a compute path of ragdot.moe.MoELayer and, for the sparse path, a backend and
whether the fused expert kernels run (``MoELayer.fused``)."""

from __future__ import annotations

__all__ = ["VARIANTS"]

VARIANTS: dict[str, tuple[str, str | None, bool | None]] = {  # name -> (path, backend, fused)
    "sparse-padded": ("sparse", "padded", False),
    "sparse-torch": ("sparse", "torch", False),
    "sparse-triton": ("sparse", "triton", None),
    "sparse-auto": ("sparse", "auto", None),
    "sparse-fused": ("sparse", "auto", True),
    "dense_dropless": ("dense_dropless", None, None),
    "dense_drop": ("dense_drop", None, None),
}
