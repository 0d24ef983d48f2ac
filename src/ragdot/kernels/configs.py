"""Tile configurations of the Triton kernels and the heuristic that picks one without tuning.

A `TileConfig` fixes everything that is a compile-time constant of a kernel launch. Every launcher takes an
optional `config=`; when it is None, `pick_config` chooses one from the problem's shape. The autotuner
enumerates `candidate_configs` and passes its winner explicitly.

Regimes (measured on one H200, bf16; see docs/kernels.md):
- ragged-M with few rows per group (tens of tokens per expert) is weight-bandwidth bound: a tile of rows
  covers the whole group so each weight byte is read once, and narrow N tiles give enough programs.
- ragged-M with 80+ rows per group is matrix bound: wgmma tiles, TMA loads, persistent programs; the tile
  height is chosen so a group wastes few computed rows (160 rows: 64-row tiles).
- ragged-K (weight gradient) writes G output matrices, mostly store bound: 128x128 tiles stored through TMA,
  three programs per multiprocessor.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from ragdot.kernels import record
from ragdot.kernels.interpreter import interpreting

Problem = Literal["ragged_m", "ragged_k", "batch"]
PROBLEMS: tuple[str, ...] = ("ragged_m", "ragged_k", "batch")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class TileConfig:
    """Compile-time constants of one kernel launch.

    block_m, block_n, block_k: tile of the output rows, output columns and contraction (powers of two >= 16).
    group_m: tiles along M walked together before moving along N (L2 reuse of the weight tile); 1 walks N
        fastest (the grid-order swap).
    num_warps, num_stages: Triton launch options (warps per program, software-pipelining depth).
    persistent: launch about `programs_per_sm` programs per multiprocessor that loop over tiles, instead of
        one program per tile (ragged_m only).
    tma: use tensor descriptors (TMA) where the layout allows it, on NVIDIA GPUs of compute capability >= 9:
        operand loads in ragged_m, the output store in ragged_k; elsewhere the pointer path (also ROCm).
    max_regs: register cap per thread (0: none), to fit more programs per multiprocessor (NVIDIA only).
    flat: persistent with TMA loads. ragged_m: each program runs the K steps of all its tiles as one loop,
        so the software pipeline loads the next tile's operands while the current tile finishes and stores.
        ragged_k (whose persistent kernel is always one such loop): a and b rows come through ragged TMA views
        clipped at each group's end instead of masked pointer loads (row-major operands on sm_90).
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    persistent: bool = False
    programs_per_sm: int = 1
    tma: bool = False
    max_regs: int = 0
    flat: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or not _is_pow2(value) or not 16 <= value <= 512:
                raise ValueError(f"TileConfig.{name}={value!r}: expected a power of two in [16, 512]")
        if not isinstance(self.group_m, int) or self.group_m < 1:
            raise ValueError(f"TileConfig.group_m={self.group_m!r}: expected an int >= 1")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"TileConfig.num_warps={self.num_warps!r}: expected one of 1, 2, 4, 8, 16")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"TileConfig.num_stages={self.num_stages!r}: expected an int in [1, 8]")
        if not isinstance(self.max_regs, int) or not (self.max_regs == 0 or 24 <= self.max_regs <= 255):
            raise ValueError(f"TileConfig.max_regs={self.max_regs!r}: expected 0 (no cap) or an int in [24, 255]")
        if self.flat and not (self.persistent and self.tma):
            raise ValueError("TileConfig.flat needs persistent=True and tma=True")
        if not isinstance(self.programs_per_sm, int) or self.programs_per_sm < 1:
            raise ValueError(f"TileConfig.programs_per_sm={self.programs_per_sm!r}: expected an int >= 1")

    def short(self) -> str:
        """A compact name, e.g. `128x128x64 g8 w4 s3` (+ ` p2` when persistent with 2 programs per SM)."""
        text = f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} s{self.num_stages}"
        text += f" p{self.programs_per_sm}" if self.persistent else ""
        text += f" r{self.max_regs}" if self.max_regs else ""
        text += " tma" if self.tma else ""
        return text + (" flat" if self.flat else "")


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _for_dtype(cfg: TileConfig, dtype: torch.dtype) -> TileConfig:
    """Adapt a 16-bit config to float32 inputs.

    Full-precision float32 dots run on the FMA units (no wgmma): large tiles would spill, so a 64x128 tile
    is used. With TF32 allowed the tensor cores run and only block_k halves, to keep the pipelined stages in
    shared memory.
    """
    if _dtype_bytes(dtype) < 4:
        return cfg
    if dot_precision(dtype) == "ieee":
        return TileConfig(64, 128, 32, group_m=cfg.group_m, num_warps=4, num_stages=3)
    return replace(cfg, block_k=cfg.block_k // 2) if cfg.block_k > 32 else cfg


def _padded_rows(rows: float, block_m: int) -> float:
    """Rows a group of `rows` occupies in tiles of `block_m` (the tile rows the MMA computes)."""
    return -(-max(rows, 1) // block_m) * block_m


# 128x128x64 tiles, two flat persistent programs per SM (one's epilogue overlaps the other's main loop; each
# prefetches its next tile): ragged-M's tile for short groups and for some long ones (below)
_FLAT_128 = TileConfig(128, 128, 64, group_m=8, num_warps=4, num_stages=3, persistent=True, programs_per_sm=2,
                       tma=True, flat=True)


def _ragged_m_config(m: int, k: int, n: int, g: int, wide_shared: bool, b_kmajor: bool, b_row_bytes: int
                     ) -> TileConfig:
    """`b_row_bytes`: the bytes of one row of a row-major B (n elements)."""
    rows = m / max(g, 1)  # average rows per group: the compile-time estimate M / G
    if rows <= 16:
        # decode: a few rows per group, the active groups' weights read once at the memory's pace; 16-row tiles
        # with long K steps keep more loads in flight per program (H200 graph replays, 1-row groups over
        # 32-64 experts: 16x128x128 1.45-1.86x the raw grouped GEMM and 1.1-1.7x the 64x128x64 tile,
        # benchmarks/results/h200-20261203g); 147 KB of shared memory, so 16x64x128 (82 KB, within 0-11%)
        # where a block gets less
        return TileConfig(16, 128 if wide_shared else 64, 128, group_m=1, num_warps=4, num_stages=4)
    if rows <= 64:
        # weight-bandwidth bound: one 64-row tile covers a group, each weight tile is read once
        return TileConfig(64, 128, 64, group_m=1, num_warps=4, num_stages=4)
    if rows < 256 and _padded_rows(rows, 64) <= 0.8 * _padded_rows(rows, 128):
        # e.g. 160 rows: 128-row tiles compute 256 rows, 64-row tiles 192; flat persistent loop
        # (measured 1.13-1.24x torch on qwen3-235b, unflattened 1.10-1.17x)
        return TileConfig(64, 256, 64, group_m=8, num_warps=4, num_stages=4, persistent=True, tma=True, flat=True)
    if rows < 256:
        # matrix bound with short groups: 1.11-1.38x torch at 80 rows
        return _FLAT_128
    if b_kmajor and rows < 512:
        # groups of 256 to 511 rows with B column-major (a data gradient's transposed weight): the 128x128 tile,
        # two flat programs per SM, beat 128x256 in every such key tuned: 1.10-1.11x on an H100 at 256 rows
        # (gpt-oss-like's layer, 2880 -> 2880 and 5760 -> 2880, benchmarks/results/h100-20261206v) and 1.01-1.07x
        # on an H200 at deepseek2-16b's anchors; at 512 rows with long contractions it lost (mixtral-8x7b on an
        # H100: 0.86x), so longer groups keep the rules below
        return _FLAT_128
    if _narrow(n) and _rows_load_whole(b_kmajor, b_row_bytes):
        # long groups where 256-wide tiles would compute over 15% more columns than 128-wide ones (widths in
        # (256, 384] and (512, 640]: gpt-oss-120b's expert width under 8-way tensor parallelism, 360, computes 512
        # columns against 384). Measured on an H100 (benchmarks/results/h100-20261206u, graph and eager clocks):
        # B column-major (K contiguous: a data gradient's transposed weight) 1.07-1.17x the 128x256 tile at
        # widths 352, 360, 384 and 640; B row-major 1.06-1.24x at 352, 384 and 640 (the tuner: 1.06-1.29x at
        # 320 too), but 0.84-0.87x at 360 (balanced groups, K 2048 to 4096), whose 720-byte rows are 16-byte
        # aligned only: a row-major B keeps 128x256 unless its rows are 64-byte multiples.
        return _FLAT_128
    # long groups: large wgmma tiles, TMA loads, one flat persistent program per SM
    return TileConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=3, persistent=True, tma=True, flat=True)


_WIDE_WASTE = 1.15  # the most extra columns a 256-wide tile may compute over a 128-wide one


def _narrow(n: int) -> bool:
    """Whether 256-wide tiles would compute over 15% more of the `n` output columns than 128-wide ones."""
    return _padded_cols(n, 256) > _WIDE_WASTE * _padded_cols(n, 128)


def _rows_load_whole(b_kmajor: bool, b_row_bytes: int) -> bool:
    """Whether the 128-wide tile reads B well: B column-major, or row-major with rows of 64-byte multiples."""
    return b_kmajor or b_row_bytes % 64 == 0


def vendor_beats_tiles(m: int, n: int, g: int, dtype: torch.dtype, b_kmajor: bool) -> bool:
    """ragged_m calls (dims, `dtype` and `b_kmajor` as `pick_config`'s) where the vendor grouped GEMM beat every
    Triton and Gluon tile measured: 16-bit operands, groups of 256+ rows, a narrow output (`_narrow`) and a
    row-major B whose rows (n elements) are no 64-byte multiple. bf16 width 360 on an H100, the tuner's clock:
    the vendor 1.01-1.17x the best other candidate at K 2048, 2880 and 4096 (benchmarks/results/h100-20261206t
    and h100-20261206u)."""
    size = _dtype_bytes(dtype)
    return (size == 2 and m >= 256 * max(g, 1) and _narrow(n)
            and not _rows_load_whole(b_kmajor, n * size))


def _padded_cols(n: int, block_n: int) -> int:
    """Output columns the tiles of width `block_n` compute for an output `n` wide."""
    return -(-max(n, 1) // block_n) * block_n


def _ragged_k_config(r: int, m: int, n: int, g: int, tma_loads: bool) -> TileConfig:
    if tma_loads:
        # sm_90: two persistent programs per multiprocessor read their rows through ragged TMA views; this
        # tile won all 14 anchor weight-gradient problems among the Triton configs, 3-26% ahead of the best
        # pointer-load tile (mixtral-8x7b 7.05-7.27 ms against 9.50; benchmarks/results/h200-20261203b)
        return TileConfig(128, 128, 32, group_m=8, num_warps=4, num_stages=4, persistent=True, programs_per_sm=2,
                          tma=True, flat=True)
    # short contractions (tens to hundreds of tokens per group): the output store dominates, so the tile is
    # stored through TMA and three programs share a multiprocessor (160 registers, 48-64 KB shared memory)
    # to overlap one's epilogue with the others' loads; a fourth stage pays below ~256 tokens per group
    # (measured +4-10%), three stages above (mixtral, 480 tokens: s4 0.89x vs s3 0.90x).
    tokens = r / max(g, 1)
    return TileConfig(128, 128, 32, group_m=8, num_warps=4, num_stages=4 if tokens < 256 else 3, tma=True)


# Configs that won or came within a few percent in measured sweeps (H200, bf16, benchmarks/triton_dev.py),
# per problem and regime: what the autotuner tries after the heuristic's pick.
_TUNE_SPACE: dict[str, tuple[tuple[str, TileConfig], ...]] = {
    "ragged_m": (
        ("small", TileConfig(16, 128, 128, 1, 4, 4)),
        ("small", TileConfig(16, 64, 128, 1, 4, 4)),
        ("small", TileConfig(64, 128, 64, 1, 4, 4)),
        ("small", TileConfig(64, 256, 64, 8, 4, 4, True, 1, tma=True, flat=True)),
        ("small", TileConfig(128, 128, 64, 8, 4, 3, True, 2, tma=True, flat=True)),
        ("small", TileConfig(64, 256, 32, 8, 4, 4, True, 2, tma=True, flat=True)),
        ("large", TileConfig(128, 128, 64, 8, 4, 3, True, 2, tma=True, flat=True)),
        ("large", TileConfig(64, 256, 64, 8, 4, 4, True, 1, tma=True, flat=True)),
        ("large", TileConfig(64, 256, 32, 8, 4, 4, True, 2, tma=True, flat=True)),
        ("large", TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True, flat=True)),
        ("large", TileConfig(64, 256, 32, 8, 4, 4, True, 2, tma=True)),
        ("large", TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True)),
        ("large", TileConfig(128, 128, 64, 8, 4, 3, True, 2, tma=True)),
    ),
    "ragged_k": (
        ("any", TileConfig(128, 128, 32, 8, 4, 3, tma=True)),
        ("any", TileConfig(128, 128, 32, 8, 4, 4, tma=True)),
        ("any", TileConfig(128, 128, 16, 8, 4, 5, tma=True)),
        ("any", TileConfig(128, 128, 32, 8, 4, 4, True, 2, tma=True)),
        ("any", TileConfig(64, 256, 32, 8, 4, 3, tma=True)),
        ("any", TileConfig(64, 128, 32, 8, 4, 3, tma=True)),
        ("any", TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True, flat=True)),
        ("any", TileConfig(128, 128, 64, 8, 4, 4, True, 1, tma=True, flat=True)),
        ("any", TileConfig(128, 128, 32, 8, 4, 4, True, 2, tma=True, flat=True)),
    ),
    "batch": (),
}


