"""Launch configs of the Gluon kernels (pure Python: no Triton import, so it loads and tests anywhere)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GluonConfig", "SHARED_BYTES", "pick_gluon_config", "gluon_tuning_configs", "pick_gluon_m_config",
           "gluon_m_tuning_configs"]

SHARED_BYTES = 232448  # shared memory one block may use on sm_90 (227 KiB)


@dataclass(frozen=True)
class GluonConfig:
    """One launch of the warp-specialized kernels: tile, ring depth, consumer warps (4 = one warpgroup, 8 = two
    cooperating on the tile), row tiles per band, registers of the producer warp, and consumer partitions
    (1; or 2 = ping-pong: two one-warpgroup consumers on alternate tiles, each with its own epilogue buffer,
    taking turns at the tensor cores so that one's epilogue runs under the other's main loop)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    num_warps: int = 4
    group_m: int = 8
    producer_regs: int = 24
    consumers: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"{name}: expected a power of two >= 16, got {value!r}")
        if self.block_m < 64:
            raise ValueError(f"block_m: wgmma needs at least 64 rows per tile, got {self.block_m}")
        if self.stages < 2:
            raise ValueError(f"stages: expected at least 2, got {self.stages}")
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps: expected 4 or 8 (one or two consumer warpgroups), got {self.num_warps}")
        if self.num_warps == 8 and self.block_m < 128:
            raise ValueError(f"num_warps: 8 consumer warps need block_m >= 128, got {self.block_m}")
        if self.group_m < 1:
            raise ValueError(f"group_m: expected >= 1, got {self.group_m}")
        if self.producer_regs % 8 or not 24 <= self.producer_regs <= 256:
            raise ValueError(f"producer_regs: expected a multiple of 8 in [24, 256], got {self.producer_regs}")
        if self.consumers not in (1, 2):
            raise ValueError(f"consumers: expected 1 or 2 (ping-pong), got {self.consumers!r}")
        if self.consumers == 2 and self.num_warps != 4:
            raise ValueError(f"num_warps: ping-pong consumers are one warpgroup each (4), got {self.num_warps}")

    def shared_bytes(self, in_bytes: int = 2, out_bytes: int = 2, epilogue_tiles: int = 1) -> int:
        """Shared memory of the ring, the epilogue tiles (`epilogue_tiles` per consumer: two for ragged_k's "tma2")
        and the barriers."""
        ring = self.stages * self.block_k * (self.block_m + self.block_n) * in_bytes
        tiles = epilogue_tiles * self.consumers * self.block_m * self.block_n * out_bytes
        return ring + tiles + 16 * self.stages + 1024

    def short(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k}s{self.stages}w{self.num_warps}"
                f"g{self.group_m}r{self.producer_regs}" + ("p2" if self.consumers == 2 else ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The first candidate that fits is the default. On the H200 (bf16, graph replays, the 16 anchor weight-gradient
# cells; benchmarks/results/h200-evening-20261201/): the cooperative 128x256 tile with 32-deep chunks in six
# stages won 10 of the 14 tuned problems (qwen3-235b 442-451 TFLOP/s against 373-377 for the next config,
# mixtral-8x7b's wgrad_wi 579 against the vendor's 538), ping-pong 128x128 the 80-row shapes' others, ping-pong
# 64x256 at M = 2880 and 704 (measured when tiles had to divide M; since the store clips at M, the 128-row tiles
# run there too). With a float32 output neither the 128x256 nor the ping-pong tiles fit: 128x128, one consumer.
_COOPERATIVE_32_DEEP = GluonConfig(128, 256, 32, 6, 8)
_CANDIDATES = (
    _COOPERATIVE_32_DEEP,
    GluonConfig(128, 128, 64, 5, 4, consumers=2),
    GluonConfig(64, 256, 64, 4, 4, consumers=2),
    GluonConfig(128, 128, 64, 4, 4, consumers=2),
    GluonConfig(128, 256, 64, 3, 8),
    GluonConfig(128, 128, 64, 4, 4),
    GluonConfig(128, 128, 64, 4, 8),
    GluonConfig(64, 128, 64, 5, 4),
    GluonConfig(128, 64, 64, 6, 4),
    GluonConfig(64, 256, 64, 4, 4),
    GluonConfig(64, 128, 64, 6, 4, consumers=2),
)


def _fits(cfg: GluonConfig, m: int, out_bytes: int) -> bool:
    """Shared memory, and no 128-row tile over fewer than 128 output rows (a 64-row one covers them)."""
    return cfg.shared_bytes(2, out_bytes) <= SHARED_BYTES and (m >= cfg.block_m or cfg.block_m == 64)


def gluon_tuning_configs(m: int, n: int, out_bytes: int = 2, limit: int | None = None) -> list[GluonConfig]:
    """The candidate configs a ragged_k problem with output [M, N] can run (M a multiple of block_m)."""
    fits = [c for c in _CANDIDATES if _fits(c, m, out_bytes)]
    if n <= 128:
        fits = [c for c in fits if c.block_n <= 128] or fits
    return fits[:limit] if limit else fits


def pick_gluon_config(m: int, n: int, out_bytes: int = 2) -> GluonConfig | None:
    """The default config for output [M, N] (None where no candidate fits shared memory)."""
    fits = gluon_tuning_configs(m, n, out_bytes)
    return fits[0] if fits else None


# The ragged_m (forward / data gradient) order, from the sweep of every config on the 16 anchor fwd_wi and
# dgrad_wi cells (H200, bf16, graph replays, geomean against the vendor; benchmarks/results/h200-night-20261201/):
# ping-pong 64x256 0.971x (best in 7 cells), one-consumer 64x256 0.961x (3), cooperative 128x256x64 0.940x (3),
# 128x256x32 0.929x (3: mixtral-8x7b, qwen3-235b's forward), the 128x128 and narrower tiles 0.77-0.94x. Every one
# trails the Triton kernel there (1.21-1.22x the vendor): the tuner keeps them as candidates, `auto` runs triton.
_M_CANDIDATES = tuple(_CANDIDATES[i] for i in (2, 9, 4, 0, 1, 3, 10, 6, 5, 7, 8))
_LONG_GROUP_ROWS = 384  # rows a group on average from which the 128x256x32 tile led (mixtral-8x7b: 480)


def gluon_m_tuning_configs(k: int, n: int, out_bytes: int = 2, limit: int | None = None) -> list[GluonConfig]:
    """The candidate configs of a ragged_m problem with contraction K and N output columns: those whose chunk
    depth divides K (a chunk never reaches into the next group's matrix) and whose tiles fit shared memory."""
    fits = [c for c in _M_CANDIDATES if k % c.block_k == 0 and c.shared_bytes(2, out_bytes) <= SHARED_BYTES]
    if n <= 128:
        fits = [c for c in fits if c.block_n <= 128] or fits
    return fits[:limit] if limit else fits


def pick_gluon_m_config(m: int, k: int, n: int, g: int, out_bytes: int = 2) -> GluonConfig | None:
    """The default ragged_m config: the cooperative 128x256x32 tile where groups hold 384 rows or more on
    average, else the first candidate that fits (ping-pong 64x256 for 16-bit outputs); None where K is not a
    multiple of 64 (the backend then runs the Triton kernel; 32-deep tiles take such K only when tuned)."""
    if k % 64:
        return None
    fits = gluon_m_tuning_configs(k, n, out_bytes)
    if m >= _LONG_GROUP_ROWS * max(g, 1) and _COOPERATIVE_32_DEEP in fits:
        return _COOPERATIVE_32_DEEP
    return fits[0] if fits else None
