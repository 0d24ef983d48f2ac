"""The Gluon weight gradient that reads one operand's rows through a row index (`ragdot.kernels.gluon.ragged_k_gather`).

CPU: its host side's refusals. GPU (`gpu` marker, sm_90 only): bitwise equal to the TMA-fed Gluon ragged_k on a
gathered copy and close to a float64 reference, with empty groups, a NaN row named only past the last group, negative
indices clamped, four- and eight-warp producers, one consumer or two (ping-pong).
"""

from __future__ import annotations

import pytest
import torch

from helpers import hopper, ragged_k_reference
from ragdot.kernels.gluon import GluonConfig


def test_gather_kernel_is_the_same_kernel_with_another_producer():
    """ragged_k_gather's kernel is ragged_k's consumer (fenced) with a cp.async producer: it builds for sm_90
    where Gluon imports, and its host side refuses what it does not serve, naming it."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.ampere")
    from ragdot.kernels.gluon import ragged_k_gather as rkg

    x, b = torch.empty(1, 64, 256, dtype=torch.bfloat16), torch.empty(1, 128, 256, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="ping-pong takes a four-warp producer"):
        rkg.Prepared(x, b, 4, torch.bfloat16, GluonConfig(128, 128, 64, 4, 4, consumers=2), gather_warps=8)
    with pytest.raises(NotImplementedError, match="bf16/fp16 only"):
        rkg.Prepared(x.float(), b.float(), 4, torch.float32)
    with pytest.raises(ValueError, match=r"expected \[1, S, M\]"):
        rkg.Prepared(x[0], b, 4, torch.bfloat16)
    with pytest.raises(ValueError, match="gather_warps: expected 4 or 8"):
        rkg.Prepared(x, b, 4, torch.bfloat16, gather_warps=2)
    with pytest.raises(ValueError, match="index: expected an int32"):
        rkg.ragged_k_gather(x[0], torch.zeros(128, dtype=torch.int64), b[0], torch.zeros(4, dtype=torch.int32))


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("sizes, cfg, warps", [
    ([40, 0, 300, 7, 0, 96], None, 4),  # skewed, empty groups, tails that straddle chunks
    ([40, 0, 300, 7, 0, 96], GluonConfig(128, 128, 64, 4, 4), 4),
    ([40, 0, 300, 7, 0, 96], GluonConfig(128, 128, 64, 4, 4), 8),  # an eight-warp producer
    ([128] * 6, GluonConfig(128, 256, 64, 3, 8), 4),
    ([40, 0, 300, 7, 0, 96], GluonConfig(128, 128, 64, 4, 4, consumers=2), 4),  # ping-pong consumers
    ([256, 0, 130, 255, 1, 64, 0, 320], GluonConfig(64, 256, 64, 4, 4, consumers=2), 4),  # odd and even items
])
def test_gather_kernel_matches_the_copy_and_a_float64ragged_k_reference(sizes, cfg, warps):
    from ragdot.kernels.gluon.ragged_k import Prepared
    from ragdot.kernels.gluon.ragged_k_gather import Prepared as GatherPrepared

    dev, gen = torch.device("cuda"), torch.Generator().manual_seed(11)
    s_rows, m, n, r = 200, 2880, 320, sum(sizes) + 24  # 24 rows past the last group
    x = torch.randn(s_rows, m, generator=gen).to(dev, torch.bfloat16)
    x[7] = float("nan")  # a token only the rows past the last group name
    index = torch.randint(0, s_rows, (r,), generator=gen).to(dev, torch.int32)
    index[index == 7] = 8
    index[sum(sizes):] = 7
    index[3] = -5  # clamped into [0, S): reads row 0
    b = torch.randn(r, n, generator=gen).to(dev, torch.bfloat16)
    ref_rows = x.index_select(0, index.clamp(0, s_rows - 1).long())
    prep = GatherPrepared(x[None], b[None], len(sizes), torch.bfloat16, cfg, from_sizes=True, gather_warps=warps)
    got = prep(x[None], b[None], torch.tensor(sizes, device=dev), index=index)[0]
    assert torch.isfinite(got).all()
    assert all((got[g] == 0).all() for g, size in enumerate(sizes) if size == 0)  # empty groups: exact zeros
    copy = Prepared(ref_rows[None].nan_to_num(0), b[None], len(sizes), torch.bfloat16, prep.cfg, from_sizes=True)
    want = copy(ref_rows[None].nan_to_num(0), b[None], torch.tensor(sizes, device=dev))[0]
    assert torch.equal(got, want)  # the same chunks in the same order: the same bits
    ref = ragged_k_reference(ref_rows[None].nan_to_num(0), b[None], sizes)
    assert torch.allclose(got.double(), ref, atol=0.5, rtol=2e-2)
    again = prep(x[None], b[None], torch.tensor(sizes, device=dev), index=index)[0]
    assert torch.equal(again, got)
