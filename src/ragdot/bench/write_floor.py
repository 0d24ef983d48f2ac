"""Writes as a second floor under a bench cell's time: a diagnosis beside its % of speed of light.

The speed of light of `ragdot bench` (docs/benchmarks.md, DESIGN.md section 5) bounds a cell's bytes by the
device's copy bandwidth (reads plus writes). A stream that only writes runs slower on the H200: `fill_` of 4 GiB
3.37 TB/s against the copy's 4.26 (`benchmarks/results/kernel-study/bandwidth-1276eaa.txt`), 3.19 TB/s for a
403 MB output (`h200-20261204/t2/write.txt`). A cell writes its output once, so it cannot finish before

    write floor = output bytes / write bandwidth

and where that floor exceeds its speed of light the cell cannot reach 100% of it: its cap is
100 x speed of light / max(speed of light, write floor). `markdown` lists, per system, routing and clock view,
the mean % of speed of light beside the largest mean the caps allow, and each capped cell's % of its write
floor. The speed of light itself (and every "% of speed of light" the targets name) is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragdot.bench.summary import Row, view_title
from ragdot.measure.classes import flops, get_class
from ragdot.shapes import Shape

__all__ = ["output_bytes", "cap_pct", "markdown"]


def _shape(row: Row) -> Shape:
    m, k, n, e = (int(x) for x in row.dims.split(","))
    return Shape(row.shape, m, k, n, e)


def output_bytes(row: Row) -> int | None:
    """Bytes of the cell's output, written once (None when the record does not name its dtype)."""
    dtype = getattr(torch, row.dtype, None) if row.dtype else None
    if not isinstance(dtype, torch.dtype):
        return None
    return math.prod(get_class(row.cls).shapes(_shape(row))[2]) * dtype.itemsize


def _cap_and_floor(row: Row, write_bps: float) -> tuple[float, float] | None:
    """(the largest % of speed of light the cell can reach with writes at `write_bps` bytes/s, its write floor in
    seconds) of a timed row; None without its dtype or speed of light."""
    out = output_bytes(row)
    if out is None or not row.sol_tflops or not row.timed:
        return None
    sol, floor = flops(_shape(row)) / (row.sol_tflops * 1e12), out / write_bps
    return (100.0 if floor <= sol else 100 * sol / floor), floor


def cap_pct(row: Row, write_bps: float) -> float | None:
    """The largest % of speed of light the cell can reach with writes at `write_bps` bytes/s."""
    found = _cap_and_floor(row, write_bps)
    return None if found is None else found[0]


def markdown(rows: Sequence[Row], write_bps: float) -> list[str]:
    """Markdown lines: per (system, routing, view) the mean % of speed of light, the mean of the caps, and the
    capped cells with their % of speed of light, cap and % of the write floor (floor / measured time)."""
    lines = [f"## Writes as a floor ({write_bps / 1e12:g} TB/s write-only)", "",
             "Per cell: write floor = output bytes / write bandwidth; cap = the largest % of speed of light "
             "the cell can reach under it. The speed of light is unchanged.", ""]
    groups: dict[tuple[str, str, str], list[tuple[Row, float, float]]] = {}
    for r in rows:
        found = _cap_and_floor(r, write_bps) if r.pct_sol is not None else None
        if found is not None:
            groups.setdefault((r.system, r.routing, r.view), []).append((r, *found))
    if not groups:
        return [*lines, "No timed row names its dtype and speed of light: nothing to bound.", ""]
    lines += ["| system | routing | view | cells | mean % SOL | mean of caps "
              "| capped cells (% SOL / cap / % of write floor) |", "|---|---|---|---|---|---|---|"]
    for (system, routing, view), group in sorted(groups.items()):
        capped = [f"{r.shape} {r.cls} {r.pct_sol:.1f} / {cap:.1f} / {100 * floor / (r.ms / 1e3):.0f}"
                  for r, cap, floor in group if cap < 100]
        mean_sol = sum(r.pct_sol for r, _, _ in group) / len(group)
        mean_cap = sum(cap for _, cap, _ in group) / len(group)
        lines.append(f"| {system} | {routing} | {view} | {len(group)} | {mean_sol:.1f} | {mean_cap:.1f} "
                     f"| {'; '.join(capped) or '-'} |")
    views = sorted({v for _, _, v in groups})
    return [*lines, "", *(f"- {v}: {view_title(v)}" for v in views), ""]
