"""benchmarks/tune_vs_call.py (one cell timed the tuner's way and the call path's way): its public call computes
the cell's product, and a CPU dry run prints every way for every candidate."""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import benchmark_script


def _module():
    return benchmark_script("tune_vs_call")


@pytest.mark.parametrize("cls", ["fwd_wi", "dgrad_wi", "wgrad_wi", "wgrad_wo"])
def test_the_public_call_computes_the_cells_product(cls):
    mod = _module()  # puts benchmarks/ on the path
    from gluon_gpu import cell_operands, system_call

    from ragdot.routing import group_sizes

    ops = cell_operands(cls, 40, 16, 24, 3, torch.Generator().manual_seed(1), torch.float32)
    sizes = group_sizes("skewed", 40, 3)
    got = mod._user_call(cls, ops, sizes, "reference")()
    want = system_call("vendor", ops, sizes, 3)()
    torch.testing.assert_close(got, want.reshape(got.shape), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_a_dry_run_prints_each_way_for_each_candidate(capsys):
    backends = [n for n in ("triton", "torch") if n in ragdot.backends()][:1]
    assert _module().main(["--device", "cpu", "--shape", "32,16,16,2", "--cls", "wgrad_wi", "--iters", "1",
                           "--routings", "balanced", "--backends", *backends]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    ways = {line.split()[0] for line in lines[1:]}
    assert ways == {"tuner", "own-out", "call"} and any("vendor" in line for line in lines)


def test_no_usable_backend_is_one_line(capsys):
    assert _module().main(["--device", "cpu", "--shape", "32,16,16,2", "--backends", "nonesuch"]) == 2
    assert "--backends" in capsys.readouterr().err


def test_more_than_one_shape_is_one_line(capsys):
    assert _module().main(["--device", "cpu", "--shape", "tag:anchor"]) == 2
    assert "--shape: one shape" in capsys.readouterr().err
