"""Kernel-level tests of ragdot.kernels against a float64 torch reference: ragged-M, batch, the tail kernel,
configs and errors (the weight gradient's ragged-K kernels: `test_triton_ragged_k.py`).

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1) with float16/float32 inputs and
small tiles (the interpreter's bfloat16 tl.dot is wrong, and it is slow); with CUDA the same tests run the
compiled kernels, and the `gpu` tests add bfloat16, TMA, large (int64-offset) problems and code checks.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_cases import (
    DEVICE,
    SMALL,
    SMALL_PERSISTENT,
    TOL,
    ends_of,
    gpu,
    needs_cuda,
    operand,
    ref_ragged_k,
    ref_ragged_m,
    rel_err,
)
from ragdot.kernels import TileConfig, candidate_configs, pick_config, zero_tail_rows_
from ragdot.kernels import batch as batch_mod
from ragdot.kernels import ragged_k as rk_mod
from ragdot.kernels import ragged_m as rm_mod

# ---- ragged-M -------------------------------------------------------------------------------------------

RAGGED_M_CASES = [
    # (M, K, N, sizes): what it exercises
    (37, 24, 19, [5, 0, 20, 3]),  # odd K/N, an empty group, sum < M (NaN tail), tiles straddling groups
    (9, 16, 16, [3, 2, 4]),  # M < tile, groups smaller than a tile, sum == M
    (40, 33, 48, [0, 0, 40]),  # leading empty groups, odd K (masked K tail)
    (30, 16, 20, [0, 0, 0]),  # every group empty: all rows are tail rows, exactly zero
    (12, 20, 17, [2, 1, 0, 3, 1, 0, 2, 1, 1]),  # more groups than row tiles, prime-ish G
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", RAGGED_M_CASES)
def test_ragged_m_matches_reference(case: tuple, dtype: torch.dtype) -> None:
    m, k, n, sizes = case
    a = operand((1, m, k), dtype, False)
    b = operand((1, len(sizes), k, n), dtype, False)
    ends = ends_of(sizes, m)
    a[:, int(ends[-1]) :] = float("nan")  # rows of no group: must never reach the output
    c = rm_mod.ragged_m(a, b, ends, config=SMALL)
    ref = ref_ragged_m(a, b, ends)
    assert c.shape == (1, m, n) and c.dtype == dtype
    assert not c.isnan().any()
    assert (c[:, int(ends[-1]) :] == 0).all()
    if ref.norm() > 0:
        assert rel_err(c, ref) < TOL[dtype]


@pytest.mark.parametrize("a_t,b_t", [(True, False), (False, True), (True, True)])
def test_ragged_m_transposed_views(a_t: bool, b_t: bool) -> None:
    m, k, n, sizes = 29, 24, 21, [4, 11, 0, 9]
    a = operand((2, m, k), torch.float32, a_t)
    b = operand((2, len(sizes), k, n), torch.float32, b_t)
    assert a.is_contiguous() != a_t and b.is_contiguous() != b_t
    ends = ends_of(sizes, m)
    c = rm_mod.ragged_m(a, b, ends, config=SMALL)
    assert rel_err(c, ref_ragged_m(a, b, ends)) < TOL[torch.float32]
    assert (c[:, int(ends[-1]) :] == 0).all()


@pytest.mark.parametrize("cfg", [SMALL_PERSISTENT, TileConfig(16, 16, 32, group_m=8, num_warps=4, num_stages=3)])
def test_ragged_m_schedules(cfg: TileConfig) -> None:
    """Persistent loop and wide GROUP_M bands cover every tile exactly once."""
    m, k, n, sizes = 70, 32, 40, [17, 0, 30, 5, 8]
    a = operand((1, m, k), torch.float16, False)
    b = operand((1, len(sizes), k, n), torch.float16, False)
    ends = ends_of(sizes, m)
    a[:, int(ends[-1]) :] = float("inf")
    out = torch.full((1, m, n), float("nan"), dtype=torch.float32, device=DEVICE)  # poisoned output
    c = rm_mod.ragged_m(a, b, ends, torch.float32, config=cfg, out=out)
    assert c is out and not c.isnan().any()
    assert rel_err(c, ref_ragged_m(a, b, ends)) < TOL[torch.float16]


TMA_FLAT = TileConfig(16, 16, 16, group_m=2, num_warps=4, num_stages=2, persistent=True, tma=True, flat=True)


@pytest.mark.parametrize("cfg", [TMA_FLAT, TileConfig(**{**TMA_FLAT.__dict__, "flat": False}),
                                 TileConfig(**{**TMA_FLAT.__dict__, "block_k": 32, "group_m": 1})])
@pytest.mark.parametrize("b_t,batch", [(False, 1), (True, 1), (True, 2)])
def test_ragged_m_tma_kernels(cfg: TileConfig, b_t: bool, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensor-descriptor kernels (on the CPU through the interpreter, which implements descriptors): the
    flat persistent loop crosses tiles of different groups, K is not a multiple of BLOCK_K in one case, empty
    groups, the tail group's tiles are zeroed, every row is written (poisoned output), NaN never leaks."""
    if DEVICE == "cpu":
        monkeypatch.setattr(rm_mod, "tma_capable", lambda device: True)
    m, k, n, sizes = 83, 40, 40, [17, 0, 30, 5, 1, 8]  # 22 tail rows
    a = operand((batch, m, k), torch.float16, False)
    b = operand((batch, len(sizes), k, n), torch.float16, b_t)
    ends = ends_of(sizes, m)
    a[:, int(ends[-1]) :] = float("nan")
    out = torch.full((batch, m, n), float("nan"), dtype=torch.float16, device=DEVICE)
    c, _ = rm_mod.launch(a, b, ends, config=cfg, out=out)
    assert not c.isnan().any() and (c[:, int(ends[-1]) :] == 0).all()
    assert rel_err(c, ref_ragged_m(a, b, ends)) < TOL[torch.float16]


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("sizes", [[17, 0, 30, 5, 1, 8], [0, 0, 0], [40, 43], [83, 0]])
def test_ragged_m_tma_store_gives_the_pointer_store_s_bits(batch, sizes, split, monkeypatch) -> None:
    """`ragged_m.TMA_STORE`: the flat kernel's tiles stored through a ragged TMA view of c, clipped at each group's
    end (whole, or as two column slices: `STORE_SPLIT`), give the pointer stores' bits: tiles that straddle two
    groups write only their own rows, the tail rows are zero, no row of the poisoned output is left, batch entries
    keep to their rows, the last column tile's columns past N are dropped; rows whose bytes are not 16-byte
    multiples (N = 20 in float16) keep the pointer stores. The default (None) takes the view where N is no
    multiple of 16 (`vector_rows`: N = 40) and pointer stores where it is (N = 32)."""
    if DEVICE == "cpu":
        monkeypatch.setattr(rm_mod, "tma_capable", lambda device: True)
    monkeypatch.setattr(rm_mod, "STORE_SPLIT", split)
    cfg = TileConfig(**{**TMA_FLAT.__dict__, "block_n": 32})  # N = 40: a second column tile, 8 columns wide
    m, k, n = 83, 40, 40
    a = operand((batch, m, k), torch.float16, False)
    b = operand((batch, len(sizes), k, n), torch.float16, True)
    ends = ends_of(sizes, m)
    a[:, int(ends[-1]):] = float("nan")

    def run(store: bool | None, width: int = n) -> tuple:
        monkeypatch.setattr(rm_mod, "TMA_STORE", store)
        prepared = rm_mod.Prepared(a, b[..., :width], torch.float16, cfg)
        out = torch.full((batch, m, width), float("nan"), dtype=torch.float16, device=DEVICE)
        return prepared, prepared(a, b[..., :width], ends, out)[0]

    prepared, c = run(True)
    assert prepared.c_view is not None and prepared.c_view[2][3] == 32 // split
    _, want = run(False)
    assert torch.equal(c, want)
    assert not c.isnan().any() and (c[:, int(ends[-1]):] == 0).all()
    prepared, _ = run(True, width=20)  # 40-byte rows: no TMA view of c
    assert prepared.c_view is None
    prepared, default = run(None)  # N = 40: scalar pointer stores there, so the view
    assert prepared.c_view is not None and torch.equal(default, want)
    assert run(None, width=32)[0].c_view is None  # N = 32: vector pointer stores


