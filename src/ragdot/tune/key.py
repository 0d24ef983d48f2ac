"""Tuning keys: what a measured choice is valid for.

A key holds the device name, the dtypes, the canonical problem, its static sizes, the operand layouts and
the ragged extent bucketed (never the exact runtime token count), plus the library version:

    ragged_m  a [Bt, M, K] x b [Bt, G, K, N]   static (Bt, K, N, G), bucket of M
    ragged_k  a [Bt, R, M] x b [Bt, R, N]      static (Bt, M, N, G), bucket of R
    batch     a [Bt, M, K] x b [Bt, K, N]      static (Bt, K, N, 0), bucket of M
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TuneKey", "bucket", "key_for", "device_name", "layout_of"]


def bucket(n: int) -> int:
    """The smallest of 16, 24, 32, 48, 64, 96, ... (2^k and 1.5 * 2^k) that is >= n."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    value = 16
    while value < n:
        half = value + value // 2
        if half >= n and value >= 16:
            return half
        value *= 2
    return value


_NAMES: dict[tuple[str, int | None], str] = {}


def device_name(device: torch.device) -> str:
    """The GPU's marketing name ('NVIDIA H200'), or the device type off the GPU; memoized per device."""
    key = (device.type, device.index)
    if key not in _NAMES:
        _NAMES[key] = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return _NAMES[key]


def layout_of(t: torch.Tensor) -> str:
    """'r' when the last dim is contiguous, 'c' when the second-to-last is, 's' otherwise."""
    if t.stride(-1) == 1:
        return "r"
    if t.stride(-2) == 1:
        return "c"
    return "s"


@dataclass(frozen=True)
class TuneKey:
    device: str
    dtype: str
    out_dtype: str
    problem: str
    sizes: tuple[int, int, int, int]
    layout: str
    bucket: int
    version: str

    @property
    def b_kmajor(self) -> bool:
        """Whether a ragged_m key's B is not row-major (the tile heuristic's `b_kmajor`)."""
        return self.problem == "ragged_m" and self.layout[3] != "r"

    def text(self) -> str:
        sizes = "x".join(str(s) for s in self.sizes)
        return (
            f"{self.device}|{self.dtype}->{self.out_dtype}|{self.problem}|{sizes}|{self.layout}|"
            f"<={self.bucket}|v{self.version}"
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def key_for(problem: str, a: torch.Tensor, b: torch.Tensor, num_groups: int, out_dtype: torch.dtype) -> TuneKey:
    from ragdot._version import __version__

    if problem == "ragged_m":
        sizes, extent = (a.shape[0], a.shape[2], b.shape[3], num_groups), a.shape[1]
    elif problem == "ragged_k":
        sizes, extent = (a.shape[0], a.shape[2], b.shape[2], num_groups), a.shape[1]
    elif problem == "batch":
        sizes, extent = (a.shape[0], a.shape[2], b.shape[2], 0), a.shape[1]
    else:
        raise ValueError(f"problem={problem!r}: expected ragged_m, ragged_k or batch")
    return TuneKey(
        device=device_name(a.device),
        dtype=_dtype_name(a.dtype),
        out_dtype=_dtype_name(out_dtype),
        problem=problem,
        sizes=tuple(int(s) for s in sizes),
        layout=f"a{layout_of(a)}b{layout_of(b)}",
        bucket=bucket(int(extent)),
        version=__version__,
    )