def tuning_configs(
    problem: Problem, m: int, k: int, n: int, g: int, dtype: torch.dtype, limit: int = 8,
    device: torch.device | str | None = None, b_kmajor: bool = False,
) -> list[TileConfig]:
    """Up to `limit` configs for the autotuner to measure: the heuristic's pick for `device` and B's layout (the
    tile a call there runs untuned), then the measured-strong configs of the problem's regime (dims and
    `b_kmajor` as in `pick_config`)."""
    heuristic = pick_config(problem, m, k, n, g, dtype, device, b_kmajor)
    regime = "small" if problem == "ragged_m" and m / max(g, 1) <= 64 else "large"
    out = [heuristic]
    for tag, cfg in _TUNE_SPACE[problem]:
        cfg = _for_dtype(cfg, dtype)
        if tag in (regime, "any") and cfg not in out:
            out.append(cfg)
    return out[: max(limit, 1)]


def _batch_config(m: int, k: int, n: int, bt: int) -> TileConfig:
    if m >= 128 and n >= 256:
        return TileConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=3)
    return TileConfig(64, 128, 64, group_m=8, num_warps=4, num_stages=4)


def gather_config(r: int, m: int, n: int, g: int, dtype: torch.dtype, device: torch.device | str) -> TileConfig:
    """The heuristic's ragged_k tile when one operand is read through a row index (`ragged_k(a_rows=...)`;
    dims as `pick_config`'s). The index load takes a stage of the software pipeline, leaving fewer operand
    buffers than the stage count: on sm_90 a 128x256x64 tile with five stages (three buffers, 213 KB of shared
    memory) measured fastest of eight (H200, bf16, graph clock, the MoE layer's gate|up weight gradient at four
    layer widths: 474-527 TFLOP/s against 271-318 for `pick_config`'s 128x128x32 s4; benchmarks/results/
    h200-20261204e/w1/wgrad.txt), where a block may take that much (`wide_shared_memory`); elsewhere
    `pick_config`'s tile."""
    device = torch.device(device)
    if tma_capable(device) and wide_shared_memory(device) and _dtype_bytes(dtype) == 2:
        return TileConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=5, persistent=True, tma=True, flat=True)
    return pick_config("ragged_k", m, r, n, g, dtype, device)