def test_ragged_m_clamped_ends_and_int64() -> None:
    """int64 group_ends, ends clamped at M (sizes summing past M), default heuristic config."""
    m, k, n = 20, 16, 16
    a = operand((1, m, k), torch.float32, False)
    b = operand((1, 3, k, n), torch.float32, False)
    ends = torch.tensor([8, 20, 20], dtype=torch.int64, device=DEVICE)
    c = rm_mod.ragged_m(a, b, ends)
    assert rel_err(c, ref_ragged_m(a, b, ends)) < TOL[torch.float32]


@settings(max_examples=8, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    extra=st.integers(0, 9),
    k=st.integers(1, 40),
    n=st.integers(1, 24),
)
def test_ragged_m_random_partitions(sizes: list[int], extra: int, k: int, n: int) -> None:
    m = sum(sizes) + extra
    if m == 0:
        return
    a = operand((1, m, k), torch.float32, False)
    b = operand((1, len(sizes), k, n), torch.float32, False)
    ends = ends_of(sizes, m)
    a[:, int(ends[-1]) :] = float("nan")
    c = rm_mod.ragged_m(a, b, ends, config=SMALL)
    ref = ref_ragged_m(a, b, ends)
    assert not c.isnan().any() and (c[:, int(ends[-1]) :] == 0).all()
    assert (c.double() - ref).abs().max() <= 1e-4 * (1 + ref.abs().max())


