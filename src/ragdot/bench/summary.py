"""Summaries of `ragdot bench` rows: markdown tables and PNG plots, the eager and device-time views side by side.

The same code summarises one run (`ragdot bench` writes ``<stem>.md`` and its plots) and committed CSVs
(`benchmarks/summarize.py`, which merges several). Rows are read by column name, so CSVs of earlier runs
work too (their clock ``event`` is today's ``eager``; a missing clock counts as ``eager``).

Views (`timing.view_of`): ``eager`` (clock eager: CUDA events around batches of back-to-back eager calls,
host time included; the JAX systems' batch clock, a wall clock around a batch of their calls, is shown
here too), ``graph`` (CUDA-graph replays: device time; the JAX systems' program clock, n calls in one
jitted program, is shown here too) and ``wall`` (a CPU's one clock). Every ratio is the
baseline's time over the system's in the same cell and view (> 1: faster than the baseline), the
baseline being `vendor` (raw ``torch._grouped_mm``) unless asked otherwise. A pass (fwd, dgrad, wgrad)
aggregates its two classes. No plot is written without data in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragdot.measure.timing import HOST_BOUND_SHARE, is_host_bound, view_of

__all__ = ["Row", "Stats", "PASSES", "BASELINE", "parse_rows", "merge", "ratios", "stats", "geomean",
           "views", "view_title", "markdown", "plot", "TIMED"]

PASSES = {"fwd": ("fwd_wi", "fwd_wo"), "dgrad": ("dgrad_wi", "dgrad_wo"), "wgrad": ("wgrad_wi", "wgrad_wo")}
BASELINE = "vendor"
TIMED = ("ok", "unchecked")
_VIEW_ORDER = ("eager", "graph", "wall")
_VIEW_TITLES = {
    "eager": "eager clock (CUDA events around batches of back-to-back eager calls, host time included; "
    "JAX systems: wall clock around a batch of calls)",
    "graph": "graph clock (CUDA-graph replays: device time; JAX systems: n calls in one jitted program)",
    "wall": "wall clock (CPU, per call)",
}
_VIEW_SHORT = {"eager": "eager calls, host time included", "graph": "CUDA-graph replays, device time",
               "wall": "CPU wall clock"}
_SKIP_PLOT = {"reference"}  # the oracle is checked against, not plotted


@dataclass(frozen=True)
class Row:
    """One result of a cell on one clock, as the summaries need it."""

    shape: str
    dims: str  # "M,K,N,E"
    cls: str
    routing: str
    system: str
    clock: str
    status: str
    ms: float | None
    tflops: float | None
    pct_sol: float | None
    sol_tflops: float | None
    host_ms: float | None
    dtype: str = ""  # the operands' dtype ("bfloat16", ...); "" in records that do not say

    @property
    def view(self) -> str:
        return view_of(self.clock)

    @property
    def timed(self) -> bool:
        return self.status in TIMED and bool(self.ms)

    @property
    def host_bound(self) -> bool:
        return self.timed and is_host_bound(self.clock, self.ms, self.host_ms)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.shape, self.cls, self.routing, self.system, self.clock)

    @property
    def cell(self) -> tuple[str, str, str, str]:
        return (self.shape, self.cls, self.routing, self.view)


def _float(value: Any) -> float | None:
    if value is None or value == "":
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_rows(dicts: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Rows from CSV/JSON records (`report.result_rows` or a committed CSV)."""
    rows = []
    for d in dicts:
        clock = str(d.get("clock") or "eager")
        rows.append(Row(
            shape=str(d["shape"]),
            dims=f"{d['M']},{d['K']},{d['N']},{d['E']}",
            cls=str(d["cls"]),
            routing=str(d["routing"]),
            system=str(d["backend"]),
            clock="eager" if clock == "event" else clock,
            status=str(d["status"]),
            ms=_float(d.get("ms")),
            tflops=_float(d.get("tflops")),
            pct_sol=_float(d.get("pct_sol")),
            sol_tflops=_float(d.get("sol_tflops")),
            host_ms=_float(d.get("host_ms")),
            dtype=str(d.get("dtype") or ""),
        ))
    return rows


