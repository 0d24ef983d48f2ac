"""`gluon` backend: ragdot's Gluon kernels for Hopper (sm_90): warp-specialized, persistent, TMA + wgmma.

It serves the weight gradient (ragged_k) with `ragdot.kernels.gluon.ragged_k` and the forward / data gradient
(ragged_m) with `ragdot.kernels.gluon.ragged_m`; batch, and ragged_m problems the Gluon kernel does not take
(K not a multiple of 64), are the `triton` backend's kernels, so `backend="gluon"` runs a whole MoE block.
Usable only on an NVIDIA sm_90 GPU with a Triton that ships Gluon, outside Triton's interpreter. Raises
NotImplementedError (so `auto` moves on) for the ragged_k problems the Gluon kernel does not take: operands
other than bf16/fp16, operands that are not row views with 16-byte aligned rows.

Configs are `ragdot.kernels.gluon.config.GluonConfig` (batch and the delegated ragged_m problems use the
triton backend's heuristic and are not tuned under this name). No host synchronisation on the hot path: the
group ranking (ragged_k) and the row-tile table (ragged_m) are one-program kernels fed the raw group sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ragdot.backends.base import BackendBase
from ragdot.backends.triton_gmm import _KernelCall  # the same prepared-call face: reads addresses only
from ragdot.kernels.gluon.common import unavailable_reason
from ragdot.kernels.gluon.config import (
    GluonConfig,
    gluon_m_tuning_configs,
    gluon_tuning_configs,
    pick_gluon_config,
    pick_gluon_m_config,
)

__all__ = ["GluonBackend", "BACKEND"]


def _out_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class GluonBackend(BackendBase):
    name = "gluon"
    writes_into = True
    config_type = GluonConfig

    def is_available(self) -> bool:
        return unavailable_reason() is None

    @staticmethod
    def _triton():
        from ragdot.backends.triton_gmm import BACKEND as triton_backend

        return triton_backend

    @staticmethod
    def _check(a: torch.Tensor) -> None:
        reason = unavailable_reason(a.device)
        if reason is not None:
            raise NotImplementedError(f"gluon backend: {reason} (tensors on {a.device})")

    # ---- configs ------------------------------------------------------------------------------------------
    def default_config(self, problem, dims, dtype) -> GluonConfig | None:
        m, k, n, g = dims  # ragged_k: (M, R, N, G)
        if problem == "ragged_k":
            return pick_gluon_config(m, n, _out_bytes(dtype))
        return pick_gluon_m_config(m, k, n, g, _out_bytes(dtype)) if problem == "ragged_m" else None

    def tuning_configs(self, problem, dims, dtype, limit, device=None, b_kmajor=False) -> list[Any]:
        m, k, n, _ = dims
        if problem == "ragged_k":
            return list(gluon_tuning_configs(m, n, _out_bytes(dtype), limit))
        return list(gluon_m_tuning_configs(k, n, _out_bytes(dtype), limit)) if problem == "ragged_m" else []

    def config_to_dict(self, config: GluonConfig | None) -> dict[str, Any] | None:
        return None if config is None else dataclasses.asdict(config)

    def config_from_dict(self, data: dict[str, Any] | None) -> GluonConfig | None:
        return None if data is None else GluonConfig(**data)

    def config_label(self, config: GluonConfig | None) -> str:
        return self.name if config is None else f"{self.name}:{config.short()}"

    # ---- running ------------------------------------------------------------------------------------------
    def prepare(self, problem, a, b, num_groups, out_dtype, config=None, scale=1):
        cfg = config if isinstance(config, GluonConfig) else None
        if problem == "ragged_m":
            self._check(a)
            from ragdot.kernels.gluon.ragged_m import Prepared as MPrepared

            try:
                return _KernelCall(MPrepared(a, b, out_dtype, cfg, from_sizes=True, scale=scale))
            except NotImplementedError:
                if cfg is not None:  # a config of this backend was asked for: do not measure another kernel
                    raise
        if problem != "ragged_k":
            return self._triton().prepare(problem, a, b, num_groups, out_dtype, None, scale)
        self._check(a)
        from ragdot.kernels.gluon.ragged_k import Prepared

        return _KernelCall(Prepared(a, b, num_groups, out_dtype, cfg, from_sizes=True, scale=scale))

    def ragged_m(self, a, b, group_ends, out_dtype, config: GluonConfig | None = None) -> torch.Tensor:
        self._check(a)
        from ragdot.kernels.gluon.ragged_m import ragged_m

        try:
            return ragged_m(a, b, group_ends, out_dtype, config=config)
        except NotImplementedError:
            if config is not None:
                raise
        return self._triton().ragged_m(a, b, group_ends, out_dtype)

    def ragged_k(self, a, b, group_ends, out_dtype, config: GluonConfig | None = None) -> torch.Tensor:
        self._check(a)
        from ragdot.kernels.gluon.ragged_k import ragged_k

        return ragged_k(a, b, group_ends, out_dtype, config=config)

    def batch(self, a, b, out_dtype, config: Any = None) -> torch.Tensor:
        return self._triton().batch(a, b, out_dtype)


BACKEND = GluonBackend()
