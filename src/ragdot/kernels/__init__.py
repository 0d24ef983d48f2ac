"""Triton Group-GEMM kernels, one family per canonical problem (see ragdot.backends for the contract).

    ragged_m(a [Bt,M,K], b [Bt,G,K,N], group_ends [G]) -> c [Bt,M,N]      forward / data gradient
    ragged_k(a [Bt,R,M], b [Bt,R,N], group_ends [G]) -> c [G,Bt,M,N]     weight gradient
    batch(a [Bt,M,K], b [Bt,K,N]) -> c [Bt,M,N]                          plain batched GEMM
    zero_tail_rows_(c [Bt,M,N], group_ends [G])                          zero rows >= group_ends[-1]

Each lives in the module of its name (`ragdot.kernels.ragged_m.ragged_m`, ...), beside `launch`, which
also returns the launched kernel handle. `compile_only()` turns launches into compiles for a GPU target on
any machine (`resource_usage` then reports wgmma use, registers and spills). Every launcher takes an
optional `config=` (a `TileConfig`); None uses `pick_config`'s heuristic.
"""

from ragdot.kernels import batch, ragged_k, ragged_m
from ragdot.kernels.configs import (
    TileConfig,
    candidate_configs,
    compile_only,
    pick_config,
    resource_usage,
    tuning_configs,
)
from ragdot.kernels.tail import zero_tail_rows_

__all__ = [
    "TileConfig",
    "batch",
    "candidate_configs",
    "compile_only",
    "pick_config",
    "ragged_k",
    "ragged_m",
    "resource_usage",
    "tuning_configs",
    "zero_tail_rows_",
]
