"""benchmarks/gluon_carry.py, the reproducer of the ragged-M prefetch's hang: its case, its sm_90 compile."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import bundled_ptxas, compiled_in_a_subprocess

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_case_sums_each_items_own_rows():
    from gluon_carry import BLOCK, make_case

    a, info, ref = make_case(50, "cpu", seed=3)
    rows, chunks = info[:, 0].long(), info[:, 1].long()
    assert info.shape == (50, 8) and info.dtype == torch.int32
    assert bool((chunks >= 1).all()) and int(rows[0]) == 0 and a.shape == (int(chunks.sum()) * BLOCK, BLOCK)
    assert torch.equal(rows[1:], rows[:-1] + chunks[:-1] * BLOCK)  # items' rows in order, no gaps
    assert torch.equal(info[:, 2], info[:, 3]) and torch.equal(info[:, 4], info[:, 5])  # pairs that cancel
    i = 17
    assert ref[i] == a[rows[i]: rows[i] + chunks[i] * BLOCK].double().sum()


@pytest.mark.skipif(not bundled_ptxas(), reason="needs the ptxas bundled with Triton's NVIDIA backend")
def test_every_variant_compiles_for_sm90_warp_specialized():
    stdout = compiled_in_a_subprocess([str(ROOT / "benchmarks" / "gluon_carry.py")])
    report = json.loads(stdout.strip().splitlines()[-1])
    assert set(report) == {"carry24", "carry48", "plain24"}
    assert all(isinstance(v["spills"], int) and v["regs"] > 0 for v in report.values())
    assert report["plain24"]["spills"] == 0  # the pattern the ragged kernels use does not spill


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU")
def test_the_per_item_producer_delivers_every_chunk():
    from gluon_carry import variant_results

    assert variant_results("plain24", programs=16, items=200)["ok"]
