"""What the Triton kernel tests share: the device, tolerances, interpreter-sized tiles, group ends, float64
references and operands (`test_triton_kernels.py`: ragged-M, batch, tail, configs; `test_triton_ragged_k.py`)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402

from ragdot.kernels import TileConfig  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
SMALL = TileConfig(16, 16, 16, group_m=2, num_warps=4, num_stages=2)  # interpreter-sized tiles
SMALL_PERSISTENT = TileConfig(16, 32, 16, group_m=1, num_warps=4, num_stages=2, persistent=True)
SMALL_PERSISTENT_K = TileConfig(16, 16, 16, group_m=2, num_warps=4, num_stages=2, persistent=True)


def ends_of(sizes: list[int], limit: int) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).clamp(max=limit).to(torch.int32).to(DEVICE)


def ref_ragged_m(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    a64, b64 = a.double().nan_to_num(0), b.double()
    c = torch.zeros(a.shape[0], a.shape[1], b.shape[-1], dtype=torch.float64, device=a.device)
    start = 0
    for g, end in enumerate(ends.tolist()):
        c[:, start:end] = a64[:, start:end] @ b64[:, g]
        start = max(start, end)
    return c


def ref_ragged_k(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(len(ends), a.shape[0], a.shape[2], b.shape[2], dtype=torch.float64, device=a.device)
    start = 0
    for g, end in enumerate(ends.tolist()):
        out[g] = a[:, start:end].double().transpose(1, 2) @ b[:, start:end].double()
        start = max(start, end)
    return out


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def operand(shape: tuple[int, ...], dtype: torch.dtype, transposed: bool) -> torch.Tensor:
    """Random tensor of `shape`; with `transposed`, a non-contiguous view with the last two dims swapped."""
    if transposed:
        return torch.randn(*shape[:-2], shape[-1], shape[-2], device=DEVICE).to(dtype).transpose(-1, -2)
    return torch.randn(*shape, device=DEVICE).to(dtype)
