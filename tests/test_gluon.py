"""The Gluon (Hopper, warp-specialized) kernels and the `gluon` backend.

CPU: configs, availability, the registry entry, errors and the triton fallback (through the interpreter); the
sm_90 code compiled with Triton's bundled ptxas is checked in test_gluon_codegen.py, the ragged-M kernel (the
forward and data gradient) in test_gluon_ragged_m.py. GPU (`gpu` marker, sm_90 only): ragged_k against a float64
reference over balanced / skewed / empty groups, sums below the ragged extent with NaN-poisoned rows, G=1,
batches, every candidate config, bitwise repeats, and the backend's prepared calls from raw group sizes.
"""

from __future__ import annotations

import pytest
import torch

from helpers import ON_HOPPER, SIZES_BY_ROUTING, benchmark_script, hopper, misaligned_nan_tailed, ragged_k_reference
from ragdot.kernels.gluon import GluonConfig, gluon_tuning_configs, pick_gluon_config, unavailable_reason
from ragdot.kernels.gluon.common import consumer_regs
from ragdot.kernels.gluon.config import SHARED_BYTES, gluon_m_tuning_configs
from ragdot.routing import skewed

# ---- pure Python ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_m": 96}, "block_m: expected a power of two"),
        ({"block_m": 32}, "block_m: wgmma needs"),
        ({"block_k": 8}, "block_k: expected a power of two"),
        ({"stages": 1}, "stages: expected at least 2"),
        ({"num_warps": 2}, "num_warps: expected 4 or 8"),
        ({"num_warps": 8, "block_m": 64}, "num_warps: 8 consumer warps"),
        ({"group_m": 0}, "group_m: expected >= 1"),
        ({"producer_regs": 20}, "producer_regs: expected a multiple of 8"),
        ({"consumers": 3}, "consumers: expected 1 or 2"),
        ({"consumers": 2, "num_warps": 8}, "num_warps: ping-pong consumers are one warpgroup each"),
    ],
)
def test_config_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GluonConfig(**kwargs)


def test_configs_fit_shared_memory_and_the_output_rows():
    for m, n in ((2048, 1408), (2880, 2880), (704, 10240), (7168, 2048), (512, 512)):
        cfgs = gluon_tuning_configs(m, n)
        assert cfgs and cfgs[0] == pick_gluon_config(m, n)
        for cfg in cfgs:  # M need not be a multiple of the tile's rows: the output's TMA store clips at M
            assert cfg.shared_bytes() <= SHARED_BYTES, (m, n, cfg)
        assert all(cfg.shared_bytes(2, 4) <= SHARED_BYTES for cfg in gluon_tuning_configs(m, n, out_bytes=4))
    assert pick_gluon_config(2880, 2880).block_m == 128
    assert all(c.block_m == 64 for c in gluon_tuning_configs(100, 256))  # fewer rows than a 128-row tile
    assert all(c.block_n <= 128 for c in gluon_tuning_configs(1024, 96))
    assert len(gluon_tuning_configs(2048, 2048, limit=2)) == 2


def test_backend_is_an_auto_candidate_after_triton_and_torch():
    """gluon runs where a measurement names it: without one, auto tries triton and torch first; the tuner
    measures gluon's configs only where the backend is usable (a Hopper GPU)."""
    from ragdot.backends import BACKEND_NAMES, _candidates, get_backend
    from ragdot.tune.tuner import candidates_for

    assert "gluon" in BACKEND_NAMES
    order = _candidates("cuda", tuple(BACKEND_NAMES))
    assert order.index("triton") < order.index("torch") < order.index("gluon") < order.index("reference")
    assert "gluon" not in _candidates("cpu", tuple(BACKEND_NAMES))
    names = {name for name, _ in candidates_for("ragged_k", (2048, 8192, 1408, 64), torch.bfloat16, 4)}
    assert ("gluon" in names) == ON_HOPPER
    if not ON_HOPPER:
        with pytest.raises(RuntimeError, match="backend 'gluon' is not usable"):
            get_backend("gluon")


