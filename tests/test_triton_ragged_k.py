"""Kernel-level tests of the weight gradient's ragged-K kernels (ragdot.kernels.ragged_k) against a float64
torch reference: pointer and persistent tiles, ragged TMA loads, a row-index operand, strided outputs, the
in-kernel group ranking. Without CUDA through Triton's interpreter (float16/float32, small tiles); the `gpu`
tests add bfloat16 and the sm_90 TMA paths.
"""

from __future__ import annotations

import pytest
import torch

from kernel_cases import (
    DEVICE,
    SMALL,
    SMALL_PERSISTENT_K,
    TOL,
    ends_of,
    gpu,
    needs_cuda,
    operand,
    ref_ragged_k,
    rel_err,
)
from ragdot.kernels import TileConfig, candidate_configs
from ragdot.kernels import ragged_k as rk_mod
from ragdot.kernels.configs import tuning_configs

# ---- ragged-K -------------------------------------------------------------------------------------------

RAGGED_K_CASES = [
    (37, 24, 19, [5, 0, 20, 3]),  # odd M/N, an empty group, NaN rows past the last group
    (9, 16, 16, [3, 2, 4]),  # groups shorter than BLOCK_K
    (40, 33, 17, [0, 0, 40]),  # leading empty groups: exact zeros
    (12, 8, 8, [0, 0]),  # no rows in any group: every output exactly zero
]


