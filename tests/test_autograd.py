"""Gradients of both operands in every mode, on every backend, against the float64 oracle's autograd."""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import TOL, backend_dtype_params, nerr, rand
from oracle import ragged_dot_general_oracle
from ragdot import RaggedDotDimensionNumbers as DN
from ragdot.dimension_numbers import RAGGED_DOT_DN as _RAGGED_DOT_DN
from test_backends import maxtext_classes

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PARAMS = backend_dtype_params(DEV)
IDS = [f"{b}-{str(dt).split('.')[-1]}" for b, dt in PARAMS]

CASES = {
    **{name: spec for name, spec in maxtext_classes(40, 24, 16, 4).items()},
    "batch_mode": ((3, 10, 16), (3, 16, 8), DN((((2,), (1,)), ((0,), (0,))), (0,), ())),
    "batched_ragged_m": ((2, 40, 16), (2, 4, 16, 8), DN((((2,), (2,)), ((0,), (0,))), (1,), (1,))),
    "batched_ragged_k": ((2, 40, 16), (2, 40, 8), DN((((1,), (1,)), ((0,), (0,))), (1,), ())),
}


def _grads(fn, lhs, rhs, cot):
    lhs = lhs.detach().requires_grad_(True)
    rhs = rhs.detach().requires_grad_(True)
    out = fn(lhs, rhs)
    da, db = torch.autograd.grad(out, (lhs, rhs), cot.to(out.device, out.dtype))
    return out, da, db


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_oracle(backend, dtype, case):
    lshape, rshape, dn = CASES[case]
    gen = torch.Generator().manual_seed(10)
    lhs, rhs = rand(lshape, dtype, DEV, gen), rand(rshape, dtype, DEV, gen)
    gs = torch.tensor([12, 0, 15, 9], dtype=torch.int32, device=DEV)  # one empty group, 4 rows outside
    ref_out = ragged_dot_general_oracle(lhs, rhs, gs, dn)
    cot = torch.randn(ref_out.shape, generator=gen, dtype=torch.float64)
    out, da, db = _grads(lambda a, b: ragdot.ragged_dot_general(a, b, gs, dn, backend=backend), lhs, rhs, cot)
    oracle = lambda a, b: ragged_dot_general_oracle(a, b, gs, dn)  # noqa: E731
    _, rda, rdb = _grads(oracle, lhs.cpu().double(), rhs.cpu().double(), cot)
    assert da.dtype == lhs.dtype and db.dtype == rhs.dtype
    assert nerr(da, rda) <= TOL[dtype] and nerr(db, rdb) <= TOL[dtype]
    if case.startswith("wgrad"):
        # dy/x rows outside every group get exactly zero gradient.
        assert (da[36:] == 0).all() and (db[36:] == 0).all()
    elif case in ("fwd_wi", "fwd_wo", "dgrad_wi", "dgrad_wo"):
        assert (da[36:] == 0).all()  # rows outside every group
        assert (db[1] == 0).all()  # the empty expert's weight gradient is exactly zero


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_nan_cotangent_and_inputs_outside_groups_do_not_leak(backend, dtype):
    gen = torch.Generator().manual_seed(11)
    lhs, rhs = rand((30, 16), dtype, DEV, gen), rand((3, 16, 8), dtype, DEV, gen)
    lhs[20:] = float("nan")
    gs = torch.tensor([8, 0, 12], dtype=torch.int32, device=DEV)
    cot = torch.randn(30, 8, generator=gen, dtype=torch.float64)
    cot[20:] = float("nan")
    _, da, db = _grads(lambda a, b: ragdot.ragged_dot(a, b, gs, backend=backend), lhs, rhs, cot)
    assert torch.isfinite(da).all() and torch.isfinite(db).all()
    assert (da[20:] == 0).all() and (db[1] == 0).all()
    # the same weights stored [G, N, K] (a transposed view): its gradient takes the other product, ragged_k(dy, x)
    wt = rhs.transpose(1, 2).contiguous()
    _, da_t, db_t = _grads(lambda a, b: ragdot.ragged_dot(a, b.transpose(1, 2), gs, backend=backend), lhs, wt, cot)
    assert torch.isfinite(da_t).all() and torch.isfinite(db_t).all()
    assert (da_t[20:] == 0).all() and (db_t[1] == 0).all()


