"""Triton's interpreter (the CPU runs of the Triton kernels): a dtype whose `tl.dot` it computes wrong is refused
with a clear reason, never computed (`ragdot.kernels.interpreter`); `auto` then answers from another backend."""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import nerr
from ragdot.kernels import interpreter

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not interpreter.interpreting() or torch.cuda.is_available(),
                                reason="Triton's interpreter on a CPU host")


def _operands(dtype, rows=24):
    gen = torch.Generator().manual_seed(3)
    lhs, rhs = torch.randn(rows, 16, generator=gen), torch.randn(3, 16, 8, generator=gen)
    return lhs.to(dtype), rhs.to(dtype), torch.tensor([9, 0, 11])


def _want(lhs, rhs, sizes):
    out = torch.zeros(lhs.shape[0], rhs.shape[2], dtype=torch.float64)
    start = 0
    for g, n in enumerate(sizes.tolist()):
        out[start:start + n] = lhs[start:start + n].double() @ rhs[g].double()
        start += n
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_triton_backend_computes_a_dtype_right_or_refuses_it(dtype):
    """Whatever this Triton's interpreter does with the dtype, the triton backend never returns a wrong
    product: it computes it (checked against float64) or raises NotImplementedError naming the interpreter."""
    lhs, rhs, sizes = _operands(dtype)
    want = _want(lhs, rhs, sizes)
    if interpreter.dot_refusal(dtype) is None:
        got = ragdot.ragged_dot(lhs, rhs, sizes, backend="triton")
        assert nerr(got.double(), want) < (5e-2 if dtype == torch.bfloat16 else 5e-3)
    else:
        with pytest.raises(NotImplementedError, match="interpreter"):
            ragdot.ragged_dot(lhs, rhs, sizes, backend="triton")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_auto_answers_every_16_bit_dtype_right(dtype):
    lhs, rhs, sizes = _operands(dtype)
    got = ragdot.ragged_dot(lhs, rhs, sizes)
    assert got.dtype == dtype and nerr(got.double(), _want(lhs, rhs, sizes)) < 5e-2


def test_the_probe_finds_a_wrong_product(monkeypatch):
    """The probe's verdict decides: a dtype probed wrong is refused by the backend and by the fused block."""
    from ragdot.moe.fused import fused_supported

    monkeypatch.setitem(interpreter._EXACT, torch.float16, False)
    reason = interpreter.dot_refusal(torch.float32, torch.float16)
    assert reason is not None and "float16" in reason and "TRITON_INTERPRET=1" in reason
    lhs, rhs, sizes = _operands(torch.float16, rows=25)  # a signature no call has prepared yet: checked anew
    with pytest.raises(NotImplementedError, match="interpreter"):
        ragdot.ragged_dot(lhs, rhs, sizes, backend="triton")
    assert not fused_supported(lhs, rhs, rhs)
    monkeypatch.setitem(interpreter._EXACT, torch.float16, True)
    assert interpreter.dot_refusal(torch.float16) is None and fused_supported(lhs, rhs, rhs)


def test_float16_and_float32_products_are_right_in_this_interpreter():
    assert interpreter._probe(torch.float16)
    assert interpreter.dot_refusal(torch.float32) is None  # only 16-bit dots are probed


def test_nothing_is_refused_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setitem(interpreter._EXACT, torch.bfloat16, False)
    assert interpreter.dot_refusal(torch.bfloat16) is None


def test_a_tool_that_reads_no_value_may_run_every_dtype(monkeypatch):
    monkeypatch.setitem(interpreter._EXACT, torch.bfloat16, False)
    assert interpreter.dot_refusal(torch.bfloat16) is not None
    monkeypatch.setattr(interpreter, "refuse_wrong_dots", False)
    assert interpreter.dot_refusal(torch.bfloat16) is None


def test_the_probe_runs_inside_an_autocast_region(monkeypatch):
    """The first question may come from inside torch.autocast (a layer's forward): the probe's own float32
    reference product must not be autocast."""
    monkeypatch.delitem(interpreter._EXACT, torch.bfloat16, raising=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        verdict = interpreter.dot_refusal(torch.bfloat16)
    assert torch.bfloat16 in interpreter._EXACT and (verdict is None) == interpreter._EXACT[torch.bfloat16]


def test_the_fused_block_refuses_a_dtype_probed_wrong(monkeypatch):
    from ragdot.moe.fused import fused_experts, sort_experts

    monkeypatch.setitem(interpreter._EXACT, torch.float16, False)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 16, generator=gen).half()
    ids = torch.randint(0, 3, (6, 2), generator=gen)
    sizes, order = sort_experts(ids, 3)
    wgu, wd = torch.randn(3, 16, 8, generator=gen).half(), torch.randn(3, 4, 16, generator=gen).half()
    with pytest.raises(NotImplementedError, match="interpreter"):
        fused_experts(x, order, sizes, torch.rand(6, 2, generator=gen), wgu, wd)
