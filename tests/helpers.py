"""Helpers shared by the backend suite: dtypes per backend and device, tolerances, inputs."""

from __future__ import annotations

import os

import torch

import ragdot

# Normalised error ||out - ref|| / ||ref|| allowed per input dtype.
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def dtypes_for(backend: str, device: torch.device) -> list[torch.dtype]:
    if device.type == "cpu":
        # The Triton interpreter computes bf16 dots wrongly: fp16/fp32 only there.
        return [torch.float32, torch.float16] if backend == "triton" else [torch.float32, torch.bfloat16]
    return [torch.bfloat16, torch.float32] if backend != "triton" else [torch.bfloat16, torch.float16, torch.float32]


# The backends the shared suites parametrize over. `gluon` (sm_90 GPUs) serves a subset by design: 16-bit
# operands, K a multiple of its block, 16-byte rows; asked for by name it raises NotImplementedError elsewhere,
# which `auto` turns into its next candidate. Its own suite (test_gluon.py) and `auto` cover it.
GENERAL_BACKENDS = [b for b in ragdot.backends() if b != "gluon"]


def backend_dtype_params(device: torch.device) -> list[tuple[str, torch.dtype]]:
    return [(b, dt) for b in GENERAL_BACKENDS for dt in dtypes_for(b, device)]


def rand(shape, dtype, device, gen, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def nerr(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


def bundled_ptxas() -> bool:
    """Whether Triton's NVIDIA backend ships its ptxas (sm_90 code can then be compiled on any machine)."""
    try:
        import triton
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))
