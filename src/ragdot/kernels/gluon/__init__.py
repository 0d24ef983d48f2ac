"""Hopper (sm_90) kernels written in Gluon (`triton.experimental.gluon`): explicit TMA, mbarriers, wgmma and
warp-specialized partitions, beside the portable Triton kernels of ragdot.kernels (which stay the fallback).

    ragged_k.ragged_k(a [Bt,R,M], b [Bt,R,N], group_ends [G]) -> c [G,Bt,M,N]   weight gradient (persistent,
                                                                              TMA producer warp + wgmma
                                                                              consumer warpgroup(s))
    ragged_k_gather.ragged_k_gather(x [S,M], index [R], b [R,N], ends [G])    the same with a's rows read
        -> c [G,M,N]                                                          through an index (cp.async producer)
    matmul.matmul(a [M,K], b [K,N]) -> c [M,N]                                 probes of the primitives

`config.GluonConfig` holds the launch configs; `common.unavailable_reason()` says why the kernels cannot
run here (None where they can). Importing this package imports no Gluon code; the kernel modules do.
"""

from ragdot.kernels.gluon.common import gluon_importable, unavailable_reason
from ragdot.kernels.gluon.config import GluonConfig, gluon_tuning_configs, pick_gluon_config

__all__ = ["GluonConfig", "gluon_importable", "gluon_tuning_configs", "pick_gluon_config", "unavailable_reason"]
