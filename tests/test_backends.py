"""The shared backend suite: every available backend against an independent float64 oracle.

Each case names the path it exercises. On CPU the Triton backend runs through the interpreter with
fp16/fp32; with CUDA the same suite runs in bf16 too.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import ragdot
from helpers import TOL, backend_dtype_params, deterministic_algorithms, nerr, rand
from oracle import ragged_dot_general_oracle
from ragdot import RaggedDotDimensionNumbers as DN

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PARAMS = backend_dtype_params(DEV)
IDS = [f"{b}-{str(dt).split('.')[-1]}" for b, dt in PARAMS]

# The six MaxText classes (the seed's Table 7), as (lhs shape, rhs shape, dimension numbers).
def maxtext_classes(m, k, n, e):
    return {
        "fwd_wi": ((m, k), (e, k, n), DN((((1,), (1,)), ((), ())), (0,), (0,))),
        "fwd_wo": ((m, n), (e, n, k), DN((((1,), (1,)), ((), ())), (0,), (0,))),
        "dgrad_wi": ((m, n), (e, k, n), DN((((1,), (2,)), ((), ())), (0,), (0,))),
        "dgrad_wo": ((m, k), (e, n, k), DN((((1,), (2,)), ((), ())), (0,), (0,))),
        "wgrad_wi": ((m, k), (m, n), DN((((0,), (0,)), ((), ())), (0,), ())),
        "wgrad_wo": ((m, n), (m, k), DN((((0,), (0,)), ((), ())), (0,), ())),
    }


def check(lhs, rhs, gs, dn, backend, dtype, **kw):
    out = ragdot.ragged_dot_general(lhs, rhs, gs, dn, backend=backend, **kw)
    ref = ragged_dot_general_oracle(lhs, rhs, gs, dn)
    assert out.shape == ref.shape
    assert out.dtype == kw.get("preferred_element_type") or dtype
    assert torch.isfinite(out).all()
    assert nerr(out, ref) <= TOL[dtype], nerr(out, ref)
    return out, ref


def sizes(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
@pytest.mark.parametrize("cls", list(maxtext_classes(1, 1, 1, 1)))
def test_maxtext_classes(backend, dtype, cls):
    # All six classes with uneven groups, one empty group, and a tail of rows outside every group.
    gen = torch.Generator().manual_seed(0)
    m, k, n, e = 70, 48, 40, 5
    lhs_shape, rhs_shape, dn = maxtext_classes(m, k, n, e)[cls]
    lhs, rhs = rand(lhs_shape, dtype, DEV, gen), rand(rhs_shape, dtype, DEV, gen)
    out, _ = check(lhs, rhs, sizes([20, 0, 13, 25, 7]), dn, backend, dtype)
    if cls.startswith("wgrad"):
        assert (out[1] == 0).all()  # empty expert: exact zeros
    else:
        assert (out[65:] == 0).all()  # rows past sum(group_sizes)


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
@pytest.mark.parametrize(
    "case",
    [
        # name: (lhs shape, rhs shape, dn, group sizes)
        ("rhs_group_not_leading", (33, 24), (24, 3, 16), DN((((1,), (0,)), ((), ())), (0,), (1,)), [10, 12, 11]),
        ("ragged_dim_not_leading", (24, 33), (3, 24, 16), DN((((0,), (1,)), ((), ())), (1,), (0,)), [5, 0, 20]),
        ("group_dim_last", (33, 24), (24, 16, 3), DN((((1,), (0,)), ((), ())), (0,), (2,)), [4, 4, 4]),
        ("batch_dims_noncontracting", (2, 30, 16), (2, 3, 16, 8), DN((((2,), (2,)), ((0,), (0,))), (1,), (1,)),
         [9, 11, 6]),
        ("batch_dims_contracting", (2, 30, 16), (2, 30, 8), DN((((1,), (1,)), ((0,), (0,))), (1,), ()), [9, 0, 16]),
        ("batch_mode", (3, 10, 16), (3, 16, 8), DN((((2,), (1,)), ((0,), (0,))), (0,), ()), [1, 1, 1]),
        ("ragged_contracting_not_leading", (16, 30), (30, 8), DN((((1,), (0,)), ((), ())), (1,), ()), [7, 7, 7]),
        ("two_contracting_dims", (30, 4, 6), (30, 4, 8), DN((((0, 1), (0, 1)), ((), ())), (0,), ()), [10, 5, 15]),
        ("extra_lhs_free_dim", (3, 20, 16), (2, 16, 8), DN((((2,), (1,)), ((), ())), (1,), (0,)), [12, 5]),
        ("extra_free_after_ragged", (20, 3, 16), (2, 16, 8), DN((((2,), (1,)), ((), ())), (0,), (0,)), [12, 8]),
        ("odd_sizes", (37, 19), (4, 19, 13), DN((((1,), (1,)), ((), ())), (0,), (0,)), [3, 17, 1, 16]),
        ("m_below_tile", (5, 32), (2, 32, 24), DN((((1,), (1,)), ((), ())), (0,), (0,)), [2, 3]),
        ("more_groups_than_rows", (6, 16), (11, 16, 8), DN((((1,), (1,)), ((), ())), (0,), (0,)),
         [1, 0, 0, 2, 0, 1, 0, 0, 1, 0, 1]),
        ("prime_groups_wgrad", (41, 16), (41, 8), DN((((0,), (0,)), ((), ())), (0,), ()),
         [3, 5, 0, 7, 2, 11, 0, 13, 0, 0, 0, 0, 0]),
        ("all_to_one_expert", (40, 16), (4, 16, 24), DN((((1,), (1,)), ((), ())), (0,), (0,)), [0, 0, 40, 0]),
        ("negative_and_overflowing_sizes", (30, 16), (4, 16, 8), DN((((1,), (1,)), ((), ())), (0,), (0,)),
         [-5, 12, 40, 9]),
        ("overflowing_wgrad", (30, 16), (30, 8), DN((((0,), (0,)), ((), ())), (0,), ()), [20, -3, 25, 7]),
    ],
    ids=lambda c: c[0] if isinstance(c, tuple) else None,
)
def test_layouts_and_edges(backend, dtype, case):
    _, lshape, rshape, dn, gs = case
    gen = torch.Generator().manual_seed(1)
    lhs, rhs = rand(lshape, dtype, DEV, gen), rand(rshape, dtype, DEV, gen)
    check(lhs, rhs, sizes(gs), dn, backend, dtype)


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_every_zero_pattern_of_small_g(backend, dtype):
    # Every zero/non-zero pattern of G = 3 in both ragged modes.
    gen = torch.Generator().manual_seed(2)
    lhs, rhs = rand((24, 16), dtype, DEV, gen), rand((3, 16, 8), dtype, DEV, gen)
    wl, wr = rand((24, 16), dtype, DEV, gen), rand((24, 8), dtype, DEV, gen)
    fwd, wgrad = maxtext_classes(1, 1, 1, 1)["fwd_wi"][2], maxtext_classes(1, 1, 1, 1)["wgrad_wi"][2]
    for pattern in itertools.product([0, 1], repeat=3):
        gs = sizes([7 * p for p in pattern])
        check(lhs, rhs, gs, fwd, backend, dtype)
        out, _ = check(wl, wr, gs, wgrad, backend, dtype)
        for g, p in enumerate(pattern):
            if not p:
                assert (out[g] == 0).all()


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_nan_poisoned_tail_never_leaks(backend, dtype):
    # sum(group_sizes) < M with NaN/Inf stored in the rows outside every group, in both ragged modes.
    gen = torch.Generator().manual_seed(3)
    m, k, n = 48, 32, 24
    gs = sizes([10, 0, 17])  # 27 of 48 rows belong to a group
    lhs, rhs = rand((m, k), dtype, DEV, gen), rand((3, k, n), dtype, DEV, gen)
    lhs[27:] = float("nan")
    lhs[30] = float("inf")
    out, _ = check(lhs, rhs, gs, maxtext_classes(1, 1, 1, 1)["fwd_wi"][2], backend, dtype)
    assert (out[27:] == 0).all()
    x, dy = rand((m, k), dtype, DEV, gen), rand((m, n), dtype, DEV, gen)
    x[27:], dy[27:] = float("nan"), float("-inf")
    out, _ = check(x, dy, gs, maxtext_classes(1, 1, 1, 1)["wgrad_wi"][2], backend, dtype)
    assert (out[1] == 0).all()


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_transposed_views_without_copies(backend, dtype):
    # Non-contiguous operands: lhs stored [K, M] and rhs stored [G, N, K], both passed transposed.
    gen = torch.Generator().manual_seed(4)
    lhs = rand((32, 40), dtype, DEV, gen).t()
    rhs = rand((3, 24, 32), dtype, DEV, gen).transpose(1, 2)
    gs = sizes([11, 20, 9])
    out = ragdot.ragged_dot(lhs, rhs, gs, backend=backend)
    ref = ragged_dot_general_oracle(lhs, rhs, gs, maxtext_classes(1, 1, 1, 1)["fwd_wi"][2])
    assert nerr(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
@pytest.mark.parametrize(
    "shapes",
    [((0, 16), (3, 16, 8)), ((10, 0), (3, 0, 8)), ((10, 16), (3, 16, 0)), ((10, 16), (0, 16, 8))],
    ids=["m0", "k0", "n0", "g0"],
)
def test_zero_length_inputs(backend, dtype, shapes):
    lshape, rshape = shapes
    gen = torch.Generator().manual_seed(5)
    lhs, rhs = rand(lshape, dtype, DEV, gen), rand(rshape, dtype, DEV, gen)
    gs = sizes([lshape[0] // max(rshape[0], 1)] * rshape[0])
    out = ragdot.ragged_dot(lhs, rhs, gs, backend=backend)
    assert out.shape == (lshape[0], rshape[2])
    assert (out == 0).all()
    dn = maxtext_classes(1, 1, 1, 1)["wgrad_wi"][2]
    dy = rand((lshape[0], 5), dtype, DEV, gen)
    out = ragdot.ragged_dot_general(lhs, dy, gs, dn, backend=backend)
    assert out.shape == (rshape[0], lshape[1], 5)
    assert nerr(out, ragged_dot_general_oracle(lhs, dy, gs, dn)) <= TOL[dtype]


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_preferred_element_type(backend, dtype):
    gen = torch.Generator().manual_seed(6)
    lhs, rhs = rand((20, 16), dtype, DEV, gen), rand((2, 16, 8), dtype, DEV, gen)
    out = ragdot.ragged_dot(lhs, rhs, sizes([8, 12]), preferred_element_type=torch.float32, backend=backend)
    assert out.dtype == torch.float32
    ref = ragged_dot_general_oracle(lhs, rhs, sizes([8, 12]), maxtext_classes(1, 1, 1, 1)["fwd_wi"][2])
    assert nerr(out, ref) <= TOL[torch.float32 if dtype == torch.float32 else torch.float16]


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_bitwise_deterministic(backend, dtype):
    gen = torch.Generator().manual_seed(7)
    x, w = rand((64, 32), dtype, DEV, gen), rand((4, 32, 24), dtype, DEV, gen)
    dy = rand((64, 24), dtype, DEV, gen)
    gs = sizes([9, 30, 0, 20])
    wgrad = maxtext_classes(1, 1, 1, 1)["wgrad_wi"][2]
    a1 = ragdot.ragged_dot(x, w, gs, backend=backend)
    b1 = ragdot.ragged_dot_general(x, dy, gs, wgrad, backend=backend)
    for _ in range(2):
        assert torch.equal(a1, ragdot.ragged_dot(x, w, gs, backend=backend))
        assert torch.equal(b1, ragdot.ragged_dot_general(x, dy, gs, wgrad, backend=backend))


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_runs_under_torch_s_deterministic_algorithms(backend, dtype):
    """With torch.use_deterministic_algorithms(True) every op a call runs, forward and backward, has a
    deterministic implementation (none raises), and repeats are bitwise equal."""
    gen = torch.Generator().manual_seed(9)
    x = rand((64, 32), dtype, DEV, gen).requires_grad_()
    w = rand((4, 32, 24), dtype, DEV, gen).requires_grad_()
    dy = rand((64, 24), dtype, DEV, gen)
    gs = sizes([9, 30, 0, 20])  # 5 rows past the last group
    runs = []
    with deterministic_algorithms():
        for _ in range(2):
            x.grad = w.grad = None
            y = ragdot.ragged_dot(x, w, gs, backend=backend)
            y.backward(dy)
            runs.append((y.detach(), x.grad, w.grad))
    for first, again in zip(*runs):
        assert torch.equal(first, again)
    assert (runs[0][0][59:] == 0).all() and (runs[0][2][2] == 0).all()  # the tail rows, the empty group


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
def test_group_sizes_of_any_int_dtype_and_on_host(backend, dtype):
    gen = torch.Generator().manual_seed(8)
    lhs, rhs = rand((20, 16), dtype, DEV, gen), rand((2, 16, 8), dtype, DEV, gen)
    b = ragdot.ragged_dot(lhs, rhs, sizes([8, 10]), backend=backend)
    for dtype_ in (torch.int64, torch.int16, torch.uint8):
        a = ragdot.ragged_dot(lhs, rhs, torch.tensor([8, 10], dtype=dtype_), backend=backend)
        assert torch.equal(a, b)