def merge(rows: Iterable[Row]) -> list[Row]:
    """Later rows replace earlier ones of the same shape, class, routing, system and clock."""
    return list({r.key: r for r in rows}.values())


def geomean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else None


def ratios(rows: Sequence[Row], baseline: str = BASELINE) -> dict[tuple[str, ...], float]:
    """Row key -> baseline's ms / the row's ms, same cell and view (timed rows only)."""
    base = {r.cell: r.ms for r in rows if r.system == baseline and r.timed}
    return {r.key: base[r.cell] / r.ms for r in rows if r.timed and r.cell in base}  # type: ignore[operator]


@dataclass
class Stats:
    """Aggregates of a group of rows (one system, one view, maybe one pass)."""

    timed: int
    not_timed: dict[str, int]
    tflops: float | None  # geometric mean over the cells
    pct_sol: float | None  # arithmetic mean over the cells (the "mean % of speed of light" the targets name)
    ratio: float | None  # geometric mean over the cells
    min_ratio: float | None
    min_cell: str
    host_bound: int


def stats(rows: Sequence[Row], ratio_of: Mapping[tuple[str, ...], float]) -> Stats:
    timed = [r for r in rows if r.timed]
    not_timed: dict[str, int] = {}
    for r in rows:
        if not r.timed:
            not_timed[r.status] = not_timed.get(r.status, 0) + 1
    mine = [(ratio_of[r.key], f"{r.shape} {r.cls}") for r in timed if r.key in ratio_of]
    low = min(mine, default=(None, ""))
    return Stats(
        timed=len(timed),
        not_timed=dict(sorted(not_timed.items())),
        tflops=geomean(r.tflops for r in timed),
        pct_sol=_mean([r.pct_sol for r in timed if r.pct_sol is not None]),
        ratio=geomean(v for v, _ in mine),
        min_ratio=low[0],
        min_cell=low[1],
        host_bound=sum(r.host_bound for r in timed),
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def views(rows: Sequence[Row]) -> list[str]:
    """The views with at least one timed row, eager first."""
    present = {r.view for r in rows if r.timed}
    return [v for v in _VIEW_ORDER if v in present] + sorted(present - set(_VIEW_ORDER))


def view_title(view: str, short: bool = False) -> str:
    return (_VIEW_SHORT if short else _VIEW_TITLES).get(view, f"{view} clock")


def _systems(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(r.system for r in rows))


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _tf(value: float | None) -> str:
    """TFLOP/s: whole numbers from 100 up, three significant digits below."""
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _table(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def _system_table(rows: Sequence[Row], shown: Sequence[str], baseline: str) -> list[str]:
    ratio_of = ratios(rows, baseline)
    header = ["system"]
    for v in shown:
        header += [f"{v} {name}" for name in ("timed", "not timed", "TFLOP/s", "mean % SOL", f"x {baseline}",
                                                f"min x {baseline} (cell)", "host-bound")]
    body = []
    for system in _systems(rows):
        line = [system]
        for v in shown:
            s = stats([r for r in rows if r.system == system and r.view == v], ratio_of)
            low = "-" if s.min_ratio is None else f"{s.min_ratio:.3f}x ({s.min_cell})"
            missing = ", ".join(f"{k}:{n}" for k, n in s.not_timed.items()) or "0"
            line += [str(s.timed), missing, _fmt(s.tflops), _fmt(s.pct_sol), _ratio_text(s.ratio), low,
                     str(s.host_bound)]
        body.append(line)
    return _table(header, body)


def _pass_table(rows: Sequence[Row], shown: Sequence[str], baseline: str) -> list[str]:
    ratio_of = ratios(rows, baseline)
    header = ["system", "pass"]
    for v in shown:
        header += [f"{v} {name}" for name in ("TFLOP/s", "mean % SOL", f"x {baseline}", f"min x {baseline}")]
    body = []
    for system in _systems(rows):
        for name, classes in PASSES.items():
            mine = [r for r in rows if r.system == system and r.cls in classes]
            if not mine:
                continue
            line = [system, name]
            for v in shown:
                s = stats([r for r in mine if r.view == v], ratio_of)
                line += [_fmt(s.tflops), _fmt(s.pct_sol), _ratio_text(s.ratio), _ratio_text(s.min_ratio)]
            body.append(line)
    return _table(header, body)


def _shape_table(rows: Sequence[Row], shown: Sequence[str]) -> list[str]:
    systems = [s for s in _systems(rows) if s not in _SKIP_PLOT]
    header = ["shape (M,K,N,E)", "SOL"] + [f"{s} {v}" for s in systems for v in shown]
    body = []
    for shape in dict.fromkeys(r.shape for r in rows):
        mine = [r for r in rows if r.shape == shape]
        line = [f"{shape} ({mine[0].dims})", _tf(geomean(r.sol_tflops for r in mine))]
        for system in systems:
            for v in shown:
                parts = []
                for classes in PASSES.values():
                    cells = [r for r in mine if r.system == system and r.view == v and r.cls in classes and r.timed]
                    parts.append(_tf(geomean(r.tflops for r in cells)) if cells else "-")
                line.append("/".join(parts))
        body.append(line)
    return _table(header, body)


def _target_lines(rows: Sequence[Row], shown: Sequence[str], baseline: str) -> list[str]:
    """Per view, triton's and auto's ratio to the baseline as measured (geometric mean, lowest, cells below
    0.9x) and how often auto is within 3% of the faster of the two; descriptive, no pass or fail."""
    lines = []
    ratio_of = ratios(rows, baseline)
    for v in shown:
        mine = [r for r in rows if r.view == v and r.timed]
        parts = []
        for system in ("triton", "auto"):
            s = stats([r for r in mine if r.system == system], ratio_of)
            if s.ratio is not None:
                below = sum(1 for r in mine if r.system == system and ratio_of.get(r.key, 1.0) < 0.9)
                parts.append(f"{system}/{baseline} geomean {s.ratio:.3f}x over {s.timed} cells, lowest "
                             f"{s.min_ratio:.3f}x ({s.min_cell}), {below} cells below 0.9x")
        gap = _auto_gap(mine, baseline)
        if gap:
            parts.append(gap)
        if parts:
            lines.append(f"- {v}: " + "; ".join(parts))
    return lines


def _auto_gap(rows: Sequence[Row], baseline: str) -> str:
    """How often `auto` is within 3% of the faster of the baseline and triton (time ratio best/auto)."""
    by = {(r.shape, r.cls, r.system): r.ms for r in rows}
    gaps = []
    for (shape, cls, system), auto_ms in by.items():
        if system != "auto":
            continue
        best = [by.get((shape, cls, b)) for b in (baseline, "triton")]
        best = [b for b in best if b]
        if best and auto_ms:
            gaps.append((min(best) / auto_ms, f"{shape} {cls}"))
    if not gaps:
        return ""
    within = sum(1 for g, _ in gaps if g >= 0.97)
    low = min(gaps)
    return (f"auto within 3% of the faster of {baseline} and triton in {within} of {len(gaps)} cells "
            f"(lowest best/auto {low[0]:.3f}, {low[1]})")


def markdown(rows: Sequence[Row], title: str, baseline: str = BASELINE) -> str:
    """The summary: per routing, per-system and per-pass tables and the per-shape table, views side by side."""
    shown_all = views(rows)
    lines = [f"# {title}", ""]
    lines += [
        "Clocks: " + "; ".join(f"`{v}` = {view_title(v)}" for v in shown_all) + ".",
        f"Ratios (`x {baseline}`): {baseline}'s time over the system's, same cell and clock (> 1: faster than "
        f"{baseline}). Host-bound: host time per call >= {HOST_BOUND_SHARE:g} x the measured time per call.",
        "",
    ]
    for routing in dict.fromkeys(r.routing for r in rows):
        mine = [r for r in rows if r.routing == routing]
        shown = views(mine)
        if not shown:
            lines += [f"## {routing} routing: nothing timed", ""]
            continue
        clocks = " | ".join(shown)
        lines += [f"## {routing} routing", ""]
        lines += [f"### Per system, geometric means over the cells; clock: {clocks}", ""]
        lines += _system_table(mine, shown, baseline) + [""]
        lines += [f"### Per system and pass, geometric means over the pass's cells; clock: {clocks}", ""]
        lines += _pass_table(mine, shown, baseline) + [""]
        lines += [f"### TFLOP/s per shape and pass (fwd/dgrad/wgrad); clock: {clocks}", ""]
        lines += _shape_table(mine, shown) + [""]
        targets = _target_lines(mine, shown, baseline)
        if targets:
            lines += [f"### Against {baseline}; clock: {clocks}", ""] + targets + [""]
    return "\n".join(lines).rstrip() + "\n"


def _figure(rows: Sequence[Row], metric: str, baseline: str, path: Path, title: str) -> Path | None:
    """Bars per class panel, shapes along x, a bar per system; None (nothing written) without data."""
    ratio_of = ratios(rows, baseline)
    rows = [r for r in rows if r.system not in _SKIP_PLOT and r.timed]
    if metric == "speedup":
        rows = [r for r in rows if r.system != baseline and r.key in ratio_of]
        value = lambda r: ratio_of.get(r.key)
    else:
        rows = [r for r in rows if r.pct_sol]
        value = lambda r: r.pct_sol
    if not rows:
        return None
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    classes = [c for pair in PASSES.values() for c in pair if any(r.cls == c for r in rows)]
    classes += [c for c in dict.fromkeys(r.cls for r in rows) if c not in classes]
    shapes = list(dict.fromkeys(r.shape for r in rows))
    systems = list(dict.fromkeys(r.system for r in rows))
    ncols = min(3, len(classes))
    nrows = (len(classes) + ncols - 1) // ncols
    width = max(6.0, 0.45 * len(shapes) * max(1, len(systems)) / 2 + 2)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 4.2 * nrows), squeeze=False)
    bar = 0.8 / max(1, len(systems))
    for ax, cls in zip(axes.flat, classes, strict=False):
        for j, system in enumerate(systems):
            by_shape = {r.shape: value(r) for r in rows if r.cls == cls and r.system == system}
            xs = [i + (j - (len(systems) - 1) / 2) * bar for i in range(len(shapes))]
            ax.bar(xs, [by_shape.get(s) or 0.0 for s in shapes], width=bar, label=system)
        ax.set_title(cls)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=35, ha="right", fontsize=8)
        if metric == "speedup":
            ax.set_yscale("log")
            times = FuncFormatter(lambda v, _: f"{v:g}x")
            ax.yaxis.set_major_formatter(times)
            ax.yaxis.set_minor_formatter(times)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_ylabel(f"speedup over {baseline} (x)")
        else:
            ax.set_ylim(0, 100)
            ax.set_ylabel("% of speed of light")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(classes):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(rows: Sequence[Row], prefix: Path, title: str, baseline: str = BASELINE) -> list[Path]:
    """``<prefix>-speedup-<routing>-<view>.png`` and ``-sol-``, one per routing and view with data; returns
    the files written."""
    written = []
    for routing in dict.fromkeys(r.routing for r in rows):
        for view in views([r for r in rows if r.routing == routing]):
            mine = [r for r in rows if r.routing == routing and r.view == view]
            for metric, label in (("speedup", f"speedup over {baseline}"), ("sol", "% of speed of light")):
                path = prefix.with_name(f"{prefix.name}-{metric}-{routing}-{view}.png")
                text = f"{title}: {label}, {routing} routing, {view} clock ({view_title(view, short=True)})"
                done = _figure(mine, metric, baseline, path, text)
                if done is not None:
                    written.append(done)
    return written
