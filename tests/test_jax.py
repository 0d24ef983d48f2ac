"""ragdot.jax against jax.lax.ragged_dot_general and the float64 oracle: jit, grad/vjp in all three modes,
every dimension-number case ragdot supports, group-size edge cases, dtypes and errors."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
pytest.importorskip("jax.experimental.buffer_callback")

import jax.numpy as jnp  # noqa: E402

import ragdot  # noqa: E402
import ragdot.jax as rj  # noqa: E402
from helpers import JAX_SHAPE_ERRORS, TOL, nerr  # noqa: E402
from oracle import ragged_dot_general_oracle  # noqa: E402
from ragdot import RaggedDotDimensionNumbers as DN  # noqa: E402

# name: (lhs shape, rhs shape, ((contracting), (batch)), lhs ragged, rhs group, group sizes)
CASES = {
    "fwd_wi": ((20, 8), (3, 8, 6), (((1,), (1,)), ((), ())), (0,), (0,), [5, 0, 9]),
    "dgrad": ((20, 6), (3, 8, 6), (((1,), (2,)), ((), ())), (0,), (0,), [5, 0, 9]),
    "wgrad": ((20, 8), (20, 6), (((0,), (0,)), ((), ())), (0,), (), [5, 0, 9]),
    "group_dim_not_leading": ((20, 8), (8, 3, 6), (((1,), (0,)), ((), ())), (0,), (1,), [7, 7, 6]),
    "ragged_dim_not_leading": ((8, 20), (3, 8, 6), (((0,), (1,)), ((), ())), (1,), (0,), [4, 12, 0]),
    "batched_ragged_m": ((2, 20, 8), (2, 3, 8, 6), (((2,), (2,)), ((0,), (0,))), (1,), (1,), [6, 3, 8]),
    "batched_ragged_k": ((2, 20, 8), (2, 20, 6), (((1,), (1,)), ((0,), (0,))), (1,), (), [9, 0, 11]),
    "batch_mode": ((3, 5, 8), (3, 8, 6), (((2,), (1,)), ((0,), (0,))), (0,), (), [1, 1, 1]),
    "two_contracting_dims": ((20, 2, 4), (20, 2, 6), (((0, 1), (0, 1)), ((), ())), (0,), (), [5, 10, 3]),
    "extra_lhs_free_dim": ((3, 20, 8), (2, 8, 6), (((2,), (1,)), ((), ())), (1,), (0,), [12, 5]),
    "extra_free_after_ragged": ((20, 3, 8), (2, 8, 6), (((2,), (1,)), ((), ())), (0,), (0,), [12, 8]),
    "more_groups_than_rows": ((6, 8), (9, 8, 4), (((1,), (1,)), ((), ())), (0,), (0,), [0, 2, 0, 0, 3, 0, 0, 1, 0]),
}
LAX_GRAD = {"fwd_wi", "dgrad", "group_dim_not_leading", "ragged_dim_not_leading", "batched_ragged_m",
            "extra_lhs_free_dim", "extra_free_after_ragged", "more_groups_than_rows"}  # jax's own grads


@pytest.fixture(autouse=True, params=["ffi", "callback"])
def bridge(request, monkeypatch):
    """Every test on both bridges: the FFI custom call (default) and buffer_callback."""
    from ragdot.jax import _ffi

    monkeypatch.setenv("RAGDOT_JAX_BRIDGE", request.param)
    if request.param == "ffi" and not _ffi.available():
        pytest.skip(f"the FFI handler library is not available here: {_ffi.reason()}")
    return request.param


def _dns(case):
    _, _, ddn, lrag, rgrp, _ = CASES[case]
    return (jax.lax.RaggedDotDimensionNumbers(ddn, list(lrag), list(rgrp)), DN(ddn, lrag, rgrp))


def _inputs(case, dtype=jnp.float32, seed=0):
    lshape, rshape, *_, sizes = CASES[case]
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal(lshape), dtype)
    rhs = jnp.asarray(rng.standard_normal(rshape), dtype)
    return lhs, rhs, jnp.asarray(sizes, jnp.int32)


def _t(x) -> torch.Tensor:
    return torch.from_numpy(np.asarray(jnp.asarray(x, jnp.float32), dtype=np.float64))


def _oracle_grads(lhs, rhs, sizes, dn, dout):
    a, b = _t(lhs).requires_grad_(), _t(rhs).requires_grad_()
    out = ragged_dot_general_oracle(a, b, torch.tensor(np.asarray(sizes)), dn)
    da, db = torch.autograd.grad(out, (a, b), _t(dout))
    return da, db


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_lax_and_the_oracle_under_jit(case):
    lhs, rhs, sizes = _inputs(case)
    jdn, dn = _dns(case)
    out = jax.jit(lambda x, w, s: rj.ragged_dot_general(x, w, s, jdn))(lhs, rhs, sizes)
    want = jax.lax.ragged_dot_general(lhs, rhs, sizes, jdn, precision=jax.lax.Precision.HIGHEST)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert nerr(_t(out), _t(want)) < TOL[torch.float32]
    ref = ragged_dot_general_oracle(_t(lhs), _t(rhs), torch.tensor(np.asarray(sizes)), dn)
    assert nerr(_t(out), ref) < TOL[torch.float32]
    assert torch.equal(_t(out) == 0, ref == 0) or case == "batch_mode"  # exact zeros exactly where the oracle's


@pytest.mark.parametrize("case", list(CASES))
def test_grad_matches_the_oracle_in_every_mode(case):
    lhs, rhs, sizes = _inputs(case)
    jdn, dn = _dns(case)
    dout = jnp.asarray(np.random.default_rng(1).standard_normal(jax.eval_shape(
        lambda: jax.lax.ragged_dot_general(lhs, rhs, sizes, jdn)).shape), jnp.float32)

    def loss(fn):
        return lambda x, w: jnp.vdot(fn(x, w, sizes, jdn), dout)

    dl, dr = jax.jit(jax.grad(loss(rj.ragged_dot_general), (0, 1)))(lhs, rhs)
    assert dl.shape == lhs.shape and dr.shape == rhs.shape
    da, db = _oracle_grads(lhs, rhs, sizes, dn, dout)
    assert nerr(_t(dl), da) < TOL[torch.float32] and nerr(_t(dr), db) < TOL[torch.float32]
    if case in LAX_GRAD:
        hi = lambda x, w, s, d: jax.lax.ragged_dot_general(x, w, s, d, precision=jax.lax.Precision.HIGHEST)
        ll, lr = jax.grad(loss(hi), (0, 1))(lhs, rhs)
        assert nerr(_t(dl), _t(ll)) < TOL[torch.float32] and nerr(_t(dr), _t(lr)) < TOL[torch.float32]


@pytest.mark.parametrize("backend", ragdot.backends())
@pytest.mark.parametrize("case", ["fwd_wi", "wgrad", "batch_mode"])
def test_every_backend_through_the_bridge(backend, case):
    dtype = jnp.float16 if backend == "triton" else jnp.float32  # the interpreter's bf16 dots are wrong
    lhs, rhs, sizes = _inputs(case, dtype)
    jdn, dn = _dns(case)
    f = lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn, preferred_element_type=jnp.float32, backend=backend)
    out, vjp = jax.vjp(jax.jit(f), lhs, rhs)
    ref = ragged_dot_general_oracle(_t(lhs), _t(rhs), torch.tensor(np.asarray(sizes)), dn)
    assert out.dtype == jnp.float32 and nerr(_t(out), ref) < TOL[torch.float16]
    dout = jnp.ones_like(out)
    dl, dr = vjp(dout)
    assert dl.dtype == dtype and dr.dtype == dtype
    da, db = _oracle_grads(lhs, rhs, sizes, dn, dout)
    assert nerr(_t(dl), da) < TOL[torch.float16] and nerr(_t(dr), db) < TOL[torch.float16]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("preferred", [None, jnp.float32, jnp.bfloat16])
def test_dtypes_follow_lax(dtype, preferred):
    lhs, rhs, sizes = _inputs("fwd_wi", dtype)
    out = jax.jit(lambda x, w: rj.ragged_dot(x, w, sizes, preferred_element_type=preferred))(lhs, rhs)
    want = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=preferred)
    assert out.dtype == want.dtype and out.shape == want.shape
    ref = ragged_dot_general_oracle(_t(lhs), _t(rhs), torch.tensor(np.asarray(sizes)), _dns("fwd_wi")[1])
    out_dtype = preferred or dtype
    tol = TOL[torch.bfloat16 if jnp.bfloat16 in (dtype, out_dtype) else torch.float16 if dtype == jnp.float16
              else torch.float32]
    assert nerr(_t(out), ref) < tol
    dl, dr = jax.grad(lambda x, w: rj.ragged_dot(x, w, sizes, preferred_element_type=preferred)
                      .astype(jnp.float32).sum(), (0, 1))(lhs, rhs)
    assert dl.dtype == dtype and dr.dtype == dtype


@pytest.mark.parametrize("case", ["fwd_wi", "wgrad", "batched_ragged_k", "ragged_dim_not_leading"])
def test_nan_in_the_tail_never_leaks(case):
    lhs, rhs, sizes = _inputs(case)
    jdn, dn = _dns(case)
    (r,) = CASES[case][3]
    total = int(np.asarray(sizes).sum())
    tail = (slice(None),) * r + (slice(total, None),)
    clean_l = lhs.at[tail].set(0.0)
    poisoned_l = lhs.at[tail].set(jnp.nan)
    poisoned_r, clean_r = rhs, rhs
    if not CASES[case][4]:  # contracting: rhs shares the ragged rows, poison them too
        rtail = (slice(None),) * dn.dot_dimension_numbers[0][1][0] + (slice(total, None),)
        poisoned_r, clean_r = rhs.at[rtail].set(jnp.nan), rhs.at[rtail].set(0.0)
    f = jax.jit(lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn))
    out = f(poisoned_l, poisoned_r)
    assert not jnp.isnan(out).any()
    assert jnp.array_equal(out, f(clean_l, clean_r))
    dl, dr = jax.grad(lambda x, w: f(x, w).sum(), (0, 1))(poisoned_l, poisoned_r)
    assert not jnp.isnan(dr).any()
    assert not jnp.isnan(dl[(slice(None),) * r + (slice(0, total),)]).any()
    da, db = _oracle_grads(clean_l, clean_r, sizes, dn, jnp.ones_like(out))
    assert nerr(_t(dr), db) < TOL[torch.float32]


def test_sum_below_m_leaves_an_exact_zero_tail_and_zero_size_groups_are_fine():
    lhs, rhs, _ = _inputs("fwd_wi")
    sizes = jnp.asarray([0, 4, 0], jnp.int32)
    out = jax.jit(rj.ragged_dot)(lhs, rhs, sizes)
    assert jnp.all(out[4:] == 0)
    assert nerr(_t(out[:4]), _t(lhs[:4] @ rhs[1])) < TOL[torch.float32]
    dl, dr = jax.grad(lambda x, w: rj.ragged_dot(x, w, sizes).sum(), (0, 1))(lhs, rhs)
    assert jnp.all(dl[4:] == 0) and jnp.all(dr[0] == 0) and jnp.all(dr[2] == 0)


@pytest.mark.parametrize("lshape,rshape,sizes", [((0, 8), (3, 8, 6), [0, 0, 0]), ((20, 8), (0, 8, 6), []),
                                                 ((20, 0), (3, 0, 6), [5, 5, 5])])
def test_zero_size_operands(lshape, rshape, sizes):
    lhs, rhs = jnp.ones(lshape, jnp.float32), jnp.ones(rshape, jnp.float32)
    gs = jnp.asarray(sizes, jnp.int32)
    out = jax.jit(rj.ragged_dot)(lhs, rhs, gs)
    assert out.shape == (lshape[0], rshape[2]) and jnp.all(out == 0)
    dl, dr = jax.grad(lambda x, w: rj.ragged_dot(x, w, gs).sum(), (0, 1))(lhs, rhs)
    assert dl.shape == lhs.shape and dr.shape == rhs.shape and jnp.all(dl == 0)


def test_traced_group_sizes_compile_once_and_the_bridge_is_one_custom_call_each_way(bridge):
    lhs, rhs, _ = _inputs("fwd_wi")
    traces = []

    def f(x, w, s):
        traces.append(1)
        return rj.ragged_dot(x, w, s)

    jf = jax.jit(f)
    for sizes in ([5, 0, 9], [1, 1, 1], [20, 0, 0]):
        s = jnp.asarray(sizes, jnp.int32)
        assert nerr(_t(jf(lhs, rhs, s)), _t(jax.lax.ragged_dot(lhs, rhs, s))) < TOL[torch.float32]
    assert len(traces) == 1
    sizes = jnp.asarray([5, 0, 9], jnp.int32)

    def lowered(loss):
        return jax.jit(jax.grad(lambda x, w, s: loss(rj.ragged_dot(x, w, s)), (0, 1))).lower(lhs, rhs, sizes).as_text()

    text = lowered(lambda out: (out * out).sum())
    assert text.count("custom_call @") == 2 and "ragged_dot" not in text  # forward and backward, no jax.lax
    assert ("custom_call @ragdot_launch" in text) == (bridge == "ffi")
    assert lowered(lambda out: out.sum()).count("custom_call @") == 1  # a gradient that needs no forward skips it


def test_vmap_runs_one_call_per_slice():
    lhs, rhs, sizes = _inputs("fwd_wi")
    stacked = jnp.stack([lhs, 2 * lhs])
    out = jax.vmap(lambda x: rj.ragged_dot(x, rhs, sizes))(stacked)
    assert nerr(_t(out[1]), _t(2 * jax.lax.ragged_dot(lhs, rhs, sizes))) < TOL[torch.float32]


def test_jax_s_full_signature_is_accepted_with_its_defaults():
    """Every argument of jax.lax.ragged_dot / ragged_dot_general (0.11: ..., group_offset, out_sharding), passed
    by keyword with its default, gives jax's result: ragdot.jax drops in for calls written against jax's API."""
    lhs, rhs, sizes = _inputs("fwd_wi")
    kw = dict(precision=None, preferred_element_type=None, group_offset=None, out_sharding=None)
    want = jax.lax.ragged_dot(lhs, rhs, sizes)
    assert nerr(_t(rj.ragged_dot(lhs, rhs, sizes, **kw)), _t(want)) < TOL[torch.float32]
    dims = jax.lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), [0], [0])
    general = rj.ragged_dot_general(lhs, rhs, sizes, ragged_dot_dimension_numbers=dims, **kw)
    assert nerr(_t(general), _t(want)) < TOL[torch.float32]


@pytest.mark.parametrize("lhs_shape,rhs_shape,sizes_shape,dims,phrase", JAX_SHAPE_ERRORS)
def test_shape_errors_are_jax_s_type_errors(lhs_shape, rhs_shape, sizes_shape, dims, phrase):
    dn = jax.lax.RaggedDotDimensionNumbers(*dims)
    for fn in (rj.ragged_dot_general, jax.lax.ragged_dot_general):  # ragdot.jax raises what jax raises
        with pytest.raises(TypeError, match=phrase):
            fn(jnp.ones(lhs_shape), jnp.ones(rhs_shape), jnp.ones(sizes_shape, jnp.int32), dn)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_mode_matches_the_oracle_in_every_mode(case):
    """jax.jvp: the tangent P(lhs', rhs) + P(lhs, rhs') against float64, under jit, with the primal unchanged."""
    lhs, rhs, sizes = _inputs(case)
    tl, tr, _ = _inputs(case, seed=2)
    jdn, dn = _dns(case)
    out, tangent = jax.jit(lambda x, w, dx, dw: jax.jvp(
        lambda a, b: rj.ragged_dot_general(a, b, sizes, jdn), (x, w), (dx, dw)))(lhs, rhs, tl, tr)
    s = torch.tensor(np.asarray(sizes))
    want = ragged_dot_general_oracle(_t(tl), _t(rhs), s, dn) + ragged_dot_general_oracle(_t(lhs), _t(tr), s, dn)
    assert tangent.shape == out.shape and tangent.dtype == out.dtype
    assert nerr(_t(tangent), want) < TOL[torch.float32]
    assert nerr(_t(out), ragged_dot_general_oracle(_t(lhs), _t(rhs), s, dn)) < TOL[torch.float32]


@pytest.mark.parametrize("case", ["fwd_wi", "wgrad", "batched_ragged_m", "batch_mode"])
def test_jacfwd_equals_jacrev_and_jax_s_gradient_checks_pass(case):
    """Forward and reverse mode agree (each is the other's transpose), and jax.test_util.check_grads passes in
    both modes, to second order in forward mode (a tangent of a tangent)."""
    from jax.test_util import check_grads

    lhs, rhs, sizes = _inputs(case)
    jdn, _ = _dns(case)
    f = lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn)  # noqa: E731
    fwd, rev = jax.jacfwd(f, (0, 1))(lhs, rhs), jax.jacrev(f, (0, 1))(lhs, rhs)
    for a, b in zip(fwd, rev):
        assert nerr(_t(a), _t(b)) < TOL[torch.float32]
    check_grads(f, (lhs, rhs), order=1, modes=("fwd", "rev"), atol=2e-2, rtol=2e-2)
    check_grads(f, (lhs, rhs), order=2, modes=("fwd",), atol=2e-2, rtol=2e-2)


def test_second_derivatives_through_forward_over_reverse_match_jax():
    """jvp of grad (jax.hessian's forward over reverse) and forward over forward, against jax.lax."""
    lhs, rhs, sizes = _inputs("fwd_wi")
    tl, tr, _ = _inputs("fwd_wi", seed=3)
    results = []
    for fn in (rj.ragged_dot, functools.partial(jax.lax.ragged_dot, precision=jax.lax.Precision.HIGHEST)):
        loss = lambda x, w, fn=fn: (fn(x, w, sizes) ** 2).sum()  # noqa: E731
        grad_tangent = jax.jvp(jax.grad(loss, (0, 1)), (lhs, rhs), (tl, tr))[1]
        inner = lambda x, w, fn=fn: jax.jvp(lambda a, b: fn(a, b, sizes), (x, w), (tl, tr))[1]  # noqa: E731
        results.append((*grad_tangent, jax.jvp(inner, (lhs, rhs), (tl, tr))[1]))
    for a, b in zip(*results):
        assert nerr(_t(a), _t(b)) < TOL[torch.float32]
    short = jnp.asarray([2, 0, 1], jnp.int32)  # rows 3.. in no group
    hess = jax.hessian(lambda x: (rj.ragged_dot(x, rhs, short) ** 2).sum())(lhs[:6])
    want = jax.hessian(lambda x: (x[:3, :, None] * rhs[jnp.array([0, 0, 2])]).sum(1).__pow__(2).sum())(lhs[:6])
    assert hess.shape == (6, 8, 6, 8) and float(jnp.abs(hess[3:]).max()) == 0.0
    assert nerr(_t(hess), _t(want)) < TOL[torch.float32]


@pytest.mark.parametrize("case", ["fwd_wi", "dgrad", "wgrad", "batched_ragged_k", "batch_mode"])
def test_reverse_over_reverse_matches_the_oracle_s_double_backward(case):
    """jax.grad of a function of jax.grad (both operands), in each mode, against torch's double backward through
    the float64 oracle."""
    lhs, rhs, sizes = _inputs(case)
    jdn, dn = _dns(case)
    c_lhs, c_rhs, _ = _inputs(case, seed=5)

    def outer(fn, grad, dot):
        def inner(x, w):
            return (fn(x, w) ** 3).sum()

        def loss(x, w):
            gx, gw = grad(inner, x, w)
            return dot(gx, c_lhs) + dot(gw, c_rhs)
        return loss

    jfn = functools.partial(rj.ragged_dot_general, group_sizes=sizes, ragged_dot_dimension_numbers=jdn)
    jgrad = lambda f, x, w: jax.grad(f, (0, 1))(x, w)  # noqa: E731
    got = jax.jit(jax.grad(outer(jfn, jgrad, lambda a, c: jnp.vdot(a, c)), (0, 1)))(lhs, rhs)

    s = torch.tensor(np.asarray(sizes))
    tfn = lambda x, w: ragged_dot_general_oracle(x, w, s, dn)  # noqa: E731
    tgrad = lambda f, x, w: torch.autograd.grad(f(x, w), (x, w), create_graph=True)  # noqa: E731
    x, w = _t(lhs).requires_grad_(), _t(rhs).requires_grad_()
    want = torch.autograd.grad(outer(tfn, tgrad, lambda a, c: (a * _t(c)).sum())(x, w), (x, w))
    for a, b in zip(got, want):
        assert a.shape == tuple(b.shape) and nerr(_t(a), b) < 1e-4


def test_vmap_of_forward_and_reverse_mode_runs_each_slice():
    """vmap over jvp, grad of vmap and vmap of grad give each slice's own result (jax.lax 0.10 refuses the
    non-leading batch axes jacfwd makes; ragdot runs one call per slice)."""
    lhs, rhs, sizes = _inputs("fwd_wi")
    xs = jnp.stack([lhs, 2 * lhs, -lhs])
    f = lambda x: rj.ragged_dot(x, rhs, sizes)  # noqa: E731
    tangents = jax.vmap(lambda x: jax.jvp(f, (x,), (x,))[1])(xs)
    grads = jax.vmap(jax.grad(lambda x: (f(x) ** 2).sum()))(xs)
    of_vmap = jax.grad(lambda x: (jax.vmap(f)(jnp.stack([x, 2 * x])) ** 2).sum())(lhs)
    for i in range(3):
        assert nerr(_t(tangents[i]), _t(f(xs[i]))) < TOL[torch.float32]
        assert nerr(_t(grads[i]), _t(jax.grad(lambda x: (f(x) ** 2).sum())(xs[i]))) < TOL[torch.float32]
    assert nerr(_t(of_vmap), _t(5 * jax.grad(lambda x: (f(x) ** 2).sum())(lhs))) < TOL[torch.float32]
    _, pullback = jax.vjp(f, lhs)  # a batch of cotangents through one pullback
    douts = jnp.stack([f(lhs), -f(lhs)])
    assert nerr(_t(jax.vmap(pullback)(douts)[0][1]), _t(-pullback(f(lhs))[0])) < TOL[torch.float32]
    empty = xs[:0]  # an empty batch: empty results, nothing run
    assert jax.vmap(lambda x: jax.jvp(f, (x,), (x,))[1])(empty).shape == (0, 20, 6)
    assert jax.vmap(jax.grad(lambda x: (f(x) ** 2).sum()))(empty).shape == (0, 20, 8)


@pytest.mark.parametrize("policy", [None, "nothing_saveable", "dots_saveable"])
def test_layers_in_a_scan_with_rematerialization_match_jax(policy):
    """The way MaxText-like models call it: layers in `jax.lax.scan`, each under `jax.checkpoint`; gradients and
    a forward-mode tangent against jax.lax."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((20, 8)), jnp.float32)
    ws = jnp.asarray(rng.standard_normal((3, 3, 8, 8)) * 0.3, jnp.float32)
    sizes = jnp.asarray([5, 0, 9], jnp.int32)
    remat = functools.partial(jax.checkpoint, policy=policy and getattr(jax.checkpoint_policies, policy))

    def loss(fn):
        def body(h, w):
            return jnp.tanh(fn(h, w, sizes)), None
        return lambda x, ws: (jax.lax.scan(remat(body), x, ws)[0] ** 2).sum()

    lax_hi = functools.partial(jax.lax.ragged_dot, precision=jax.lax.Precision.HIGHEST)
    got, want = (jax.jit(jax.grad(loss(fn), (0, 1)))(x, ws) for fn in (rj.ragged_dot, lax_hi))
    for a, b in zip(got, want):
        assert nerr(_t(a), _t(b)) < TOL[torch.float32]
    tangents = [jax.jvp(lambda w, fn=fn: loss(fn)(x, w), (ws,), (ws,))[1] for fn in (rj.ragged_dot, lax_hi)]
    assert abs(float(tangents[0] - tangents[1])) <= 1e-4 * abs(float(tangents[1]))


_SHARD_MAP_CHILD = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
import ragdot.jax as rj

def dense(x, w, s):  # the ragged product written densely: rows past sum(s) in no group
    gid = jnp.searchsorted(jnp.cumsum(s), jnp.arange(x.shape[0]), side="right")
    onehot = (gid[:, None] == jnp.arange(w.shape[0])[None]).astype(x.dtype)
    return jnp.einsum("mk,gkn,mg->mn", x, w, onehot, precision=jax.lax.Precision.HIGHEST)

rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((2, 20, 8)), jnp.float32)
w = jnp.asarray(rng.standard_normal((2, 3, 8, 6)), jnp.float32)
s = jnp.asarray([[5, 0, 9], [2, 10, 8]], jnp.int32)
mesh = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
errors = {}
for name, ww, w_spec in (("replicated", w[0], P()), ("per_device", w, P("d"))):
    results = []
    for f in (rj.ragged_dot, dense):
        local = lambda a, b, c, f=f: f(a[0], b[0] if b.ndim == 4 else b, c[0])[None]
        sm = jax.shard_map(local, mesh=mesh, in_specs=(P("d"), w_spec, P("d")), out_specs=P("d"))
        grads = jax.jit(jax.grad(lambda a, b, sm=sm: jnp.sin(sm(a, b, s)).sum(), (0, 1)))(x, ww)
        tangent = jax.jvp(jax.grad(lambda a, sm=sm: (sm(a, ww, s) ** 2).sum()), (x,), (x,))[1]
        results.append((jax.jit(sm)(x, ww, s), *grads, tangent))
    errors[name] = [float(jnp.abs(a - b).max() / jnp.abs(b).max()) for a, b in zip(*results)]
print(json.dumps(errors))
"""


def test_inside_shard_map_forward_gradients_and_tangents_are_each_device_s(bridge):
    """Inside `jax.shard_map` over two host devices (a child process: the device count is fixed at start), each
    device's product, the gradient of weights replicated over the devices summed over them, weights held per
    device each getting its own, and forward over reverse: against the product written densely."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _SHARD_MAP_CHILD], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("replicated", "per_device"):  # forward, d lhs, d rhs, jvp of grad
        assert len(errors[name]) == 4 and max(errors[name]) < 1e-5, errors


def test_out_sharding_places_the_result_as_jax_does():
    """out_sharding: a PartitionSpec under a mesh with explicit axes or a NamedSharding gives the result that
    sharding, eager and jitted, and the gradient its operand's; jax's own errors outside a mesh."""
    lhs, rhs, sizes = _inputs("fwd_wi")
    ref = _t(jax.lax.ragged_dot(lhs, rhs, sizes))
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(mesh):
        for spec in (jax.P("x", None), jax.NamedSharding(mesh, jax.P(None, "x"))):
            f = functools.partial(rj.ragged_dot, group_sizes=sizes, out_sharding=spec)
            want = spec if isinstance(spec, jax.P) else spec.spec
            for g in (f, jax.jit(f)):
                out = g(lhs, rhs)
                assert jax.typeof(out).sharding.spec == want and out.sharding.spec == want
                assert nerr(_t(out), ref) < TOL[torch.float32]
            dl, dr = jax.grad(lambda x, w, f=f: (f(x, w) ** 2).sum(), (0, 1))(lhs, rhs)
            assert dl.shape == lhs.shape and dr.shape == rhs.shape
    with pytest.raises(ValueError, match="mesh"):
        rj.ragged_dot(lhs, rhs, sizes, out_sharding=jax.P("x", None))


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda x, w, s: rj.ragged_dot(x.astype(jnp.int32), w.astype(jnp.int32), s), TypeError, "lhs must be float"),
    (lambda x, w, s: rj.ragged_dot(x, w, s.astype(jnp.float32)), TypeError, "group_sizes must be an integer"),
    (lambda x, w, s: rj.ragged_dot(x, w, s[None]), ValueError, "group_sizes must be 1-D"),
    (lambda x, w, s: rj.ragged_dot(x, w, s[:2]), ValueError, "rhs group dimension 0 has size 3"),
    (lambda x, w, s: rj.ragged_dot(x, w[:, :4], s), ValueError, "contracting dimensions differ"),
    (lambda x, w, s: rj.ragged_dot(x[None], w, s), ValueError, "ragged_dot expects lhs of rank 2"),
    (lambda x, w, s: rj.ragged_dot(x, w, s, group_offset=jnp.zeros(1, jnp.int32)), ValueError, "group_offset"),
    (lambda x, w, s: rj.ragged_dot(x, w, s, group_offset=jnp.zeros(1, jnp.int32)), NotImplementedError,
     "group_offset"),
    (lambda x, w, s: rj.ragged_dot(x, w, s, out_sharding=object()), TypeError, "out_sharding must be"),
    (lambda x, w, s: rj.ragged_dot(x, w, s, preferred_element_type=jnp.int32), TypeError, "preferred_element_type"),
    (lambda x, w, s: rj.ragged_dot(x, w, s, backend="nope"), ValueError, "backend='nope' is unknown"),
    (lambda x, w, s: rj.ragged_dot(np.ones((20, 8)).tolist(), w, s), TypeError, "lhs must be a jax array"),
    (lambda x, w, s: rj.ragged_dot_general(x, w, s, "dims"), TypeError, "ragged_dot_dimension_numbers"),
    (lambda x, w, s: rj.ragged_dot_general(x, w, s, jax.lax.RaggedDotDimensionNumbers(
        (((1,), (1,)), ((), ())), [0], [])), ValueError, "rhs_group_dimensions must name"),
])
def test_unsupported_calls_raise_clear_errors(call, exc, pattern):
    lhs, rhs, sizes = _inputs("fwd_wi")
    with pytest.raises(exc, match=pattern):
        jax.jit(call)(lhs, rhs, sizes)


def _jax_gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["fwd_wi", "dgrad", "wgrad", "batched_ragged_m", "batch_mode"])
def test_on_the_gpu_through_triton_on_xla_s_stream(case):
    gpu = _jax_gpu()
    if gpu is None:
        pytest.skip("jax has no GPU backend here")
    lhs, rhs, sizes = (jax.device_put(t, gpu) for t in _inputs(case, jnp.bfloat16))
    jdn, dn = _dns(case)
    f = lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn, preferred_element_type=jnp.float32, backend="triton")
    out, vjp = jax.vjp(jax.jit(f), lhs, rhs)
    ref = ragged_dot_general_oracle(_t(lhs), _t(rhs), torch.tensor(np.asarray(sizes)), dn)
    assert nerr(_t(out), ref) < TOL[torch.bfloat16]
    dl, dr = vjp(jnp.ones_like(out))
    da, db = _oracle_grads(lhs, rhs, sizes, dn, jnp.ones_like(out))
    assert nerr(_t(dl), da) < TOL[torch.bfloat16] and nerr(_t(dr), db) < TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["fwd_wi", "wgrad"])
def test_on_the_gpu_a_loop_whose_turns_change_the_operands(case):
    """A loop whose turns change the operands (buffers XLA may keep at one address from turn to turn), then
    the same program on other arrays and on the first ones again: each result is the oracle's."""
    gpu = _jax_gpu()
    if gpu is None:
        pytest.skip("jax has no GPU backend here")
    lhs, rhs, sizes = (jax.device_put(t, gpu) for t in _inputs(case, jnp.bfloat16))
    jdn, dn = _dns(case)
    call = lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn, preferred_element_type=jnp.float32,
                                              backend="triton")

    def turns(x, w):
        def turn(i, carry):
            x, total = carry
            x = (x * 0.5 + 0.25).astype(x.dtype)
            return x, total + call(x, w) * (i + 1)
        return jax.lax.fori_loop(0, 4, turn, (x, jnp.zeros(jax.eval_shape(call, x, w).shape, jnp.float32)))[1]

    def oracle(x, w):
        x, w, total = _t(x), _t(w), 0
        for i in range(4):
            x = (x * 0.5 + 0.25).to(torch.bfloat16).double()
            total = total + ragged_dot_general_oracle(x, w, torch.tensor(np.asarray(sizes)), dn) * (i + 1)
        return total

    program = jax.jit(turns)
    other = (lhs * 2).astype(lhs.dtype), (rhs - 1).astype(rhs.dtype)
    for x, w in ((lhs, rhs), other, (lhs, rhs)):
        assert nerr(_t(program(x, w)), oracle(x, w)) < TOL[torch.bfloat16]
        assert nerr(_t(jax.jit(call)(x, w)), ragged_dot_general_oracle(
            _t(x), _t(w), torch.tensor(np.asarray(sizes)), dn)) < TOL[torch.bfloat16]


@pytest.mark.skipif(not hasattr(jax, "enable_x64"), reason="this jax has no jax.enable_x64 context")
@pytest.mark.parametrize("case", ["fwd_wi", "wgrad", "batch_mode"])
def test_float64_with_x64_enabled(case):
    with jax.enable_x64(True):
        lhs, rhs, sizes = _inputs(case, jnp.float64)
        jdn, dn = _dns(case)
        out = jax.jit(lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn))(lhs, rhs)
        assert out.dtype == jnp.float64
        ref = ragged_dot_general_oracle(torch.tensor(np.asarray(lhs)), torch.tensor(np.asarray(rhs)),
                                        torch.tensor(np.asarray(sizes)), dn)
        assert nerr(torch.tensor(np.asarray(out)), ref) < TOL[torch.float64]
        dl, dr = jax.grad(lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn).sum(), (0, 1))(lhs, rhs)
        assert dl.dtype == jnp.float64 and dr.dtype == jnp.float64


