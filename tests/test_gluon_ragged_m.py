"""The Gluon ragged-M kernel (the MoE forward and data gradient, `ragdot.kernels.gluon.ragged_m`).

CPU: the row-tile table (its Triton kernel through the interpreter) and the triton fallback for operands TMA
cannot address. GPU (`gpu` marker, sm_90 only): against a float64 reference over balanced / skewed / empty groups,
NaN-poisoned rows past the last group stored as exact zeros, both weight layouts, every candidate config, batches
and dtypes, half tail tiles, ping-pong consumers over many items, bitwise repeats, and the backend's prepared call
from raw group sizes.
"""

from __future__ import annotations

import pytest
import torch

from helpers import SIZES_BY_ROUTING, hopper, misaligned_nan_tailed
from ragdot.kernels.gluon import GluonConfig
from ragdot.kernels.gluon.config import gluon_m_tuning_configs
from ragdot.routing import skewed

# ---- CPU: the row-tile table and the fallback ---------------------------------------------------------------


def _table_reference(sizes: list[int], m: int, block_m: int) -> list[tuple[int, int, int, int, int]]:
    """Per slot: group, first row, end row, the group's first slot and tile count."""
    out, start = [], 0
    for g, end in enumerate([*torch.tensor(sizes).clamp(min=0).cumsum(0).clamp(max=m).tolist(), m]):
        end = max(end, start)
        rows = range(start, end, block_m)
        out += [(g, r, end, len(out), len(rows)) for r in rows]
        start = end
    return out


_SKEWED_130 = [(i * 7) % 23 for i in range(130)]  # 130 groups: the slot-to-group tile is cut into slot chunks


@pytest.mark.parametrize("sizes, m", [([5, 0, 130, 64], 300), ([0, 0], 10), ([400, 7], 300), ([-3, 64, 1], 65),
                                      ([64, 64], 128), (_SKEWED_130, 1500), (_SKEWED_130, 3000)])