def test_backend_configs_and_refusals_off_hopper():
    from ragdot.backends.gluon_gmm import BACKEND

    cfg = BACKEND.default_config("ragged_k", (2048, 4096, 1408, 64), torch.bfloat16)
    assert isinstance(cfg, GluonConfig)
    assert BACKEND.config_from_dict(BACKEND.config_to_dict(cfg)) == cfg
    assert BACKEND.config_label(cfg) == f"gluon:{cfg.short()}" and BACKEND.config_label(None) == "gluon"
    short = BACKEND.default_config("ragged_m", (2048, 4096, 1408, 64), torch.bfloat16)  # 32 rows a group
    assert (short.block_m, short.block_n, short.consumers) == (64, 256, 2)  # the sweep's best on average
    long = BACKEND.default_config("ragged_m", (15360, 6144, 20480, 32), torch.bfloat16)  # 480 rows a group
    assert (long.block_m, long.block_n, long.block_k, long.num_warps) == (128, 256, 32, 8)
    fp32 = BACKEND.default_config("ragged_m", (2048, 4096, 1408, 64), torch.float32)  # ping-pong 64x256 won't fit
    assert fp32.consumers == 1 and fp32.shared_bytes(2, 4) <= SHARED_BYTES
    assert BACKEND.default_config("ragged_m", (2048, 4000, 1408, 64), torch.bfloat16) is None  # K % 64 != 0
    assert BACKEND.tuning_configs("ragged_m", (2048, 4096, 1408, 64), torch.bfloat16, 3) == \
        gluon_m_tuning_configs(4096, 1408, limit=3)
    assert BACKEND.default_config("batch", (64, 64, 64, 4), torch.bfloat16) is None
    assert BACKEND.tuning_configs("batch", (64, 64, 64, 4), torch.bfloat16, 8) == []
    assert BACKEND.tuning_configs("ragged_k", (2048, 4096, 1408, 64), torch.bfloat16, 2) == \
        gluon_tuning_configs(2048, 1408, limit=2)
    if ON_HOPPER:
        return
    assert not BACKEND.is_available()
    a, b = torch.zeros(1, 64, 128, dtype=torch.bfloat16), torch.zeros(1, 64, 128, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="gluon backend"):
        BACKEND.prepare("ragged_k", a, b, 2, torch.bfloat16)
    with pytest.raises(NotImplementedError, match="gluon backend"):
        BACKEND.ragged_k(a, b, torch.tensor([10, 64], dtype=torch.int32), torch.bfloat16)


def test_unavailable_reason_is_one_line():
    reason = unavailable_reason()
    if not ON_HOPPER:
        assert reason and "\n" not in reason


def test_prepared_refuses_what_it_does_not_serve():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from ragdot.kernels.gluon.ragged_k import Prepared

    bf = torch.bfloat16
    with pytest.raises(NotImplementedError, match="operand dtypes"):
        Prepared(torch.zeros(1, 64, 128), torch.zeros(1, 64, 128), 2, torch.float32)
    with pytest.raises(NotImplementedError, match="row views"):  # M = 100: a's rows not 16-byte aligned
        Prepared(torch.zeros(1, 64, 100, dtype=bf), torch.zeros(1, 64, 128, dtype=bf), 2, bf)
    Prepared(torch.zeros(1, 64, 104, dtype=bf), torch.zeros(1, 64, 128, dtype=bf), 2, bf)  # M % 64 != 0 is served
    with pytest.raises(NotImplementedError, match="out_dtype"):
        Prepared(torch.zeros(1, 64, 128, dtype=bf), torch.zeros(1, 64, 128, dtype=bf), 2, torch.float64)
    with pytest.raises(NotImplementedError, match="row views"):  # rows of 20 elements: not 16-byte aligned
        Prepared(torch.zeros(1, 64, 128, dtype=bf), torch.zeros(1, 64, 20, dtype=bf), 2, bf)
    with pytest.raises(NotImplementedError, match="row views"):  # M strided
        Prepared(torch.zeros(1, 128, 64, dtype=bf).transpose(1, 2), torch.zeros(1, 64, 128, dtype=bf), 2, bf)
    for bt, r in ((1, (1 << 30) + 16), (3, 1 << 30)):  # token rows past the int32 TMA coordinates (views, no memory)
        a, b = torch.zeros(1, 1, 128, dtype=bf).expand(bt, r, 128), torch.zeros(1, 1, 128, dtype=bf).expand(bt, r, 128)
        with pytest.raises(NotImplementedError, match=r"rows \(at most"):
            Prepared(a, b, 2, bf)
    from ragdot.kernels.gluon.ragged_m import Prepared as PreparedM

    for bt, m in ((1, (1 << 30) + 128), (3, 1 << 30)):  # output rows past the ragged store view's coordinates
        a = torch.zeros(1, 1, 128, dtype=bf).expand(bt, m, 128)
        with pytest.raises(NotImplementedError, match=r"gluon ragged_m: .* rows \(at most"):
            PreparedM(a, torch.zeros(bt, 2, 128, 128, dtype=bf), bf)


