"""The MoE benchmark variants: a compute path of ragdot.moe.MoELayer and, for the sparse path, a backend."""

from __future__ import annotations

__all__ = ["VARIANTS"]

VARIANTS: dict[str, tuple[str, str | None]] = {  # name -> (path, backend)
    "sparse-padded": ("sparse", "padded"),
    "sparse-torch": ("sparse", "torch"),
    "sparse-triton": ("sparse", "triton"),
    "sparse-auto": ("sparse", "auto"),
    "dense_dropless": ("dense_dropless", None),
    "dense_drop": ("dense_drop", None),
}
