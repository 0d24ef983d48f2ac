"""The eager call path: prepared calls, forward-mode AD, torch.func transforms, cotangent precision, caches."""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import GENERAL_BACKENDS, TOL, nerr, rand
from oracle import ragged_dot_general_oracle
from test_autograd import CASES

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = [b for b in GENERAL_BACKENDS if b != "padded"]
GS = [12, 0, 15, 9]  # one empty group, 4 of 40 rows outside every group


def _sizes() -> torch.Tensor:
    return torch.tensor(GS, dtype=torch.int32, device=DEV)


def _dtype(backend: str) -> torch.dtype:
    return torch.float32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_mode_tangent_matches_the_oracle(backend, case):
    """torch.func.jvp and torch.autograd.forward_ad give the true tangent (never a silent zero)."""
    lshape, rshape, dn = CASES[case]
    gen = torch.Generator().manual_seed(20)
    dt = _dtype(backend)
    lhs, rhs = rand(lshape, dt, DEV, gen), rand(rshape, dt, DEV, gen)
    tl, tr = rand(lshape, dt, DEV, gen), rand(rshape, dt, DEV, gen)
    gs = _sizes()

    def fn(a, b):
        return ragdot.ragged_dot_general(a, b, gs, dn, backend=backend)

    def oracle(a, b):
        return ragged_dot_general_oracle(a, b, gs.cpu(), dn)

    ref_out, ref_t = torch.func.jvp(oracle, (lhs.cpu().double(), rhs.cpu().double()),
                                    (tl.cpu().double(), tr.cpu().double()))
    out, tangent = torch.func.jvp(fn, (lhs, rhs), (tl, tr))
    assert ref_t.abs().max() > 0
    assert nerr(out, ref_out) <= TOL[dt] and nerr(tangent, ref_t) <= TOL[dt]

    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        dual = fn(fwad.make_dual(lhs, tl), rhs)
        t = fwad.unpack_dual(dual).tangent
    _, ref_tl = torch.func.jvp(lambda a: oracle(a, rhs.cpu().double()), (lhs.cpu().double(),), (tl.cpu().double(),))
    assert t is not None and nerr(t, ref_tl) <= TOL[dt]


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_func_grad_vjp_and_jacrev(backend):
    gen = torch.Generator().manual_seed(21)
    lhs, rhs = rand((10, 4), torch.float32, DEV, gen), rand((3, 4, 2), torch.float32, DEV, gen)
    gs = torch.tensor([3, 0, 5], dtype=torch.int32, device=DEV)

    def loss(a, b):
        return (ragdot.ragged_dot(a, b, gs, backend=backend) ** 2).sum()

    def oracle_loss(a, b):
        return (ragged_dot_general_oracle(a, b, gs.cpu(), CASES["fwd_wi"][2]) ** 2).sum()

    da, db = torch.func.grad(loss, argnums=(0, 1))(lhs, rhs)
    rda, rdb = torch.func.grad(oracle_loss, argnums=(0, 1))(lhs.cpu().double(), rhs.cpu().double())
    assert nerr(da, rda) <= 1e-5 and nerr(db, rdb) <= 1e-5
    out, pull = torch.func.vjp(lambda a: ragdot.ragged_dot(a, rhs, gs, backend=backend), lhs)
    (pa,) = pull(torch.ones_like(out))
    assert (pa[8:] == 0).all() and pa[:8].abs().sum() > 0
    jac = torch.func.jacrev(lambda a: ragdot.ragged_dot(a, rhs, gs, backend=backend))(lhs)  # [10, 2, 10, 4]
    ref = torch.func.jacrev(lambda a: ragged_dot_general_oracle(a, rhs.cpu().double(), gs.cpu(),
                                                                CASES["fwd_wi"][2]))(lhs.cpu().double())
    assert jac.shape == (10, 2, 10, 4) and nerr(jac, ref) <= 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward(backend):
    gen = torch.Generator().manual_seed(22)
    lhs = rand((10, 4), torch.float32, DEV, gen).requires_grad_()
    rhs = rand((3, 4, 2), torch.float32, DEV, gen).requires_grad_()
    gs = torch.tensor([3, 2, 5], dtype=torch.int32, device=DEV)
    (da,) = torch.autograd.grad(ragdot.ragged_dot(lhs, rhs, gs, backend=backend).sum(), lhs, create_graph=True)
    (ddb,) = torch.autograd.grad((da**2).sum(), rhs)
    l64, r64 = lhs.detach().cpu().double().requires_grad_(), rhs.detach().cpu().double().requires_grad_()
    (rda,) = torch.autograd.grad(ragged_dot_general_oracle(l64, r64, gs.cpu(), CASES["fwd_wi"][2]).sum(), l64,
                                 create_graph=True)
    (rddb,) = torch.autograd.grad((rda**2).sum(), r64)
    assert nerr(ddb, rddb) <= 1e-5


