"""Fused sparse expert block (ragdot.moe.fused) against the unfused path: outputs and every gradient, edge
routings (empty experts, a token choosing one expert twice), NaN isolation, determinism, master weights, tile
configs. Under compilers, transforms and dispatch modes: test_fused_moe_modes.py."""

from __future__ import annotations

import pytest
import torch

from fused_cases import (
    DEV,
    DTYPES,
    TOL,
    _fused,
    _layer_run,
    _operands,
    _unfused,
    _value_and_grads,
    backward_kinds,  # noqa: F401 (the fixture `backward`)
)
from helpers import benchmark_script, nerr
from ragdot.moe import MoELayer
from ragdot.moe import fused as fused_mod
from ragdot.moe import routing_kernels as rk
from ragdot.moe.fused import fused_experts, sort_experts
from ragdot.moe.permute import permute

pytestmark = pytest.mark.skipif(not rk.HAS_TRITON, reason="the fused kernels need triton")


def _assert_match(operands, tol, seed=1):
    gen = torch.Generator().manual_seed(seed)
    cot = torch.randn(operands[0].shape, generator=gen).to(DEV, operands[0].dtype)
    y, grads = _value_and_grads(_fused, operands, cot)
    y_ref, grads_ref = _value_and_grads(_unfused, operands, cot)
    assert nerr(y, y_ref) <= tol
    for name, g, ref in zip(("x", "weights", "w_gate_up", "w_down"), grads, grads_ref):
        assert g.dtype == ref.dtype and g.shape == ref.shape, name
        assert nerr(g, ref) <= tol, name
    return grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 40, 24, 6, 2), (16, 32, 16, 4, 1), (50, 24, 40, 9, 3), (3, 16, 17, 5, 2)])
@pytest.mark.usefixtures("backward")
def test_fused_matches_unfused(shape, dtype):
    _assert_match(_operands(*shape, dtype), TOL[dtype])


@pytest.mark.parametrize("top_k", range(1, 9))
@pytest.mark.usefixtures("backward")
def test_every_top_k(top_k):
    _assert_match(_operands(21, 32, 16, 8, top_k, torch.float32, seed=top_k), TOL[torch.float32])


@pytest.mark.usefixtures("backward")
def test_empty_experts_get_exact_zero_gradients():
    x, chosen, weights, wgu, wd = _operands(30, 32, 16, 7, 2, torch.float32)
    chosen = torch.where(chosen >= 4, chosen - 4, chosen)  # experts 4..6 unused; pairs may repeat an expert
    grads = _assert_match((x, chosen, weights, wgu, wd), TOL[torch.float32])
    assert torch.equal(grads[2][4:], torch.zeros_like(grads[2][4:]))
    assert torch.equal(grads[3][4:], torch.zeros_like(grads[3][4:]))


@pytest.mark.usefixtures("backward")
def test_token_picking_one_expert_twice():
    x, chosen, weights, wgu, wd = _operands(19, 32, 24, 5, 3, torch.float32)
    chosen[:, 1] = chosen[:, 0]
    chosen[::2, 2] = chosen[::2, 0]
    _assert_match((x, chosen, weights, wgu, wd), TOL[torch.float32])


@pytest.mark.usefixtures("backward")
def test_all_tokens_one_expert():
    x, chosen, weights, wgu, wd = _operands(40, 16, 16, 6, 2, torch.float32)
    _assert_match((x, torch.full_like(chosen, 3), weights, wgu, wd), TOL[torch.float32])


@pytest.mark.usefixtures("backward")
def test_nan_in_fresh_buffers_and_unused_experts_never_leaks(monkeypatch):
    """Every buffer the kernels allocate starts as NaN, and the unused experts' weights are NaN."""
    x, chosen, weights, wgu, wd = _operands(25, 32, 16, 6, 2, torch.float32)
    chosen = chosen % 4
    with torch.no_grad():
        wgu[4:] = float("nan")
        wd[4:] = float("nan")
    new_empty = torch.Tensor.new_empty

    def poisoned(self, *args, **kwargs):
        out = new_empty(self, *args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    cot = torch.randn(x.shape, device=DEV)
    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)
    y, grads = _value_and_grads(_fused, (x, chosen, weights, wgu, wd), cot)
    monkeypatch.undo()
    assert torch.isfinite(y).all()
    for g in grads[:2]:
        assert torch.isfinite(g).all()
    assert torch.isfinite(grads[2][:4]).all() and torch.isfinite(grads[3][:4]).all()
    assert torch.equal(grads[2][4:], torch.zeros_like(grads[2][4:]))
    assert torch.equal(grads[3][4:], torch.zeros_like(grads[3][4:]))