# ---- batch, tail, configs, errors ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batch_matches_reference(dtype: torch.dtype) -> None:
    a = operand((3, 21, 37), dtype, True)
    b = operand((3, 37, 19), dtype, False)
    c = batch_mod.batch(a, b, config=SMALL)
    assert rel_err(c, a.double() @ b.double()) < TOL[dtype]


def test_batch_prepared_once_runs_every_later_call_of_its_signature() -> None:
    """The triton backend's prepared batch call (`batch_mod.Prepared`: config, grid and constexprs bound once):
    repeated calls on new operands of the prepared layout, into a caller's buffer, and the degenerate shapes
    (K = 0 gives zeros, an empty output launches nothing) match the float64 product."""
    a, b = operand((3, 21, 37), torch.float16, True), operand((3, 37, 19), torch.float16, False)
    prep = batch_mod.Prepared(a, b, torch.float32, SMALL)
    for _ in range(3):
        a2, b2 = torch.randn_like(a), torch.randn_like(b)
        a2, b2 = a2.as_strided(a.shape, a.stride()), b2.as_strided(b.shape, b.stride())
        c, _ = prep(a2, b2)
        assert c.dtype == torch.float32 and rel_err(c, a2.double() @ b2.double()) < TOL[torch.float16]
    out = torch.full((3, 21, 19), float("nan"), device=DEVICE)
    c, _ = prep(a, b, None, out)
    assert c is out and rel_err(out, a.double() @ b.double()) < TOL[torch.float16]
    a0, b0 = torch.randn(2, 5, 0, device=DEVICE), torch.randn(2, 0, 4, device=DEVICE)
    c0, handle = batch_mod.Prepared(a0, b0, torch.float32, SMALL)(a0, b0, None, torch.full((2, 5, 4), 7.0,
                                                                                         device=DEVICE))
    assert handle is None and (c0 == 0).all()
    ae, be = torch.randn(2, 0, 3, device=DEVICE), torch.randn(2, 3, 4, device=DEVICE)
    ce, handle = batch_mod.Prepared(ae, be, torch.float32, SMALL)(ae, be)
    assert handle is None and ce.shape == (2, 0, 4)
    from ragdot.backends import get_backend

    call = get_backend("triton").prepare("batch", a, b, 0, torch.float32, SMALL)  # the eager path's call
    assert rel_err(call.direct(a, b, None, (3, 21, 19)), a.double() @ b.double()) < TOL[torch.float16]