GRADCHECK_CASES = {
    "fwd_wi": ((12, 5), (4, 5, 3), CASES["fwd_wi"][2]),
    "dgrad_wo": ((12, 5), (4, 3, 5), CASES["dgrad_wo"][2]),
    "wgrad_wi": ((12, 5), (12, 3), CASES["wgrad_wi"][2]),
    "batch_mode": ((2, 3, 4), (2, 4, 3), CASES["batch_mode"][2]),
    "batched_ragged_m": ((2, 12, 4), (2, 4, 4, 3), CASES["batched_ragged_m"][2]),
}


@pytest.mark.parametrize("backend", [b for b in ("reference", "padded") if b in ragdot.backends()])
@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck_float64(backend, case):
    lshape, rshape, dn = GRADCHECK_CASES[case]
    gen = torch.Generator().manual_seed(12)
    gs = torch.tensor([3, 0, 4, 2], dtype=torch.int32)  # 3 of 12 rows outside every group
    lhs = torch.randn(lshape, generator=gen, dtype=torch.float64, requires_grad=True)
    rhs = torch.randn(rshape, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ragdot.ragged_dot_general(a, b, gs, dn, backend=backend), (lhs, rhs))


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_weight_gradient_of_a_transposed_view_comes_in_the_weights_layout(backend, dtype, compiled):
    """rhs = w.transpose(1, 2) of a contiguous w [G, N, K] (nn.Linear's [out, in] per expert): the gradient of
    the view comes with the view's strides, so w.grad is that memory itself, contiguous (AccumulateGrad copies
    a gradient in any other layout: a weight-sized transient), and equals the oracle's."""
    gen = torch.Generator().manual_seed(12)
    rows = rand((40, 16), dtype, DEV, gen)
    w = rand((4, 24, 16), dtype, DEV, gen)  # [G, N, K]
    gs = torch.tensor([12, 0, 15, 9], dtype=torch.int32, device=DEV)
    cot = torch.randn(40, 24, generator=gen, dtype=torch.float64)

    def fn(a, b):
        return ragdot.ragged_dot(a, b.transpose(1, 2), gs, backend=backend)

    if compiled:  # `fn`'s code object is shared by every case: dynamo's per-code recompile limit (8) would end the
        torch._dynamo.reset()  # suite's later cases (backends x dtypes) with FailOnRecompileLimitHit
    run = torch.compile(fn, fullgraph=True, backend="aot_eager") if compiled else fn
    for _ in range(2):  # the second eager call takes the bound backward of the first
        x, v = rows.detach().requires_grad_(True), w.detach().requires_grad_(True)
        out = run(x, v)
        out.backward(cot.to(out.device, out.dtype))
        assert v.grad.is_contiguous() and v.grad.shape == w.shape
        _, rdx, rdw = _grads(lambda a, b: ragged_dot_general_oracle(a, b.transpose(1, 2), gs, _RAGGED_DOT_DN),
                             rows.cpu().double(), w.cpu().double(), cot)
        assert nerr(x.grad, rdx) <= TOL[dtype] and nerr(v.grad, rdw) <= TOL[dtype]
        assert (v.grad[1] == 0).all()  # the empty group's weight gradient is exactly zero
    view = w.detach().transpose(1, 2).requires_grad_(True)
    out = ragdot.ragged_dot(rows, view, gs, backend=backend)
    (dview,) = torch.autograd.grad(out, (view,), cot.to(DEV, dtype))
    assert dview.stride() == view.stride()


def test_transposed_weight_view_gradcheck_and_gradgradcheck():
    """The layout-keeping weight gradient of a transposed view is a differentiable product too (double
    backward through ragged_k(dy, x)); float64 on the reference backend."""
    gen = torch.Generator().manual_seed(13)
    rows = torch.randn(11, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(3, 4, 5, dtype=torch.float64, generator=gen, requires_grad=True)  # [E, out, in]
    sizes = torch.tensor([4, 0, 5], dtype=torch.int32)  # two rows past the groups: zero output

    def fn(r, w):
        return ragdot.ragged_dot(r, w.transpose(1, 2), sizes, backend="reference")

    assert torch.autograd.gradcheck(fn, (rows, weight))
    assert torch.autograd.gradgradcheck(fn, (rows, weight))