@pytest.mark.parametrize("backend", [b for b in ("reference", "torch", "triton") if b in ragdot.backends()])
def test_float32_cotangent_of_float16_operands_is_not_rounded_to_float16(backend):
    """Loss scaling: a cotangent of 7e4 overflows float16 (max 65504); the gradients must stay finite and
    match the oracle, as they do in jax (the cotangent is contracted in float32)."""
    gen = torch.Generator().manual_seed(23)
    lhs = rand((20, 16), torch.float16, DEV, gen, scale=0.01).requires_grad_()
    rhs = rand((2, 16, 8), torch.float16, DEV, gen, scale=0.01).requires_grad_()
    gs = torch.tensor([9, 11], dtype=torch.int32, device=DEV)
    out = ragdot.ragged_dot(lhs, rhs, gs, preferred_element_type=torch.float32, backend=backend)
    cot = torch.full_like(out, 7e4)
    da, db = torch.autograd.grad(out, (lhs, rhs), cot)
    l64, r64 = lhs.detach().cpu().double().requires_grad_(), rhs.detach().cpu().double().requires_grad_()
    rda, rdb = torch.autograd.grad(ragged_dot_general_oracle(l64, r64, gs.cpu(), CASES["fwd_wi"][2]), (l64, r64),
                                   cot.cpu().double())
    assert da.dtype == torch.float16 and db.dtype == torch.float16
    finite = rda.abs().max() < 65504 and rdb.abs().max() < 65504
    assert finite, "the test's true gradients must be representable in float16"
    assert torch.isfinite(da).all() and torch.isfinite(db).all()
    assert nerr(da, rda) <= TOL[torch.float16] and nerr(db, rdb) <= TOL[torch.float16]


def test_repeated_calls_reuse_one_prepared_call_and_stay_exact():
    from ragdot import api

    gen = torch.Generator().manual_seed(24)
    lhs, rhs = rand((40, 16), torch.float32, DEV, gen), rand((4, 16, 8), torch.float32, DEV, gen)
    before = len(api._CALLS)
    first = ragdot.ragged_dot(lhs, rhs, _sizes(), backend="reference")
    after = len(api._CALLS)
    for _ in range(3):
        assert torch.equal(ragdot.ragged_dot(lhs, rhs, _sizes(), backend="reference"), first)
    assert len(api._CALLS) == after and after in (before, before + 1)
    # other sizes in the same signature: the cached call reads the new sizes
    other = torch.tensor([40, 0, 0, 0], dtype=torch.int32, device=DEV)
    out = ragdot.ragged_dot(lhs, rhs, other, backend="reference")
    assert nerr(out, lhs.double() @ rhs[0].double()) <= TOL[torch.float32]
    # a transposed (non-contiguous) lhs is another signature and still right (another matmul layout: the
    # vendor library may round differently)
    lt = lhs.t().contiguous().t()
    assert nerr(ragdot.ragged_dot(lt, rhs, _sizes(), backend="reference"), first) <= TOL[torch.float32]