def test_zero_tail_rows() -> None:
    c = torch.randn(2, 10, 7, device=DEVICE) + 5.0
    keep = c.clone()
    zero_tail_rows_(c, torch.tensor([3, 6], dtype=torch.int32, device=DEVICE))
    assert (c[:, 6:] == 0).all() and torch.equal(c[:, :6], keep[:, :6])
    full = keep.clone()
    zero_tail_rows_(full, torch.tensor([4, 10], dtype=torch.int64, device=DEVICE))  # sum == M: untouched
    assert torch.equal(full, keep)
    none = keep.clone()
    zero_tail_rows_(none, torch.tensor([0, 0], dtype=torch.int32, device=DEVICE))  # no rows in any group
    assert (none == 0).all()


def test_tuning_configs_start_with_the_heuristic() -> None:
    from ragdot.kernels import tuning_configs

    for shape in ((5120, 512, 512, 256), (20480, 4096, 1536, 128), (15360, 6144, 20480, 32)):
        for problem in ("ragged_m", "ragged_k"):
            for dtype in (torch.bfloat16, torch.float32):
                cfgs = tuning_configs(problem, *shape, dtype, limit=4)
                assert cfgs[0] == pick_config(problem, *shape, dtype)
                assert (2 if dtype == torch.bfloat16 else 1) <= len(cfgs) <= 4 and len(set(cfgs)) == len(cfgs)
                assert all(c in candidate_configs(problem, dtype) for c in cfgs)
    # few rows per group: only tiles that cover a group at once; many rows: no 64x128 bandwidth tiles
    assert all(c.block_m <= 128 for c in tuning_configs("ragged_m", 5120, 512, 512, 256, torch.bfloat16))
    assert TileConfig(64, 128, 64, 1, 4, 4) not in tuning_configs("ragged_m", 20480, 4096, 1536, 128, torch.bfloat16)
    assert tuning_configs("batch", 64, 64, 64, 2, torch.bfloat16, limit=3) == [
        pick_config("batch", 64, 64, 64, 2, torch.bfloat16)
    ]


def test_tuning_configs_start_with_the_tile_the_device_runs_untuned(monkeypatch) -> None:
    """On a TMA-capable device the untuned call runs the ragged_k TMA tile; the tuner must try it first, not the
    pointer-load tile (it was the ninth candidate, outside `ragdot tune --max-configs 7`, though it was the best
    Triton tile on every anchor weight gradient)."""
    import ragdot.kernels.configs as configs

    monkeypatch.setattr(configs, "tma_capable", lambda device: True)
    dims = (5120, 8192, 1536, 16)
    tma = configs.pick_config("ragged_k", *dims, torch.bfloat16, "cpu")
    assert tma.tma and tma.persistent and tma != configs.pick_config("ragged_k", *dims, torch.bfloat16)
    assert configs.tuning_configs("ragged_k", *dims, torch.bfloat16, limit=1, device="cpu") == [tma]
    assert configs.tuning_configs("ragged_k", *dims, torch.bfloat16, limit=1)[0] != tma  # no device: portable
    from ragdot.tune.tuner import candidates_for  # the tuner hands the backend its device

    tuned = [cfg for name, cfg in candidates_for("ragged_k", dims, torch.bfloat16, 1, torch.device("cpu"))
             if name == "triton"]
    assert tuned == [tma]