def pick_config(
    problem: Problem, m: int, k: int, n: int, g: int, dtype: torch.dtype, device: torch.device | str | None = None,
    b_kmajor: bool = False,
) -> TileConfig:
    """The heuristic's config for one problem.

    ragged_m: A[m, k] x B[g, k, n]; ragged_k: A[k, m] x B[k, n] -> [g, m, n] (k is the ragged token axis);
    batch: g is the batch count. `device`: ragged_k picks its TMA-load tile where the device can run it
    (`tma_capable`; without a device, the pointer-load tile every backend runs). `b_kmajor`: ragged_m's B is
    column-major (K contiguous), which changes the tile at some narrow output widths (a row-major B is taken
    to have rows of n elements).
    """
    if problem == "ragged_m":
        wide_shared = device is not None and wide_shared_memory(torch.device(device))
        cfg = _ragged_m_config(m, k, n, g, wide_shared, b_kmajor, n * _dtype_bytes(dtype))
    elif problem == "ragged_k":
        cfg = _ragged_k_config(k, m, n, g, device is not None and tma_capable(torch.device(device)))
    elif problem == "batch":
        cfg = _batch_config(m, k, n, g)
    else:
        raise ValueError(f"problem={problem!r}: expected one of {', '.join(PROBLEMS)}")
    return _for_dtype(cfg, dtype)


