"""What every backend shares: the protocol's default methods (configs, preparation for a static signature)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ragdot.groups import group_ends_from_sizes

__all__ = ["BackendBase", "Prepared"]

# A problem prepared for one static signature: (a, b, group_sizes) -> c for ragged_m / ragged_k, and
# (a, b, None) -> c for batch; operands with exactly the shapes, strides and dtypes it was prepared for.
# group_sizes are the raw sizes ([G], any integer dtype, on the operands' device, contiguous): negatives count
# as 0 and the ends are clamped to the ragged extent (a.shape[1]) by the backend, `scale` rows per unit.
Prepared = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


class BackendBase:
    """Defaults for a backend without configs of its own: one way to run each problem, nothing to tune."""

    name: str = "?"
    config_type: type | None = None  # the frozen dataclass of the backend's launch configs, if it has any
    # Whether its prepared calls can write a caller's buffer (`fn.prepared(a, b, sizes, out)`): a caller
    # that needs the result in a buffer of its own (the JAX bridge: XLA's output) copies the others' results.
    writes_into: bool = False

    def is_available(self) -> bool:
        return True

    # ---- configs: the backend owns their type, default, tuning candidates and (de)serialisation -----------
    def default_config(self, problem: str, dims: tuple[int, int, int, int], dtype: torch.dtype) -> Any:
        """The config used without a measured one (None: the backend has no configs). dims = (M, K, N, G)
        for ragged_m and batch, (M, R, N, G) for ragged_k (R the ragged contraction)."""
        return None

    def tuning_configs(
        self, problem: str, dims: tuple[int, int, int, int], dtype: torch.dtype, limit: int,
        device: torch.device | None = None, b_kmajor: bool = False,
    ) -> list[Any]:
        """The configs the autotuner measures for this problem on `device` ([None]: just the backend itself);
        `b_kmajor`: ragged_m's B is column-major (K contiguous)."""
        return [None]

    def config_to_dict(self, config: Any) -> dict[str, Any] | None:
        return None

    def config_from_dict(self, data: dict[str, Any] | None) -> Any:
        return None

    def config_label(self, config: Any) -> str:
        return self.name

    # ---- running ---------------------------------------------------------------------------------------------
    def prepare(
        self, problem: str, a: torch.Tensor, b: torch.Tensor, num_groups: int, out_dtype: torch.dtype,
        config: Any = None, scale: int = 1,
    ) -> Prepared:
        """Resolve what depends only on the static signature of (a, b) and return the call that runs it.

        Raises NotImplementedError when the backend cannot serve this signature at all."""
        fn = getattr(self, problem)
        if problem == "batch":
            return lambda a, b, sizes: fn(a, b, out_dtype)
        extent = a.shape[1]
        return lambda a, b, sizes: fn(a, b, group_ends_from_sizes(sizes, extent, scale), out_dtype)