def test_ragged_view_addresses_and_clips_at_the_group_end():
    """The 4-D view's address arithmetic (64-bit wrap-around, as TMA computes it) lands on the group's own rows,
    and the third coordinate's extent ends every box at the group's end row; stride bytes stay 16-byte
    aligned and below TMA's 2^40 limit. The loads of ragged_k and the stores of ragged_m use the same
    coordinates: [BASE, end, BASE - (end - first row) + k, column]."""
    from ragdot.kernels.ragged_view import RAGGED_BASE, ragged_view

    base = RAGGED_BASE.value
    for cols, row_stride, elem in ((1536, 1536, 2), (192, 320, 2), (2880, 2880, 2), (264, 264, 4)):
        shape, strides = ragged_view(cols, row_stride)
        assert shape[2:] == [base, cols] and strides[2:] == [row_stride, 1]
        assert all(s * elem % 16 == 0 and s * elem < 1 << 40 for s in strides[:3])
        for start, end, k in ((0, 37, 32), (300, 700, 0), (5, 6, 0), (1 << 20, (1 << 20) + 96, 64)):
            size = end - start
            coords = [base, end, base - size + k]
            assert all(0 <= c < e for c, e in zip(coords, shape[:3]))
            offset = sum(c * s for c, s in zip(coords, strides[:3])) % (1 << 64)
            assert offset == (start + k) * row_stride  # row start + k, column 0
            rows_in_bounds = shape[2] - coords[2]  # the box is clipped after this many rows
            assert rows_in_bounds == size - k