def resolve_config(
    config: object, problem: Problem, m: int, k: int, n: int, g: int, a: torch.Tensor, b_kmajor: bool = False
) -> TileConfig:
    """A launcher's `config=` argument: a TileConfig as given, or the heuristic's pick for `a`'s dtype and
    device when None (dims and `b_kmajor` as in `pick_config`); TypeError for anything else."""
    if config is None:
        return pick_config(problem, m, k, n, g, a.dtype, a.device, b_kmajor)
    if not isinstance(config, TileConfig):
        raise TypeError(f"config: expected a TileConfig or None, got {type(config).__name__}")
    return config


def candidate_configs(problem: Problem, dtype: torch.dtype = torch.bfloat16) -> list[TileConfig]:
    """The space the autotuner searches for `problem` (the heuristic's picks are all inside it)."""
    if problem not in PROBLEMS:
        raise ValueError(f"problem={problem!r}: expected one of {', '.join(PROBLEMS)}")
    out: list[TileConfig] = []
    for bm, bn, bk, warps in (
        (32, 64, 128, 4),
        (64, 64, 128, 4),
        (64, 128, 64, 4),
        (64, 256, 64, 8),
        (128, 64, 64, 4),
        (128, 128, 32, 4),
        (128, 128, 64, 4),
        (128, 128, 64, 8),
        (128, 256, 32, 8),
        (128, 256, 64, 8),
        (256, 128, 64, 8),
    ):
        for stages in (3, 4):
            for group_m in (1, 8):
                for persistent in (False, True) if problem != "batch" else (False,):
                    for tma in (False, True) if problem != "batch" else (False,):
                        pps = (1 if bm * bn >= 128 * 256 else 2) if persistent else 1
                        for flat in (False, True) if problem != "batch" and persistent and tma else (False,):
                            cfg = TileConfig(bm, bn, bk, group_m, warps, stages, persistent, pps, tma, flat=flat)
                            out.append(_for_dtype(cfg, dtype))
    out += [_for_dtype(cfg, dtype) for _, cfg in _TUNE_SPACE[problem]]
    return sorted(set(out), key=TileConfig.short)


