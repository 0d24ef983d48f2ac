"""Benchmark output: CSV and JSON records, the markdown summary, and the terminal tables (rich).

Columns worth knowing: `clock` (eager | graph | wall | batch, see `ragdot.measure.timing`), `host_ms` (host
time per call: wall time of a sample's calls without waiting for the device, over their number),
`host_bound` (1 when host_ms >= timing.HOST_BOUND_SHARE x ms; empty where the clock cannot say: wall,
batch), `batch` (calls per sample), `speedup_vs_vendor` (the baseline: vendor's ms over this row's, same
cell and clock view; also `speedup_vs_padded` and `speedup_vs_torch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragdot.bench import summary
from ragdot.bench.runner import Result
from ragdot.measure import records
from ragdot.measure.console import Console, Table
from ragdot.measure.records import safe_name
from ragdot.measure.timing import EAGER, GRAPH, HOST_BOUND_SHARE, view_of

__all__ = ["COLUMNS", "result_rows", "write_csv", "write_json", "write_markdown", "summary_rows", "file_stem",
           "print_tables"]

# The first 13 columns are a fixed contract (scripts read them by position); more may follow.
COLUMNS: tuple[str, ...] = (
    "gpu",
    "commit",
    "shape",
    "M",
    "K",
    "N",
    "E",
    "cls",
    "routing",
    "dtype",
    "backend",
    "ms",
    "tflops",
    "status",
    "p20",
    "p80",
    "pct_sol",
    "speedup_vs_vendor",
    "speedup_vs_padded",
    "speedup_vs_torch",
    "peak_mem_mb",
    "err",
    "warmup",
    "iters",
    "batch",
    "clock",
    "host_ms",
    "host_bound",
    "flops",
    "bytes",
    "sol_tflops",
    "peak_tflops",
    "bandwidth_gbs",
    "date",
    "torch",
    "note",
)

PASSES = {"fwd": ("fwd_wi", "fwd_wo"), "dgrad": ("dgrad_wi", "dgrad_wo"), "wgrad": ("wgrad_wi", "wgrad_wo")}

def _num(value: float | None, digits: int) -> float | str:
    """`value` to `digits` significant digits; "" for None."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "" if value is None else str(value)
    return float(f"{value:.{digits}g}")