def test_long_groups_take_128_wide_tiles_where_256_wide_ones_waste_columns() -> None:
    """Groups of 256+ rows run 256-wide tiles, unless those compute over 15% more output columns than 128-wide
    ones (width 360: 512 columns against 384; 640: 768 against 640) and B's rows load whole: B column-major, or
    row-major with rows of 64-byte multiples (bf16 width 384 and 640, not 360). 720, 744, 2880 keep 256 from
    512 rows a group; below 512, B column-major takes the 128-wide tile at any width. The kernel resolves it from
    B's strides, and the tuner tries that tile first for that layout."""
    bf, dims = torch.bfloat16, (32768, 2880, 360, 128)
    for n, kmajor_width, row_width in ((360, 128, 256), (384, 128, 128), (352, 128, 128), (640, 128, 128),
                                       (720, 256, 256), (744, 256, 256), (2880, 256, 256), (20480, 256, 256)):
        kmajor = pick_config("ragged_m", 65536, 2880, n, 128, bf, b_kmajor=True)  # 512 rows a group
        assert kmajor.block_n == kmajor_width and kmajor.block_m == 128 and kmajor.flat, (n, kmajor)
        assert kmajor in candidate_configs("ragged_m", bf)
        assert pick_config("ragged_m", 65536, 2880, n, 128, bf).block_n == row_width, n
        # 256 to 511 rows a group: B column-major takes the 128-wide tile at every width, row-major as above
        for m in (32768, 65535):
            assert pick_config("ragged_m", m, 2880, n, 128, bf, b_kmajor=True).block_n == 128, (m, n)
            assert pick_config("ragged_m", m, 2880, n, 128, bf).block_n == row_width, (m, n)
    # 128-row groups take the 128-wide tile whatever B's layout
    assert pick_config("ragged_m", 16384, 2880, 360, 128, bf, b_kmajor=True) == pick_config(
        "ragged_m", 16384, 2880, 360, 128, bf)
    a = torch.empty(1, 32768, 2880, dtype=bf)
    b_col = torch.empty(1, 128, 360, 2880, dtype=bf).transpose(2, 3)  # [1, G, K, N], K contiguous
    b_row = torch.empty(1, 128, 2880, 360, dtype=bf)
    assert rm_mod.Prepared(a, b_col, bf, None).cfg.block_n == 128
    assert rm_mod.Prepared(a, b_row, bf, None).cfg.block_n == 256
    from ragdot.tune.tuner import candidates_for

    first = {kmajor: next(cfg for name, cfg in candidates_for("ragged_m", dims, bf, 8, None, kmajor)
                          if name == "triton") for kmajor in (False, True)}
    assert (first[False].block_n, first[True].block_n) == (256, 128)


def test_configs() -> None:
    for problem in ("ragged_m", "ragged_k", "batch"):
        for shape in ((5120, 512, 512, 256), (15360, 6144, 20480, 32), (64, 64, 64, 1), (8192, 8192, 64, 4)):
            for dtype in (torch.bfloat16, torch.float32):
                cfg = pick_config(problem, *shape, dtype)
                assert cfg in candidate_configs(problem, dtype), (problem, shape, cfg)
    assert pick_config("ragged_m", 5120, 512, 512, 256, torch.float32).block_k <= 64
    if not torch.backends.cuda.matmul.allow_tf32:  # full float32 runs on FMA units: a tile that does not spill
        assert pick_config("ragged_k", 2048, 10240, 768, 128, torch.float32).block_m == 64
    with pytest.raises(ValueError, match="block_m"):
        TileConfig(block_m=48)
    with pytest.raises(ValueError, match="num_warps"):
        TileConfig(num_warps=3)
    with pytest.raises(ValueError, match="max_regs"):
        TileConfig(max_regs=8)
    with pytest.raises(ValueError, match="flat"):
        TileConfig(persistent=True, flat=True)
    with pytest.raises(ValueError, match="problem"):
        pick_config("dense", 1, 1, 1, 1, torch.float16)


class _TightKernel:
    """A stand-in for a @triton.jit kernel whose compiled form fits the device only with <= `fits` stages."""

    __name__ = "tight_kernel"

    def __init__(self, fits: int):
        self.fits, self.stages = fits, []

    def __getitem__(self, grid):
        def launch(*args, num_stages, **options):
            from triton.runtime.errors import OutOfResources

            self.stages.append(num_stages)
            if num_stages > self.fits:
                raise OutOfResources(num_stages * 40_000, 65_536, "shared memory")
            return "compiled"

        return launch


