"""benchmarks/write_ceiling.py --check: every store path writes the whole buffer (the interpreter on a CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ragdot
from helpers import benchmark_script

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "write_ceiling.py"


def _module():
    return benchmark_script("write_ceiling")


@pytest.mark.skipif(torch.cuda.is_available() or "triton" not in ragdot.backends(),
                    reason="the CPU check of the Triton store kernels (on a GPU the script times them)")
def test_every_store_path_writes_every_element(capsys):
    mod = _module()
    assert mod.main(["--check", "--groups", "2", "--m", "128", "--n", "256", "--tokens", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.rsplit(None, 1)[0].strip() for line in lines]
    assert names == ["fill_", "zero_", "triton store default", "triton store .cs", "triton store .wt",
                     "triton store .cg", "triton TMA store tile per program", "triton TMA store persistent"]
    assert all(line.endswith(" ok") for line in lines)


def test_a_buffer_that_is_not_whole_tiles_has_no_tma_row_and_timing_needs_cuda(capsys):
    mod = _module()
    out = torch.empty(2, 16, 24)
    assert not any("TMA" in name for name, _ in mod.writers(out))
    if not torch.cuda.is_available():
        assert mod.main(["--groups", "2"]) == 2
        assert "needs a CUDA device" in capsys.readouterr().err


def test_bad_sizes_exit_2_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        _module().main(["--check", "--m", "0"])
    assert exc.value.code == 2
    assert "argument --m: expected an int >= 1, got 0" in capsys.readouterr().err


def test_a_path_that_misses_an_element_stops_the_probe_and_one_that_raises_is_left_out(monkeypatch, capsys):
    mod = benchmark_script("write_ceiling")
    out = torch.empty(2, 4, 8)

    def refused():
        raise RuntimeError("not on this GPU\nmore")

    monkeypatch.setattr(mod, "writers", lambda t: [("fill_", lambda: t.fill_(1.0)), ("refused", refused)])
    assert [name for name, _ in mod._checked(out, quiet=True)] == ["fill_"]
    assert "refused                          failed: RuntimeError: not on this GPU" in capsys.readouterr().out
    monkeypatch.setattr(mod, "writers", lambda t: [("half", lambda: t[0].fill_(1.0))])
    assert mod._checked(out, quiet=True) is None
    printed = capsys.readouterr().out
    assert "half" in printed and printed.rstrip().endswith("WRONG")