def test_misaligned_operands_run_the_triton_kernel():
    """TMA needs 16-byte aligned starts: such calls go to the triton kernel (here through its interpreter)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from ragdot.kernels.gluon.ragged_k import Prepared

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(2)
    r, m, n, sizes = 40, 64, 32, [7, 0, 20]
    a = misaligned_nan_tailed(r, m, 27, gen, dev)
    b = torch.randn(1, r, n, generator=gen).to(dev, torch.float16)
    prepared = Prepared(a, b, len(sizes), torch.float32, from_sizes=True)
    out = prepared(a, b, torch.tensor(sizes, device=dev))[0]
    ref = ragged_k_reference(a.nan_to_num(0), b, sizes)
    assert prepared.fallback is not None and out.dtype == torch.float32
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    assert torch.allclose(out.double(), ref, atol=1e-2, rtol=1e-2)


# ---- GPU: against a float64 reference -----------------------------------------------------------------------


def _case(r, m, n, sizes, bt=1, dtype=torch.bfloat16, seed=0, poison=True):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(bt, r, m, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(bt, r, n, device="cuda", dtype=dtype, generator=gen)
    used = sum(sizes)
    if poison and used < r:  # rows past ends[-1] belong to no group: NaN must never leak
        a[:, used:] = float("nan")
        b[:, used:] = float("inf")
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(device="cuda", dtype=torch.int32)
    return a, b, ends


def _check(out, a, b, sizes, dtype=torch.bfloat16):
    from ragdot.measure.checks import normalised_error

    ref = ragged_k_reference(a.nan_to_num(0, 0, 0), b.nan_to_num(0, 0, 0), sizes)
    assert torch.isfinite(out).all()
    err = normalised_error(out, ref)
    assert err <= {torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype], err
    for g, size in enumerate(sizes):
        if size == 0:
            assert (out[g] == 0).all(), f"empty group {g} is not exactly zero"


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("routing", sorted(SIZES_BY_ROUTING))
@pytest.mark.parametrize("r, m, n, e, used", [(1000, 256, 192, 8, 900), (4096, 512, 384, 16, 4096),
                                              (777, 128, 136, 5, 700)])
def test_ragged_k_matches_float64(routing, r, m, n, e, used):
    from ragdot.kernels.gluon.ragged_k import ragged_k

    sizes = SIZES_BY_ROUTING[routing](used, e)
    a, b, ends = _case(r, m, n, sizes)
    out = ragged_k(a, b, ends)
    _check(out, a, b, sizes)
    assert torch.equal(ragged_k(a, b, ends), out), "not bitwise reproducible"


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("epilogue", ["tma", "blocked"])
@pytest.mark.parametrize("cfg", gluon_tuning_configs(512, 512), ids=lambda c: c.short())
def test_every_candidate_config(cfg, epilogue, monkeypatch):
    monkeypatch.setattr("ragdot.kernels.gluon.ragged_k.EPILOGUE", epilogue)
    sizes = [300, 0, 17, 64, 0, 129, 1, 200, 63, 65]  # edges inside chunks, at chunk ends, one-row groups
    _check_config(cfg, 1000, 512, 512, sizes, seed=3)


def _check_config(cfg, r, m, n, sizes, bt=1, seed=0):
    """The Gluon ragged_k with `cfg` on a poisoned case: against float64, and bitwise stable."""
    from ragdot.kernels.gluon.ragged_k import ragged_k

    a, b, ends = _case(r, m, n, sizes, bt=bt, seed=seed)
    out = ragged_k(a, b, ends, config=cfg)
    _check(out, a, b, sizes)
    assert torch.equal(ragged_k(a, b, ends, config=cfg), out)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(
    "cfg", [c for c in gluon_tuning_configs(1024, 1024) if c.consumers == 2], ids=lambda c: c.short()
)
@pytest.mark.parametrize("epilogue", ["tma", "blocked"])
def test_ping_pong_consumers_over_many_items_per_program(cfg, epilogue, monkeypatch):
    """Ping-pong: each program takes several items, alternately consumed by its two consumers, of unequal
    chunk counts (long, one-row, empty and chunk-edge groups), so the turn barriers and each consumer's count
    of the other's chunks are exercised; against float64, and bitwise stable."""
    monkeypatch.setattr("ragdot.kernels.gluon.ragged_k.EPILOGUE", epilogue)
    _check_config(cfg, 2400, 1024, 1024, [700, 0, 1, 64, 0, 129, 65, 0, 300, 2, 640, 63, 0, 128], seed=11)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("cfg", [c for c in gluon_tuning_configs(2880, 2880) if c.block_m == 128][:4],
                         ids=lambda c: c.short())
@pytest.mark.parametrize("epilogue", ["tma", "blocked"])
def test_output_rows_not_a_multiple_of_the_tile(cfg, epilogue, monkeypatch):
    """M = 200 and N = 328 with 128-row tiles: each tile's TMA store clips at its own group's slab (c viewed
    [G*Bt, M, N]), and the blocked epilogue's stores are masked at M and N of it, so no tile writes into the next
    group's rows; batched, with empty groups."""
    monkeypatch.setattr("ragdot.kernels.gluon.ragged_k.EPILOGUE", epilogue)
    _check_config(cfg, 800, 200, 328, [300, 0, 129, 64, 5, 0, 250], bt=2, seed=13)


