"""`ragdot bench` output: rows per clock and their ratios, the markdown summary, terminal tables and plots."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import torch

from helpers import benchmark_script
from ragdot.bench import runner, summary
from ragdot.bench.report import print_tables, result_rows, write_csv
from ragdot.bench.runner import Result, run_cell
from ragdot.bench.systems import FunctionSystem, VendorSystem
from ragdot.measure import timing
from ragdot.measure.classes import CLASS_NAMES, CLASSES, flops, get_class
from ragdot.measure.targets import load_targets, section
from ragdot.measure.timing import Timing
from ragdot.shapes import get_shape
from test_bench import SMALL, _cfg, _off_by_a_percent, _right

TARGETS = Path(__file__).resolve().parents[1] / "benchmarks" / "targets-h200.json"

CUDA = torch.device("cuda")  # only a name here: nothing below touches a GPU


def test_tables_flag_host_bound_cells_and_compare_with_the_anchors():
    from rich.console import Console

    shape = get_shape("deepseek2-16b")
    anchors = section(load_targets(TARGETS), "bench", "NVIDIA H200")["anchors"]
    anchor = anchors["tflops"]["balanced"][shape.name]
    results = []
    for cls in CLASSES:
        tflops = anchor[CLASS_NAMES.index(cls.name) // 2] * 1.1  # 10% above the page in every pass
        ms = flops(shape) / (tflops * 1e12) * 1e3
        results.append(Result(shape, cls.name, "balanced", "torch", "ok", flops(shape), 1, 1e-6, ms=ms, host_ms=ms,
                              clock="eager"))
    results.append(Result(shape, "fwd_wi", "balanced", "padded", "OOM", flops(shape), 1, 1e-6))
    console = Console(record=True, width=200)
    print_tables(results, console, "t", anchors=anchors)
    text = console.export_text()
    assert "(1.10)" in text and "torch: geometric mean ratio 1.10 over 3 passes" in text
    line = next(line for line in text.splitlines() if line.startswith("│ torch"))
    assert line.rstrip("│ ").endswith("6")  # all six cells host-bound
    assert "OOM:1" in text



# Simulated CUDA timings (ms, host ms per call) for the row logic: two clocks per system.
_TIMES = {
    ("vendor", "eager"): (2.0, 0.5), ("vendor", "graph"): (1.0, 0.01),
    ("fast", "eager"): (1.0, 0.95), ("fast", "graph"): (0.5, 0.01),
    ("nograph", "eager"): (4.0, 0.1),
    ("lost", "eager"): (2.0, 0.1),  # its graph could not be captured
}


def _simulated_cell(monkeypatch):
    def lanes(system, device, clocks):
        return timing.lane_clocks(system, CUDA, clocks)

    def fake_measure(timed, device, *, clocks, **kwargs):
        out = {}
        for t in timed:
            for clock in lanes(t, device, clocks):
                if (t.name, clock) in _TIMES:
                    ms, host = _TIMES[(t.name, clock)]
                    out[(t.name, clock)] = Timing([ms] * 3, 1, 30, clock, [host] * 3, 10 if clock == "eager" else 1)
        return out

    monkeypatch.setattr(runner, "lane_clocks", lanes)
    monkeypatch.setattr(runner, "measure_clocks", fake_measure)
    nograph = FunctionSystem("nograph", _right)
    nograph.graphable = False
    systems = [VendorSystem(), FunctionSystem("fast", _right), nograph, FunctionSystem("lost", _right),
               FunctionSystem("wrong", _off_by_a_percent)]
    return run_cell(SMALL, get_class("dgrad_wo"), "balanced", systems, _cfg())


def test_rows_per_clock_ratios_to_vendor_and_host_bound(monkeypatch, tmp_path):
    results = _simulated_cell(monkeypatch)
    assert [r.clock for r in results] == ["eager"] * 5 + ["graph"] * 4  # eager rows first, nograph has one
    by = {(r.backend, r.clock): r for r in results}
    assert by[("vendor", "eager")].speedup_vs_vendor == 1.0 and by[("fast", "eager")].speedup_vs_vendor == 2.0
    assert by[("fast", "graph")].speedup_vs_vendor == 2.0  # 1.0 / 0.5: never across clocks
    assert by[("nograph", "eager")].speedup_vs_vendor == 0.5 and ("nograph", "graph") not in by
    assert by[("lost", "graph")].status == "n/a" and "graph" in by[("lost", "graph")].note
    assert by[("wrong", "eager")].status == by[("wrong", "graph")].status == "wrong"
    assert by[("fast", "eager")].host_bound and not by[("vendor", "eager")].host_bound
    assert by[("fast", "eager")].batch == 10 and by[("fast", "graph")].batch == 1
    meta = {"gpu": "sim", "commit": "c", "date": "d", "dtype": "float32", "torch": "t", "peak_tflops": 1.0,
            "bandwidth_gbs": 1.0}
    path = write_csv(result_rows(results, meta), tmp_path / "sim.csv")
    with open(path) as f:
        rows = {(r["backend"], r["clock"]): r for r in csv.DictReader(f)}
    fast = rows[("fast", "eager")]
    assert (fast["host_ms"], fast["host_bound"], fast["speedup_vs_vendor"], fast["batch"]) == ("0.95", "1", "2.0", "10")
    assert rows[("vendor", "graph")]["host_bound"] == "0" and rows[("wrong", "eager")]["host_bound"] == ""


# --------------------------------------------------------------------------------------------- summary


def _summary_rows(monkeypatch) -> list[summary.Row]:
    from ragdot.bench.report import summary_rows

    return summary_rows(_simulated_cell(monkeypatch))


def test_summary_shows_both_clocks_side_by_side(monkeypatch):
    rows = _summary_rows(monkeypatch)
    ratio_of = summary.ratios(rows)
    fast = summary.stats([r for r in rows if r.system == "fast" and r.view == "eager"], ratio_of)
    assert (fast.timed, fast.ratio, fast.min_ratio, fast.host_bound) == (1, 2.0, 2.0, 1)
    lost = summary.stats([r for r in rows if r.system == "lost" and r.view == "graph"], ratio_of)
    assert (lost.timed, lost.not_timed) == (0, {"n/a": 1})
    text = summary.markdown(rows, "sim")
    tables = [line for line in text.splitlines() if line.startswith("### ")]
    assert tables and all("clock: eager | graph" in line for line in tables)  # every title states its clocks
    assert "| system | eager timed | eager not timed |" in text and "| graph timed |" in text
    assert "| eager x vendor |" in text and "| graph min x vendor (cell) | graph host-bound |" in text
    assert "| nograph | 1 | 0 |" in text  # eager: one timed cell ...
    assert "| fast | dgrad | " in text and "2.000x" in text and "0.500x" in text
    assert "| small (40,16,24,5) |" in text and "vendor eager | vendor graph" in text
    graph_title = "`graph` = graph clock (CUDA-graph replays: device time; JAX systems: n calls in one jitted program)"
    assert "host-bound" in text and graph_title in text


def test_terminal_tables_show_every_clock(monkeypatch):
    from rich.console import Console

    results = _simulated_cell(monkeypatch)
    console = Console(record=True, width=250)
    print_tables(results, console, "sim")
    text = console.export_text()
    assert "TFLOP/s, eager clock" in text and "TFLOP/s, graph clock" in text
    fast = [line for line in text.splitlines() if line.startswith("│ fast")]
    assert len(fast) == 2 and "eager" in fast[0] and "graph" in fast[1]
    assert fast[0].rstrip("│ ").endswith("1") and fast[1].rstrip("│ ").endswith("0")  # host-bound cells


def test_legacy_rows_and_summarize_script(tmp_path):

    script = benchmark_script("summarize")
    base = {"shape": "s", "M": 4, "K": 4, "N": 4, "E": 2, "routing": "balanced", "status": "ok",
            "sol_tflops": 1.0, "pct_sol": 50, "host_ms": 0.01}
    old = [dict(base, cls=c, backend=b, clock="event" if i else "graph", ms=ms, tflops=1 / ms)
           for c in ("fwd_wi", "fwd_wo") for i in (0, 1) for b, ms in (("torch", 2.0), ("triton", 1.0))]
    assert {r.clock for r in summary.parse_rows(old)} == {"graph", "eager"}
    path = tmp_path / "old.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(old[0]))
        writer.writeheader()
        writer.writerows(old)
    prefix = tmp_path / "summary-old"
    assert script.main([str(path), "--out", str(prefix), "--baseline", "torch"]) == 0
    text = (tmp_path / "summary-old.md").read_text()
    assert "triton/torch geomean 2.000x over 2 cells" in text and "- eager: " in text and "- graph: " in text
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == [f"summary-old-{m}-balanced-{v}.png" for m in ("sol", "speedup") for v in ("eager", "graph")]
    for png in tmp_path.glob("*.png"):
        png.unlink()
    assert script.main([str(path), "--out", str(prefix)]) == 0  # no vendor rows: no ratios, no speedup plots
    assert sorted(p.name.split("-")[2] for p in tmp_path.glob("*.png")) == ["sol", "sol"]


def test_no_plot_without_data(tmp_path):
    rows = [summary.Row("s", "4,4,4,2", "fwd_wi", "balanced", b, "graph", "OOM", None, None, None, 1.0, None)
            for b in ("vendor", "triton")]
    assert summary.plot(rows, tmp_path / "x", "t") == [] and not list(tmp_path.iterdir())
    timed = [dataclasses.replace(rows[0], status="ok", ms=1.0, tflops=1.0, pct_sol=10.0),
             dataclasses.replace(rows[1], status="ok", ms=0.5, tflops=2.0, pct_sol=20.0)]
    files = summary.plot(timed, tmp_path / "x", "t")
    assert sorted(p.name for p in files) == ["x-sol-balanced-graph.png", "x-speedup-balanced-graph.png"]
    assert len({p.read_bytes() for p in files}) == 2
    only_vendor = summary.plot(timed[:1], tmp_path / "y", "t")  # nothing to compare: no speedup figure
    assert [p.name for p in only_vendor] == ["y-sol-balanced-graph.png"]



def test_sol_is_the_arithmetic_mean_over_cells_and_rates_the_geometric_mean():
    """The summaries' `mean % SOL` is the plain mean over the timed cells (what the targets name), the TFLOP/s
    and the ratios are geometric means; untimed cells count in neither."""
    base = summary.Row("s", "4,4,4,2", "fwd_wi", "balanced", "triton", "graph", "ok", 1.0, 1.0, 10.0, 1.0, None)
    rows = [base, dataclasses.replace(base, cls="dgrad_wi", ms=0.25, tflops=4.0, pct_sol=40.0),
            dataclasses.replace(base, cls="wgrad_wi", status="OOM", ms=None, tflops=None, pct_sol=None)]
    s = summary.stats(rows, {})
    assert s.pct_sol == 25.0 and s.tflops == 2.0 and s.timed == 2
    assert "mean % SOL" in "\n".join(summary.markdown(rows, "t").splitlines())


def _floor_row(cls: str, ms: float, sol_tflops: float, dtype: str = "bfloat16", pct: float = 50.0) -> summary.Row:
    return summary.Row("s", "1024,512,512,64", cls, "skewed", "auto", "graph", "ok", ms, None, pct, sol_tflops, None,
                       dtype)


def test_write_floors_cap_the_cells_whose_output_outweighs_their_speed_of_light():
    from ragdot.bench import write_floor

    # wgrad_wi writes [E, K, N] = 64 x 512 x 512 bf16 = 32 MiB; its 0.54 GFLOP at 1000 TFLOP/s of "speed of
    # light" take 0.54 us, the write at 1 TB/s 33.6 us: a cap of 1.6%
    wgrad, fwd = _floor_row("wgrad_wi", 0.1, 1000.0), _floor_row("fwd_wi", 1.0, 1.0)  # fwd: 0.54 ms of compute
    out = 64 * 512 * 512 * 2
    assert write_floor.output_bytes(wgrad) == out and write_floor.output_bytes(fwd) == 1024 * 512 * 2
    sol = 2 * 1024 * 512 * 512 / 1e15
    assert abs(write_floor.cap_pct(wgrad, 1e12) - 100 * sol / (out / 1e12)) < 1e-9
    assert write_floor.cap_pct(fwd, 1e12) == 100.0  # a floor under the speed of light caps nothing, exactly
    assert write_floor.cap_pct(_floor_row("wgrad_wi", 0.1, 1000.0, dtype=""), 1e12) is None  # dtype unknown
    text = "\n".join(write_floor.markdown([wgrad, fwd], 1e12))
    assert "| auto | skewed | graph | 2 | 50.0 |" in text and "s wgrad_wi 50.0 / 1.6 / 34" in text
    assert "s fwd_wi" not in text


def test_summarize_adds_the_write_floors_on_request(tmp_path):
    rows = [{"shape": "s", "M": 1024, "K": 512, "N": 512, "E": 64, "cls": "wgrad_wo", "routing": "skewed",
             "dtype": "bfloat16", "backend": b, "ms": 0.05, "tflops": 10.7, "status": "ok", "pct_sol": 60.0,
             "sol_tflops": 17.9, "clock": "graph", "host_ms": 0.01} for b in ("vendor", "auto")]
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    script = benchmark_script("summarize")
    assert script.main([str(path), "--out", str(tmp_path / "s"), "--no-plots", "--write-tbps", "3.37"]) == 0
    text = (tmp_path / "s.md").read_text()
    assert "## Writes as a floor (3.37 TB/s write-only)" in text and "| auto | skewed | graph | 1 | 60.0 |" in text
