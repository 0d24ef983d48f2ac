"""The `peer` layer equals ragdot's sparse MoE layer, and `ragdot moe-bench --layer` (CPU, tiny shapes)."""

from __future__ import annotations

import csv
import json
import time

import pytest
import torch

from helpers import nerr
from ragdot.bench import moe_layer as lb
from ragdot.cli import main
from ragdot.moe import MoELayer
from ragdot.moe.peer import peer_moe

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_grouped_mm = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch has no _grouped_mm")


def _grads(layer: MoELayer, fn, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    layer.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_(True)
    y = fn(xg)
    y.backward(dy)
    return {"y": y.detach(), "x": xg.grad} | {n: p.grad for n, p in layer.named_parameters()}


@needs_grouped_mm
@pytest.mark.parametrize(
    "dtype,tokens,tol",
    [
        (torch.float32, 37, 1e-5),  # every expert used
        (torch.float32, 3, 1e-5),  # 6 assignments over 8 experts: empty groups
        (torch.bfloat16, 37, 2e-2),  # peer sums the top-k in bf16 (index_add_), ragdot in float32
    ],
)
def test_peer_equals_ragdot_sparse_layer(dtype, tokens, tol):
    """Same parameters, same routing: outputs and every gradient agree (grouped_mm strides: 16-byte rows)."""
    torch.manual_seed(0)
    layer = MoELayer(16, 8, 8, 2, path="sparse", backend="reference", dtype=dtype, device=DEV)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, 16, generator=gen).to(DEV, dtype)
    dy = torch.randn(tokens, 16, generator=gen).to(DEV, dtype)
    want = _grads(layer, layer, x, dy)
    got = _grads(layer, lambda v: peer_moe(v, layer.router.weight, layer.w_gate_up, layer.w_down, 2), x, dy)
    assert set(got) == {"y", "x", "router.weight", "w_gate_up", "w_down"}
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, name
        assert nerr(got[name], ref) <= tol, name


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_every_run_gets_new_files(tmp_path):
    first = lb.RowWriter(tmp_path, {"run": 1})
    first.add({"config": "c", "ms": 1.0})
    second = lb.RowWriter(tmp_path, {"run": 2})  # same second: a suffix, never the first run's files
    assert {first.csv, first.json}.isdisjoint({second.csv, second.json})
    assert json.loads(first.json.read_text())["rows"] == [{"config": "c", "ms": 1.0}]
    assert len(_rows(first.csv)) == 1 and _rows(second.csv) == []