def test_a_pipeline_too_deep_for_the_device_runs_with_fewer_stages() -> None:
    from ragdot.kernels.launch import BoundLaunch

    kernel = _TightKernel(fits=2)
    bound = BoundLaunch(kernel, (1,), {}, {"num_warps": 4, "num_stages": 4}, torch.device("cpu"))
    assert bound._first_launch(()) == "compiled"
    assert kernel.stages == [4, 3, 2] and bound.options == {"num_warps": 4, "num_stages": 2}
    never = BoundLaunch(_TightKernel(fits=0), (1,), {}, {"num_warps": 4, "num_stages": 3}, torch.device("cpu"))
    with pytest.raises(NotImplementedError, match="tight_kernel: out of resource: shared memory"):
        never._first_launch(())


def test_bad_inputs_raise() -> None:
    a = torch.randn(1, 8, 4, device=DEVICE)
    b = torch.randn(1, 2, 4, 5, device=DEVICE)
    ends = torch.tensor([3, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="b: expected shape"):
        rm_mod.ragged_m(a, b[:, :, :3], ends)
    with pytest.raises(TypeError, match="b: expected the dtype"):
        rm_mod.ragged_m(a, b.half(), ends)
    with pytest.raises(ValueError, match="group_ends: expected shape"):
        rm_mod.ragged_m(a, b, ends[:1])
    with pytest.raises(TypeError, match="group_ends: expected dtype"):
        rm_mod.ragged_m(a, b, ends.float())
    with pytest.raises(TypeError, match="a: expected dtype"):
        rm_mod.ragged_m(a.double(), b.double(), ends)
    with pytest.raises(ValueError, match="out: expected"):
        rm_mod.ragged_m(a, b, ends, out=torch.empty(1, 8, 4, device=DEVICE))
    with pytest.raises(TypeError, match="config"):
        rk_mod.ragged_k(a, a, ends, config={"block_m": 16})
    with pytest.raises(ValueError, match="c: expected a contiguous"):
        zero_tail_rows_(torch.randn(4, 4, 3, device=DEVICE).transpose(1, 2), ends)


# ---- GPU only ---------------------------------------------------------------------------------------------

ANCHOR_SMALL = [(3840, 2048, 1408, 64), (5120, 512, 512, 256), (1280, 5120, 8192, 16)]


@gpu
@needs_cuda
@pytest.mark.parametrize("shape", ANCHOR_SMALL)
@pytest.mark.parametrize("tma", [False, True])
def test_gpu_bf16_classes(shape: tuple[int, int, int, int], tma: bool) -> None:
    m, k, n, e = shape
    sizes = [m // e] * e
    sizes[0] += sizes[1] + m - sum(sizes) - 5  # group 1 empty, 5 tail rows (poisoned)
    sizes[1] = 0
    ends = ends_of(sizes, m)
    x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    x[:, int(ends[-1]) :] = float("nan")
    base = pick_config("ragged_m", m, k, n, e, torch.bfloat16)
    cfg = TileConfig(**{**base.__dict__, "tma": tma, "flat": base.flat and tma})
    for b in (torch.randn(1, e, k, n, device="cuda", dtype=torch.bfloat16),
              torch.randn(1, e, n, k, device="cuda", dtype=torch.bfloat16).transpose(-1, -2)):
        c, handle = rm_mod.launch(x, b, ends, config=cfg)
        assert not c.isnan().any() and (c[:, int(ends[-1]) :] == 0).all()
        assert rel_err(c, ref_ragged_m(x.float(), b.float(), ends)) < TOL[torch.bfloat16]
        assert handle.n_spills == 0
        assert base.block_m < 64 or "wgmma" in handle.asm["ptx"]
    dy = torch.randn(1, m, n, device="cuda", dtype=torch.bfloat16)
    dy[:, int(ends[-1]) :] = float("inf")
    w, handle = rk_mod.launch(x, dy, ends)
    ref = ref_ragged_k(x.float().nan_to_num(0), dy.float().nan_to_num(0, 0, 0), ends)
    assert not w.isnan().any() and (w[1] == 0).all()
    assert rel_err(w, ref) < TOL[torch.bfloat16]
    assert handle.n_spills == 0 and "wgmma" in handle.asm["ptx"]


@gpu
@needs_cuda
def test_gpu_narrow_column_major_b_runs_the_heuristic_128_wide_tile() -> None:
    """Width 360 with 256 rows a group and B column-major: the untuned call takes the 128-wide tile (its TMA
    store through the ragged view at a width no multiple of 16), poisoned tail rows come back zero."""
    m, k, n, e = 4096, 512, 360, 16
    sizes = [256] * e
    sizes[3], sizes[-1] = 0, 256 - 40  # an empty group, 40 tail rows
    ends = ends_of(sizes, m)
    x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    x[:, int(ends[-1]) :] = float("nan")
    b = torch.randn(1, e, n, k, device="cuda", dtype=torch.bfloat16).transpose(-1, -2)
    prepared = rm_mod.Prepared(x, b, torch.bfloat16, None)
    assert prepared.cfg.block_n == 128 and prepared.kmajor
    c, _ = rm_mod.launch(x, b, ends)
    assert not c.isnan().any() and (c[:, int(ends[-1]) :] == 0).all()
    assert rel_err(c, ref_ragged_m(x.float(), b.float(), ends)) < TOL[torch.bfloat16]


@gpu
@needs_cuda
@pytest.mark.parametrize("cfg", [
    TileConfig(64, 256, 64, 8, 4, 4, True, 1, tma=True, flat=True),
    TileConfig(128, 128, 64, 8, 4, 3, True, 2, tma=True, flat=True),
    TileConfig(128, 256, 64, 8, 8, 4, True, 1, tma=True, flat=True),
])
def test_gpu_flat_persistent(cfg: TileConfig) -> None:
    """bf16 flat persistent tiles on uneven groups (empty, 1 row, multiples of the tile, a long one), K not a
    multiple of BLOCK_K, both weight layouts; every row written (poisoned output), tail rows zero."""
    m, k, n = 3000, 1560, 1024
    sizes = [160, 0, 129, 64, 65, 300, 1, 256, 192, 1200, 100]  # sum 2467: 533 tail rows
    ends = ends_of(sizes, m)
    x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    x[:, int(ends[-1]) :] = float("nan")
    for b in (torch.randn(1, len(sizes), k, n, device="cuda", dtype=torch.bfloat16),
              torch.randn(1, len(sizes), n, k, device="cuda", dtype=torch.bfloat16).transpose(-1, -2)):
        out = torch.full((1, m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        c, handle = rm_mod.launch(x, b, ends, config=cfg, out=out)
        assert not c.isnan().any() and (c[:, int(ends[-1]) :] == 0).all()
        assert rel_err(c, ref_ragged_m(x.float(), b.float(), ends)) < TOL[torch.bfloat16]
        assert handle.n_spills == 0 and "wgmma" in handle.asm["ptx"]


@gpu
@needs_cuda
def test_gpu_int64_offsets() -> None:
    """Index products past 2**31 (rows x row stride, tokens x hidden): 2**19 + 64 rows x 4096 columns."""
    m, k, n = (1 << 19) + 64, 4096, 64
    a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, 2, k, n, device="cuda", dtype=torch.bfloat16)
    ends = torch.tensor([m - 100, m - 1], dtype=torch.int32, device="cuda")
    c = rm_mod.ragged_m(a, b, ends)
    assert rel_err(c[0, m - 100 : m - 1], a[0, m - 100 : m - 1].float() @ b[0, 1].float()) < TOL[torch.bfloat16]
    assert rel_err(c[0, :64], a[0, :64].float() @ b[0, 0].float()) < TOL[torch.bfloat16]
    assert (c[0, m - 1] == 0).all()
    dy = torch.randn(1, m, n, device="cuda", dtype=torch.bfloat16)
    w = rk_mod.ragged_k(a, dy, ends)
    for g, rows in enumerate((slice(0, m - 100), slice(m - 100, m - 1))):
        assert rel_err(w[g, 0], a[0, rows].float().t() @ dy[0, rows].float()) < TOL[torch.bfloat16]
    c2 = torch.empty(1, m, k, device="cuda", dtype=torch.bfloat16).fill_(1.0)
    zero_tail_rows_(c2, ends)
    assert (c2[0, m - 1] == 0).all() and (c2[0, m - 2] == 1).all()

