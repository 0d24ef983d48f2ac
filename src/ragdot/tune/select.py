"""Measured backend and config selection for `backend=None` / `"auto"`.

For each call: the cached best (backend, Triton config) for its key; the heuristic order when there is no
entry (with one warning per GPU that has no shipped results); tuning at call time only with
`RAGDOT_AUTOTUNE=1`. The choice is a pure function of the key and the cache, hence deterministic, and it
never synchronises with the device.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from ragdot.backends import candidates
from ragdot.tune.cache import CACHE
from ragdot.tune.key import TuneKey, key_for

__all__ = ["plan", "tuned_entry", "config_from_dict"]

_warned: set[str] = set()


def config_from_dict(data: dict[str, Any] | None):
    if data is None:
        return None
    from ragdot.kernels.configs import TileConfig

    return TileConfig(**data)


def tuned_entry(key: TuneKey) -> dict[str, Any] | None:
    entry = CACHE.get(key.text(), key.device)
    if entry is None and os.environ.get("RAGDOT_AUTOTUNE", "") == "1":
        from ragdot.tune.tuner import tune_key

        entry = tune_key(key)
    if entry is None and key.device not in _warned and not CACHE.has_shipped(key.device):
        _warned.add(key.device)
        warnings.warn(
            f"ragdot: no tuned results for {key.device}; choosing backends and tiles by heuristics "
            "(run `ragdot tune` once to measure them, or set RAGDOT_AUTOTUNE=1)",
            stacklevel=4,
        )
    return entry


def plan(
    problem: str, requested: str, a: torch.Tensor, b: torch.Tensor, num_groups: int, out_dtype: torch.dtype
) -> list[tuple[str, Any]]:
    """The (backend, config) pairs to try in order. Configs only ever go to the Triton backend."""
    if a.device.type != "cuda":
        names = candidates(a.device) if requested == "auto" else [requested]
        return [(name, None) for name in names]
    if requested not in ("auto", "triton"):
        return [(requested, None)]
    entry = tuned_entry(key_for(problem, a, b, num_groups, out_dtype))
    triton_cfg = config_from_dict(entry.get("triton_config")) if entry else None
    if requested == "triton":
        return [("triton", triton_cfg)]
    names = candidates(a.device)
    if entry is not None and entry["backend"] in names:
        names = [entry["backend"], *[n for n in names if n != entry["backend"]]]
    return [(name, triton_cfg if name == "triton" else None) for name in names]