def test_cached_signature_still_raises_for_bad_sizes_when_validating(monkeypatch):
    lhs, rhs = torch.randn(6, 4, device=DEV), torch.randn(2, 4, 3, device=DEV)
    good = torch.tensor([3, 3], device=DEV)
    ragdot.ragged_dot(lhs, rhs, good, validate=True)
    with pytest.raises(ValueError, match=r"group_sizes\[1\]"):
        ragdot.ragged_dot(lhs, rhs, torch.tensor([3, -1], device=DEV), validate=True)
    with pytest.raises(ValueError, match="beyond"):
        ragdot.ragged_dot(lhs, rhs, torch.tensor([3, 4], device=DEV), validate=True)


def test_bad_arguments_raise_on_a_cached_signature_too():
    lhs, rhs, gs = torch.randn(6, 4), torch.randn(2, 4, 3), torch.tensor([3, 3])
    ragdot.ragged_dot(lhs, rhs, gs)
    with pytest.raises(TypeError, match="validate"):
        ragdot.ragged_dot(lhs, rhs, gs, validate="yes")
    with pytest.raises(ValueError, match="backend"):
        ragdot.ragged_dot(lhs, rhs, gs, backend="nope")
    with pytest.raises(TypeError, match="rhs"):
        ragdot.ragged_dot(lhs, rhs.int(), gs)  # mixed floats are promoted; an int rhs is not
    with pytest.raises(ValueError, match="group dimension"):
        ragdot.ragged_dot(lhs, rhs, torch.tensor([3, 2, 1]))


def test_group_ends_clamp_negative_and_oversized_sizes():
    from ragdot.groups import group_ends_from_sizes

    sizes = torch.tensor([-5, 4, 100, 3], dtype=torch.int64)
    assert group_ends_from_sizes(sizes, 10).tolist() == [0, 4, 10, 10]
    assert group_ends_from_sizes(sizes, 12, scale=3).tolist() == [0, 12, 12, 12]
    assert group_ends_from_sizes(torch.tensor([2**40, 1]), 7).tolist() == [7, 7]



@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_the_cpu_host_loop_forms_the_same_ends(dtype):
    """The `torch` backend forms a few groups' ends on the CPU by a loop over the sizes (`_HostEnds`): the
    same clamped int32 ends as the torch ops, whatever the sizes hold."""
    from ragdot.backends.torch_gmm import _HOST_ENDS_MAX_GROUPS, _HostEnds
    from ragdot.groups import group_ends_from_sizes

    gen = torch.Generator().manual_seed(5)
    info = torch.iinfo(dtype)
    for g in range(1, _HOST_ENDS_MAX_GROUPS + 1):
        for extent, scale in ((0, 1), (1, 1), (37, 1), (36, 3), (2**20, 1)):
            sizes = torch.randint(info.min, info.max, (g,), generator=gen, dtype=torch.int64).to(dtype)
            for s in (sizes, sizes.clamp(0, 5), torch.zeros_like(sizes)):
                got = _HostEnds(extent, scale)(s)
                assert got.dtype == torch.int32 and torch.equal(got, group_ends_from_sizes(s, extent, scale))


def test_the_cpu_tail_zeroing_uses_the_end_it_formed_only_for_those_ends():
    """`_HostEnds.zero_tail` takes the last end it formed when handed that very tensor, else reads the ends
    given (another product's offsets): both zero exactly the rows past the last end."""
    from ragdot.backends.torch_gmm import _HostEnds

    ends = _HostEnds(10, 1)
    mine = ends(torch.tensor([3, 2, 1]))
    c = torch.ones(10, 4)
    ends.zero_tail(c, mine)
    assert (c[:6] == 1).all() and (c[6:] == 0).all()
    other = torch.tensor([4, 8, 9], dtype=torch.int32)  # not the tensor it formed: its own last end counts
    c = torch.ones(10, 4)
    ends.zero_tail(c, other)
    assert (c[:9] == 1).all() and (c[9:] == 0).all()


