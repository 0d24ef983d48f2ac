"""PNG plots of a benchmark run (matplotlib, Agg): speedup over `padded` and % of speed of light.

One figure per routing and metric, one panel per class, shapes along x, one bar per backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ragdot.bench.runner import Result

__all__ = ["plot_results"]

_SKIP = {"reference"}  # the oracle is checked against, not plotted


def _figure(results: Sequence[Result], routing: str, metric: str, path: Path, title: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = [r for r in results if r.routing == routing and r.backend not in _SKIP]
    if metric == "speedup":
        rows = [r for r in rows if r.backend != "padded"]
    value = (lambda r: r.speedup_vs_padded) if metric == "speedup" else (lambda r: r.pct_sol)
    if not any(value(r) for r in rows):
        return None
    classes = list(dict.fromkeys(r.cls for r in rows))
    shapes = list(dict.fromkeys(r.shape.name for r in rows))
    backends = list(dict.fromkeys(r.backend for r in rows))
    ncols = min(3, len(classes))
    nrows = (len(classes) + ncols - 1) // ncols
    width = max(6.0, 0.45 * len(shapes) * max(1, len(backends)) / 2 + 2)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 4.2 * nrows), squeeze=False)
    bar = 0.8 / max(1, len(backends))
    for ax, cls in zip(axes.flat, classes, strict=False):
        for j, backend in enumerate(backends):
            by_shape = {r.shape.name: value(r) for r in rows if r.cls == cls and r.backend == backend}
            xs = [i + (j - (len(backends) - 1) / 2) * bar for i in range(len(shapes))]
            ax.bar(xs, [by_shape.get(s) or 0.0 for s in shapes], width=bar, label=backend)
        ax.set_title(cls)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=35, ha="right", fontsize=8)
        if metric == "speedup":
            ax.set_yscale("log")
            times = FuncFormatter(lambda v, _: f"{v:g}x")
            ax.yaxis.set_major_formatter(times)
            ax.yaxis.set_minor_formatter(times)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_ylabel("speedup over padded (x)")
        else:
            ax.set_ylim(0, 100)
            ax.set_ylabel("% of speed of light")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(classes) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_results(results: Sequence[Result], out_dir: Path, stem: str, title: str) -> list[Path]:
    """Write the speedup and % SOL figures for each routing present; returns the files written."""
    written = []
    for routing in dict.fromkeys(r.routing for r in results):
        for metric, label in (("speedup", "speedup over padded"), ("sol", "% of speed of light")):
            path = out_dir / f"{stem}-{metric}-{routing}.png"
            done = _figure(results, routing, metric, path, f"{title}: {label}, {routing} routing")
            if done is not None:
                written.append(done)
    return written