@pytest.mark.usefixtures("backward")
def test_repeats_are_bitwise_identical():
    operands = _operands(33, 32, 24, 5, 3, torch.float16)
    cot = torch.randn(operands[0].shape, device=DEV).to(torch.float16)
    y0, g0 = _value_and_grads(_fused, operands, cot)
    y1, g1 = _value_and_grads(_fused, operands, cot)
    assert torch.equal(y0, y1)
    for a, b in zip(g0, g1):
        assert torch.equal(a, b)


@pytest.mark.usefixtures("backward")
def test_a_profile_attributes_the_blocks_kernels_to_its_gemms_and_routing():
    """`moe-bench` splits a layer's profile by ragdot's range names (`ragdot.ops.profiled`): the block's GEMMs and
    its routing (sort, gather, combine) land in their classes, kernels included on a GPU (a user-annotation range
    got none of the Triton kernels launched inside it: every kernel counted as other work)."""
    from torch.profiler import ProfilerActivity, profile

    from ragdot.bench.moe_train import _kernel_split

    x, chosen, weights, wgu, wd = _operands(37, 40, 24, 6, 2, torch.float32)

    def step():
        sizes, order = sort_experts(chosen, wgu.shape[0])
        fused_experts(x, order, sizes, weights, wgu, wd).sum().backward()

    step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if DEV.type == "cuda":
            torch.cuda.synchronize()
    split = _kernel_split(prof, DEV)
    assert split["gemm"] > 0 and split["routing"] > 0, split
    names = {e.name for e in prof.events()}
    assert {"ragdot::moe_sort", "ragdot::moe_combine"} <= names, sorted(n for n in names if "ragdot" in n)


# 16-bit dtypes of x for float32 master weights (the Triton interpreter computes bf16 dots wrongly)
LOW = [torch.float16] + ([torch.bfloat16] if DEV.type == "cuda" else [])


@pytest.mark.parametrize("low", LOW)
def test_float32_master_weights_of_a_16_bit_x(low, backward):
    """Float32 weights with a 16-bit x (torch.autocast's master weights): y and the gradients of x and the router
    weights are the bits of the block run on the weights' 16-bit casts; the weights' gradients come back in
    float32, written so by the GEMMs (not 16-bit results cast) on the "gemms" backward, within a 16-bit rounding
    of the cast weights' gradients; empty experts still get exact zeros."""
    x, chosen, weights, wgu, wd = _operands(37, 40, 24, 7, 2, torch.float32)
    chosen = chosen % 6  # expert 6 unused
    x16 = x.detach().to(low).requires_grad_()
    wgu16, wd16 = (w.detach().to(low).requires_grad_() for w in (wgu, wd))
    cot = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).to(DEV, low)
    y, grads = _value_and_grads(_fused, (x16, chosen, weights, wgu, wd), cot)
    y16, grads16 = _value_and_grads(_fused, (x16, chosen, weights, wgu16, wd16), cot)
    assert y.dtype == low and torch.equal(y, y16)
    assert torch.equal(grads[0], grads16[0]) and torch.equal(grads[1], grads16[1])
    for got, ref in zip(grads[2:], grads16[2:]):
        assert got.dtype == torch.float32 and ref.dtype == low
        assert nerr(got, ref) <= {torch.float16: 2e-3, torch.bfloat16: 1e-2}[low]
        assert torch.equal(got[6], torch.zeros_like(got[6]))
        if backward == "gemms":
            assert not torch.equal(got, got.to(low).float())
    with torch.no_grad():  # the forward alone: the same bits
        assert torch.equal(_fused(x16, chosen, weights, wgu, wd), y16)
    with pytest.raises(TypeError, match="float32 for a 16-bit x"):
        _fused(x16.float(), chosen, weights, wgu16, wd16)  # 16-bit weights of a float32 x: no master weights