@pytest.mark.parametrize("cls", ["fwd_wi", "fwd_wo", "dgrad_wi", "dgrad_wo", "wgrad_wi", "wgrad_wo"])
def test_the_torch_backend_takes_every_anchor_layout_directly(cls, device, monkeypatch):
    """The six MoE classes on the `torch` backend: its prepared call takes the user's tensors at the canonical
    operands' addresses (data-gradient weights [E, N, K] included) without the canonical views, and matches the
    float64 oracle, NaN rows past the groups never leaking, forward and backward (bf16 on a GPU)."""
    from ragdot import api
    from ragdot.measure.classes import get_class
    from ragdot.shapes import Shape

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    c = get_class(cls)
    ls, rs, _ = c.shapes(Shape("t", 40, 24, 16, 4))
    gen = torch.Generator().manual_seed(3)
    lhs, rhs = torch.randn(ls, generator=gen), torch.randn(rs, generator=gen)
    sizes = torch.tensor([9, 0, 14, 10])  # 33 of 40 rows used
    dn = c.ragdot_dimension_numbers()
    ref = ragged_dot_general_oracle(lhs.to(dtype).double(), rhs.to(dtype).double(), sizes, dn)
    lhs[33:] = float("nan")
    if cls.startswith("wgrad"):
        rhs[33:] = float("nan")
    x, w = lhs.to(device, dtype), rhs.to(device, dtype)
    monkeypatch.setattr(api, "_CALLS", {})  # only this call's signature in the cache
    out = ragdot.ragged_dot_general(x, w, sizes.to(device), dn, backend="torch")
    (call,) = api._CALLS.values()
    assert call.direct is not None and call.runner.takes(call.direct)
    assert out.shape == ref.shape and torch.isfinite(out).all() and nerr(out, ref) <= TOL[dtype]
    x, w = x.nan_to_num(0).requires_grad_(), w.nan_to_num(0).requires_grad_()
    dy = torch.randn(ref.shape, generator=gen).to(device, dtype)
    grads = {}
    for backend in ("reference", "torch"):
        x.grad = w.grad = None
        ragdot.ragged_dot_general(x, w, sizes.to(device), dn, backend=backend).backward(dy)
        grads[backend] = (x.grad.clone(), w.grad.clone())
    for got, want in zip(grads["torch"], grads["reference"]):
        assert nerr(got, want.double()) <= TOL[dtype]


def _module_imports() -> dict[str, set[str]]:
    """ragdot module -> the ragdot modules it imports at module level (imports inside functions are lazy)."""
    import ast
    from pathlib import Path

    root = Path(ragdot.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = {node for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, (ast.Import, ast.ImportFrom))}
    edges: dict[str, set[str]] = {}
    for m, nodes in graph.items():
        deps = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif node.module:  # `from pkg import sub` imports the submodule, `from mod import name` the module
                subs = {f"{node.module}.{a.name}" for a in node.names} & graph.keys()
                deps.update(subs or {node.module})
        edges[m] = {d for d in deps if d in graph and d != m}
    return edges


def test_no_import_cycle_in_the_package():
    graph = _module_imports()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(d):], d]))
            if d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_op_imports_no_benchmark_code():
    core = ("ragdot.api", "ragdot.ops", "ragdot.groups", "ragdot.dimension_numbers", "ragdot.backends",
            "ragdot.kernels", "ragdot.tune.select", "ragdot.tune.key", "ragdot.tune.cache")
    graph = _module_imports()
    for m in graph:
        if m.startswith(core):
            assert not any(d.startswith("ragdot.bench") for d in graph[m]), m


@pytest.mark.skipif("triton" not in ragdot.backends(), reason="needs the triton backend")
@pytest.mark.parametrize("sizes,scale", [([5, -3, 9, 2], 1), ([40, 7, 0, 1], 1), ([3, 2, -1, 9], 2), ([0, 0, 0, 0], 1)])
def test_triton_kernels_form_the_clamped_ends_from_raw_sizes(sizes, scale):
    """The prepared kernels read raw sizes (negatives, sums past the extent, a scale) exactly as the ends."""
    from ragdot.groups import group_ends_from_sizes
    from ragdot.kernels import ragged_k as rk
    from ragdot.kernels import ragged_m as rm

    gen = torch.Generator().manual_seed(25)
    a = rand((1, 24, 16), torch.float32, DEV, gen)
    b = rand((1, 4, 16, 8), torch.float32, DEV, gen)
    raw = torch.tensor(sizes, dtype=torch.int64, device=DEV)
    ends = group_ends_from_sizes(raw, 24, scale)
    want = rm.ragged_m(a, b, ends)
    got = rm.Prepared(a, b, torch.float32, None, from_sizes=True, scale=scale)(a, b, raw)[0]
    assert torch.equal(got, want)
    b2 = rand((1, 24, 8), torch.float32, DEV, gen)
    want_k = rk.ragged_k(a, b2, ends)
    got_k = rk.Prepared(a, b2, 4, torch.float32, None, from_sizes=True, scale=scale)(a, b2, raw)[0]
    assert torch.equal(got_k, want_k)
    assert rk.schedule(raw, 24, scale)[3].tolist() == ends.tolist()


