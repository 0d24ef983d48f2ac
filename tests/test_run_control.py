"""Long runs: progress with the time left, a run budget, rows kept on Ctrl-C; reference numbers from a file;
busy-machine flags on measured ceilings."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ragdot.bench import ceilings as ceil
from ragdot.cli import main
from ragdot.cli_common import UsageError
from ragdot.measure.progress import INTERRUPTED, Progress
from ragdot.measure.targets import applies, load_targets, section

TARGETS = Path(__file__).resolve().parents[1] / "benchmarks" / "targets-h200.json"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_count_steps_and_estimate_the_time_left():
    clock, said = _Clock(), []
    progress = Progress(4, budget=25, say=said.append, clock=clock)
    assert progress.left() is None and not progress.spent()
    clock.now += 10
    progress.done("first")
    assert said == ["[1/4] first: 10.0 s (elapsed 10 s of a 25 s budget, about 30 s left)"]
    clock.now += 20
    progress.done("second", units=1)
    assert progress.left() == pytest.approx(30.0) and progress.spent()


def test_progress_with_weighted_steps_and_no_budget():
    clock = _Clock()
    progress = Progress(10.0, 2, say=None, clock=clock)
    clock.now += 2
    line = progress.done("small", units=2.0)
    assert line.startswith("[1/2] small: 2.0 s") and "about 8 s left" in line and "budget" not in line
    assert not progress.spent()


def test_targets_file_sections_and_errors(tmp_path):
    targets = load_targets(TARGETS)
    assert applies(targets, "NVIDIA H200") and not applies(targets, "cpu") and not applies({}, "NVIDIA H200")
    assert section(targets, "moe-bench", "cpu") == {}
    anchors = section(targets, "bench", "NVIDIA H200")["anchors"]
    assert len(anchors["tflops"]["balanced"]) == 8 and all(len(v) == 3 for v in anchors["tflops"]["skewed"].values())
    assert section(targets, "ceilings", "NVIDIA H200 NVL")["hbm_gbs"] > 0
    assert load_targets(None) == {}
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    for path, needle in ((tmp_path / "missing.json", "cannot read"), (bad, "JSON object")):
        with pytest.raises(UsageError, match=needle):
            load_targets(path)
    bad.write_text("{")
    with pytest.raises(UsageError, match="not a JSON file"):
        load_targets(bad)


@pytest.mark.parametrize("command", ["bench", "moe-bench"])
def test_a_bad_targets_file_is_one_line_and_status_2(command, tmp_path, capsys):
    argv = [command, "--quick", "--no-plots", "--out", str(tmp_path), "--targets", str(tmp_path / "none.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--targets" in err and "cannot read" in err


def test_no_reference_numbers_in_the_package():
    src = Path(ceil.__file__).resolve().parents[1]
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert "ANCHOR_TORCH" not in text and "720e12" not in text and "4.2e12" not in text, path


def test_busy_machine_flags():
    assert ceil.busy_reason(True, {"matmul": 0.05}, load=0.2, cores=2) == ""
    assert "load average 3.0 on 2 cores" in ceil.busy_reason(True, {}, load=3.0, cores=2)
    assert "matmul repeats 50% apart" in ceil.busy_reason(False, {"matmul": 0.5, "copy": 0.1})
    assert ceil.busy_reason(False, {}, load=99.0, cores=1) == ""  # the load of a GPU's host does not count
    flagged = ceil.Ceilings(1e12, 1e11, busy="load average 3.0 on 2 cores")
    assert flagged.label == "measured; BUSY: load average 3.0 on 2 cores" and ceil.Ceilings(1, 1).label == "measured"


def test_bench_flags_a_busy_cpu_in_the_console_summary_and_metadata(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ceil.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    argv = ["bench", "--quick", "--no-plots", "--classes", "fwd_wi", "--backends", "torch", "--no-vendor",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "BUSY: load average 64.0" in out and "busy machine" in out
    meta = json.loads(next(tmp_path.glob("*.json")).read_text())["meta"]
    assert meta["ceilings_busy"].startswith("load average 64.0")
    assert "**Note:** ceilings measured on a busy machine" in next(tmp_path.glob("*.md")).read_text()


def _fake_variant(calls: list[str], interrupt_at: int | None = None, seconds: float = 0.0, terminate: bool = False):
    import os
    import signal
    import time

    def run_variant(model, opt, tokens, cfg, name, args, device, dtype):
        calls.append(name)
        if interrupt_at is not None and len(calls) == interrupt_at:
            if terminate:  # what `timeout` sends: the CLI turns it into an interrupt
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            raise KeyboardInterrupt
        time.sleep(seconds)
        return {"variant": name, "status": "ok", "step_s": 0.01 * len(calls), "mode": "eager"}

    return run_variant


def _csv_rows(folder: Path, pattern: str) -> list[dict[str, str]]:
    (path,) = folder.glob(pattern)
    with open(path) as f:
        return list(csv.DictReader(f))


def test_moe_bench_keeps_finished_rows_on_ctrl_c(tmp_path, monkeypatch, capsys):
    from ragdot.bench import moe_train

    calls: list[str] = []
    monkeypatch.setattr(moe_train, "_run_variant", _fake_variant(calls, interrupt_at=3))
    assert main(["moe-bench", "--quick", "--no-plots", "--out", str(tmp_path)]) == INTERRUPTED
    captured = capsys.readouterr()
    from ragdot.moe.variants import DEFAULT_VARIANTS as VARIANTS

    assert "interrupted: 2 finished rows kept" in captured.err and f"[2/{len(VARIANTS)}]" in captured.out
    rows = _csv_rows(tmp_path, "moe-bench-*.csv")
    assert [r["variant"] for r in rows] == calls[:2] and rows[1]["speedup_vs_padded"]


def test_sigterm_keeps_finished_rows_like_ctrl_c_and_restores_the_handler(tmp_path, monkeypatch, capsys):
    import signal

    from ragdot.bench import moe_train

    before = signal.getsignal(signal.SIGTERM)
    calls: list[str] = []
    monkeypatch.setattr(moe_train, "_run_variant", _fake_variant(calls, interrupt_at=2, terminate=True))
    assert main(["moe-bench", "--quick", "--no-plots", "--out", str(tmp_path)]) == INTERRUPTED
    assert "interrupted: 1 finished rows kept" in capsys.readouterr().err
    assert [r["variant"] for r in _csv_rows(tmp_path, "moe-bench-*.csv")] == calls[:1]
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_swallowed_by_a_finalizer_still_stops_at_the_next_step(tmp_path, monkeypatch, capsys):
    """A SIGTERM that lands inside a weakref callback or __del__ has its KeyboardInterrupt swallowed by Python
    ("Exception ignored in ..."): the run must still stop before its next step, keeping the rows it finished."""
    import contextlib

    from ragdot import cli
    from ragdot.bench import moe_train

    calls: list[str] = []

    def run_variant(model, opt, tokens, cfg, name, args, device, dtype):
        calls.append(name)
        if len(calls) == 2:
            with contextlib.suppress(KeyboardInterrupt):  # what a finalizer does with the handler's interrupt
                cli._interrupt(15, None)
        return {"variant": name, "status": "ok", "step_s": 0.01 * len(calls), "mode": "eager"}

    monkeypatch.setattr(moe_train, "_run_variant", run_variant)
    assert main(["moe-bench", "--quick", "--no-plots", "--out", str(tmp_path)]) == INTERRUPTED
    assert len(calls) == 2 and "interrupted: 2 finished rows kept" in capsys.readouterr().err
    assert [r["variant"] for r in _csv_rows(tmp_path, "moe-bench-*.csv")] == calls
    from ragdot.measure import progress

    assert not progress._stop  # the next run in this process starts clean


def test_moe_bench_budget_skips_the_variants_left(tmp_path, monkeypatch):
    from ragdot.bench import moe_train

    calls: list[str] = []
    # the budget outlasts building the tiny model (tens of ms on a loaded CI machine), not the first variant
    monkeypatch.setattr(moe_train, "_run_variant", _fake_variant(calls, seconds=0.6))
    assert main(["moe-bench", "--quick", "--no-plots", "--quiet", "--budget", "0.3", "--out", str(tmp_path)]) == 0
    from ragdot.moe.variants import DEFAULT_VARIANTS as VARIANTS

    rows = _csv_rows(tmp_path, "moe-bench-*.csv")
    assert len(calls) == 1 and len(rows) == len(VARIANTS)
    assert [r["status"] for r in rows] == ["ok"] + ["skipped"] * (len(VARIANTS) - 1)


def test_bench_mxfp8_keeps_rows_on_ctrl_c_and_honours_its_budget(tmp_path, monkeypatch, capsys):
    pytest.importorskip("triton")
    import time

    from ragdot.bench import mxfp8_cases

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen: list[str] = []

    def fake_shape(shape, dims, args, variants, emit, on_routing=None, spent=lambda: False, hbm_gbs=None):
        seen.append(shape)
        for routing in args.routings:
            if spent():
                break
            time.sleep(0.05)
            emit({"shape": shape, "routing": routing, "variant": "v", "ms": 1.0, "tflops": 0.0, "speedup": 1.0,
                  "err": 0.0, "note": ""})
            on_routing(f"{shape} {routing}")
            if shape == "interrupt":
                raise KeyboardInterrupt

    monkeypatch.setattr(mxfp8_cases, "bench_shape", fake_shape)
    base = ["bench-mxfp8", "--device", "cpu", "--shapes", "tiny", "1024,64,64,4", "--out"]
    assert main([*base, str(tmp_path / "budget"), "--budget", "0.01"]) == 0
    assert seen == ["tiny"] and len(_csv_rows(tmp_path / "budget", "mxfp8-bench-*.csv")) == 1
    assert "[1/4] tiny aligned" in capsys.readouterr().out
    monkeypatch.setitem(__import__("ragdot.bench.mxfp8", fromlist=["SHAPES"]).SHAPES, "interrupt", (64, 64, 4, 1024))
    seen.clear()
    argv = ["bench-mxfp8", "--device", "cpu", "--shapes", "interrupt", "tiny", "--out", str(tmp_path / "stop")]
    assert main(argv) == INTERRUPTED
    assert seen == ["interrupt"] and len(_csv_rows(tmp_path / "stop", "mxfp8-bench-*.csv")) == 1


def test_keep_on_interrupt_and_until_spent(capsys):
    from ragdot.measure.progress import KeepOnInterrupt

    rows = [1, 2]
    with KeepOnInterrupt(rows) as kept:
        raise KeyboardInterrupt
    assert kept.status == INTERRUPTED and "interrupted: 2 finished rows kept" in capsys.readouterr().err
    with pytest.raises(ValueError), KeepOnInterrupt(rows):
        raise ValueError("not ours to swallow")
    clock = _Clock()
    progress = Progress(3, budget=1.0, say=None, clock=clock)
    seen = []
    for item in progress.until_spent(["a", "b", "c"], "items"):
        seen.append(item)
        clock.now += 2
    assert seen == ["a"] and "budget spent: b and the items after it are left out" in capsys.readouterr().err
