"""benchmarks/profile_cell.py (the cell ncu profiles): its systems resolve, run and are checked on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ragdot
from helpers import benchmark_script

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "profile_cell.py"


def _module():
    return benchmark_script("profile_cell")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run (on a GPU the script profiles)")
@pytest.mark.parametrize("cls", ["fwd_wi", "dgrad_wi", "wgrad_wi", "wgrad_wo"])
def test_every_system_runs_and_matches_the_vendor(cls, capsys):
    systems = ["vendor", "torch", "reference"] + (["triton"] if "triton" in ragdot.backends() else [])
    assert _module().main(["--device", "cpu", "--shape", "40,16,24,3", "--cls", cls, "--routing", "skewed",
                           "--systems", *systems]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(systems)
    for system, line in zip(systems, lines):
        assert f" {system}: profiled 1 call(s), error vs vendor " in line
        assert float(line.rsplit(" ", 1)[1]) < 1e-5


@pytest.mark.skipif(torch.cuda.is_available() or "triton" not in ragdot.backends(),
                    reason="the CPU dry run, with the triton backend through Triton's interpreter")
def test_config_labels_resolve_and_unknown_ones_are_one_line_errors(capsys):
    module = _module()
    argv = ["--device", "cpu", "--shape", "40,16,24,3", "--cls", "fwd_wi"]
    assert module.main([*argv, "--list-configs", "triton"]) == 0
    labels = capsys.readouterr().out.split("\n")
    assert labels[0].startswith("triton:")
    assert module.main([*argv, "--systems", "vendor", labels[0]]) == 0
    assert "error vs vendor" in capsys.readouterr().out
    assert module.main([*argv, "--systems", "triton:no-such-tile"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "triton:no-such-tile" in err and labels[0] in err
    assert module.main([*argv, "--systems", "vendor", "--calls", "0"]) == 2
    assert "--calls" in capsys.readouterr().err