def test_unusable_backend_says_why_and_how(monkeypatch):
    from ragdot import api
    from ragdot.backends import unusable_reason

    monkeypatch.setattr(api, "available_backends", lambda: ["reference", "padded"])
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1|not installed"):  # a signature no other test uses
        ragdot.ragged_dot(torch.randn(5, 3), torch.randn(1, 3, 7), torch.tensor([5]), backend="triton")
    assert "_grouped_mm" in unusable_reason("torch")


def test_interleaved_signatures_never_share_a_cached_result():
    """Calls that differ in layout, dtypes, group-size dtype, backend and grad mode, interleaved in random
    order, each equal the oracle: a cached call or runner never serves another signature."""
    gen = torch.Generator().manual_seed(26)
    base = rand((40, 16), torch.float32, DEV, gen)
    wide = rand((40, 24), torch.float32, DEV, gen)
    w = rand((4, 16, 8), torch.float32, DEV, gen)
    variants = []
    for backend in BACKENDS:
        for lhs in (base, base.t().contiguous().t(), wide[:, 4:20]):  # row-major, column-major, strided view
            for sizes_dtype in (torch.int32, torch.int64):
                for grad in (False, True):
                    variants.append((backend, lhs, sizes_dtype, grad))
    order = torch.randperm(len(variants) * 2, generator=gen) % len(variants)
    for i in order.tolist():
        backend, lhs, sizes_dtype, grad = variants[i]
        sizes = torch.randint(0, 12, (4,), generator=gen).to(device=DEV, dtype=sizes_dtype)
        x = lhs.detach().requires_grad_(grad)
        out = ragdot.ragged_dot(x, w, sizes, backend=backend)
        ref = ragged_dot_general_oracle(lhs.cpu().double(), w.cpu().double(), sizes.cpu(), CASES["fwd_wi"][2])
        assert nerr(out, ref) <= TOL[torch.float32], (backend, sizes_dtype, grad)
        assert (out[int(sizes.clamp(min=0).sum()):] == 0).all()
        if grad:
            (dx,) = torch.autograd.grad(out.sum(), x)
            assert (dx[int(sizes.sum()):] == 0).all()


def _backward_grads(fn, lhs, rhs, cot, needs=(True, True)):
    a = lhs.detach().requires_grad_(needs[0])
    b = rhs.detach().requires_grad_(needs[1])
    fn(a, b).backward(cot)
    return a.grad, b.grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_bound_backward_is_bitwise_the_general_path(backend, case):
    """A signature's first backward runs the general path and binds its products (ragdot.grad_plan); later
    backwards run the bound products: the same values, bit for bit, and the oracle's."""
    lshape, rshape, dn = CASES[case]
    gen = torch.Generator().manual_seed(30)
    lhs, rhs = rand(lshape, torch.float32, DEV, gen), rand(rshape, torch.float32, DEV, gen)
    gs = _sizes()
    ref = ragged_dot_general_oracle(lhs.cpu().double().requires_grad_(), rhs.cpu().double().requires_grad_(),
                                    gs.cpu(), dn)
    cot = torch.randn(ref.shape, generator=gen).to(DEV)

    def fn(a, b):
        return ragdot.ragged_dot_general(a, b, gs, dn, backend=backend)

    runs = [_backward_grads(fn, lhs, rhs, cot) for _ in range(3)]
    for da, db in runs[1:]:
        assert torch.equal(da, runs[0][0]) and torch.equal(db, runs[0][1])
    l64, r64 = lhs.cpu().double().requires_grad_(), rhs.cpu().double().requires_grad_()
    rda, rdb = torch.autograd.grad(ragged_dot_general_oracle(l64, r64, gs.cpu(), dn), (l64, r64), cot.cpu().double())
    assert nerr(runs[-1][0], rda) <= TOL[torch.float32] and nerr(runs[-1][1], rdb) <= TOL[torch.float32]


