"""benchmarks/kernel_ab.py (a kernel module against its earlier source): a CPU dry run through the interpreter."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch

import ragdot
from helpers import benchmark_script

ROOT = Path(__file__).resolve().parent.parent
PATH = ROOT / "benchmarks" / "kernel_ab.py"


def _module():
    return benchmark_script("kernel_ab")


@pytest.mark.skipif(torch.cuda.is_available() or "triton" not in ragdot.backends(),
                    reason="the CPU dry run of the Triton kernels (on a GPU the script times them)")
@pytest.mark.parametrize("sizes", [False, True], ids=["ends", "from-sizes"])
def test_a_module_against_a_copy_of_itself_is_bitwise_equal(tmp_path, capsys, sizes):
    old = tmp_path / "old_ragged_k.py"
    shutil.copy(ROOT / "src" / "ragdot" / "kernels" / "ragged_k.py", old)
    out = tmp_path / "out"
    argv = ["--module", "ragdot.kernels.ragged_k", "--old", str(old), "--device", "cpu", "--shapes", "40,16,24,3",
            "--routing", "empty", "--classes", "wgrad_wi", "--configs", "default", "--seconds", "0.01",
            "--out", str(out), *(["--from-sizes"] if sizes else [])]
    assert _module().main(argv) == 0
    (path,) = out.glob("kernel-ab-*.csv")
    rows = list(csv.DictReader(path.open()))
    assert [r["system"].split(":")[0] for r in rows] == ["vendor", "old", "new"]
    assert all(r["status"] == "ok" and r["clock"] == "wall" and float(r["ms"]) > 0 for r in rows)
    assert [r["bitwise"] for r in rows[1:]] == ["True", "True"] and rows[1]["finite"] == "True"
    assert "0 kernel rows not bitwise equal or not finite" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--classes", "fwd_wi"], "--classes: fwd_wi are not ragged_k classes"),
    (["--shapes", "no-such-shape"], "--shapes"),
    (["--cell-timeout", "0"], "--cell-timeout: must be > 0"),
    (["--old-set", "TMA_STORE"], "--old-set: expected NAME=VALUE"),
    (["--old-set", "TMA_STORE=yes please"], "--old-set: expected NAME=VALUE"),
    (["--old-set", "NO_SUCH_NAME=1"], "--old-set: "),
])
def test_bad_arguments_exit_2_naming_the_argument(tmp_path, capsys, extra, message):
    old = tmp_path / "old.py"
    old.write_text("class Prepared: ...\n")
    argv = ["--module", "ragdot.kernels.ragged_k", "--old", str(old), "--device", "cpu", "--out", str(tmp_path), *extra]
    with pytest.raises(SystemExit) as exc:
        _module().main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_missing_old_file_is_a_usage_error(tmp_path, capsys):
    argv = ["--module", "ragdot.kernels.ragged_m", "--old", str(tmp_path / "nope.py"), "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:
        _module().main(argv)
    assert exc.value.code == 2 and "--old" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available() or "triton" not in ragdot.backends(),
                    reason="the CPU dry run of the Triton kernels (on a GPU the script times them)")
def test_a_module_switch_set_on_the_old_copy(tmp_path):
    """`--old-set`: the checkout's own file as "old" with one of its module-level switches set (ragged_m's
    TMA_STORE, which the interpreter's CPU path never reaches: the two give the same bits)."""
    mod = _module()
    old = mod.load_old(ROOT / "src" / "ragdot" / "kernels" / "ragged_m.py", "ragdot.kernels.ragged_m",
                       mod.parse_settings(["TMA_STORE=True"]))
    assert old.TMA_STORE is True
    import ragdot.kernels.ragged_m as current

    assert current.TMA_STORE is None  # the loaded copy is a module of its own
    out = tmp_path / "out"
    argv = ["--module", "ragdot.kernels.ragged_m", "--old", str(ROOT / "src" / "ragdot" / "kernels" / "ragged_m.py"),
            "--old-set", "TMA_STORE=True", "--device", "cpu", "--shapes", "40,16,24,3", "--routing", "skewed",
            "--classes", "dgrad_wi", "--configs", "default", "--seconds", "0.01", "--out", str(out)]
    assert mod.main(argv) == 0
    (path,) = out.glob("kernel-ab-*.csv")
    rows = list(csv.DictReader(path.open()))
    assert [r["system"].split(":")[0] for r in rows] == ["vendor", "old", "new"]
    assert all(r["bitwise"] == "True" for r in rows[1:])


def test_summary_is_the_geomean_of_old_over_new_per_clock():
    row = {"shape": "s", "cls": "wgrad_wi", "status": "ok"}
    rows = [{**row, "routing": "balanced", "system": "vendor", "clock": "graph", "ms": 9.0},
            {**row, "routing": "balanced", "system": "old:t1", "clock": "graph", "ms": 2.0},
            {**row, "routing": "balanced", "system": "new:t1", "clock": "graph", "ms": 1.0},
            {**row, "routing": "skewed", "system": "old:t1", "clock": "graph", "ms": 1.0},
            {**row, "routing": "skewed", "system": "new:t1", "clock": "graph", "ms": 2.0},
            {**row, "routing": "skewed", "system": "old:t2", "clock": "graph", "ms": 3.0},  # no new arm: left out
            {**row, "routing": "skewed", "system": "new:t1", "clock": "eager", "ms": 1.0, "status": "failed"}]
    (line,) = _module().summary(rows)
    assert line.startswith("graph: old / new time, geomean 1.0000 over 2 cell-configs")
    assert "lowest 0.500 (s wgrad_wi skewed), highest 2.000 (s wgrad_wi balanced)" in line
