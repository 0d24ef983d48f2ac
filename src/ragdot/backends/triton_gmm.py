"""`triton` backend: ragdot's own Group-GEMM kernels (ragdot.kernels), CUDA and ROCm.

No host synchronisation on the hot path: group_ends stays on the device, the kernels derive their tile maps
from it, and the weight gradient's longest-first group order is computed by a one-program kernel.
Raises NotImplementedError (so `auto` moves on) for inputs the kernels do not take: other dtypes, mixed
dtypes, or tensors on a device Triton cannot run on.

The backend owns its configs (`ragdot.kernels.configs.TileConfig`): their heuristic default, the tuning
candidates and their serialisation; the tuner and the cache see only dictionaries.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any

import torch

from ragdot.backends.base import BackendBase
from ragdot.kernels.configs import TileConfig
from ragdot.kernels.interpreter import dot_refusal
from ragdot.kernels.interpreter import interpreting as _interpreting

_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


def _kernels(problem: str):
    return importlib.import_module(f"ragdot.kernels.{problem}")


class _KernelCall:
    """A prepared kernel as the dispatcher calls it. The kernels read only the operands' addresses, so
    `direct` takes any tensors that start where the canonical views start (direct_kind "address") and
    writes an output allocated in the caller's layout: no view op on the hot path. On a GPU, `direct` (the
    eager calls' path, forward and the bound backward products) replays the prepared call's launches from C
    after its first calls (`ragdot.kernels.replay`)."""

    __slots__ = ("prepared", "launch")
    direct_kind = "address"

    def __init__(self, prepared: Any):
        self.prepared = prepared
        if prepared.device.type == "cuda" and getattr(prepared, "replayable", False) and not _interpreting():
            from ragdot.kernels.replay import Replayed

            self.launch = Replayed(prepared)
        else:
            self.launch = lambda a, b, sizes, out: prepared(a, b, sizes, out)[0]

    def __call__(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
        return self.prepared(a, b, sizes)[0]

    def direct(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None,
               out_shape: tuple[int, ...], ends: torch.Tensor | None = None) -> torch.Tensor:
        """The kernels form the group ends from the raw sizes themselves: `ends` is not read."""
        out = torch.empty(out_shape, dtype=self.prepared.out_dtype, device=self.prepared.device)
        return self.launch(a, b, sizes, out)


class TritonBackend(BackendBase):
    name = "triton"
    writes_into = True  # the kernels read and write addresses only (`_KernelCall.prepared`)
    config_type = TileConfig

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
        reason = dot_refusal(first.dtype)
        if reason is not None:
            raise NotImplementedError(f"triton backend: {reason}")

    # ---- configs ------------------------------------------------------------------------------------------
    def default_config(self, problem, dims, dtype) -> TileConfig:
        from ragdot.kernels.configs import pick_config

        return pick_config(problem, *dims, dtype)

    def tuning_configs(self, problem, dims, dtype, limit, device=None, b_kmajor=False) -> list[Any]:
        if problem == "batch":
            return []
        from ragdot.kernels.configs import tuning_configs

        # the tile a call on `device` with this layout of B runs untuned (sm_90: the TMA one) comes first
        return list(tuning_configs(problem, *dims, dtype, limit=limit, device=device, b_kmajor=b_kmajor))

    def config_to_dict(self, config: TileConfig | None) -> dict[str, Any] | None:
        return None if config is None else dataclasses.asdict(config)

    def config_from_dict(self, data: dict[str, Any] | None) -> TileConfig | None:
        return None if data is None else TileConfig(**data)

    def config_label(self, config: TileConfig | None) -> str:
        return self.name if config is None else f"{self.name}:{config.short()}"

    # ---- running ------------------------------------------------------------------------------------------
    def prepare(self, problem, a, b, num_groups, out_dtype, config=None, scale=1):
        """The kernels read the raw group sizes and form the clamped ends themselves (no prefix-sum launch); a
        batch call reads none."""
        self._check(a, b, out_dtype=out_dtype)
        if problem == "ragged_m":
            prepared = _kernels("ragged_m").Prepared(a, b, out_dtype, config, from_sizes=True, scale=scale)
        elif problem == "ragged_k":
            prepared = _kernels("ragged_k").Prepared(a, b, num_groups, out_dtype, config, from_sizes=True,
                                                     scale=scale)
        else:
            prepared = _kernels("batch").Prepared(a, b, out_dtype, config)
        return _KernelCall(prepared)

    def _launch(self, problem: str, a: torch.Tensor, b: torch.Tensor, *rest, config: TileConfig | None):
        self._check(a, b, out_dtype=rest[-1])
        return getattr(_kernels(problem), problem)(a, b, *rest, config=config)

    def ragged_m(self, a, b, group_ends, out_dtype, config: TileConfig | None = None) -> torch.Tensor:
        return self._launch("ragged_m", a, b, group_ends, out_dtype, config=config)

    def ragged_k(self, a, b, group_ends, out_dtype, config: TileConfig | None = None) -> torch.Tensor:
        return self._launch("ragged_k", a, b, group_ends, out_dtype, config=config)

    def batch(self, a, b, out_dtype, config: TileConfig | None = None) -> torch.Tensor:
        return self._launch("batch", a, b, out_dtype, config=config)


BACKEND = TritonBackend()