def _only_call():
    from ragdot import api

    assert len(api._CALLS) == 1
    return next(iter(api._CALLS.values()))


@pytest.mark.parametrize("backend", [b for b in ("torch", "triton") if b in ragdot.backends()])
def test_the_moe_calls_backward_is_bound_and_survives_offsets_and_expanded_cotangents(backend, monkeypatch):
    from ragdot import api

    monkeypatch.setattr(api, "_CALLS", {})
    gen = torch.Generator().manual_seed(31)
    big = rand((50, 16), torch.float32, DEV, gen)
    rhs = rand((4, 16, 8), torch.float32, DEV, gen)
    gs = _sizes()
    w64 = rhs.cpu().double()
    for start in (0, 3, 7):  # the same signature at other storage offsets: the bound views follow the tensor
        lhs = big[start:start + 40]
        da, db = _backward_grads(lambda a, b: ragdot.ragged_dot(a, b, gs, backend=backend), lhs, rhs,
                                 torch.ones(40, 8, device=DEV))
        l64, r64 = lhs.cpu().double().requires_grad_(), w64.clone().requires_grad_()
        rda, rdb = torch.autograd.grad(ragged_dot_general_oracle(l64, r64, gs.cpu(), CASES["fwd_wi"][2]).sum(),
                                       (l64, r64))
        assert nerr(da, rda) <= TOL[torch.float32] and nerr(db, rdb) <= TOL[torch.float32]
    # an expanded cotangent (what .sum().backward() sends) is another backward key, bound as well
    for _ in range(2):
        x = big[:40].detach().requires_grad_()
        ragdot.ragged_dot(x, rhs, gs, backend=backend).sum().backward()
    call = _only_call()
    assert len(call.bwd) == 2 and all(bound is not None for bound in call.bwd.values())
    l64 = big[:40].cpu().double().requires_grad_()
    (rda,) = torch.autograd.grad(ragged_dot_general_oracle(l64, w64, gs.cpu(), CASES["fwd_wi"][2]).sum(), l64)
    assert nerr(x.grad, rda) <= TOL[torch.float32]


