"""The dtype contract of the forward op, through the public API, on every backend usable here.

Accumulation is in the widest of float32, the input dtype and preferred_element_type; the output dtype is
preferred_element_type or the input dtype. Three checks, each in the three modes (non-contracting,
contracting, batch), against the float64 oracle of tests/oracle.py:
- float64 output from 16/32-bit inputs is float64-accurate (a float32 accumulation is ~1e-7 off);
- f16 inputs whose products overflow f16 give finite, right results with a bf16 or f32 output;
- the output dtype of every (input dtype, preferred_element_type) pair.
Backends without float64 kernels (torch, triton) must raise NotImplementedError, so that auto moves on.
On CPU the Triton backend runs through the interpreter, with f16/f32 inputs only (its bf16 dots are wrong).
"""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import TOL, nerr, rand
from oracle import ragged_dot_general_oracle
from ragdot import RaggedDotDimensionNumbers as DN

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
USABLE = ragdot.backends()
FLOAT64_BACKENDS = [b for b in ("reference", "padded") if b in USABLE] + [None]  # None: auto's choice
NO_FLOAT64_BACKENDS = [b for b in ("torch", "triton") if b in USABLE]
ALL_BACKENDS = [*[b for b in ("reference", "padded", "torch", "triton") if b in USABLE], None]
LOW = (torch.float32, torch.float16, torch.bfloat16)
ALL = (*LOW, torch.float64)
GROUPS = [5, 0, 9, 4]  # one empty group; 2 of the 20 ragged rows belong to no group

# mode -> (lhs shape, rhs shape, dimension numbers), with K (the contraction) = 16 and a ragged extent of 20.
MODES = {
    "non_contracting": ((20, 16), (4, 16, 6), DN((((1,), (1,)), ((), ())), (0,), (0,))),
    "contracting": ((20, 7), (20, 6), DN((((0,), (0,)), ((), ())), (0,), ())),
    "batch": ((3, 5, 16), (3, 16, 6), DN((((2,), (1,)), ((0,), (0,))), (0,), ())),
}


def _call(lhs, rhs, mode, backend, out_dtype):
    sizes = torch.tensor(GROUPS, dtype=torch.int32, device=DEV)
    if mode == "non_contracting":  # the ragged_dot entry point: same problem, default dimension numbers
        return ragdot.ragged_dot(lhs, rhs, sizes, preferred_element_type=out_dtype, backend=backend)
    return ragdot.ragged_dot_general(lhs, rhs, sizes, MODES[mode][2], preferred_element_type=out_dtype, backend=backend)


def _oracle(lhs, rhs, mode):
    return ragged_dot_general_oracle(lhs, rhs, torch.tensor(GROUPS), MODES[mode][2])


def _operands(mode, dtype, seed=0, low=None, high=None):
    """Normal operands, or uniform in [low, high] when given (all positive: no cancellation)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = MODES[mode][:2]
    if low is None:
        return [rand(s, dtype, DEV, gen) for s in shapes]
    return [(low + (high - low) * torch.rand(s, generator=gen)).to(DEV, dtype) for s in shapes]


def _input_dtypes(backend):
    # The Triton interpreter computes bf16 dots wrongly: its CPU runs take f16/f32 inputs only.
    if backend == "triton" and DEV.type == "cpu":
        return (torch.float32, torch.float16)
    return LOW


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("backend", FLOAT64_BACKENDS, ids=str)
def test_float64_output_accumulates_in_float64(backend, dtype, mode):
    lhs, rhs = _operands(mode, dtype)
    out = _call(lhs, rhs, mode, backend, torch.float64)
    assert out.dtype == torch.float64
    assert nerr(out, _oracle(lhs, rhs, mode)) <= 1e-12


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("backend", NO_FLOAT64_BACKENDS)
def test_backends_without_float64_say_so(backend, mode):
    for dtype in _input_dtypes(backend):
        lhs, rhs = _operands(mode, dtype)
        with pytest.raises(NotImplementedError):
            _call(lhs, rhs, mode, backend, torch.float64)
    lhs, rhs = _operands(mode, torch.float64)
    for out_dtype in (None, torch.float32):
        with pytest.raises(NotImplementedError):
            _call(lhs, rhs, mode, backend, out_dtype)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("backend", ALL_BACKENDS, ids=str)
def test_f16_products_beyond_f16_range_stay_finite(backend, out_dtype, mode):
    # Values in [90, 110]: every contraction (16 terms, or a group of 9 or 5 rows) sums products of ~1e4 to
    # 5e4..1.8e5, past f16's largest value 65504 for most entries; bf16 and f32 hold them.
    lhs, rhs = _operands(mode, torch.float16, seed=1, low=90.0, high=110.0)
    ref = _oracle(lhs, rhs, mode)
    assert ref.abs().max() > torch.finfo(torch.float16).max  # the test would prove nothing otherwise
    out = _call(lhs, rhs, mode, backend, out_dtype)
    assert out.dtype == out_dtype
    assert torch.isfinite(out).all()
    assert nerr(out, ref) <= TOL[out_dtype]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("backend", ALL_BACKENDS, ids=str)
def test_output_dtype_is_preferred_or_input(backend, mode):
    float64_ok = backend not in NO_FLOAT64_BACKENDS
    for dtype in (*_input_dtypes(backend), torch.float64):
        lhs, rhs = _operands(mode, dtype, seed=2)
        ref = _oracle(lhs, rhs, mode)
        for preferred in (None, *ALL):
            expected = dtype if preferred is None else preferred
            if torch.float64 in (dtype, expected) and not float64_ok:
                continue  # test_backends_without_float64_say_so
            out = _call(lhs, rhs, mode, backend, preferred)
            assert out.dtype == expected, (dtype, preferred)
            # Inputs are exact in float64; the error is the coarser of the input and output roundings.
            assert nerr(out, ref) <= max(TOL[dtype], TOL[expected]), (dtype, preferred)
