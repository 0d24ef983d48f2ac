"""`ragdot.grouped_mm`: torch._grouped_mm's four forms on every backend, against a float64 loop over the groups
and against torch._grouped_mm itself where it runs; ragdot's zero tails, gradients, torch.compile, errors."""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import TOL, backend_dtype_params, benchmark_script, nerr, rand

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PARAMS = backend_dtype_params(DEV)
IDS = [f"{b}-{str(dt).split('.')[-1]}" for b, dt in PARAMS]
# form: (mat_a shape, mat_b shape, offs or None); offs with an empty group and ending before the ragged extent
FORMS = {
    "2d_3d": ((40, 24), (4, 24, 16), [9, 9, 25, 33]),
    "3d_2d": ((4, 12, 24), (24, 40), [16, 16, 24, 36]),
    "2d_2d": ((12, 40), (40, 16), [9, 9, 25, 33]),
    "3d_3d": ((4, 12, 24), (4, 24, 16), None),
}


def _loop(a: torch.Tensor, b: torch.Tensor, offs: list[int] | None) -> torch.Tensor:
    """The definition, group by group in float64; rows, columns or K past offs[-1] in no group (zeros)."""
    a, b = a.double(), b.double()
    if offs is None:
        return a @ b
    starts = [0, *offs[:-1]]
    if a.dim() == 2 and b.dim() == 3:
        out = a.new_zeros(a.shape[0], b.shape[2])
        for g, (s, e) in enumerate(zip(starts, offs)):
            out[s:e] = a[s:e] @ b[g]
    elif a.dim() == 3:
        out = a.new_zeros(a.shape[1], b.shape[1])
        for g, (s, e) in enumerate(zip(starts, offs)):
            out[:, s:e] = a[g] @ b[:, s:e]
    else:
        out = a.new_zeros(len(offs), a.shape[0], b.shape[1])
        for g, (s, e) in enumerate(zip(starts, offs)):
            out[g] = a[:, s:e] @ b[s:e]
    return out


def _operands(form, dtype, requires_grad=False):
    gen = torch.Generator().manual_seed(sum(map(ord, form)))
    a_shape, b_shape, offs = FORMS[form]
    a, b = rand(a_shape, dtype, DEV, gen), rand(b_shape, dtype, DEV, gen)
    offs_t = None if offs is None else torch.tensor(offs, dtype=torch.int32, device=DEV)
    return a.requires_grad_(requires_grad), b.requires_grad_(requires_grad), offs, offs_t


@pytest.mark.parametrize("backend,dtype", PARAMS, ids=IDS)
@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_matches_the_loop_with_exact_zero_tails(backend, dtype, form):
    a, b, offs, offs_t = _operands(form, dtype)
    out = ragdot.grouped_mm(a, b, offs_t, backend=backend)
    want = _loop(a, b, offs)
    assert out.shape == want.shape and out.dtype == dtype
    assert nerr(out, want) <= TOL[dtype]
    if form == "2d_3d":
        assert (out[offs[-1]:] == 0).all()
    elif form == "3d_2d":
        assert (out[:, offs[-1]:] == 0).all()
    elif form == "2d_2d":
        assert (out[1] == 0).all()  # the empty group: exact zeros


@pytest.mark.parametrize("form", list(FORMS))
def test_agrees_with_torch_grouped_mm_where_torch_defines_the_result(form):
    a, b, offs, offs_t = _operands(form, torch.float32)
    try:
        want = torch._grouped_mm(a, b, offs=offs_t)
    except (RuntimeError, NotImplementedError) as e:  # a build without this form on this device
        pytest.skip(f"torch._grouped_mm does not run here: {e}")
    out = ragdot.grouped_mm(a, b, offs_t)
    if form == "2d_3d":
        out, want = out[:offs[-1]], want[:offs[-1]]  # torch leaves the rest undefined
    elif form == "3d_2d":
        out, want = out[:, :offs[-1]], want[:, :offs[-1]]
    assert nerr(out, want) <= TOL[torch.float32]


@pytest.mark.parametrize("form", list(FORMS))
def test_gradients_match_the_loop_s(form):
    a, b, offs, offs_t = _operands(form, torch.float32, requires_grad=True)
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    out, want = ragdot.grouped_mm(a, b, offs_t), _loop(a64, b64, offs)
    dout = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEV)
    got = torch.autograd.grad(out, (a, b), dout.float())
    ref = torch.autograd.grad(want, (a64, b64), dout)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and nerr(g, r) <= TOL[torch.float32]