def test_ragged_m_tile_table(sizes, m):
    """Row tiles per group from the raw sizes (clamped, negatives as 0), the tail group G last, unused slots
    after (group -1, themselves as their first slot, one tile); the same table from clamped ends."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from ragdot.kernels.gluon.ragged_m import table_launch, tile_table

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    raw = torch.tensor(sizes, device=dev)
    table = tile_table(raw, m, 64, from_sizes=True).cpu()
    want = _table_reference(sizes, m, 64)
    slots = -(-m // 64) + len(sizes) + 1
    assert table.shape == (5, slots)
    unused = [(-1, 0, 0, t, 1) for t in range(len(want), slots)]
    assert [tuple(col) for col in table.T.tolist()] == want + unused
    bound = table_launch(m, 64, len(sizes), True, torch.device(dev))  # what a Prepared launches: the same table
    assert torch.equal(tile_table(raw, m, 64, True, launch=bound).cpu(), table)
    ends = raw.clamp(min=0).cumsum(0).clamp(max=m).to(torch.int32)
    again = [tuple(col) for col in tile_table(ends, m, 64, from_sizes=False).cpu().T.tolist()]
    assert again == want + unused
    ends[len(sizes) // 2] = 0  # ends that fall back are held at the running maximum, as the rows' order is
    sizes_held = [max(e - s, 0) for s, e in zip([0, *ends.cummax(0).values.tolist()], ends.cummax(0).values.tolist())]
    held = [tuple(col) for col in tile_table(ends, m, 64, from_sizes=False).cpu().T.tolist()]
    assert held[: len(_table_reference(sizes_held, m, 64))] == _table_reference(sizes_held, m, 64)


def test_ragged_m_misaligned_operands_run_the_triton_kernel():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from ragdot.kernels.gluon.ragged_m import Prepared

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(4)
    m, k, n, sizes = 40, 64, 32, [7, 0, 20]
    a = misaligned_nan_tailed(m, k, 27, gen, dev)
    b = torch.randn(1, 3, k, n, generator=gen).to(dev, torch.float16)
    out = Prepared(a, b, torch.float32, from_sizes=True)(a, b, torch.tensor(sizes, device=dev))[0]
    ref = _reference_m(a.nan_to_num(0), b, sizes)
    assert torch.isfinite(out).all() and (out[:, 27:] == 0).all()
    assert torch.allclose(out.double(), ref, atol=1e-2, rtol=1e-2)


# ---- GPU: against a float64 reference -----------------------------------------------------------------------


def _reference_m(a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """float64 c [Bt, M, N]: rows of group g times b[:, g]; rows past the last group exactly zero."""
    out = torch.zeros(a.shape[0], a.shape[1], b.shape[3], dtype=torch.float64, device=a.device)
    start = 0
    for g, size in enumerate(sizes):
        out[:, start : start + size] = a[:, start : start + size].double() @ b[:, g].double()
        start += size
    return out


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("layout", ["fwd", "dgrad"])
@pytest.mark.parametrize("routing", sorted(SIZES_BY_ROUTING))
@pytest.mark.parametrize("m, k, n, e, used", [(1000, 256, 192, 8, 900), (4096, 512, 384, 16, 4096),
                                              (777, 128, 136, 5, 700)])
def test_ragged_m_matches_float64(layout, routing, m, k, n, e, used):
    from ragdot.kernels.gluon.ragged_m import ragged_m

    sizes = SIZES_BY_ROUTING[routing](used, e)
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    if layout == "fwd":
        b = torch.randn(1, e, k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    else:  # the data-gradient layout: each group's matrix stored [N, K]
        b = torch.randn(1, e, n, k, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(2, 3)
    a[:, used:] = float("nan")  # rows past the last group: their outputs must be exact zeros
    ends = torch.tensor(sizes).cumsum(0).to(device="cuda", dtype=torch.int32)
    out = ragged_m(a, b, ends)
    from ragdot.measure.checks import normalised_error

    assert torch.isfinite(out).all() and (out[:, used:] == 0).all()
    assert normalised_error(out, _reference_m(a.nan_to_num(0), b, sizes)) <= 2e-2
    assert torch.equal(ragged_m(a, b, ends), out), "not bitwise reproducible"


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("cfg", gluon_m_tuning_configs(512, 264), ids=lambda c: c.short())
def test_ragged_m_every_candidate_config_batch_and_dtypes(cfg):
    from ragdot.kernels.gluon.ragged_m import ragged_m
    from ragdot.measure.checks import normalised_error

    sizes = [300, 0, 17, 64, 0, 129, 1, 200, 63, 65]
    gen = torch.Generator(device="cuda").manual_seed(13)
    a = torch.randn(2, 1000, 512, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(2, len(sizes), 512, 264, device="cuda", dtype=torch.float16, generator=gen)
    a[:, sum(sizes):] = float("nan")
    ends = torch.tensor(sizes).cumsum(0).to(device="cuda", dtype=torch.int32)
    ref = _reference_m(a.nan_to_num(0), b, sizes)
    for out_dtype in (torch.float16, torch.float32):
        if cfg not in gluon_m_tuning_configs(512, 264, out_dtype.itemsize):  # its epilogue tile does not fit
            with pytest.raises(NotImplementedError, match="shared memory"):
                ragged_m(a, b, ends, out_dtype, config=cfg)
            continue
        out = ragged_m(a, b, ends, out_dtype, config=cfg)
        assert out.dtype == out_dtype and torch.isfinite(out).all() and (out[:, sum(sizes):] == 0).all()
        assert normalised_error(out, ref) <= 3e-3
    b1 = b[:, :1].contiguous()  # a slice of b is no flat row view (the kernel refuses it: NotImplementedError)
    out = ragged_m(a, b1, ends[-1:], config=cfg)  # G=1: one group over the used rows
    assert (out[:, sum(sizes):] == 0).all()
    assert normalised_error(out, _reference_m(a.nan_to_num(0), b1, [sum(sizes)])) <= 3e-3


def _m_case(sizes: list[int], extra: int, k: int, n: int, layout: str, seed: int):
    """(a [1, sum + extra, K] with NaN rows past the groups, b [1, G, K, N] (the "dgrad" layout: each matrix stored
    [N, K]), int32 ends, rows used) for a Gluon ragged_m test on the GPU."""
    used = sum(sizes)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(1, used + extra, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    if layout == "fwd":
        b = torch.randn(1, len(sizes), k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    else:
        b = torch.randn(1, len(sizes), n, k, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(2, 3)
    a[:, used:] = float("nan")
    ends = torch.tensor(sizes).cumsum(0).to(device="cuda", dtype=torch.int32)
    return a, b, ends, used


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("layout", ["fwd", "dgrad"])
@pytest.mark.parametrize("cfg", [GluonConfig(128, 256, 32, 6, 8), GluonConfig(128, 128, 64, 4, 4, consumers=2),
                                 GluonConfig(128, 256, 64, 3, 8)], ids=lambda c: c.short())
def test_ragged_m_half_tail_tiles_equal_whole_tiles(cfg, layout, monkeypatch):
    """HALF_TAIL_TILES (a group's last tile holding at most 64 of its 128 rows multiplies those rows alone):
    tails of 1, 63, 64, 65 and 127 rows, whole tiles, empty and one-row groups, a NaN tail of rows past the last
    group (its zeros stored by half tiles too); against float64, tail rows exactly zero, bitwise equal to
    whole tiles (each output element sums the same products in the same order)."""
    from ragdot.kernels.gluon.ragged_m import ragged_m
    from ragdot.measure.checks import normalised_error

    sizes = [129, 0, 1, 191, 192, 193, 128, 255, 64, 0, 300, 2, 383]
    a, b, ends, used = _m_case(sizes, 40, 256, 512, layout, seed=29)
    whole = ragged_m(a, b, ends, config=cfg)
    monkeypatch.setattr("ragdot.kernels.gluon.ragged_m.HALF_TAIL_TILES", True)
    half = ragged_m(a, b, ends, config=cfg)
    assert torch.isfinite(half).all() and (half[:, used:] == 0).all()
    assert normalised_error(half, _reference_m(a.nan_to_num(0), b, sizes)) <= 2e-2
    assert torch.equal(half, whole)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("layout", ["fwd", "dgrad"])
@pytest.mark.parametrize(
    "cfg", [c for c in gluon_m_tuning_configs(256, 1024) if c.consumers == 2], ids=lambda c: c.short()
)
def test_ragged_m_ping_pong_over_many_items_per_program(cfg, layout):
    """Ping-pong ragged_m: ~6 items per program (8000 rows in 40 groups of unequal sizes, empty and one-row ones
    among them, then a NaN tail), alternately consumed by the two consumers; tail tiles contract nothing, so
    the turn barriers also pass items without chunks. Against float64, tail rows exactly zero, bitwise stable."""
    from ragdot.kernels.gluon.ragged_m import ragged_m
    from ragdot.measure.checks import normalised_error

    base = [700, 0, 1, 64, 0, 129, 65, 0, 300, 2, 640, 63, 0, 128, 17, 255, 256, 3, 90, 0]
    sizes = base + base[::-1]
    a, b, ends, used = _m_case(sizes, 300, 256, 1024, layout, seed=19)
    out = ragged_m(a, b, ends, config=cfg)
    assert torch.isfinite(out).all() and (out[:, used:] == 0).all()
    assert normalised_error(out, _reference_m(a.nan_to_num(0), b, sizes)) <= 2e-2
    assert torch.equal(ragged_m(a, b, ends, config=cfg), out), "not bitwise reproducible"


@pytest.mark.gpu
@hopper
def test_backend_ragged_m_from_raw_sizes_matches_triton_and_delegates_odd_k():
    from ragdot.backends import get_backend
    from ragdot.measure.checks import normalised_error

    gl_backend, tr_backend = get_backend("gluon"), get_backend("triton")
    sizes = skewed(3000, 16).tolist()
    gen = torch.Generator(device="cuda").manual_seed(17)
    a = torch.randn(1, 3200, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(1, 16, 1024, 768, device="cuda", dtype=torch.bfloat16, generator=gen)
    raw = torch.tensor(sizes, device="cuda", dtype=torch.int64)
    call = gl_backend.prepare("ragged_m", a, b, 16, torch.bfloat16)
    out = call(a, b, raw)
    ref = tr_backend.prepare("ragged_m", a, b, 16, torch.bfloat16)(a, b, raw)
    assert normalised_error(out, ref) <= 1e-2 and torch.equal(call(a, b, raw), out)
    assert (out[:, 3000:] == 0).all()
    odd = gl_backend.prepare("ragged_m", a[:, :, :1000], b[:, :, :1000], 16, torch.bfloat16)  # K % 64 != 0
    assert normalised_error(odd(a[:, :, :1000], b[:, :, :1000], raw),
                            tr_backend.ragged_m(a[:, :, :1000], b[:, :, :1000], raw.cumsum(0).int(), torch.bfloat16)
                            ) <= 1e-2