# ---- launch helpers shared by the kernel modules ----------------------------------------------------------

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input_precision: full float32 unless PyTorch's matmul setting allows TF32 (as torch.matmul)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


_SM_COUNT: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (the target's inside `compile_only`; 4 in the interpreter)."""
    if _AOT_TARGET is not None:
        return _AOT_TARGET.multiprocessors
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def check_operand(name: str, t: object, ndim: int) -> torch.Tensor:
    """TypeError/ValueError unless `t` is a tensor of a supported float dtype with `ndim` dimensions."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {t.dtype}")
    return t


def check_operands(a: object, b: object, b_ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`check_operand` on a ([..., 3 dims]) and b (`b_ndim` dims), plus one dtype and one device for both."""
    a, b = check_operand("a", a, 3), check_operand("b", b, b_ndim)
    if a.dtype != b.dtype:
        raise TypeError(f"b: expected the dtype of a ({a.dtype}), got {b.dtype}")
    if b.device != a.device:
        raise ValueError(f"b: expected device {a.device}, got {b.device}")
    return a, b


def check_group_ends(group_ends: object, g: int, device: torch.device) -> torch.Tensor:
    """The group ends as an int32/int64 [G] tensor on `device` (no copy when it already is one)."""
    if not isinstance(group_ends, torch.Tensor):
        raise TypeError(f"group_ends: expected a torch.Tensor, got {type(group_ends).__name__}")
    if group_ends.shape != (g,):
        raise ValueError(f"group_ends: expected shape ({g},), got {tuple(group_ends.shape)}")
    if group_ends.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"group_ends: expected dtype int32 or int64, got {group_ends.dtype}")
    if group_ends.device != device:
        raise ValueError(f"group_ends: expected device {device}, got {group_ends.device}")
    return group_ends if group_ends.is_contiguous() else group_ends.contiguous()


