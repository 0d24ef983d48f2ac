"""benchmarks/overlap_probe.py and wgrad_tiles.py on a CPU: the systems they time compute what they claim
(Triton's interpreter, float16), and bad arguments stop with a usage error."""

from __future__ import annotations

import json

import pytest
import torch

import ragdot
from helpers import benchmark_script

needs_cpu_triton = pytest.mark.skipif(torch.cuda.is_available() or "triton" not in ragdot.backends(),
                                      reason="the CPU smoke run of the Triton kernels (on a GPU the scripts time them)")


@needs_cpu_triton
def test_overlap_probe_systems_agree_bitwise(tmp_path, capsys):
    mod = benchmark_script("overlap_probe")
    out = tmp_path / "ov.json"
    rc = mod.main(["--device", "cpu", "--layer", "tiny", "--tokens", "24", "--rounds", "1", "--reps", "1",
                   "--out", str(out)])
    assert rc == 0
    rows = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
    assert {"seq p2", "seq p1", "conc p1", "conc p1 rk-first", "dx p1", "dwgu p2"} <= set(rows)
    assert all(rows[s]["check"] is True for s in ("seq p2", "seq p1", "conc p1", "conc p1 rk-first"))
    assert "bitwise equal" in capsys.readouterr().out


@needs_cpu_triton
def test_overlap_probe_products_match_a_float64_reference():
    mod = benchmark_script("overlap_probe")
    ops = mod._operands("tiny", 16, torch.device("cpu"), torch.float16)
    systems, keys = mod._systems(ops, interpret=True)
    systems["seq p1"]()
    dwd, dx, dwgu = (ops["outs"][k].double() for k in keys["seq p1"])
    sizes = ops["sizes"].tolist()
    ends = torch.tensor(sizes).cumsum(0).tolist()
    d64 = {k: ops[k].double() for k in ("x_rows", "dpre", "act_w", "dy_rows", "w_gate_up")}
    start = 0
    for g, end in enumerate(ends):
        rows = slice(start, end)
        torch.testing.assert_close(dwd[g, 0], d64["act_w"][rows].T @ d64["dy_rows"][rows], rtol=2e-3, atol=2e-2)
        torch.testing.assert_close(dwgu[g, 0], d64["x_rows"][rows].T @ d64["dpre"][rows], rtol=2e-3, atol=2e-2)
        torch.testing.assert_close(dx[0, rows], d64["dpre"][rows] @ d64["w_gate_up"][g].T, rtol=2e-3, atol=2e-2)
        start = end


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--rounds", "0"], ["--reps", "-1"]])
def test_overlap_probe_rejects_bad_counts(argv, capsys):
    mod = benchmark_script("overlap_probe")
    with pytest.raises(SystemExit) as exc:
        mod.main(["--device", "cpu", "--layer", "tiny", *argv])
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--shapes", "1,2,3"], ["--shapes", "64,0,32,4"], ["--rounds", "0"]])
def test_wgrad_tiles_rejects_bad_arguments(argv, capsys):
    mod = benchmark_script("wgrad_tiles")
    with pytest.raises(SystemExit) as exc:
        mod.main(["--device", "cpu", *argv])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@needs_cpu_triton
def test_wgrad_tiles_smoke_writes_its_rows(tmp_path):
    mod = benchmark_script("wgrad_tiles")
    out = tmp_path / "tiles.json"
    assert mod.main(["--device", "cpu", "--shapes", "48,32,32,3", "--rounds", "1", "--reps", "1",
                     "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["system"] for r in rows] == ["vendor", mod.TILES[0].short()]
    assert all(r["graph_ms"] > 0 for r in rows)


@pytest.mark.parametrize("argv", [["--shapes", "1,2,3"], ["--shapes", "64,0,32,4"], ["--rounds", "0"], ["--reps", "0"]])
def test_wgrad_anatomy_rejects_bad_arguments(argv, capsys):
    mod = benchmark_script("wgrad_anatomy")
    with pytest.raises(SystemExit) as exc:
        mod.main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_wgrad_anatomy_builds_every_variant_for_sm90():
    """Its variants compile for sm_90 on any machine: the store-free one keeps its MMAs, the two-buffer epilogue is
    refused where the ring leaves no room for it, named."""
    from helpers import BENCHMARKS, bundled_ptxas, compiled_in_a_subprocess

    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    if not bundled_ptxas():
        pytest.skip("needs the ptxas bundled with Triton's NVIDIA backend")
    mod = benchmark_script("wgrad_anatomy")
    out = compiled_in_a_subprocess([str(BENCHMARKS / "wgrad_anatomy.py"), "--compile-only", "--shapes",
                                    "1024,256,512,8"])
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert "no room for a second epilogue tile" in lines["128x256x32s6w8g8r24 tma2"]
    for tile in mod.TILES:
        assert "'wgmma': True" in lines[f"{tile.short()} none"]
        assert "'spills': 0" in lines[f"{tile.short()} tma"]