def _tma2_configs(m: int, n: int) -> list:
    """The candidate configs of an [M, N] output with room for the two-buffer epilogue, one ring stage fewer where
    the candidate's ring leaves none (128x256x32 in six stages: in four)."""
    from dataclasses import replace

    out = []
    for cfg in gluon_tuning_configs(m, n):
        while cfg.stages > 2 and cfg.shared_bytes(epilogue_tiles=2) > SHARED_BYTES:
            cfg = replace(cfg, stages=cfg.stages - 1)
        if cfg.shared_bytes(epilogue_tiles=2) <= SHARED_BYTES and cfg not in out:
            out.append(cfg)
    return out


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("cfg", _tma2_configs(1024, 1024), ids=lambda c: c.short())
def test_two_buffer_epilogue_equals_the_one_buffer_one(cfg, monkeypatch):
    """EPILOGUE "tma2" (a tile's store waits for the store two tiles back): many items a program, long, one-row,
    empty and chunk-edge groups; against float64, bitwise equal to the one-buffer TMA epilogue."""
    from ragdot.kernels.gluon.ragged_k import ragged_k

    sizes = [700, 0, 1, 64, 0, 129, 65, 0, 300, 2, 640, 63, 0, 128]
    a, b, ends = _case(2400, 1024, 1024, sizes, seed=17)
    monkeypatch.setattr("ragdot.kernels.gluon.ragged_k.EPILOGUE", "tma")
    one = ragged_k(a, b, ends, config=cfg)
    monkeypatch.setattr("ragdot.kernels.gluon.ragged_k.EPILOGUE", "tma2")
    two = ragged_k(a, b, ends, config=cfg)
    _check(two, a, b, sizes)
    assert torch.equal(two, one)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("cfg", [GluonConfig(128, 256, 32, 6, 8), GluonConfig(128, 128, 64, 4, 4, consumers=2),
                                 GluonConfig(128, 256, 64, 3, 8)], ids=lambda c: c.short())
