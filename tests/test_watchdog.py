"""ragdot.measure.watchdog: a deadline that ends a hung run naming its piece of work, and stays quiet otherwise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ragdot.measure.watchdog import EXIT_HUNG, Watchdog


def _run(body: str) -> subprocess.CompletedProcess:
    head = "import time\nfrom pathlib import Path\nfrom ragdot.measure.watchdog import Watchdog\n"
    code = head + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_missed_deadline_names_the_work_and_the_rows_and_exits_3():
    proc = _run("""
        dog = Watchdog("probe", [Path("out/rows.csv")])
        with dog.cell("cell a fwd_wi skewed", 0.3):
            time.sleep(30)
        print("not reached")
    """)
    assert proc.returncode == EXIT_HUNG == 3
    assert "probe: cell a fwd_wi skewed did not finish within 0.3 s" in proc.stderr
    assert "out/rows.csv" in proc.stderr and "not reached" not in proc.stdout


def test_work_that_ends_in_time_disarms_it():
    proc = _run("""
        dog = Watchdog("probe")
        for i in range(3):
            with dog.cell(f"cell {i}", 0.5):
                time.sleep(0.05)
        time.sleep(1.0)  # past every deadline, none armed
        dog.arm("again", 5)
        dog.disarm()
        print("done")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "done" and proc.stderr == ""


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
def test_a_deadline_must_be_positive(seconds):
    with pytest.raises(ValueError, match="seconds must be > 0"):
        Watchdog("probe").arm("x", seconds)