def test_out_dtype_accumulates_in_float32_and_compiles_fullgraph():
    a, b, offs, offs_t = _operands("2d_3d", torch.float16)
    out = ragdot.grouped_mm(a, b, offs_t, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and nerr(out, _loop(a, b, offs)) <= 1e-5
    compiled = torch.compile(lambda x, w, o: ragdot.grouped_mm(x, w, o), fullgraph=True, backend="eager")
    assert nerr(compiled(a.float(), b.float(), offs_t), _loop(a, b, offs)) <= TOL[torch.float32]


# torch's compiled-path cases: a leading empty group (offs[0] == 0), odd sizes, an empty group inside, a tail
_LEADING = {"2d_3d": ((9, 13), (5, 13, 7)), "3d_2d": ((5, 3, 13), (13, 9)), "2d_2d": ((3, 9), (9, 7))}


@pytest.mark.parametrize("form", list(_LEADING))
def test_a_leading_empty_group_odd_sizes_and_their_gradients(form):
    offs = [0, 1, 6, 6, 7]
    gen = torch.Generator().manual_seed(3)
    a, b = (rand(s, torch.float32, DEV, gen).requires_grad_() for s in _LEADING[form])
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    out = ragdot.grouped_mm(a, b, torch.tensor(offs, dtype=torch.int32, device=DEV))
    want = _loop(a64, b64, offs)
    assert out.shape == want.shape and nerr(out, want) <= TOL[torch.float32]
    dout = torch.randn(want.shape, generator=gen, dtype=torch.float64).to(DEV)
    got, ref = torch.autograd.grad(out, (a, b), dout.float()), torch.autograd.grad(want, (a64, b64), dout)
    for g, r in zip(got, ref):
        assert nerr(g, r) <= TOL[torch.float32]
    if form == "2d_3d":  # the empty groups' weights get exact-zero gradients
        assert (got[1][0] == 0).all() and (got[1][3] == 0).all()


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda a, b, o: ragdot.grouped_mm(a.tolist(), b, o), TypeError, "mat_a must be a torch.Tensor"),
    (lambda a, b, o: ragdot.grouped_mm(a[0, 0], b, o), ValueError, "2-D or 3-D"),
    (lambda a, b, o: ragdot.grouped_mm(a, b, None), ValueError, "offs is required"),
    (lambda a, b, o: ragdot.grouped_mm(a, b, o[:2]), ValueError, r"offs must hold one end per group \(4\)"),
    (lambda a, b, o: ragdot.grouped_mm(a, b, o.float()), ValueError, "offs must be a 1-D integer tensor"),
    (lambda a, b, o: ragdot.grouped_mm(a, b, o, bias=b[:, 0]), NotImplementedError, "bias"),
    (lambda a, b, o: ragdot.grouped_mm(a[None].expand(4, -1, -1), b, o), ValueError, "offs must be None"),
    (lambda a, b, o: ragdot.grouped_mm(a[None].expand(3, -1, -1), b, None), ValueError, "same number of groups"),
    (lambda a, b, o: ragdot.grouped_mm(a[:, :5], b, o), ValueError, "contract"),
])
def test_bad_input_raises_naming_the_argument(call, exc, pattern):
    a, b, _, offs_t = _operands("2d_3d", torch.float32)
    with pytest.raises(exc, match=pattern):
        call(a, b, offs_t)


@pytest.mark.parametrize("backend", sorted({b for b, _ in PARAMS}))
def test_strided_and_transposed_operands_as_torch_passes_them(backend):
    """Operands as PyTorch's own grouped-GEMM tests build them: column slices, every other group, weights given
    as transposed views; an empty first group. Against torch._grouped_mm where it runs, else the loop."""
    gen = torch.Generator().manual_seed(7)
    m, n, k, g = 16, 32, 64, 4
    a = rand((m * g, 2 * k), torch.float32, DEV, gen)[:, :k]
    b_t = rand((2 * g, n, 2 * k), torch.float32, DEV, gen)[::2, :, :k].transpose(-2, -1)  # [G, K, N] view
    a3 = rand((2 * g, m, 2 * k), torch.float32, DEV, gen)[::2, :, :k]
    wide = rand((n * g, 2 * k), torch.float32, DEV, gen)[:, :k].t()  # [K, N*G] view
    long_a, long_b = (rand((rows, 2 * k * g), torch.float32, DEV, gen)[:, :k * g] for rows in (m, n))
    ends = {size: torch.arange(size, g * size + 1, size, dtype=torch.int32, device=DEV) for size in (m, n, k)}
    for e in ends.values():
        e[0] = 0
    cases = [(a, b_t, ends[m]), (a3, b_t, None), (long_a, long_b.t(), ends[k]), (a3, wide, ends[n])]
    for mat_a, mat_b, offs in cases:
        out = ragdot.grouped_mm(mat_a, mat_b, offs, backend=backend)
        try:
            want = torch._grouped_mm(mat_a, mat_b, offs=offs)
        except (RuntimeError, NotImplementedError):
            want = _loop(mat_a, mat_b, None if offs is None else offs.tolist())
        assert out.shape == want.shape and nerr(out, want) <= TOL[torch.float32]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_the_forms_benchmark_dry_run_checks_and_writes_every_form(tmp_path, capsys):
    """benchmarks/grouped_forms.py --tiny on the CPU: each form checked against torch._grouped_mm and written."""
    import json

    module = benchmark_script("grouped_forms")
    assert module.main(["--out", str(tmp_path), "--tiny", "--max-seconds", "0.02"]) == 0
    rows = json.loads((tmp_path / "grouped-forms.json").read_text())["rows"]
    assert [r["form"] for r in rows] == list(FORMS) and all(r["clock"] == "wall" for r in rows)
    assert all(r["err_vs_vendor"] < 1e-5 and r["ragdot_ms"] > 0 for r in rows)
    assert module.main(["--out", str(tmp_path)]) == 2  # no GPU and no --tiny: one line, exit 2
    assert "pass --tiny" in capsys.readouterr().err