def _run_bridge(prepared, monkeypatch, fn, lhs, rhs, dout, times):
    """`fn` traced afresh with the bridge prepared or not (not prepared: the general path, a buffer callback),
    called `times` times."""
    from ragdot.jax import _bridge

    monkeypatch.setattr(_bridge, "PREPARED", prepared)
    f = jax.jit(lambda x, w: fn(x, w))
    results = []
    for _ in range(times):  # the first call binds, the later ones take what was bound
        out, vjp = jax.vjp(f, lhs, rhs)
        results.append((np.asarray(out), *(np.asarray(g) for g in vjp(dout))))
    return results


@pytest.mark.parametrize("backend", [None, "triton"])
@pytest.mark.parametrize("case", list(CASES))
def test_prepared_bridge_gives_the_general_path_s_bits(case, backend, monkeypatch):
    dtype = jnp.float16 if backend == "triton" else jnp.float32
    lhs, rhs, sizes = _inputs(case, dtype)
    jdn, _ = _dns(case)
    f = lambda x, w: rj.ragged_dot_general(x, w, sizes, jdn, backend=backend)
    dout = jnp.asarray(np.random.default_rng(2).standard_normal(jax.eval_shape(f, lhs, rhs).shape), dtype)
    (want,) = _run_bridge(False, monkeypatch, f, lhs, rhs, dout, 1)
    for got in _run_bridge(True, monkeypatch, f, lhs, rhs, dout, 3):
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(got, want))