@pytest.mark.parametrize("cfg", [SMALL, SMALL_PERSISTENT_K], ids=["grid", "persistent"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", RAGGED_K_CASES)
def test_ragged_k_matches_reference(case: tuple, dtype: torch.dtype, cfg: TileConfig) -> None:
    r, m, n, sizes = case
    a = operand((1, r, m), dtype, False)
    b = operand((1, r, n), dtype, False)
    ends = ends_of(sizes, r)
    a[:, int(ends[-1]) :] = float("nan")
    b[:, int(ends[-1]) :] = float("inf")
    c = rk_mod.ragged_k(a, b, ends, config=cfg)
    ref = ref_ragged_k(a.nan_to_num(0), b.nan_to_num(0, 0, 0), ends)
    assert c.shape == (len(sizes), 1, m, n) and not c.isnan().any()
    for g, size in enumerate(sizes):
        if min(size, r) == 0 or (g > 0 and ends[g] == ends[g - 1]):
            assert (c[g] == 0).all(), f"empty group {g} must be exactly zero"
    if ref.norm() > 0:
        assert rel_err(c, ref) < TOL[dtype]


@pytest.mark.parametrize("a_t,b_t,cfg", [(True, False, SMALL), (False, True, SMALL), (True, True, SMALL_PERSISTENT_K)])
def test_ragged_k_transposed_views(a_t: bool, b_t: bool, cfg: TileConfig) -> None:
    r, m, n, sizes = 31, 20, 18, [7, 0, 13, 6]
    a = operand((2, r, m), torch.float32, a_t)
    b = operand((2, r, n), torch.float32, b_t)
    ends = ends_of(sizes, r)
    c = rk_mod.ragged_k(a, b, ends, config=cfg)
    assert rel_err(c, ref_ragged_k(a, b, ends)) < TOL[torch.float32]


TMA_LOADS_K = TileConfig(16, 16, 16, group_m=2, num_warps=4, num_stages=2, persistent=True, tma=True, flat=True)


@pytest.mark.parametrize("store,n", [(None, 48), (None, 40), (True, 40), (False, 40)],
                         ids=["store-by-rows", "store-by-rows-n40", "tma-store", "pointer-store"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("sizes", [[7, 0, 20, 13, 1], [0, 0, 0], [50, 30]])
def test_ragged_k_tma_loads(batch: int, sizes: list[int], store, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The persistent kernel reading a and b through ragged TMA views (on the CPU through the interpreter):
    empty groups exactly zero, NaN / inf rows past the last group (and, with sizes summing past R, ends
    clamped to R) never leak, batch entries do not read each other's rows, and the result equals the
    pointer-load kernel's with the same tile; a misaligned operand runs the pointer loads. The output goes by
    pointer stores (short groups, `pointer_stores`, with rows that take vector stores: N = 48) or through a TMA
    descriptor (N = 40, whose pointer stores would go one element at a time), or as forced."""
    monkeypatch.setattr(rk_mod, "TMA_STORE", store)
    if DEVICE == "cpu":
        monkeypatch.setattr(rk_mod, "tma_capable", lambda device: True)
    r, m = 50, 24
    a = operand((batch * r * m + m,), torch.float16, False)[m:].view(batch, r, m)  # the first row stays outside
    b = operand((batch, r, n), torch.float16, False)
    ends = ends_of(sizes, r)
    a[:, int(ends[-1]) :] = float("nan")
    b[:, int(ends[-1]) :] = float("inf")
    prepared = rk_mod.Prepared(a, b, len(sizes), torch.float16, TMA_LOADS_K)
    by_rows = n % 16 != 0  # 50 rows over <= 5 groups: short, so pointer stores where the rows take vectors
    assert prepared.tma_load and prepared.tma == (by_rows if store is None else store)
    c = prepared(a, b, ends)[0]
    ref = ref_ragged_k(a.nan_to_num(0), b.nan_to_num(0, 0, 0), ends)
    assert not c.isnan().any()
    for g in range(len(sizes)):
        if ends[g] == (ends[g - 1] if g else 0):
            assert (c[g] == 0).all(), f"empty group {g} must be exactly zero"
    if ref.norm() > 0:
        assert rel_err(c, ref) < TOL[torch.float16]
    pointer = TileConfig(**{**TMA_LOADS_K.__dict__, "flat": False})
    c_ptr = rk_mod.ragged_k(a, b, ends, config=pointer)
    assert torch.equal(c, c_ptr) if DEVICE == "cpu" else rel_err(c, c_ptr.double()) < TOL[torch.float16]
    a_odd = operand((batch * r * m + 1,), torch.float16, False)[1:].view(batch, r, m)  # same strides, 2-byte aligned
    a_odd.copy_(a)
    assert torch.equal(prepared(a_odd, b, ends)[0], c_ptr)


@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("cfg", [SMALL, SMALL_PERSISTENT_K, TMA_LOADS_K], ids=["pointer", "persistent", "tma"])
def test_ragged_k_reads_one_operand_through_a_row_index(side: str, cfg: TileConfig, monkeypatch) -> None:
    """`a_rows` / `b_rows`: the operand read through a row index gives the bits of the call on the pre-gathered
    rows with the same tile (pointer, persistent, and TMA loads of the other operand); NaN in a source row no
    token row names and past the other operand's last group never leaks; indices out of range are clamped into
    the source (never read out of bounds), those past the last group are not read; empty groups exact zeros."""
    if DEVICE == "cpu":
        monkeypatch.setattr(rk_mod, "tma_capable", lambda device: True)
    s, r, m, n, sizes = 23, 50, 24, 40, [7, 0, 20, 13, 1]  # 41 of 50 token rows in groups
    gen = torch.Generator().manual_seed(3)
    index = torch.randint(0, s - 2, (r,), generator=gen)
    index[[2, 30]] = torch.tensor([s + 100, -4])  # inside groups: clamped to s - 1 and 0
    index[45:] = 10**6  # past the last group: never read
    index = index.to(DEVICE)
    src = operand((1, s, m if side == "a" else n), torch.float16, False)
    src[:, s - 2] = float("nan")  # no token row names this one
    other = operand((1, r, n if side == "a" else m), torch.float16, False)
    ends = ends_of(sizes, r)
    other[:, int(ends[-1]):] = float("nan")
    gathered = src[:, index.clamp(0, s - 1)]
    if side == "a":
        got = rk_mod.ragged_k(src, other, ends, config=cfg, a_rows=index.int())
        want = rk_mod.ragged_k(gathered, other, ends, config=cfg)
        ref = ref_ragged_k(gathered.nan_to_num(0), other.nan_to_num(0), ends)
    else:
        got = rk_mod.ragged_k(other, src, ends, config=cfg, b_rows=index)  # int64 indices too
        want = rk_mod.ragged_k(other, gathered, ends, config=cfg)
        ref = ref_ragged_k(other.nan_to_num(0), gathered.nan_to_num(0), ends)
    assert torch.equal(got, want) and not got.isnan().any()
    assert (got[1] == 0).all()
    assert rel_err(got, ref) < TOL[torch.float16]


@pytest.mark.parametrize("cfg", [SMALL, SMALL_PERSISTENT_K, TMA_LOADS_K], ids=["pointer", "persistent", "tma"])
@pytest.mark.parametrize("where", ["rows", "columns"])
def test_ragged_k_writes_a_strided_output_view(cfg: TileConfig, where: str, monkeypatch) -> None:
    """`Prepared(out_strides=...)`: the result written into a slice of a larger gradient (its rows, or its
    columns) equals the contiguous call's bits, and nothing outside the slice is touched; a view of other
    strides is refused."""
    if DEVICE == "cpu":
        monkeypatch.setattr(rk_mod, "tma_capable", lambda device: True)
    r, m, n, sizes = 50, 24, 40, [7, 0, 20, 13, 1]
    a = operand((1, r, m), torch.float16, False)
    b = operand((1, r, n), torch.float16, False)
    ends = ends_of(sizes, r)
    want = rk_mod.ragged_k(a, b, ends, config=cfg)
    if where == "rows":  # rows 8 .. 8 + m of a [G, 1, 3m, n] gradient
        big = torch.full((len(sizes), 1, 3 * m, n), float("nan"), dtype=torch.float16, device=DEVICE)
        view = big[:, :, 8:8 + m]
    else:  # columns 16 .. 16 + n of a [G, 1, m, 2n + 16] gradient
        big = torch.full((len(sizes), 1, m, 2 * n + 16), float("nan"), dtype=torch.float16, device=DEVICE)
        view = big[:, :, :, 16:16 + n]
    strides = (view.stride(0), view.stride(2))
    prepared = rk_mod.Prepared(a, b, len(sizes), torch.float16, cfg, out_strides=strides)
    got = prepared(a, b, ends, view)[0]
    assert got.data_ptr() == view.data_ptr() and torch.equal(view, want)
    assert int(big.isnan().sum()) == big.numel() - view.numel()
    with pytest.raises(ValueError, match="out: expected"):
        prepared(a, b, ends, want)
    with pytest.raises(ValueError, match="out_strides"):
        rk_mod.Prepared(a, b, len(sizes), torch.float16, cfg, out_strides=(m * n, n - 1))


def test_ragged_k_row_index_errors() -> None:
    a = torch.randn(1, 6, 4, device=DEVICE)
    b = torch.randn(1, 8, 5, device=DEVICE)
    ends = torch.tensor([3, 8], dtype=torch.int32, device=DEVICE)
    rows = torch.arange(8, device=DEVICE) % 6
    with pytest.raises(ValueError, match="at most one operand"):
        rk_mod.ragged_k(a, b, ends, a_rows=rows, b_rows=rows)
    with pytest.raises(TypeError, match="a_rows: expected a 1-D integer tensor"):
        rk_mod.ragged_k(a, b, ends, a_rows=rows.float())
    with pytest.raises(ValueError, match="a_rows: 7 rows, but the other operand has 8"):
        rk_mod.ragged_k(a, b, ends, a_rows=rows[:7])
    with pytest.raises(ValueError, match="b_rows: needs batch-1 operands"):
        rk_mod.ragged_k(b.expand(2, 8, 5), a.expand(2, 6, 4), ends, b_rows=rows)
    with pytest.raises(ValueError, match="b: expected shape"):
        rk_mod.ragged_k(a, b, ends)
    with pytest.raises(ValueError, match="gather='c'"):
        rk_mod.Prepared(a, b, 2, a.dtype, SMALL, gather="c")
    prepared = rk_mod.Prepared(a, b, 2, a.dtype, SMALL, gather="a")
    with pytest.raises(ValueError, match="index: a call of a gathering ragged_k takes an int32 row index"):
        prepared(a, b, ends)


@pytest.mark.parametrize("cfg", [SMALL_PERSISTENT_K, TMA_LOADS_K], ids=["pointer", "tma"])
@pytest.mark.parametrize("sizes,scale", [([7, -2, 20, 0, 13, 1], 1), ([40, 7, 30, 1], 1), ([3, 2, -1, 9, 0], 2),
                                         ([0, 0, 0], 1)])
def test_ragged_k_ranks_the_groups_inside_the_persistent_kernel(cfg, sizes, scale, monkeypatch) -> None:
    """From raw sizes, a persistent ragged_k of up to INLINE_GROUPS groups forms and ranks the groups in each
    program (one launch): bitwise the result of the separate schedule launch (the same slots), with negative
    sizes, sums past the extent, a scale, NaN rows past the last group and empty groups; above either limit
    (groups, FLOPs) the schedule kernel runs as before."""
    if DEVICE == "cpu":
        monkeypatch.setattr(rk_mod, "tma_capable", lambda device: True)
    r, m, n = 50, 24, 40
    a = operand((2, r, m), torch.float16, False)
    b = operand((2, r, n), torch.float16, False)
    raw = torch.tensor(sizes, dtype=torch.int64, device=DEVICE)
    ends = torch.tensor(sizes).clamp(min=0).clamp(max=r // scale).cumsum(0).mul(scale).clamp(max=r)
    a[:, int(ends[-1]):] = float("nan")
    b[:, int(ends[-1]):] = float("inf")
    prepared = rk_mod.Prepared(a, b, len(sizes), torch.float16, cfg, from_sizes=True, scale=scale)
    assert prepared.inline
    got = prepared(a, b, raw)[0]
    separate = prepared(a, b, raw, sched=rk_mod.schedule(raw, r, scale))[0]
    assert torch.equal(got, separate)
    ref = ref_ragged_k(a.nan_to_num(0), b.nan_to_num(0, 0, 0), ends.to(torch.int32).to(DEVICE))
    assert not got.isnan().any()
    if ref.norm() > 0:
        assert rel_err(got, ref) < TOL[torch.float16]
    from ragdot.kernels import record

    with record.recording(workspace=512) as rec:  # ragdot.jax's fixed workspace holds one [4, G] ranking
        assert torch.equal(prepared(a, b, raw)[0], got)
    assert [tuple(t.shape) for t in rec.scratch] == [(4, len(sizes))]
    with record.recording() as rec:  # an eager replay allocates what the record made: the inline form
        assert torch.equal(prepared(a, b, raw)[0], got)
    assert [tuple(t.shape) for t in rec.scratch] == [(prepared.programs, 4, len(sizes))] and len(rec.steps) == 1
    for limit in ("INLINE_GROUPS", "INLINE_FLOPS"):
        with monkeypatch.context() as patch:
            patch.setattr(rk_mod, limit, len(sizes) - 1 if limit == "INLINE_GROUPS" else 2 * 2 * r * m * n - 1)
            above = rk_mod.Prepared(a, b, len(sizes), torch.float16, cfg, from_sizes=True, scale=scale)
            assert not above.inline and torch.equal(above(a, b, raw)[0], got), limit


def test_ragged_k_reproducible_and_default_config() -> None:
    r, m, n, sizes = 50, 24, 40, [20, 3, 0, 27]
    a = operand((1, r, m), torch.float16, False)
    b = operand((1, r, n), torch.float16, False)
    ends = ends_of(sizes, r)
    c1 = rk_mod.ragged_k(a, b, ends, torch.float32)
    c2 = rk_mod.ragged_k(a, b, ends, torch.float32)
    assert torch.equal(c1, c2)
    assert rel_err(c1, ref_ragged_k(a, b, ends)) < TOL[torch.float16]


@pytest.mark.parametrize(
    "sizes",
    [[5, 0, 20, 3], [4, 4, 4, 4], [0, 0, 0], [1], list(range(40, 0, -3)) + [7, 7, 0, 7], [3] * 130 + [9]],
)
def test_longest_first_order(sizes: list[int]) -> None:
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(DEVICE)
    sched = rk_mod.schedule(ends).tolist()
    expected = sorted(range(len(sizes)), key=lambda g: (-sizes[g], g))
    assert sched[0] == expected == rk_mod.longest_first(ends).tolist()
    starts = [0] + ends.tolist()[:-1]
    assert sched[1] == [starts[g] for g in expected] and sched[2] == [ends.tolist()[g] for g in expected]


@gpu
@needs_cuda
@pytest.mark.parametrize("cfg", [c for c in candidate_configs("ragged_k") if c.flat and c in
                                 tuning_configs("ragged_k", 4096, 4096, 4096, 32, torch.bfloat16, limit=99)])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("store", [None, False], ids=["store-by-rows", "pointer-store"])
def test_gpu_ragged_k_tma_loads(cfg: TileConfig, batch: int, store, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 weight gradients read through ragged TMA views: uneven groups (empty, 1 row, chunk multiples, long),
    M and N not multiples of the tile (N a multiple of 16, where pointer stores go out as vectors), NaN / inf rows
    past the last group, poisoned output; against the reference and the pointer-load kernel of the same tile, no
    spills, wgmma. The output goes through TMA (260 rows a group on average: long) or, forced, by pointer stores."""
    monkeypatch.setattr(rk_mod, "TMA_STORE", store)
    r, m, n = 2600, 1000, 752
    sizes = [160, 0, 129, 64, 65, 300, 1, 256, 192, 1200]  # sum 2367: 233 rows past the last group
    ends = ends_of(sizes, r)
    a = torch.randn(batch, r, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(batch, r, n, device="cuda", dtype=torch.bfloat16)
    a[:, int(ends[-1]) :] = float("nan")
    b[:, int(ends[-1]) :] = float("inf")
    out = torch.full((len(sizes), batch, m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    prepared = rk_mod.Prepared(a, b, len(sizes), torch.bfloat16, cfg)
    assert prepared.tma_load and prepared.tma == (store is None)
    c, handle = prepared(a, b, ends, out)
    assert not c.isnan().any() and (c[1] == 0).all()
    assert rel_err(c, ref_ragged_k(a.float().nan_to_num(0), b.float().nan_to_num(0, 0, 0), ends)) < TOL[torch.bfloat16]
    c_ptr = rk_mod.ragged_k(a, b, ends, config=TileConfig(**{**cfg.__dict__, "flat": False}))
    assert rel_err(c, c_ptr.double()) < 1e-2
    assert handle.n_spills == 0 and "wgmma" in handle.asm["ptx"]


@gpu
@needs_cuda
@pytest.mark.parametrize("side", ["a", "b"])
def test_gpu_ragged_k_row_index(side: str) -> None:
    """bf16 weight gradient with one operand read through a row index (the fused MoE block's x [T, D] through
    its token index) and the other through its ragged TMA view, heuristic tile: the bits of the call on the
    pre-gathered rows, NaN rows of x that no token row names and past the last group never leak."""
    t, r, d, q = 1500, 2600, 1000, 744
    sizes = [160, 0, 129, 64, 65, 300, 1, 256, 192, 1200]  # sum 2367: 233 rows past the last group
    ends = ends_of(sizes, r)
    x = torch.randn(1, t, d, device="cuda", dtype=torch.bfloat16)
    x[:, t - 1] = float("nan")
    index = torch.randint(0, t - 1, (r,), device="cuda", dtype=torch.int32)
    other = torch.randn(1, r, q, device="cuda", dtype=torch.bfloat16)
    other[:, int(ends[-1]):] = float("nan")
    gathered = x[:, index.long()]
    if side == "a":
        got = rk_mod.ragged_k(x, other, ends, a_rows=index)
        want = rk_mod.ragged_k(gathered, other, ends)
    else:
        got = rk_mod.ragged_k(other, x, ends, b_rows=index)
        want = rk_mod.ragged_k(other, gathered, ends)
    assert not got.isnan().any() and (got[1] == 0).all()
    assert torch.equal(got, want)