def test_trimmed_last_chunk_equals_the_whole_chunk(cfg, monkeypatch):
    """TRIM_LAST_CHUNK (a last chunk at most half full multiplied on its first half alone): groups whose last
    chunk holds 1, half, half + 1 and all of its rows, empty groups, NaN past the last group; against float64,
    equal to the untrimmed kernel (the skipped products are exact zeros; compared as values, so -0 == +0)."""
    from ragdot.kernels.gluon.ragged_k import ragged_k

    k = cfg.block_k
    sizes = [k + 1, 0, k // 2, k // 2 + 1, 3 * k, 2 * k + k // 2, 1, 0, 5 * k - 3, k // 2 - 1]
    a, b, ends = _case(sum(sizes) + 40, 256, 512, sizes, seed=23)
    whole = ragged_k(a, b, ends, config=cfg)
    monkeypatch.setattr("ragdot.kernels.gluon.ragged_k.TRIM_LAST_CHUNK", True)
    trimmed = ragged_k(a, b, ends, config=cfg)
    _check(trimmed, a, b, sizes)
    assert (trimmed == whole).all()
    assert torch.equal(ragged_k(a, b, ends, config=cfg), trimmed), "not bitwise reproducible"


def test_epilogue_choice_refusals(monkeypatch):
    """An unknown EPILOGUE and a two-buffer epilogue without the shared memory for it are NotImplementedErrors
    (so `auto` moves on), named; the default choice follows the mean group length."""
    from ragdot.kernels.gluon import ragged_k as rk

    monkeypatch.setattr(rk, "EPILOGUE", "fancy")
    with pytest.raises(NotImplementedError, match="EPILOGUE 'fancy'"):
        rk.epilogue_code(1000, 10)
    monkeypatch.setattr(rk, "EPILOGUE", "tma2")
    with pytest.raises(NotImplementedError, match="second epilogue tile"):
        rk.epilogue_code(1000, 10, GluonConfig(128, 256, 32, 6, 8))
    assert rk.epilogue_code(1000, 10, GluonConfig(128, 256, 32, 4, 8)) == 2
    monkeypatch.setattr(rk, "EPILOGUE", None)
    assert rk.epilogue_code(32768, 128) in (0, 1)


def test_ping_pong_register_plan():
    """The second consumer's registers plus the default partition's 256 and the producer's fit 64 Ki a SM."""
    assert consumer_regs(GluonConfig()) == 0
    for regs in (24, 32, 40):
        cfg = GluonConfig(consumers=2, producer_regs=regs)
        assert consumer_regs(cfg) >= 128 and (256 + consumer_regs(cfg) + regs) * 128 <= 65536
    assert any(c.consumers == 2 for c in gluon_m_tuning_configs(2048, 2048))  # ragged_m has ping-pong too
    assert all(2048 % c.block_k == 0 for c in gluon_m_tuning_configs(2048, 2048))
    assert {c.block_k for c in gluon_m_tuning_configs(96, 2048)} == {32}  # chunks never cross a group's matrix
    assert GluonConfig(consumers=2).short().endswith("p2") and not GluonConfig().short().endswith("p2")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(
    "sizes", [[640], [0], [0, 0, 0], [5, 0, 0, 0]], ids=["G=1", "G=1 empty", "all empty", "one row"]
)
def test_degenerate_groups(sizes):
    from ragdot.kernels.gluon.ragged_k import ragged_k

    a, b, ends = _case(640, 128, 256, sizes, seed=5)
    out = ragged_k(a, b, ends)
    _check(out, a, b, sizes)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("cfg", [None, GluonConfig(128, 256, 32, 6, 8), GluonConfig(128, 128, 64, 4, 4, consumers=2)],
                         ids=lambda c: "default" if c is None else c.short())
def test_chunks_that_straddle_a_group_end_never_read_the_next_group(cfg):
    """A group's last chunk reaches into the next group's rows, which here are NaN (a) and inf (b): the loads
    are clipped at the group's end, so the groups around the poisoned one stay finite and exact."""
    from ragdot.kernels.gluon.ragged_k import ragged_k

    sizes = [37, 50, 90, 1, 33]
    a, b, ends = _case(300, 128, 256, sizes, seed=17)
    a[:, 37:87], b[:, 37:87] = float("nan"), float("inf")
    out = ragged_k(a, b, ends, config=cfg)
    assert torch.isnan(out[1]).any()  # the poisoned group's own product
    ref = ragged_k_reference(a.nan_to_num(0, 0, 0), b.nan_to_num(0, 0, 0), sizes)
    keep = [0, 2, 3, 4]
    assert torch.isfinite(out[keep]).all()
    assert torch.allclose(out[keep].double(), ref[keep], atol=0.1, rtol=2e-2)


@pytest.mark.gpu
@hopper
def test_ends_past_the_rows_read_only_their_own_batch_entry():
    """Group ends beyond R (the kernel-level call takes them unclamped) stop at R in every batch entry:
    batch entry 0's last group never reads entry 1's first rows."""
    from ragdot.kernels.gluon.ragged_k import ragged_k

    a, b, _ = _case(500, 128, 136, [500], bt=2, seed=19, poison=False)
    ends = torch.tensor([300, 700], device="cuda", dtype=torch.int32)
    out = ragged_k(a, b, ends)
    _check(out, a, b, [300, 200])


@pytest.mark.gpu
@hopper
def test_batch_fp16_fp32_out_and_strided_rows():
    from ragdot.kernels.gluon.ragged_k import ragged_k

    sizes = [100, 0, 250, 77]
    a, b, ends = _case(500, 192, 264, sizes, bt=3, dtype=torch.float16, seed=7)
    _check(ragged_k(a, b, ends), a, b, sizes, torch.float16)
    out32 = ragged_k(a, b, ends, torch.float32)
    assert out32.dtype == torch.float32
    _check(out32, a, b, sizes, torch.float16)
    wide = torch.randn(1, 500, 320, device="cuda", dtype=torch.bfloat16)  # rows with a stride > M
    wide[:, 427:] = float("nan")
    a1 = wide[:, :, :192]
    b1 = torch.randn(1, 500, 264, device="cuda", dtype=torch.bfloat16)
    _check(ragged_k(a1, b1, ends[:4]), a1, b1, sizes)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("where", ["rows", "columns"])
def test_strided_output_view(where):
    """`Prepared(out_strides=...)` (the fused MoE block's weight gradient a slice of D at a time): the result
    written into a slice of a larger gradient, rows or columns, equals the contiguous call's bits and leaves
    the rest of the gradient untouched."""
    from ragdot.kernels.gluon.ragged_k import Prepared

    sizes = [300, 0, 129, 512, 77]
    a, b, ends = _case(1200, 512, 768, sizes, seed=11)
    want = Prepared(a, b, len(sizes), torch.bfloat16)(a, b, ends)[0]
    if where == "rows":
        big = torch.full((len(sizes), 1, 1536, 768), float("nan"), device="cuda", dtype=torch.bfloat16)
        view = big[:, :, 512:1024]
    else:
        big = torch.full((len(sizes), 1, 512, 2304), float("nan"), device="cuda", dtype=torch.bfloat16)
        view = big[:, :, :, 1024:1792]
    got = Prepared(a, b, len(sizes), torch.bfloat16, out_strides=(view.stride(0), view.stride(2)))(a, b, ends, view)[0]
    assert got.data_ptr() == view.data_ptr() and torch.equal(view, want)
    assert int(big.isnan().sum()) == big.numel() - view.numel()


@pytest.mark.gpu
@hopper
def test_backend_prepared_call_from_raw_sizes_matches_triton():
    from ragdot.backends import get_backend

    gl_backend, tr_backend = get_backend("gluon"), get_backend("triton")
    sizes = skewed(3000, 16).tolist()
    a, b, _ = _case(3200, 1024, 768, sizes, seed=9)
    raw = torch.tensor(sizes, device="cuda", dtype=torch.int64)
    call = gl_backend.prepare("ragged_k", a, b, len(sizes), torch.bfloat16)
    out = call(a, b, raw)
    _check(out, a, b, sizes)
    ref = tr_backend.prepare("ragged_k", a, b, len(sizes), torch.bfloat16)(a, b, raw)
    from ragdot.measure.checks import normalised_error

    assert normalised_error(out, ref) <= 1e-2
    assert torch.equal(call(a, b, raw), out)
    with pytest.raises(NotImplementedError, match="row views"):  # M = 100: a's rows are not 16-byte aligned
        gl_backend.prepare("ragged_k", a[:, :, :100], b, len(sizes), torch.bfloat16)


def test_gluon_gpu_summary_counts_the_best_config_of_each_cell():
    """benchmarks/gluon_gpu.py --configs: per cell the fastest Gluon config enters `gluon-best`."""

    mod = benchmark_script("gluon_gpu")

    def row(shape, system, graph, eager, status="ok"):
        return dict(shape=shape, cls="wgrad_wi", system=system, status=status, graph_vs_vendor=graph,
                    eager_vs_vendor=eager)

    rows = [row("s1", "gluon:a", 0.9, 1.2), row("s1", "gluon:b", 1.1, 0.8), row("s1", "triton", 1.0, 1.0),
            row("s2", "gluon:a", 2.0, 2.0), row("s2", "gluon:b", 4.0, 4.0, status="wrong"),
            row("s2", "triton", 0.5, 0.5), row("s1", "vendor", 1.0, 1.0)]
    summary = mod.summarize(rows, ["wgrad_wi"])
    best = summary["wgrad gluon-best graph"]
    assert best["cells"] == 2 and best["min_vs_vendor"] == 1.1
    assert abs(best["geomean_vs_vendor"] - (1.1 * 2.0) ** 0.5) < 1e-12
    assert summary["wgrad gluon-best eager"]["min_vs_vendor"] == 1.2
    assert summary["wgrad gluon:b graph"]["cells"] == 1  # the wrong cell is not counted
    assert "wgrad vendor graph" not in summary


def test_weight_gradient_kernels_refuse_what_they_do_not_serve_naming_it():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from ragdot.kernels.gluon.ragged_k import Prepared, checked_config

    a, b = torch.empty(1, 64, 256, dtype=torch.bfloat16), torch.empty(1, 64, 256, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=r"gluon ragged_k: operand dtypes torch.float32, .*bf16/fp16 only"):
        Prepared(a.float(), b.float(), 4, torch.float32)
    with pytest.raises(NotImplementedError, match="gluon ragged_k: out_dtype torch.float64"):
        Prepared(a, b, 4, torch.float64)
    with pytest.raises(NotImplementedError, match="needs too much shared memory"):
        Prepared(a, b, 4, torch.bfloat16, GluonConfig(128, 256, 64, 8, 8))
    cfg, out_bytes = checked_config("k", torch.float16, torch.float16, torch.float32, 2880, 2880, None)
    assert out_bytes == 4 and cfg == pick_gluon_config(2880, 2880, 4)