@pytest.mark.parametrize("backend", [b for b in ("torch", "triton") if b in ragdot.backends()])
def test_the_backward_of_a_transposed_weight_view_is_bound(backend, monkeypatch):
    """rhs = w.transpose(1, 2) ([E, out, in] weights): the weight gradient is ragged_k(dy, x) permuted into the
    view's strides; the key binds it (one as_strided) and the bound backward gives the first one's bits."""
    from ragdot import api

    monkeypatch.setattr(api, "_CALLS", {})
    gen = torch.Generator().manual_seed(33)
    lhs, w = rand((40, 16), torch.float32, DEV, gen), rand((4, 8, 16), torch.float32, DEV, gen)
    gs = _sizes()
    runs = [_backward_grads(lambda a, b: ragdot.ragged_dot(a, b.transpose(1, 2), gs, backend=backend), lhs, w,
                            torch.ones(40, 8, device=DEV)) for _ in range(3)]
    call = _only_call()
    assert len(call.bwd) == 1 and all(bound is not None for bound in call.bwd.values())
    for da, db in runs[1:]:
        assert torch.equal(da, runs[0][0]) and torch.equal(db, runs[0][1]) and db.is_contiguous()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bound_backward_with_one_gradient_shared_storage_and_double_backward(backend, monkeypatch):
    from ragdot import api

    monkeypatch.setattr(api, "_CALLS", {})
    gen = torch.Generator().manual_seed(32)
    lhs, rhs = rand((40, 16), torch.float32, DEV, gen), rand((4, 16, 8), torch.float32, DEV, gen)
    gs = _sizes()
    cot = rand((40, 8), torch.float32, DEV, gen)
    fn = lambda a, b: ragdot.ragged_dot(a, b, gs, backend=backend)  # noqa: E731
    l64, r64 = lhs.cpu().double().requires_grad_(), rhs.cpu().double().requires_grad_()
    rda, rdb = torch.autograd.grad(ragged_dot_general_oracle(l64, r64, gs.cpu(), CASES["fwd_wi"][2]), (l64, r64),
                                   cot.cpu().double())
    for _ in range(2):  # only one gradient needed: its own key
        _, db = _backward_grads(fn, lhs, rhs, cot, needs=(False, True))
        assert nerr(db, rdb) <= TOL[torch.float32]
        da, _ = _backward_grads(fn, lhs, rhs, cot, needs=(True, False))
        assert nerr(da, rda) <= TOL[torch.float32]
    # operands that share one storage are never bound; the general path still gives the right values
    buf = torch.cat([lhs.reshape(-1), rhs.reshape(-1)])
    a, b = buf[:640].view(40, 16), buf[640:].view(4, 16, 8)
    for _ in range(2):
        da, db = _backward_grads(fn, a, b, cot)
        assert nerr(da, rda) <= TOL[torch.float32] and nerr(db, rdb) <= TOL[torch.float32]
    # after binding, create_graph still differentiates the backward
    for _ in range(2):
        x, w = lhs.detach().requires_grad_(), rhs.detach().requires_grad_()
        (gx,) = torch.autograd.grad(fn(x, w), x, cot, create_graph=True)
        (gw,) = torch.autograd.grad(gx.sum(), w)
        assert gw.abs().sum() > 0


