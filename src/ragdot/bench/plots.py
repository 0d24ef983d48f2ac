"""PNG plots of a benchmark run (matplotlib, Agg): speedup over `vendor` and % of speed of light.

One figure per routing, clock view and metric, one panel per class, shapes along x, one bar per system
(`summary.plot`); a figure with no data is not written, nor any without matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ragdot.bench import summary
from ragdot.bench.runner import Result

__all__ = ["plot_results"]


def plot_results(results: Sequence[Result], out_dir: Path, stem: str, title: str) -> list[Path]:
    """Write ``<stem>-speedup-<routing>-<view>.png`` and ``-sol-`` where they have data; returns the files."""
    from ragdot.bench.report import summary_rows

    return summary.plot(summary_rows(results), out_dir / stem, title)