def test_the_bridge_binds_its_backward_for_results_copied_into_xla_s_buffers(monkeypatch):
    """The bridge's products are chosen copy-aware (`into`) and bound apart from the PyTorch autograd's."""
    from ragdot import grad_plan

    seen = []
    original = grad_plan.build

    def build(*args, **kwargs):
        seen.append(args[6])
        return original(*args, **kwargs)

    monkeypatch.setattr(grad_plan, "build", build)
    rng = np.random.default_rng(7)  # a signature of its own: no other test has bound its backward before
    lhs = jnp.asarray(rng.standard_normal((29, 13)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((3, 13, 11)), jnp.float32)
    sizes = jnp.asarray([9, 0, 17], jnp.int32)
    f = jax.jit(lambda x, w: rj.ragged_dot(x, w, sizes))
    for _ in range(2):
        out, vjp = jax.vjp(f, lhs, rhs)
        dl, dr = vjp(jnp.ones_like(out))
    assert seen == [True]  # bound once, by the first backward, with the copy-aware choice
    da, db = _oracle_grads(lhs, rhs, sizes, _dns("fwd_wi")[1], jnp.ones_like(out))
    assert nerr(_t(dl), da) < TOL[torch.float32] and nerr(_t(dr), db) < TOL[torch.float32]


def test_prepared_triton_backward_writes_xla_s_buffers(monkeypatch):
    from ragdot.jax import _bridge

    lhs, rhs, sizes = _inputs("fwd_wi", jnp.float16)
    taken = []
    original = _bridge._in_place
    monkeypatch.setattr(_bridge, "_in_place", lambda bound, outs: taken.append(original(bound, outs)) or taken[-1])
    f = jax.jit(lambda x, w: rj.ragged_dot(x, w, sizes, backend="triton"))
    for _ in range(2):
        out, vjp = jax.vjp(f, lhs, rhs)
        dl, dr = vjp(jnp.ones_like(out))
    assert taken and all(taken)  # a backward after the one that bound the products writes in place
    da, db = _oracle_grads(lhs, rhs, sizes, _dns("fwd_wi")[1], jnp.ones_like(out))
    assert nerr(_t(dl), da) < TOL[torch.float16] and nerr(_t(dr), db) < TOL[torch.float16]


def test_the_cuda_stream_switch_and_views_without_a_gpu(monkeypatch):
    """The CUDA branches of the prepared bridge, against stand-ins for torch's stream calls and a buffer."""
    from ragdot.jax import _bridge

    state = {"device": 1, "streams": {0: (7, 0, 1), 1: (8, 1, 1)}}

    class FakeStream:
        def __init__(self, ptr, device):
            self.stream_id, self.device_index, self.device_type = 99, device.index, 1

    def set_stream(stream_id, device_index, device_type):
        state["device"] = device_index
        state["streams"][device_index] = (stream_id, device_index, device_type)

    monkeypatch.setattr(torch.cuda, "ExternalStream", FakeStream)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: state["device"], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_setDevice", lambda d: state.update(device=d), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentStream", lambda d: state["streams"][d], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_setStream", set_stream, raising=False)
    switch = _bridge._Stream(torch.device("cuda", 0), 1234)
    before = switch.enter()
    assert state["device"] == 0 and state["streams"][0] == (99, 0, 1)
    switch.exit(before)
    assert state == {"device": 1, "streams": {0: (7, 0, 1), 1: (8, 1, 1)}}

    seen = []

    class Buffer:
        def __dlpack__(self, **kwargs):
            seen.append(kwargs)
            return "capsule"

    monkeypatch.setattr(_bridge, "_from_capsule", lambda capsule: capsule)
    assert _bridge._Views(torch.device("cuda", 0), 0)(Buffer()) == ["capsule"]
    assert _bridge._Views(torch.device("cuda", 0), 1234)(Buffer()) == ["capsule"]
    assert seen == [{"max_version": (1, 0), "stream": 1}, {"max_version": (1, 0), "stream": 1234}]


def test_mixed_float_operands_are_promoted_as_jax_does():
    lhs, rhs, sizes = _inputs("fwd_wi")
    x, w = lhs.astype(jnp.bfloat16), rhs.astype(jnp.float32)
    out = jax.jit(rj.ragged_dot)(x, w, sizes)
    ref = jax.lax.ragged_dot(x, w, sizes)
    assert out.dtype == ref.dtype == jnp.float32 and nerr(_t(out), _t(ref)) < TOL[torch.float32]


# jax's [slices..., G] group sizes: (lhs, rhs, dims, lhs ragged, rhs group, leading shape of the sizes)
STACKED = {
    "vmap_ragged_m": ((3, 16, 8), (3, 3, 8, 6), (((2,), (2,)), ((0,), (0,))), (1,), (1,), (3,)),
    "free_prefix": ((4, 11, 5), (3, 5, 7), (((2,), (1,)), ((), ())), (1,), (0,), (4,)),
    "ragged_k_batch": ((2, 11, 5), (2, 11, 7), (((1,), (1,)), ((0,), (0,))), (1,), (), (2,)),
}


@pytest.mark.parametrize("name", list(STACKED))
def test_stacked_group_sizes_match_jax_lax(name):
    lshape, rshape, dims, lr, rg, lead = STACKED[name]
    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.standard_normal(lshape), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal(rshape), jnp.float32)
    ends = np.sort(rng.integers(0, lshape[lr[0]] + 1, (*lead, 3)), axis=-1)
    sizes = jnp.asarray(np.diff(ends, axis=-1, prepend=0), jnp.int32)
    dn = jax.lax.RaggedDotDimensionNumbers(dims, lr, rg)
    out = jax.jit(lambda a, b, s: rj.ragged_dot_general(a, b, s, dn))(lhs, rhs, sizes)
    ref = jax.lax.ragged_dot_general(lhs, rhs, sizes, dn)
    assert out.shape == ref.shape and nerr(_t(out), _t(ref)) < TOL[torch.float32]
    if rg:  # jax differentiates the non-contracting mode only
        loss = lambda f: (lambda a, b: jnp.sum(f(a, b, sizes, dn) ** 2))  # noqa: E731
        got = jax.grad(loss(rj.ragged_dot_general), argnums=(0, 1))(lhs, rhs)
        want = jax.grad(loss(jax.lax.ragged_dot_general), argnums=(0, 1))(lhs, rhs)
        assert all(nerr(_t(g), _t(r)) < TOL[torch.float32] for g, r in zip(got, want))


def test_stacked_group_sizes_with_a_non_array_operand_raise_type_error():
    lshape, rshape, dims, lr, rg, _ = STACKED["free_prefix"]
    dn = jax.lax.RaggedDotDimensionNumbers(dims, lr, rg)
    with pytest.raises(TypeError, match="lhs must be a jax array"):
        rj.ragged_dot_general(np.ones(lshape).tolist(), jnp.ones(rshape), jnp.ones((4, 3), jnp.int32), dn)


def test_stacked_group_sizes_of_the_wrong_shape_raise_shape_errors():
    lshape, rshape, dims, lr, rg, _ = STACKED["free_prefix"]
    dn = jax.lax.RaggedDotDimensionNumbers(dims, lr, rg)
    with pytest.raises(ragdot.ShapeError, match=r"expected group_sizes to have shape \(4, 3\), got \(5, 3\)"):
        rj.ragged_dot_general(jnp.ones(lshape), jnp.ones(rshape), jnp.ones((5, 3), jnp.int32), dn)
