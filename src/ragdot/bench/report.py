"""Benchmark output: CSV and JSON records, and the terminal tables (rich)."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ragdot.bench.runner import Result

__all__ = ["COLUMNS", "result_rows", "write_csv", "write_json", "file_stem", "print_tables", "ANCHOR_TORCH"]

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
    "speedup_vs_padded",
    "speedup_vs_torch",
    "peak_mem_mb",
    "err",
    "warmup",
    "iters",
    "clock",
    "host_ms",
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

#: torch._grouped_mm TFLOP/s (fwd, dgrad, wgrad) on one H200, bf16, from the project's anchor page.
ANCHOR_TORCH: dict[str, dict[str, tuple[float, float, float]]] = {
    "balanced": {
        "deepseek2-16b": (160, 163, 116),
        "deepseek3-test": (42, 42, 35),
        "gemma4-26b": (214, 213, 146),
        "qwen3-30b-a3b": (221, 221, 154),
        "qwen3-235b-a22b": (417, 392, 274),
        "llama4-17b-16e": (261, 255, 178),
        "mixtral-8x7b": (611, 614, 496),
        "gpt-oss-120b-like": (243, 241, 153),
    },
    "skewed": {
        "deepseek2-16b": (166, 167, 116),
        "deepseek3-test": (43, 43, 37),
        "gemma4-26b": (215, 215, 152),
        "qwen3-30b-a3b": (223, 223, 160),
        "qwen3-235b-a22b": (401, 393, 282),
        "llama4-17b-16e": (255, 251, 184),
        "mixtral-8x7b": (522, 527, 488),
        "gpt-oss-120b-like": (237, 240, 167),
    },
    "empty": {
        "deepseek2-16b": (171, 171, 114),
        "deepseek3-test": (47, 48, 39),
        "gemma4-26b": (216, 216, 151),
        "qwen3-30b-a3b": (229, 228, 167),
        "qwen3-235b-a22b": (432, 404, 291),
        "llama4-17b-16e": (276, 273, 194),
        "mixtral-8x7b": (537, 538, 491),
        "gpt-oss-120b-like": (243, 247, 167),
    },
}


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
            "speedup_vs_padded": _num(r.speedup_vs_padded, 4),
            "speedup_vs_torch": _num(r.speedup_vs_torch, 4),
            "peak_mem_mb": _num(r.peak_mem_mb, 5),
            "err": "" if r.err is None else f"{r.err:.3e}",
            "warmup": r.warmup,
            "iters": r.iters,
            "clock": r.extra.get("clock", ""),
            "host_ms": _num(r.host_ms, 4),
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
    safe = lambda s: re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-") or "unknown"
    return f"ragdot-bench-{safe(gpu)}-{safe(commit)}-{safe(stamp)}"


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_json(rows: Sequence[dict[str, Any]], meta: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps({"meta": meta, "columns": list(COLUMNS), "rows": list(rows)}, indent=1))
    return path


def _geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _host_bound(r: Result) -> bool:
    """The device waited for the host: issuing a call took about as long as running it (CUDA events).

    Such cells measure Python dispatch and launch overhead, not the kernels: see `--cuda-graphs`.
    """
    return r.extra.get("clock") == "event" and bool(r.ms and r.host_ms and r.host_ms >= 0.8 * r.ms)


def _cell_text(r: Result) -> str:
    if r.ms:
        text = f"{r.tflops:.3g}" if r.tflops < 100 else f"{r.tflops:.0f}"
        return text + ("?" if r.status == "unchecked" else "")
    return {"wrong": "[red]wrong[/]", "error": "[red]error[/]", "OOM": "[yellow]OOM[/]"}.get(
        r.status, r.status
    )


def print_tables(results: Sequence[Result], console: Console, title: str, anchors: bool = False) -> None:
    """Per-cell TFLOP/s by backend, then a per-backend summary, then the comparison with the anchors."""
    backends = list(dict.fromkeys(r.backend for r in results))
    cells: dict[tuple[str, str, str], dict[str, Result]] = {}
    for r in results:
        cells.setdefault((r.shape.name, r.cls, r.routing), {})[r.backend] = r
    table = Table(title=f"{title}: TFLOP/s ('?' = not checked against the reference)")
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
    console.print(table)

    summary = Table(
        title="per backend: geometric means over the timed cells "
        "(host-bound: cells whose host time per call is >= 80% of the measured time)"
    )
    cols = ("backend", "timed", "not timed", "TFLOP/s", "% SOL", "x padded", "x torch", "peak MB (max)")
    for col in (*cols, "host-bound"):
        summary.add_column(col, justify="left" if col == "backend" else "right")
    for b in backends:
        mine = [r for r in results if r.backend == b]
        timed = [r for r in mine if r.ms]
        others = sorted({r.status for r in mine if not r.ms})
        mem = [r.peak_mem_mb for r in mine if r.peak_mem_mb is not None]
        summary.add_row(
            b,
            str(len(timed)),
            ", ".join(f"{s}:{sum(r.status == s for r in mine)}" for s in others) or "0",
            _fmt(_geomean([r.tflops for r in timed]), ".3g"),
            _fmt(_geomean([r.pct_sol for r in timed]), ".3g"),
            _fmt(_geomean([r.speedup_vs_padded for r in timed]), ".3g"),
            _fmt(_geomean([r.speedup_vs_torch for r in timed]), ".3g"),
            _fmt(max(mem, default=None), ".0f"),
            str(sum(_host_bound(r) for r in timed)),
        )
    console.print(summary)
    if anchors:
        _print_anchor_check(results, console)


def _print_anchor_check(results: Sequence[Result], console: Console) -> None:
    """Our `torch` TFLOP/s per pass against the anchor page (the shapes and routings it has)."""
    mine: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        if r.backend == "torch" and r.tflops and r.shape.name in ANCHOR_TORCH.get(r.routing, {}):
            mine.setdefault((r.shape.name, r.routing), {})[r.cls] = r.tflops
    table = Table(title="torch vs the H200 anchor page: TFLOP/s per pass, ours/anchor (ratio)")
    for col in ("shape", "routing", "fwd", "dgrad", "wgrad"):
        table.add_column(col, justify="left" if col in ("shape", "routing") else "right")
    ratios = []
    for (shape, routing), by in mine.items():
        row = []
        for i, classes in enumerate(PASSES.values()):
            if not all(c in by for c in classes):
                row.append("-")
                continue
            ours, anchor = _geomean([by[c] for c in classes]), ANCHOR_TORCH[routing][shape][i]
            ratios.append(ours / anchor)
            row.append(f"{ours:.0f}/{anchor:.0f} ({ours / anchor:.2f})")
        if any(cell != "-" for cell in row):
            table.add_row(shape, routing, *row)
    if ratios:
        table.caption = f"geometric mean ratio {_geomean(ratios):.2f} over {len(ratios)} passes"
        console.print(table)