def test_second_backward_through_a_retained_graph_is_refused():
    """The eager backward writes dpre over the saved pre-activation (less memory at its peak): a second backward
    through the retained graph is refused with an error naming the switch, never reusing dpre as pre."""
    x, chosen, weights, wgu, wd = _operands(12, 16, 16, 4, 2, torch.float32)
    y = _fused(x, chosen, weights, wgu, wd)
    first = torch.autograd.grad(y.sum(), (x, wgu), retain_graph=True)
    assert all(torch.isfinite(g).all() for g in first)
    with pytest.raises(RuntimeError, match="retained graph needs ragdot.moe.fused.backward_in_place = False"):
        torch.autograd.grad(y.sum(), (x, wgu))


def test_the_eager_backward_gets_no_zero_filled_gradient_for_pre(monkeypatch):
    """pre is an output without a gradient: autograd must not materialise a zero [T*k, 2H] for it (a fill kernel
    and one more such buffer at the backward's peak)."""
    seen = []
    backward = fused_mod._FusedEager.backward

    def spy(ctx, grad_y, grad_pre):
        seen.append(grad_pre)
        return backward(ctx, grad_y, grad_pre)

    monkeypatch.setattr(fused_mod._FusedEager, "backward", staticmethod(spy))
    x, chosen, weights, wgu, wd = _operands(12, 16, 16, 4, 2, torch.float32)
    grads = torch.autograd.grad(_fused(x, chosen, weights, wgu, wd).sum(), (x, wgu))
    assert seen == [None] and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_backward_writes_the_same_bits_over_its_inputs(dtype):
    """dpre over pre and w * act over g (the backward's transients; less memory at its peak): the same bits as into
    new buffers."""
    from ragdot.kernels import fused_moe_bwd as fb

    gen = torch.Generator().manual_seed(3)
    a, h = 37, 24
    g = torch.randn(a, h, generator=gen).to(DEV, dtype)
    pre = torch.randn(a, 2 * h, generator=gen).to(DEV, dtype)
    order = torch.randperm(a, generator=gen).to(DEV, torch.int32)
    w = torch.rand(a, generator=gen).to(DEV)
    ref = fb.swiglu_backward(g, pre, order, w)
    g2, pre2 = g.clone(), pre.clone()
    out = fb.swiglu_backward(g2, pre2, order, w, in_place=True, act_over_g=True)
    assert out[0] is pre2 and out[1] is g2
    for x, y in zip(out, ref):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="act_over_g"):
        fb.swiglu_backward(g.t().contiguous().t(), pre, order, w, act_over_g=True)


def test_a_second_backward_runs_with_the_in_place_write_off(monkeypatch):
    monkeypatch.setattr(fused_mod, "backward_in_place", False)
    x, chosen, weights, wgu, wd = _operands(12, 16, 16, 4, 2, torch.float32)
    y = _fused(x, chosen, weights, wgu, wd)
    first = torch.autograd.grad(y.sum(), (x, wgu), retain_graph=True)
    second = torch.autograd.grad(y.sum(), (x, wgu))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_atomic_mode_is_opt_in_and_close(monkeypatch):
    monkeypatch.setattr(fused_mod, "forward_kind", "fused")  # the one forward whose combine has an atomic mode
    x, chosen, weights, wgu, wd = _operands(29, 32, 16, 6, 3, torch.float32)
    with torch.no_grad():
        y = _fused(x, chosen, weights, wgu, wd)
        y_atomic = _fused(x, chosen, weights, wgu, wd, deterministic=False)
    assert nerr(y_atomic, y) <= 1e-6


@pytest.mark.usefixtures("backward")
def test_gradients_without_x_grad():
    x, chosen, weights, wgu, wd = _operands(14, 16, 16, 4, 2, torch.float32)
    x = x.detach()
    grads = torch.autograd.grad(_fused(x, chosen, weights, wgu, wd).sum(), (weights, wgu, wd))
    refs = torch.autograd.grad(_unfused(x, chosen, weights, wgu, wd).sum(), (weights, wgu, wd))
    for g, ref in zip(grads, refs):
        assert nerr(g, ref) <= TOL[torch.float32]


@pytest.mark.usefixtures("backward")
def test_no_grad_forward_gives_the_training_forwards_bits():
    """Without grad the forward runs its body directly; with grad through the eager Function: the same bits."""
    x, chosen, weights, wgu, wd = _operands(23, 32, 16, 5, 2, torch.float32)
    with torch.no_grad():
        y_plain = _fused(x, chosen, weights, wgu, wd)
    y_grad = _fused(x, chosen, weights, wgu, wd)
    assert torch.equal(y_plain, y_grad.detach())


