"""Ragged TMA views: descriptors whose row bound is a group's end, for the Triton and Gluon kernels on sm_90.

A TMA load or store clips its box at the tensor's bounds and zero-fills (or drops) what lies past them. A
group's end is a runtime value, so a plain [rows, cols] descriptor cannot clip there. The view built here
adds two leading dimensions whose strides cancel modulo 2^64, so that a box at coordinates
``[RAGGED_BASE, stop, RAGGED_BASE - (stop - row), col]`` addresses row ``row`` while its third coordinate
counts up to RAGGED_BASE exactly at ``stop``: every row from ``stop`` on is out of bounds. Rows of the next
group, or NaN past the last group, never reach shared memory, and an empty group reads only zeros.
"""

from __future__ import annotations

import torch
import triton.language as tl

__all__ = ["RAGGED_BASE", "RAGGED_OUTER", "check_ragged_rows", "ragged_view", "rows_view", "vector_rows"]

#: the ragged views' row extent and the row coordinate that stands for a group's end
RAGGED_BASE = tl.constexpr(1 << 30)
RAGGED_OUTER = 0x7FFF0000  # extent of the two leading dimensions: any coordinate used fits below it


def ragged_view(cols: int, row_stride: int) -> tuple[list[int], list[int]]:
    """Shape and strides (elements) of a 4-D TMA view of a [rows, cols] row-major operand in which a box at
    [RAGGED_BASE, stop, RAGGED_BASE - size + k, col] reads rows stop - size + k, ... and sees the rows from
    `stop` on as out of bounds: the two leading strides sum to 2^34 and RAGGED_BASE * 2^34 wraps to 0 in the
    64-bit address, leaving (stop + k - size) * row_stride, while the third coordinate's extent RAGGED_BASE
    ends the box at `stop`. Needs rows <= RAGGED_BASE (`check_ragged_rows`)."""
    outer = (1 << 34) - row_stride
    return ([RAGGED_OUTER, RAGGED_OUTER, RAGGED_BASE.value, cols], [outer, row_stride, row_stride, 1])


def rows_view(t: torch.Tensor) -> tuple[int, int] | None:
    """(rows, row stride) of [Bt, R, X] `t` seen as [Bt*R, X] with X contiguous and 16-byte rows; None if it
    cannot be."""
    bt, r, x = t.shape
    if t.stride(2) != 1 and x > 1:
        return None
    if bt > 1 and t.stride(0) != r * t.stride(1):
        return None
    stride = t.stride(1) if r > 1 else (t.stride(0) if bt > 1 else x)
    if (stride * t.element_size()) % 16 or (x * t.element_size()) % 16:
        return None
    return bt * r, stride


def vector_rows(n: int, strides: tuple[int, ...] = ()) -> bool:
    """Whether an output's rows ([..., N] with these element strides) take vectorized pointer stores: Triton
    specializes integer arguments on divisibility by 16, and only where N and the strides have it does a tile's
    masked store go out as vectors. Elsewhere it is one store per element, and the large tiles spill (built for
    sm_90 with Triton 3.6's ptxas: ragged_k's 128x128 and 128x256 tiles keep 196-206 registers and no spills at
    N = 752, 255 registers and 336-792 bytes of spills at N = 744 or 760; ragged_m's 968-992 bytes at N = 744 and
    360; tests/test_kernel_codegen.py). The kernels store through TMA views there instead."""
    return all(x % 16 == 0 for x in (n, *strides))


def fits_ragged_rows(bt: int, rows: int) -> bool:
    """Whether `bt` batch entries of `rows` rows each fit the ragged views' int32 TMA coordinates."""
    return rows <= RAGGED_BASE.value and bt * rows < RAGGED_OUTER


def check_ragged_rows(kernel: str, bt: int, rows: int) -> None:
    """NotImplementedError unless `fits_ragged_rows(bt, rows)` (at most RAGGED_BASE rows an entry, fewer than
    RAGGED_OUTER in all)."""
    if not fits_ragged_rows(bt, rows):
        raise NotImplementedError(f"{kernel}: {bt} x {rows} rows (at most {RAGGED_BASE.value} a batch entry, "
                                  f"{RAGGED_OUTER - 1} in all)")
