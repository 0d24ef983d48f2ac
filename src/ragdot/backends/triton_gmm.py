"""`triton` backend: ragdot's own Group-GEMM kernels (ragdot.kernels), CUDA and ROCm.

No host synchronisation on the hot path: group_ends stays on the device, the kernels derive their tile maps
from it, and the weight gradient's longest-first group order is computed by a one-program kernel.
Raises NotImplementedError (so `auto` moves on) for inputs the kernels do not take: other dtypes, mixed
dtypes, or tensors on a device Triton cannot run on.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import torch

from ragdot.kernels.configs import TileConfig

_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class TritonBackend:
    name = "triton"

    def is_available(self) -> bool:
        if importlib.util.find_spec("triton") is None:
            return False
        return _interpreting() or torch.cuda.is_available()

    @staticmethod
    def _check(*tensors: torch.Tensor, out_dtype: torch.dtype) -> None:
        first = tensors[0]
        if first.device.type != "cuda" and not _interpreting():
            raise NotImplementedError(f"triton backend: tensors on {first.device} (needs a GPU)")
        for t in tensors:
            if t.dtype not in _SUPPORTED or t.dtype != first.dtype:
                raise NotImplementedError(f"triton backend: operand dtypes {[x.dtype for x in tensors]}")
        if out_dtype not in _SUPPORTED:
            raise NotImplementedError(f"triton backend: out_dtype {out_dtype}")

    def _launch(self, problem: str, a: torch.Tensor, b: torch.Tensor, *rest, config: TileConfig | None):
        self._check(a, b, out_dtype=rest[-1])
        kernel = getattr(importlib.import_module(f"ragdot.kernels.{problem}"), problem)
        return kernel(a, b, *rest, config=config)

    def ragged_m(self, a, b, group_ends, out_dtype, config: TileConfig | None = None) -> torch.Tensor:
        return self._launch("ragged_m", a, b, group_ends, out_dtype, config=config)

    def ragged_k(self, a, b, group_ends, out_dtype, config: TileConfig | None = None) -> torch.Tensor:
        return self._launch("ragged_k", a, b, group_ends, out_dtype, config=config)

    def batch(self, a, b, out_dtype, config: TileConfig | None = None) -> torch.Tensor:
        return self._launch("batch", a, b, out_dtype, config=config)


BACKEND = TritonBackend()