def result_rows(results: Sequence[Result], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat dict per result, keys in COLUMNS order."""
    rows = []
    for r in results:
        row = {
            "gpu": meta["gpu"],
            "commit": meta["commit"],
            "shape": r.shape.name,
            "M": r.shape.M,
            "K": r.shape.K,
            "N": r.shape.N,
            "E": r.shape.E,
            "cls": r.cls,
            "routing": r.routing,
            "dtype": meta["dtype"],
            "backend": r.backend,
            "ms": _num(r.ms, 5),
            "tflops": _num(r.tflops, 4),
            "status": r.status,
            "p20": _num(r.p20, 5),
            "p80": _num(r.p80, 5),
            "pct_sol": _num(r.pct_sol, 3),
            "speedup_vs_vendor": _num(r.speedup_vs_vendor, 4),
            "speedup_vs_padded": _num(r.speedup_vs_padded, 4),
            "speedup_vs_torch": _num(r.speedup_vs_torch, 4),
            "peak_mem_mb": _num(r.peak_mem_mb, 5),
            "err": "" if r.err is None else f"{r.err:.3e}",
            "warmup": r.warmup,
            "iters": r.iters,
            "batch": r.batch or "",
            "clock": r.clock,
            "host_ms": _num(r.host_ms, 4),
            "host_bound": int(r.host_bound) if r.ms and r.clock in (EAGER, GRAPH) else "",
            "flops": r.flops,
            "bytes": r.bytes,
            "sol_tflops": _num(r.flops / r.sol_s / 1e12, 4),
            "peak_tflops": _num(meta["peak_tflops"], 4),
            "bandwidth_gbs": _num(meta["bandwidth_gbs"], 4),
            "date": meta["date"],
            "torch": meta["torch"],
            "note": r.note,
        }
        rows.append({k: row[k] for k in COLUMNS})
    return rows


def file_stem(gpu: str, commit: str, stamp: str) -> str:
    """``ragdot-bench-<gpu>-<commit>-<date>`` with only file-name-safe characters."""
    return f"ragdot-bench-{safe_name(gpu)}-{safe_name(commit)}-{safe_name(stamp)}"


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    return records.write_csv(rows, path, COLUMNS)


def write_json(rows: Sequence[dict[str, Any]], meta: dict[str, Any], path: Path) -> Path:
    return records.write_json(path, meta, rows, columns=COLUMNS)


def write_markdown(rows: Sequence[dict[str, Any]], title: str, path: Path, notes: Sequence[str] = ()) -> Path:
    """The summary of `summary.markdown` (eager and graph views side by side) for these records; `notes`
    (warnings about the run, e.g. a busy machine) stand under the title."""
    head, _, rest = summary.markdown(summary.parse_rows(rows), title).partition("\n\n")
    path.write_text("\n\n".join([head, *(f"**Note:** {n}" for n in notes), rest]))
    return path


def summary_rows(results: Sequence[Result]) -> list[summary.Row]:
    return [
        summary.Row(r.shape.name, f"{r.shape.M},{r.shape.K},{r.shape.N},{r.shape.E}", r.cls, r.routing, r.backend,
                    r.clock or "eager", r.status, r.ms, r.tflops, r.pct_sol, r.flops / r.sol_s / 1e12, r.host_ms)
        for r in results
    ]


def _geomean(values: Sequence[float | None]) -> float | None:
    return summary.geomean(values)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _cell_text(r: Result) -> str:
    if r.ms:
        text = f"{r.tflops:.3g}" if r.tflops < 100 else f"{r.tflops:.0f}"
        return text + ("?" if r.status == "unchecked" else "") + ("*" if r.host_bound else "")
    return {"wrong": "[red]wrong[/]", "error": "[red]error[/]", "OOM": "[yellow]OOM[/]"}.get(
        r.status, r.status
    )


def _cell_table(results: Sequence[Result], title: str) -> Table:
    backends = list(dict.fromkeys(r.backend for r in results))
    cells: dict[tuple[str, str, str], dict[str, Result]] = {}
    for r in results:
        cells.setdefault((r.shape.name, r.cls, r.routing), {})[r.backend] = r
    table = Table(title=title)
    for col in ("shape", "class", "routing", "SOL"):
        table.add_column(col, justify="left" if col != "SOL" else "right")
    for b in backends:
        table.add_column(b, justify="right")
    for (shape, cls, routing), by in cells.items():
        any_r = next(iter(by.values()))
        sol = any_r.flops / any_r.sol_s / 1e12
        table.add_row(
            shape, cls, routing, f"{sol:.3g}", *[_cell_text(by[b]) if b in by else "" for b in backends]
        )
    return table


def print_tables(
    results: Sequence[Result], console: Console, title: str, anchors: dict[str, Any] | None = None
) -> None:
    """Per clock view: TFLOP/s per cell and system; then the per-system summary of every view side by side
    (geometric means, ratio to vendor, host-bound cells); then, given `anchors` (the ``bench.anchors``
    section of a targets file, see `ragdot.measure.targets`), the check against those reference numbers."""
    rows = summary_rows(results)
    shown = summary.views(rows) or list(dict.fromkeys(r.view for r in rows))
    for view in shown:
        mine = [r for r in results if view_of(r.clock or "eager") == view]
        console.print(_cell_table(mine, f"{title}: TFLOP/s, {summary.view_title(view)} "
                                        "('?' = not checked against the reference, '*' = host-bound)"))
    console.print(_summary_table(results, rows, shown))
    if anchors:
        for view in shown:
            _print_anchor_check([r for r in results if view_of(r.clock or "eager") == view], console, view, anchors)


def _summary_table(results: Sequence[Result], rows: list[summary.Row], shown: Sequence[str]) -> Table:
    table = Table(
        title=f"per system and clock ({', '.join(shown)}): geometric means over the timed cells (mean % SOL: the "
        f"arithmetic mean); x B = B's time "
        f"over the system's, same cell and clock; host-bound: host time per call >= {HOST_BOUND_SHARE:g} x the "
        "measured time"
    )
    cols = ("system", "clock", "timed", "not timed", "TFLOP/s", "mean % SOL", f"x {summary.BASELINE}",
            f"min x {summary.BASELINE}", "x torch", "x padded", "peak MB (max)", "host-bound")
    for col in cols:
        table.add_column(col, justify="left" if col in ("system", "clock") else "right")
    by_base = {base: summary.ratios(rows, base) for base in (summary.BASELINE, "torch", "padded")}
    for system in dict.fromkeys(r.system for r in rows):
        mem = [r.peak_mem_mb for r in results if r.backend == system and r.peak_mem_mb is not None]
        for view in shown:
            mine = [r for r in rows if r.system == system and r.view == view]
            if not mine:
                continue
            s = summary.stats(mine, by_base[summary.BASELINE])
            low = "-" if s.min_ratio is None else f"{s.min_ratio:.3g} ({s.min_cell})"
            table.add_row(
                system, view, str(s.timed), ", ".join(f"{k}:{n}" for k, n in s.not_timed.items()) or "0",
                _fmt(s.tflops, ".3g"), _fmt(s.pct_sol, ".3g"), _fmt(s.ratio, ".3g"), low,
                _fmt(summary.stats(mine, by_base["torch"]).ratio, ".3g"),
                _fmt(summary.stats(mine, by_base["padded"]).ratio, ".3g"),
                _fmt(max(mem, default=None), ".0f"), str(s.host_bound),
            )
    return table


def _print_anchor_check(results: Sequence[Result], console: Console, view: str, anchors: dict[str, Any]) -> None:
    """`vendor` and `torch` TFLOP/s per pass against the reference numbers of `anchors` (the shapes and
    routings they cover): ``tflops[routing][shape]`` = one number per pass, ``date`` and ``gpu`` for the title."""
    ref: dict[str, dict[str, Sequence[float]]] = anchors.get("tflops", {})
    systems = tuple(anchors.get("systems", ("vendor", "torch")))
    mine: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in results:
        if r.backend in systems and r.tflops and r.shape.name in ref.get(r.routing, {}):
            mine.setdefault((r.shape.name, r.routing, r.backend), {})[r.cls] = r.tflops
    table = Table(title=f"{' and '.join(systems)} vs the reference numbers of {anchors.get('date', '?')}, "
                        f"{summary.view_title(view)}: TFLOP/s per pass, ours/reference (ratio)")
    for col in ("shape", "routing", "system", *PASSES):
        table.add_column(col, justify="left" if col in ("shape", "routing", "system") else "right")
    ratios: dict[str, list[float]] = {}
    for (shape, routing, system), by in mine.items():
        row = []
        for i, classes in enumerate(PASSES.values()):
            if not all(c in by for c in classes):
                row.append("-")
                continue
            ours, anchor = _geomean([by[c] for c in classes]), ref[routing][shape][i]
            ratios.setdefault(system, []).append(ours / anchor)
            row.append(f"{ours:.0f}/{anchor:.0f} ({ours / anchor:.2f})")
        if any(cell != "-" for cell in row):
            table.add_row(shape, routing, system, *row)
    if ratios:
        table.caption = "; ".join(
            f"{system}: geometric mean ratio {_geomean(v):.2f} over {len(v)} passes" for system, v in ratios.items()
        )
        console.print(table)