@pytest.mark.usefixtures("backward")
def test_no_grad_forward_saves_nothing():
    x, chosen, weights, wgu, wd = _operands(12, 16, 16, 4, 2, torch.float32)
    sizes, order = sort_experts(chosen, 4)
    with torch.no_grad():
        y, pre = torch.ops.ragdot.fused_moe(x, order, sizes, weights, wgu, wd, 2, False, True)
    assert pre.shape == (0, 32) and y.shape == x.shape


def test_sort_matches_permute_slots():
    _, chosen, _, _, _ = _operands(40, 16, 16, 7, 3, torch.float32)
    for impl in ("torch", "triton"):
        sizes, order = sort_experts(chosen, 7, impl=impl)
        _, routing = permute(torch.zeros(40, 16, device=DEV), chosen, 7, impl=impl)
        assert torch.equal(sizes, routing.group_sizes)
        assert torch.equal(order.long(), routing.order())


def test_bad_arguments_raise_clear_errors():
    x, chosen, weights, wgu, wd = _operands(9, 16, 16, 4, 2, torch.float32)
    sizes, order = sort_experts(chosen, 4)
    with pytest.raises(ValueError, match="w_down"):
        fused_experts(x, order, sizes, weights, wgu, wd[:, :8])
    with pytest.raises(ValueError, match="order"):
        fused_experts(x, order.long(), sizes, weights, wgu, wd)
    with pytest.raises(ValueError, match="fused"):
        MoELayer(16, 8, 4, 2, fused="yes")
    with pytest.raises(ValueError, match="impl"):
        sort_experts(chosen, 4, impl="numpy")


# ------------------------------------------------------------------------------------------------ the layer
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.usefixtures("backward")
def test_layer_fused_matches_unfused(dtype):
    torch.manual_seed(0)
    layer = MoELayer(32, 24, 6, 3, path="sparse", dtype=dtype, device=DEV, num_shared_experts=1, fused=True)
    x = torch.randn(2, 11, 32, device=DEV).to(dtype)
    cot = torch.randn(2, 11, 32, device=DEV).to(dtype)
    y, g = _layer_run(layer, x, cot)
    layer.fused = False
    y_ref, g_ref = _layer_run(layer, x, cot)
    assert nerr(y, y_ref) <= TOL[dtype]
    for name, ref in g_ref.items():
        assert nerr(g[name], ref) <= TOL[dtype], name