@needs_grouped_mm
def test_quick_layer_bench_rows(tmp_path):
    argv = ["moe-bench", "--layer", "--quick", "--variants", "sparse-torch", "peer", "--tokens", "64", "96",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    runs = list(tmp_path.glob("layer-*.json"))
    assert len(runs) == 1 and len(list(tmp_path.glob("layer-*.csv"))) == 1
    data = json.loads(runs[0].read_text())
    rows = data["rows"]
    assert [(r["tokens"], r["variant"]) for r in rows] == [(64, "peer"), (64, "sparse-torch"), (96, "peer"),
                                                           (96, "sparse-torch")]  # fmt: skip
    assert all(r["status"] == "ok" and r["ms"] > 0 and r["mode"] == "eager" and r["clock"] == "wall" for r in rows)
    assert all(r["config"] == "tiny" and r["gpu"] == "cpu" and r["commit"] and r["date"] for r in rows)
    assert rows[0]["vs_peer"] == 1.0 and rows[1]["vs_peer"] == pytest.approx(rows[0]["ms"] / rows[1]["ms"])
    assert all(r["loop_ms"] > 0 for r in rows)
    assert rows[1]["loop_vs_peer"] == pytest.approx(rows[0]["loop_ms"] / rows[1]["loop_ms"])
    assert data["meta"]["steps"] == 3
    table = _rows(runs[0].with_suffix(".csv"))
    assert [r["variant"] for r in table] == [r["variant"] for r in rows]
    assert set(lb.COLUMNS) == set(table[0]) and float(table[1]["ms"]) == pytest.approx(rows[1]["ms"])


@needs_grouped_mm
def test_compile_mode_rows(tmp_path):
    """compile rows (aot_eager here: inductor is slow on the CPU) carry their compile time and graph count."""
    argv = ["moe-bench", "--layer", "--quick", "--modes", "compile", "--compile-backend", "aot_eager",
            "--dtype", "bf16", "--variants", "peer", "sparse-torch", "--tokens", "64",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(next(tmp_path.glob("layer-*.json")).read_text())["rows"]
    assert [r["variant"] for r in rows] == ["peer", "sparse-torch"]
    for r in rows:
        assert r["status"] == "ok" and r["mode"] == "compile", r
        assert r["graphs"] == 1 and r["compile_s"] > 0 and r["ms"] > 0


def test_interrupted_run_keeps_finished_rows(tmp_path, monkeypatch):
    calls = []

    def fake_row(layer, x, dy, variant, mode, args):
        calls.append(variant)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"status": "ok", "ms": 1.0, "host_ms": 1.0, "steps": 3, "clock": "wall"}

    monkeypatch.setattr(lb, "measure_row", fake_row)
    rc = main(["moe-bench", "--layer", "--quick", "--variants", "peer", "sparse-torch", "--out", str(tmp_path)])
    assert rc == 130
    rows = json.loads(next(tmp_path.glob("layer-*.json")).read_text())["rows"]
    assert [r["variant"] for r in rows] == ["peer"]
    assert len(_rows(next(tmp_path.glob("layer-*.csv")))) == 1


def test_unavailable_variant_is_a_row_not_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(lb, "_unavailable", lambda v: "not here" if v == "sparse-triton" else None)
    argv = ["moe-bench", "--layer", "--quick", "--variants", "sparse-triton", "--tokens", "32", "--out", str(tmp_path)]
    assert main(argv) == 0
    (row,) = json.loads(next(tmp_path.glob("layer-*.json")).read_text())["rows"]
    assert row["status"] == "unavailable" and row["note"] == "not here" and row["vs_peer"] is None


def test_time_step_medians_and_resets():
    log = []
    t = lb.time_step(lambda: log.append("step"), lambda: log.append("reset"), torch.device("cpu"), 2, 5, 60.0)
    # 2 warm-up, 5 timed one by one, then the loop clock: 3 runs of as many steps back to back
    assert log == ["reset", "step"] * (2 + 5 + lb.LOOP_REPEATS * 5)
    assert t["steps"] == 5 and t["clock"] == "wall" and t["ms"] == t["host_ms"] and t["first_s"] >= 0
    assert t["loop_ms"] > 0
    log.clear()  # a time budget shorter than one loop run: one run
    lb.time_step(lambda: (log.append("step"), time.sleep(2e-3)), lambda: None, torch.device("cpu"), 1, 3, 1e-3)
    assert log.count("step") == 1 + 3 + 3
    log.clear()  # no budget at all (benchmarks/layer_ab.py's): every loop run
    lb.time_step(lambda: log.append("step"), lambda: None, torch.device("cpu"), 1, 3, float("inf"))
    assert log.count("step") == 1 + 3 + lb.LOOP_REPEATS * 3


def test_speedups_per_config_tokens_and_mode():
    def row(variant, ms, mode="eager", tokens=8, status="ok", mib=None):
        return {"config": "c", "tokens": tokens, "mode": mode, "variant": variant, "ms": ms, "status": status,
                "loop_ms": None if ms is None else ms / 2 if variant == "peer" else ms,
                "dim": 4, "hidden": 3, "top_k": 2, "peak_mib": mib, "saved_mib": None if mib is None else mib / 2,
                "act_peak_mib": None if mib is None else mib - 4}

    rows = [row("peer", 2.0, mib=10.0), row("sparse-torch", 1.0, mib=6.0), row("sparse-torch", 4.0, mode="compile"),
            row("peer", 8.0, mode="compile"), row("sparse-auto", None, status="OOM"),
            row("sparse-auto", 1.0, tokens=9)]  # fmt: skip
    lb.speedups(rows, peak_tflops=1e-9)
    assert [r["vs_peer"] for r in rows] == [1.0, 2.0, 2.0, 1.0, None, None]
    assert [r["loop_vs_peer"] for r in rows] == [1.0, 1.0, 1.0, 1.0, None, None]
    assert [r["mem_vs_peer"] for r in rows] == [1.0, 0.6, None, None, None, None]
    assert [r["saved_vs_peer"] for r in rows] == [1.0, 0.6, None, None, None, None]
    assert [r["act_vs_peer"] for r in rows] == [1.0, 2 / 6, None, None, None, None]
    flops = 18 * 8 * 2 * 4 * 3  # tokens x top-k x dim x hidden, forward and backward
    assert rows[1]["tflops"] == pytest.approx(flops / 1.0 / 1e9) and rows[4]["tflops"] is None
    assert rows[1]["sol_pct"] == pytest.approx(100 * rows[1]["tflops"] / 1e-9)
    lb.speedups(rows)  # no measured matmul rate: no % of speed of light
    assert rows[1]["sol_pct"] is None and rows[1]["tflops"] is not None


def test_default_configs_are_model_configs_with_many_experts():
    from ragdot.moe.model import LAYER_CONFIGS

    names = lb.default_configs()
    assert names == ["qwen3-30b-a3b", "deepseek2-16b", "gpt-oss-like"]
    assert all(LAYER_CONFIGS[n].num_experts >= 64 for n in names) and len(set(names)) == len(names)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--quick", "--variants", "peer"], "peer"),
        (["--quick", "--tokens", "64"], "--tokens"),
        (["--layer", "--quick", "--tokens", "0"], "--tokens"),
        (["--layer", "--routing-only", "--quick"], "--routing-only"),
    ],
)
def test_layer_options_are_checked(argv, needle, tmp_path, capsys):
    assert main(["moe-bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ragdot moe-bench: error: ") and needle in err and "\n" not in err


def test_table_without_rich(monkeypatch, capsys):
    """rich is optional: a plain table, also for a run cut short before its first row."""
    import importlib
    import sys

    import ragdot.measure.console as text

    for name in ("rich", "rich.console", "rich.progress", "rich.table"):
        monkeypatch.setitem(sys.modules, name, None)
    importlib.reload(text)  # as in a process without rich: the plain-text stand-ins
    try:
        assert not text.HAVE_RICH
        lb.print_table([], torch.device("cpu"))
        row = {"config": "c", "tokens": 8, "mode": "eager", "variant": "peer", "status": "ok", "ms": 1.5,
               "host_ms": 1.5, "vs_peer": 1.0}  # fmt: skip
        lb.print_table([row, {**row, "variant": "sparse-torch", "status": "OOM", "ms": None}], torch.device("cpu"))
    finally:
        monkeypatch.undo()
        importlib.reload(text)
    out = capsys.readouterr().out
    assert "wall clock" in out and "1.500" in out and "1.00x" in out and "OOM" in out


def test_layer_ab_settings_parse_apply_and_restore():
    """benchmarks/layer_ab.py's `--set`: literals parsed, a bad setting named, each arm's switches applied over
    the defaults (what the other arm set is restored) and every prepared call re-planned."""
    from helpers import benchmark_script
    from ragdot.tune import select
    from ragdot.tune.cache import CACHE

    ab = benchmark_script("layer_ab")
    module, name, value = ab.parse_setting("ragdot.tune.select.VENDOR_WGRAD_ROWS=512")
    assert (module, name, value) == (select, "VENDOR_WGRAD_ROWS", 512)
    assert ab.parse_setting("ragdot.kernels.ragged_m.TMA_STORE=True")[2] is True
    for bad, match in (("VENDOR_WGRAD_ROWS", "module.NAME=VALUE"), ("ragdot.tune.select.NOPE=1", "has no NOPE")):
        with pytest.raises(ValueError, match=match):
            ab.parse_setting(bad)
    before, generation = select.VENDOR_WGRAD_ROWS, CACHE.generation
    arm_b = [ab.parse_setting("ragdot.tune.select.VENDOR_WGRAD_ROWS=7")]
    defaults = [(select, "VENDOR_WGRAD_ROWS", before)]
    try:
        ab.apply(arm_b, defaults)
        assert select.VENDOR_WGRAD_ROWS == 7 and CACHE.generation == generation + 1
        ab.apply([], defaults)
        assert before == select.VENDOR_WGRAD_ROWS
    finally:
        select.VENDOR_WGRAD_ROWS = before
