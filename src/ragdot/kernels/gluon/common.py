"""What the Gluon kernels share: availability, wgmma layouts, register budgets and host descriptors."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ragdot.kernels.interpreter import interpreting

__all__ = ["gluon_importable", "hopper_device", "unavailable_reason", "mma_layout", "store_layout", "maxnreg_for",
           "consumer_regs", "descriptor"]


def gluon_importable() -> bool:
    """Whether this Triton ships Gluon's Hopper pieces (triton.experimental.gluon, 3.5 and later)."""
    try:
        return importlib.util.find_spec("triton.experimental.gluon.language.nvidia.hopper") is not None
    except (ImportError, ValueError):
        return False


def hopper_device(device: torch.device | None = None) -> bool:
    """Whether `device` (default: the current CUDA device) is an NVIDIA sm_90 GPU outside the interpreter."""
    if interpreting() or torch.version.hip is not None:
        return False
    if not torch.cuda.is_available():
        return False
    if device is not None and device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """None where the Gluon kernels can run on `device`; otherwise why not, in one line (the cheap checks
    first, so that a machine without a Hopper GPU never imports Gluon for this)."""
    if interpreting():
        return "Gluon kernels do not run in Triton's interpreter (TRITON_INTERPRET=1)"
    if not hopper_device(device):
        return "the Gluon kernels need an NVIDIA sm_90 (Hopper) GPU"
    if not gluon_importable():
        return "this Triton has no Gluon (triton.experimental.gluon; Triton >= 3.5)"
    return None


def maxnreg_for(consumer_warps: int, worker_warps: int = 1) -> int:
    """Register cap per thread for a warp-specialized kernel: warps are allotted by warpgroup (4 warps), so
    `consumer_warps` plus the worker warps, rounded up to warpgroups, share the SM's 64 Ki registers."""
    groups = -(-consumer_warps // 4) + -(-worker_warps // 4)
    return min(256, (65536 // (groups * 128)) // 8 * 8)


def consumer_regs(cfg: Any, producer_regs: int | None = None) -> int:
    """Registers per thread of the second (worker) consumer of a ping-pong config (0: no second consumer).
    `setmaxnreg` moves registers by warpgroup and Triton raises the default partition to 256, so the worker
    consumer gets what is left of the SM's 64 Ki registers after that and the producer's warpgroup (232 with
    a 24-register producer): a larger request would wait forever for registers no warp gives back.
    `producer_regs`: the producer's registers where they are not the config's (a four-warp producer's)."""
    if cfg.consumers == 1:
        return 0
    producer = cfg.producer_regs if producer_regs is None else producer_regs
    return (65536 // 128 - 256 - producer) // 8 * 8


def descriptor(t: torch.Tensor, block: list[int]) -> Any:
    """A Gluon host TensorDescriptor of 2-D `t` (last dim contiguous) with an NVMMA shared layout for `block`."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[t.dtype]
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def store_layout(block_m: int, block_n: int, num_warps: int, elem_bytes: int) -> Any:
    """A BlockedLayout of a [block_m, block_n] tile whose threads each hold 16 contiguous bytes of a row, a warp's
    threads spanning as much of a row as the tile has (pointer stores of whole 128-byte lines)."""
    from triton.experimental.gluon import language as gl

    vec = max(1, 16 // elem_bytes)
    across = max(1, min(32, block_n // vec))
    return gl.BlockedLayout(size_per_thread=[1, vec], threads_per_warp=[32 // across, across],
                            warps_per_cta=[num_warps, 1], order=[1, 0])


def mma_layout(block_m: int, block_n: int, num_warps: int, dtype_bits: int = 16) -> Any:
    """The wgmma accumulator layout of a [block_m, block_n] tile over `num_warps` warps (4 per warpgroup,
    warpgroups stacked along M while block_m allows, instruction N as wide as the tile allows)."""
    from triton.experimental.gluon import language as gl

    warps = [4, 1]
    while warps[0] * warps[1] < num_warps:
        if block_m > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    per_n = block_n // warps[1]
    n = min(256, per_n)
    while n > 8 and (per_n % n or n % 8):
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, 256 // dtype_bits])