def test_layer_runs_the_fused_block_by_default_where_it_measured_faster(monkeypatch):
    """fused=None: the fused block for 16-bit inputs on CUDA with backend None/"auto", no recompute and a
    forward of FUSED_MIN_FLOPS or more; the unfused path elsewhere (CPU, float32, a backend asked for by name,
    recompute, less work); True / False force either."""

    layer = MoELayer(16, 8, 4, 2, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(3, 16, device=DEV, dtype=torch.bfloat16)
    assert "fused=None" in repr(layer)
    assert not layer.uses_fused(x)  # 6 * 3 * 2 * 16 * 8 FLOPs: below the threshold (and not capturing)
    monkeypatch.setattr(fused_mod, "FUSED_MIN_FLOPS", 6 * 3 * 2 * 16 * 8)
    assert layer.uses_fused(x) == (DEV.type == "cuda")
    with torch.no_grad():  # inference: the block's forward alone was not measured against the unfused path
        assert not layer.uses_fused(x)
    assert not layer.uses_fused(x.float())
    for setting in ({"backend": "triton"}, {"backend": "torch"}, {"recompute": True}):
        for name, value in setting.items():
            setattr(layer, name, value)
        assert not layer.uses_fused(x), setting
        layer.backend, layer.recompute = None, False
    layer.fused = True
    assert layer.uses_fused(x.float().cpu())
    layer.fused = False
    assert not layer.uses_fused(x)


@pytest.mark.gpu
@pytest.mark.parametrize("transposed", [False, True], ids=["in-out", "out-in"])
def test_float32_master_weights_at_the_gluon_weight_gradient_sizes(transposed):
    """Master weights where the weight gradients run on the Gluon kernel (sm_90: 16-bit rows, D a multiple of
    256, one or several column slices) in both weight layouts: float32 gradients within a bf16 rounding of the
    cast weights' and no cast of a bf16 result."""
    x, chosen, weights, wgu, wd = _operands(384, 1024, 256, 8, 4, torch.float32, seed=5)
    if transposed:  # transformers' [E, out, in] parameters, passed as transposed views
        wgu = wgu.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
        wd = wd.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    x16 = x.detach().bfloat16().requires_grad_()
    wgu16, wd16 = (w.detach().bfloat16().requires_grad_() for w in (wgu, wd))
    cot = torch.randn(x.shape, device=DEV, dtype=torch.bfloat16)
    y, grads = _value_and_grads(_fused, (x16, chosen, weights, wgu, wd), cot)
    y16, grads16 = _value_and_grads(_fused, (x16, chosen, weights, wgu16, wd16), cot)
    assert torch.equal(y, y16) and torch.equal(grads[0], grads16[0])
    for got, ref, w in zip(grads[2:], grads16[2:], (wgu, wd)):
        assert got.dtype == torch.float32 and got.stride() == w.stride()
        assert nerr(got, ref) <= 5e-3 and not torch.equal(got, got.bfloat16().float())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.usefixtures("backward")
def test_fused_matches_unfused_on_gpu_tiles(dtype):
    """Shapes big enough for several 128-row tiles per expert and partial column tiles."""
    _assert_match(_operands(1000, 512, 352, 16, 4, dtype), TOL[dtype])

@pytest.mark.parametrize("layout", ["layer", "transposed"])
def test_gpu_benchmark_rows_on_a_tiny_layer(layout, tmp_path):
    """benchmarks/fused_gpu.py's row loop on a tiny float32 layer (the wall clock on a CPU), both weight layouts."""

    bench = benchmark_script("fused_gpu")
    variants = ",".join(bench.VARIANTS)
    args = bench._args(["--out", str(tmp_path), "--reps", "1", "--layout", layout, "--variants", variants])
    layer = bench.with_layout(MoELayer(16, 16, 4, 2, path="sparse", dtype=torch.float32, device=DEV), layout)
    assert layer.w_down.is_contiguous() == (layout == "layer")
    rows = list(bench._rows_for(layer, "tiny", 8, DEV, 1e12, args))
    assert {r["variant"] for r in rows} == set(bench.VARIANTS)
    assert all(r["status"] in ("ok", "n/a: host sync") for r in rows), rows
    assert all(float(r["max_err"]) <= 1e-4 for r in rows), rows


def test_explicit_tile_configs_give_the_heuristics_results():
    """Every fused kernel takes a `config` (what benchmarks/fused_sweep.py tries): other tiles, the same values."""
    from ragdot.kernels import fused_moe as fm
    from ragdot.kernels import fused_moe_bwd as fb
    from ragdot.kernels.fused_moe import FusedConfig

    gen = torch.Generator().manual_seed(3)
    t, d, h, e, k = 20, 32, 16, 3, 2

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(DEV)

    x, dy, w_gu, w_down = rand(t, d), rand(t, d), rand(e, d, 2 * h), rand(e, h, d)
    sizes, order = sort_experts(torch.randint(0, e, (t, k), generator=gen).to(DEV), e)
    w = torch.rand(t * k, generator=gen).to(DEV)
    act, pre = fm.up_swiglu(x, w_gu, order, sizes, k, True)
    calls = {
        "up": lambda c: fm.up_swiglu(x, w_gu, order, sizes, k, True, config=c)[1],
        "down": lambda c: fm.down_scatter(act, w_down, order, sizes, w, k, config=c),
        "dbwd": lambda c: fb.down_bwd_swiglu(dy, w_down, order, sizes, w, pre, k, config=c)[0],
        "wgrad": lambda c: fb.weight_grad(x, pre, order, sizes, None, k, gather_left=True, gather_right=False,
                                          config=c),
    }
    other = FusedConfig(block_m=32, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2)
    for name, call in calls.items():
        assert nerr(call(other), call(None)) <= TOL[torch.float32], name


def test_fused_config_per_kernel(monkeypatch):
    """The heuristic's tiles: per kernel where shared memory is wide (2-byte dtypes), the narrower ones
    elsewhere; columns cap BLOCK_N; an unknown kernel name is a ValueError naming the argument."""
    from ragdot.kernels import fused_moe as fm

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(fm, "wide_shared_memory", lambda device: True)
    tiles = {k: fm.fused_config(torch.bfloat16, gpu, 4096, k) for k in fm.FUSED_KERNELS}
    assert {k: (c.block_n, c.block_k, c.num_stages) for k, c in tiles.items()} == {
        "up": (128, 32, 4), "dbwd": (128, 64, 4), "down": (256, 64, 4), "wgrad": (128, 64, 3)}
    assert fm.fused_config(torch.bfloat16, gpu, 96, "down").block_n == 128  # the columns' next power of two
    assert fm.fused_config(torch.float32, gpu, 4096, "down") == fm.FusedConfig(block_k=32)
    monkeypatch.setattr(fm, "wide_shared_memory", lambda device: False)
    assert fm.fused_config(torch.float16, gpu, 4096, "up") == fm.FusedConfig(block_n=64)
    assert fm.fused_config(torch.float16, torch.device("cpu"), 4096, "up").block_n == 16
    with pytest.raises(ValueError, match="kernel"):
        fm.fused_config(torch.bfloat16, gpu, 4096, "gate")


@pytest.mark.skipif(DEV.type == "cuda", reason="the probe's CPU smoke run (on a GPU it sweeps every candidate)")
def test_fused_sweep_runs_on_the_cpu(tmp_path, capsys):

    sweep = benchmark_script("fused_sweep")
    for wide in (False, True):  # the candidates respect the ring budget and the accumulator limit
        for c in sweep.candidates(torch.bfloat16, wide, None):
            assert c.num_stages * (c.block_m * c.block_k + c.block_k * c.block_n) * 2 <= sweep.SHARED_BYTES
            assert c.block_m * c.block_n * (2 if wide else 1) <= (128 * 256 if c.num_warps == 8 else 128 * 128)
    assert sweep.main(["--device", "cpu", "--tiny", "--kernels", "up", "wgrad_down", "--reps", "1", "-q",
                       "--out", str(tmp_path)]) == 0
    rows = list((tmp_path).glob("fused-sweep-*.csv"))
    assert rows and "best up:" in capsys.readouterr().out
    import csv

    with open(rows[0]) as f:
        got = list(csv.DictReader(f))
    assert {r["kernel"] for r in got} == {"up", "wgrad_down"} and all(r["status"] == "ok" for r in got)


@pytest.mark.usefixtures("backward")
def test_transposed_weight_views_get_gradients_in_their_own_layout():
    """Weights stored [E, out, in] and passed as transposed views (transformers' layout): the fused backward
    computes their gradients in that memory order, with the values of contiguous weights."""
    x, chosen, weights, wgu, wd = _operands(37, 40, 24, 6, 2, torch.float32)
    stored = [w.detach().transpose(1, 2).contiguous().requires_grad_(True) for w in (wgu, wd)]  # [E, out, in]
    cot = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(DEV)
    views = [w.transpose(1, 2) for w in stored]
    grads = torch.autograd.grad(_fused(x, chosen, weights, *views), views, cot)
    _, ref = _value_and_grads(_fused, (x, chosen, weights, wgu, wd), cot)
    for got, view, want in zip(grads, views, ref[2:]):
        assert got.stride() == view.stride()  # no copy into the parameter's layout is needed
        assert nerr(got, want) <= TOL[torch.float32]


@pytest.mark.parametrize("mode", fused_mod.WGRAD_ROWS)  # "chunks" reads through the index where Gluon does not run
@pytest.mark.parametrize("layout", ["layer", "transposed"])
def test_every_way_of_reading_x_for_the_last_weight_gradient(mode, layout, monkeypatch):
    """`wgrad_rows`: x's token rows read through the index ("index"), gathered a slice of columns at a time
    ("chunks", Gluon on sm_90, three slices at these widths; elsewhere the index), copied into the Gluon kernel's
    shared memory by its producer ("gather", sm_90; elsewhere the index) or all at once ("copy") give
    w_gate_up's gradient within rounding of each other, in the weight's own memory order, and every other
    gradient bit for bit."""
    shape = (300, 1280, 96, 8, 2) if DEV.type == "cuda" else (37, 40, 24, 6, 2)
    dtype = torch.bfloat16 if DEV.type == "cuda" else torch.float16
    x, chosen, weights, wgu, wd = _operands(*shape, dtype)
    if layout == "transposed":  # transformers' [E, out, in] parameters, passed as views
        stored = [w.detach().transpose(1, 2).contiguous().requires_grad_(True) for w in (wgu, wd)]
        wgu, wd = (w.transpose(1, 2) for w in stored)
    cot = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(DEV, dtype)
    inputs = (x, weights, wgu, wd)
    monkeypatch.setattr(fused_mod, "backward_kind", "gemms")  # the backward that reads x's rows so
    monkeypatch.setattr(fused_mod, "wgrad_rows", mode)
    grads = torch.autograd.grad(_fused(x, chosen, weights, wgu, wd), inputs, cot)
    monkeypatch.setattr(fused_mod, "wgrad_rows", "copy")
    refs = torch.autograd.grad(_fused(x, chosen, weights, wgu, wd), inputs, cot)
    for name, got, want in zip(("x", "weights", "w_gate_up", "w_down"), grads, refs):
        assert got.shape == want.shape and got.stride() == want.stride(), name
        assert torch.equal(got, want) if name != "w_gate_up" else nerr(got, want) <= TOL[dtype], name
    assert grads[2].stride() == wgu.stride()


def test_gather_mode_runs_at_the_tuned_gluon_tile_of_the_whole_product(monkeypatch):
    """"gather" asks the tune cache for the Gluon config of the product on a gathered [1, A, D] copy (the key the
    tuner measured) and builds its kernel at that tile; where there is none, or the kernel refuses it, the
    kernel's default tile."""
    import ragdot.tune.select as select

    x, right = torch.empty(1, 10, 64), torch.empty(1, 40, 96)  # x [1, T, D], dpre [1, A, Q]
    asked, built, tuned = [], [], {}

    def plan(problem, backend, a, b, e, dtype):
        asked.append((problem, backend, tuple(a.shape), tuple(b.shape), e, dtype))
        return [("gluon", tuned["config"])]

    def kernel(a, b, e, dtype, config, from_sizes):
        built.append(config)
        if config == "refused":
            raise NotImplementedError("not this tile")
        return "kernel"

    monkeypatch.setattr(select, "plan", plan)
    for config, want in (("pingpong", ["pingpong"]), (None, [None]), ("refused", ["refused", None])):
        tuned["config"] = config
        built.clear()
        assert fused_mod._gather_kernel(x, right, 4, torch.float16, kernel) == "kernel"
        assert built == want
    assert asked[0] == ("ragged_k", "gluon", (1, 40, 64), (1, 40, 96), 4, torch.float16)


def test_wgrad_row_slices_and_mode_errors(monkeypatch):
    assert fused_mod.CHUNK_SLICES == 3
    assert fused_mod._chunks(2048) == [(0, 768), (768, 1536), (1536, 2048)]
    assert fused_mod._chunks(2880) == [(0, 1024), (1024, 2048), (2048, 2880)]
    assert fused_mod._chunks(7168) == [(0, 2560), (2560, 5120), (5120, 7168)]
    assert fused_mod._chunks(1280) == [(0, 512), (512, 1024), (1024, 1280)]
    assert fused_mod._chunks(100) == [(0, 100)]
    monkeypatch.setattr(fused_mod, "CHUNK_SLICES", 4)
    assert fused_mod._chunks(2048) == [(0, 512), (512, 1024), (1024, 1536), (1536, 2048)]
    assert fused_mod._chunks(2880) == [(0, 768), (768, 1536), (1536, 2304), (2304, 2880)]
    monkeypatch.setattr(fused_mod, "backward_kind", "gemms")
    monkeypatch.setattr(fused_mod, "wgrad_rows", "slices")
    x, chosen, weights, wgu, wd = _operands(8, 16, 16, 4, 1, torch.float32)
    with pytest.raises(ValueError, match="wgrad_rows='slices': expected one of chunks, gather, index, copy"):
        _fused(x, chosen, weights, wgu, wd).sum().backward()


@pytest.mark.skipif(DEV.type == "cuda", reason="CPU tensors through Triton's interpreter: CPU-only hosts")
def test_wgrad_rows_benchmark_runs_on_the_cpu(tmp_path):
    """benchmarks/wgrad_rows.py's systems on a tiny layer through Triton's interpreter (host clock)."""
    import json

    bench = benchmark_script("wgrad_rows")
    out = tmp_path / "wgrad.json"
    assert bench.main(["--device", "cpu", "--tiny", "--tokens", "24", "--reps", "1", "--heuristic-only",
                       "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["system"].split()[0] for r in rows] == ["copy+auto", "auto", "vendor", "index"]
    assert all(r["status"] == "ok" or r["system"] == "vendor" for r in rows), rows
    assert all(r["eager_ms"] > 0 for r in rows if r["status"] == "ok")