@pytest.mark.gpu
def test_bound_tma_launch_forms_descriptors_itself_and_follows_new_addresses():
    """Repeated TMA launches skip Triton's per-call descriptor wrapper (kernels/launch.py); the descriptors
    they form must describe the new operands' addresses exactly."""
    from ragdot.kernels import ragged_m

    gen = torch.Generator(device="cuda").manual_seed(33)
    a = torch.randn(1, 512, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(1, 4, 256, 384, device="cuda", dtype=torch.bfloat16, generator=gen)
    sizes = torch.tensor([100, 0, 200, 150], device="cuda", dtype=torch.int32)
    prepared = ragged_m.Prepared(a, b, torch.bfloat16, None, from_sizes=True)
    if not prepared.tma:
        pytest.skip("the heuristic's config uses no TMA on this GPU")
    first = prepared(a, b, sizes)[0]
    assert torch.equal(prepared(a, b, sizes)[0], first)
    entries = list(prepared.tma_launch._compiled.values())
    assert entries and entries[0][2] is not None, "the TMA launch was not bound"
    for _ in range(2):  # other operands at other addresses
        a2 = torch.randn(1, 512, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        out = prepared(a2, b, sizes)[0]
        ends = [100, 100, 300, 450]
        ref = torch.zeros(512, 384, dtype=torch.float64)
        start = 0
        for g, end in enumerate(ends):
            ref[start:end] = a2[0, start:end].double().cpu() @ b[0, g].double().cpu()
            start = end
        assert nerr(out[0], ref) <= TOL[torch.bfloat16]


def test_bound_descriptor_slots_keep_no_reference_to_the_first_calls_tensors():
    """The bound TMA slots compare later descriptors with the first call's layout only: holding the first
    descriptor would keep its base tensor alive, and with it that call's autograd graph (memory, and
    AccumulateGrad nodes recorded on that call's stream, which break a later CUDA-graph capture)."""
    import weakref

    from ragdot.kernels.launch import _Descriptors

    class Desc:  # what the slots read of Triton's TensorDescriptor
        def __init__(self, base):
            self.base, self.shape, self.strides, self.block_shape, self.padding = base, [4, 8], [8, 1], [4, 8], "zero"

    base = torch.randn(4, 8, requires_grad=True) * 2  # a non-leaf: it carries a graph
    ref = weakref.ref(base)
    meta = {"fp4_padded": False, "swizzle": 0, "elem_size": 4, "elem_type": "fp32", "block_size": [4, 8]}
    bound = [_Descriptors._slots((Desc(base),), [0], [meta], lambda *a: "filled", {"fp32": 0}),
             _Descriptors._slots((Desc(base),), [0], [None], lambda *a: None, {})]
    del base
    assert ref() is None
    for slots in bound:  # the same layout still takes the bound path
        assert _Descriptors(None, slots).expand((Desc(torch.zeros(4, 8)),)) is not None


def test_auto_moves_on_when_the_direct_call_is_refused_at_its_first_launch(monkeypatch):
    """A backend whose kernel turns out not to fit the device at its first launch (NotImplementedError from
    `ragdot.kernels.launch`) hands over to `auto`'s next candidate on the direct path too; a backend asked
    for by name says so in the error."""
    from ragdot.backends import torch_gmm

    def refuse(self, *args, **kwargs):
        raise NotImplementedError("kernel: out of resource: shared memory")

    monkeypatch.setattr(torch_gmm._PreparedGMM, "direct", refuse)
    ragdot.api._CALLS.clear()
    ragdot.ops._RUNNERS.clear()
    x, w = torch.randn(10, 8), torch.randn(3, 8, 6)
    sizes = torch.tensor([3, 3, 4])
    want = ragdot.ragged_dot(x, w, sizes, backend="reference")
    torch.testing.assert_close(ragdot.ragged_dot(x, w, sizes, backend="auto"), want)
    torch.testing.assert_close(ragdot.ragged_dot(x, w, sizes, backend="auto"), want)  # the runner moved on
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ragdot.ragged_dot(xr, wr, sizes, backend="auto").sum().backward()
    assert xr.grad is not None and wr.grad is not None
    with pytest.raises(NotImplementedError, match="backend 'torch' cannot compute this ragged_m problem: kernel"):
        ragdot.ragged_dot(x, w, sizes, backend="torch")
    ragdot.api._CALLS.clear()
    ragdot.ops._RUNNERS.clear()


def test_a_full_cache_is_kept_while_a_graph_is_captured(monkeypatch):
    """During a CUDA graph capture a full cache grows instead of starting over (what the capture's warm-up
    prepared stays), and starts over at its next miss outside the capture."""
    from ragdot import _memo

    cache = {i: i for i in range(3)}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    _memo.remember(cache, "during", 0, 3)
    assert set(cache) == {0, 1, 2, "during"}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    _memo.remember(cache, "after", 0, 3)
    assert set(cache) == {"after"}


def test_signature_caches_stay_bounded_and_give_the_same_values(monkeypatch):
    """A cache that would pass its limit starts over (`ragdot._memo.remember`): many distinct signatures (here five
    row counts through caches of three) never grow it past the limit, and a signature seen again after the reset
    is prepared anew with the same values."""
    from ragdot import api, ops

    monkeypatch.setattr(api, "_CALLS", {})
    monkeypatch.setattr(api, "_MAX_CALLS", 3)
    monkeypatch.setattr(ops, "_RUNNERS", {})
    monkeypatch.setattr(ops, "_MAX_RUNNERS", 3)
    gen = torch.Generator().manual_seed(25)
    rhs = rand((4, 16, 8), torch.float32, DEV, gen)
    lhs = {m: rand((m, 16), torch.float32, DEV, gen) for m in (40, 41, 42, 43, 44)}
    first = {m: ragdot.ragged_dot(x, rhs, _sizes(), backend="reference") for m, x in lhs.items()}
    assert 1 <= len(api._CALLS) <= 3 and 1 <= len(ops._RUNNERS) <= 3
    for m, x in lhs.items():
        assert torch.equal(ragdot.ragged_dot(x, rhs, _sizes(), backend="reference"), first[m])
    assert len(api._CALLS) <= 3 and len(ops._RUNNERS) <= 3