def make_output(
    name: str, out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """`out` checked to be contiguous with `shape`/`dtype`/`device`, or a new empty tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(
            f"{name}: expected a contiguous {dtype} tensor of shape {shape} on {device}, got "
            f"{out.dtype} {tuple(out.shape)} on {out.device} (contiguous={out.is_contiguous()})"
        )
    return out


def host_descriptor(base: torch.Tensor, shape: list[int], strides: list[int], block: list[int]) -> Any:
    """A Triton host TensorDescriptor of `base` without its constructor's checks: for callers that checked
    the static layout once (last dim contiguous, other strides 16-byte multiples) and the base's 16-byte
    alignment on this call."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    desc = object.__new__(TensorDescriptor)
    desc.__dict__.update(base=base, shape=shape, strides=strides, block_shape=block, padding="zero")
    return desc


def prepared_output(prepared: Any, out: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """The output of a prepared kernel call (`out`, or a new tensor of the prepared shape, dtype and device)
    and whether it is final already: an empty problem, or one with nothing to contract (all zeros)."""
    c = torch.empty(prepared.shape, dtype=prepared.out_dtype, device=prepared.device) if out is None else out
    if prepared.empty:
        return c, True
    if prepared.zero:
        rec = record.active()
        if rec is not None:
            rec.steps.append(("zero", c))
        return c.zero_(), True
    return c, False


def next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


# ---- compile-only mode: build for a GPU target on any machine (no launch) ---------------------------------


class _FakeDriver:
    """Answers the Triton JIT's driver queries for a GPU that is not there; launches become compiles."""

    def __init__(self, target: object) -> None:
        self.target = target

    def get_current_target(self) -> object:
        return self.target

    def get_current_device(self) -> str:
        return f"aot-{self.target}"  # a cache key of its own: never mixed with a real device's kernels

    def get_current_stream(self, device: object = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


@dataclass(frozen=True)
class _Target:
    backend: str  # "cuda" or "hip"
    arch: int | str  # 90 (sm_90) or e.g. "gfx942"
    multiprocessors: int


_AOT_TARGET: _Target | None = None  # the target of the enclosing `compile_only` block, if any


@contextlib.contextmanager
def compile_only(
    arch: int | str = 90, backend: str = "cuda", warp_size: int = 32, multiprocessors: int = 132
) -> Iterator[None]:
    """Inside this block the kernel launchers compile for `backend`/`arch` and return the compiled kernel
    without running it (tensors may live on the CPU; only their dtypes, strides and alignment matter).
    NVIDIA: backend "cuda", arch 90 (sm_90); AMD: backend "hip", arch e.g. "gfx942", warp_size 64.

    `multiprocessors` stands in for the target's SM count (persistent grids depend on it).
    Needs a process where TRITON_INTERPRET is not set (the interpreter compiles nothing) and, for CUDA
    targets, the ptxas that ships with Triton. Use it to check instructions (wgmma) and register spills.
    """
    global _AOT_TARGET
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    if interpreting():
        raise RuntimeError("compile_only: TRITON_INTERPRET=1 is set; Triton's interpreter compiles nothing")
    previous = driver._active
    driver.set_active(_FakeDriver(GPUTarget(backend, arch, warp_size)))
    _AOT_TARGET = _Target(backend, arch, multiprocessors)
    try:
        yield
    finally:
        _AOT_TARGET = None
        driver._active = previous


def tma_capable(device: torch.device) -> bool:
    """Whether kernels for `device` may use tensor descriptors (TMA): NVIDIA compute capability >= 9.0, or
    inside `compile_only`, whether its target is such a GPU."""
    if _AOT_TARGET is not None:
        return _AOT_TARGET.backend == "cuda" and isinstance(_AOT_TARGET.arch, int) and _AOT_TARGET.arch >= 90
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


_WIDE_SMEM: dict[int, bool] = {}


def wide_shared_memory(device: torch.device) -> bool:
    """Whether a block on `device` may take >= 160 KB of shared memory (A100, H100/H200, B200: 163-227 KB;
    consumer parts and AMD GPUs 64-100 KB), or inside `compile_only`, on its target."""
    if _AOT_TARGET is not None:
        arch = _AOT_TARGET.arch
        return _AOT_TARGET.backend == "cuda" and isinstance(arch, int) and (arch in (80, 87) or 90 <= arch < 120)
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _WIDE_SMEM:  # read once per device, as `num_sms`: the fused kernels ask on every call
        optin = getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0)
        _WIDE_SMEM[index] = optin >= 160 * 1024
    return _WIDE_SMEM[index]


def launch_options(cfg: TileConfig, device: torch.device) -> dict[str, Any]:
    """Triton launch options of a config: warps, stages and, on NVIDIA, the register cap."""
    opts: dict[str, Any] = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if _AOT_TARGET is not None:
        nvidia = _AOT_TARGET.backend == "cuda"
    else:
        nvidia = device.type == "cuda" and torch.version.hip is None
    if cfg.max_regs and nvidia:
        opts["maxnreg"] = cfg.max_regs
    return opts


def run_kernel(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
    """Launch a @triton.jit kernel on `grid` (or only compile it inside `compile_only`); returns its handle.
    Inside a `record.recording()` block the record is marked foreign (this launch is not in it)."""
    rec = record.active()
    if rec is not None:
        rec.foreign = True
    if _AOT_TARGET is not None:
        return kernel.warmup(*args, grid=grid, **kwargs)
    return kernel[grid](*args, **kwargs)


def resource_usage(handle: Any) -> dict[str, Any]:
    """{"wgmma": bool, "regs": int, "spills": int, "shared": int} of a kernel handle from a launcher.

    Works for kernels launched on a GPU and for kernels built inside `compile_only` (read with the
    cuobjdump that ships with Triton; spills are the local-memory/stack bytes of the cubin).
    """
    asm = handle.asm
    info: dict[str, Any] = {"wgmma": "wgmma" in asm.get("ptx", ""), "shared": int(handle.metadata.shared)}
    if getattr(handle, "n_regs", None) is not None and getattr(handle, "n_spills", None) is not None:
        info.update(regs=int(handle.n_regs), spills=int(handle.n_spills))
        return info
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(\w+):(\d+)", text.split("Function", 1)[-1]))
    info.update(regs=int(fields["REG"]), spills=int(fields.get("STACK", 0)) + int(fields.get("LOCAL", 0)))
    return info
