"""Argument checking, `validate`, backend names, torch.compile and property-based dimension numbers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdot
from helpers import GENERAL_BACKENDS, JAX_SHAPE_ERRORS, TOL, nerr
from oracle import ragged_dot_general_oracle
from ragdot import RaggedDotDimensionNumbers as DN

FWD = DN((((1,), (1,)), ((), ())), (0,), (0,))
WGRAD = DN((((0,), (0,)), ((), ())), (0,), ())


def _args(m=10, k=8, n=6, g=3):
    return torch.randn(m, k), torch.randn(g, k, n), torch.tensor([3, 3, 4][:g] + [0] * max(0, g - 3))


def test_backends_lists_the_always_available_ones():
    names = ragdot.backends()
    assert {"reference", "padded"} <= set(names)
    assert set(names) <= {"reference", "padded", "torch", "triton", "gluon"}


def test_unknown_backend_raises_value_error():
    lhs, rhs, gs = _args()
    with pytest.raises(ValueError, match="backend='cutlass' is unknown"):
        ragdot.ragged_dot(lhs, rhs, gs, backend="cutlass")
    with pytest.raises(TypeError, match="backend must be"):
        ragdot.ragged_dot(lhs, rhs, gs, backend=3)


@pytest.mark.parametrize(
    "mutate,exc,pattern",
    [
        (lambda x, r, g: (x.int(), r.int(), g), TypeError, "lhs must be float16"),
        (lambda x, r, g: (x, r, g.float()), TypeError, "group_sizes must be an integer"),
        (lambda x, r, g: (x, r, g[None]), ValueError, "group_sizes must be 1-D"),
        (lambda x, r, g: (x, r, g[None]), TypeError, "group_sizes must be 1-D"),  # as jax raises: both
        (lambda x, r, g: (x, r, g[:2]), ValueError, "group_sizes has 2 entries"),
        (lambda x, r, g: (x[:, :5], r, g), ValueError, "contracting dimensions differ in size"),
        (lambda x, r, g: (x[None], r, g), ValueError, "ragged_dot expects lhs of rank 2"),
        (lambda x, r, g: (x.numpy(), r, g), TypeError, "lhs must be a torch.Tensor"),
    ],
    ids=["int_operands", "float_sizes", "2d_sizes", "2d_sizes_type", "g_mismatch", "k_mismatch",
         "rank", "numpy"],
)
def test_bad_arguments_raise_clear_errors(mutate, exc, pattern):
    with pytest.raises(exc, match=pattern):
        ragdot.ragged_dot(*mutate(*_args()))


@pytest.mark.parametrize(
    "dn,rhs_shape,pattern",
    [
        (DN((((1,), (1,)), ((), ())), (0,), ()), (3, 8, 6), "must name rhs's group dimension"),
        (DN((((1,), (1,)), ((), ())), (0, 1), (0,)), (3, 8, 6), "exactly one dimension"),
        (DN((((0,), (0,)), ((), ())), (0,), (1,)), (10, 3, 6), "must be empty when the lhs ragged dimension is"),
        (DN((((1,), (1,)), ((0,), (0,))), (0,), (2,)), (10, 8, 3), "must be empty when the lhs ragged dimension is"),
        (DN((((1,), (1,)), ((), ())), (5,), (0,)), (3, 8, 6), "lhs ragged dimension 5 is out of range"),
        (DN((((1,), (1, 2)), ((), ())), (0,), (0,)), (3, 8, 6), "as many contracting dimensions"),
        (DN((((1,), (0,)), ((), ())), (0,), (0,)), (3, 8, 6), "must be distinct"),
        (DN((((1,), (1,)), ((0,), (0,))), (0,), (2,)), (9, 8, 3), "batch dimensions differ in size"),
    ],
)
def test_bad_dimension_numbers(dn, rhs_shape, pattern):
    lhs, _, gs = _args()
    rhs = torch.randn(rhs_shape)
    with pytest.raises(ValueError, match=pattern):
        ragdot.ragged_dot_general(lhs, rhs, gs, dn)


@pytest.mark.parametrize("lhs_shape,rhs_shape,sizes_shape,dims,phrase", JAX_SHAPE_ERRORS)
def test_shape_errors_are_type_errors_in_jax_s_words(lhs_shape, rhs_shape, sizes_shape, dims, phrase):
    """Code written against jax's ragged_dot_general (which raises TypeError with these phrases) matches
    ragdot's errors; ragdot's own detail follows the phrase."""
    with pytest.raises(TypeError, match=phrase):
        ragdot.ragged_dot_general(torch.ones(lhs_shape), torch.ones(rhs_shape),
                                  torch.ones(sizes_shape, dtype=torch.int32), DN(*dims))


def test_dimension_numbers_type_errors():
    with pytest.raises(TypeError, match="dot_dimension_numbers must be"):
        DN((1, 2, 3), (0,), (0,))
    with pytest.raises(TypeError, match="must contain ints"):
        DN((((1.0,), (1,)), ((), ())), (0,), (0,))
    with pytest.raises(TypeError, match="ragged_dot_dimension_numbers must be"):
        ragdot.ragged_dot_general(*_args(), "fwd")


def test_group_sizes_as_a_list_or_numpy_array():
    import numpy as np

    lhs, rhs, gs = _args()
    expected = ragdot.ragged_dot(lhs, rhs, gs, backend="reference")
    assert torch.equal(ragdot.ragged_dot(lhs, rhs, gs.tolist(), backend="reference"), expected)
    assert torch.equal(ragdot.ragged_dot(lhs, rhs, np.array(gs.tolist()), backend="reference"), expected)
    with pytest.raises(TypeError, match="group_sizes must be an integer"):
        ragdot.ragged_dot(lhs, rhs, [1.5, 2.0, 3.0])
    with pytest.raises(TypeError, match="group_sizes must be a"):
        ragdot.ragged_dot(lhs, rhs, "3,3,4")


def test_explain_names_the_problem_and_what_would_run():
    x, w, gs = torch.randn(64, 32), torch.randn(4, 32, 16), torch.tensor([10, 20, 0, 34])
    info = ragdot.explain(x, w, gs)
    assert info["problem"] == "ragged_m" and info["plan"][0][0] in ragdot.backends()
    assert info["key"] is None and info["tuned"] is False  # measured entries exist for GPUs only
    assert ragdot.explain(x, w, gs, backend="reference")["plan"] == [("reference", None)]
    dn = DN((([0], [0]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])  # weight gradient
    assert ragdot.explain(x, torch.randn(64, 16), gs, dn)["problem"] == "ragged_k"
    with pytest.raises(ValueError, match="backend"):
        ragdot.explain(x, w, gs, backend="nope")


def test_preferred_element_type_must_be_a_float_dtype():
    with pytest.raises(TypeError, match="preferred_element_type"):
        ragdot.ragged_dot(*_args(), preferred_element_type=torch.int32)


@pytest.mark.parametrize("backend", GENERAL_BACKENDS)
def test_validate_names_the_offending_group(backend, monkeypatch, device):
    lhs, rhs, _ = (t.to(device) for t in _args())
    with pytest.raises(ValueError, match=r"group_sizes\[1\] = -2 is negative"):
        ragdot.ragged_dot(lhs, rhs, torch.tensor([3, -2, 4]), validate=True, backend=backend)
    with pytest.raises(ValueError, match="sum to 11 by group 2, beyond the ragged dimension's size 10"):
        ragdot.ragged_dot(lhs, rhs, torch.tensor([3, 3, 5]), validate=True, backend=backend)
    with pytest.raises(ValueError, match="by group 0"):
        ragdot.ragged_dot_general(lhs, torch.randn(10, 4, device=device), torch.tensor([11, 0, 0]), WGRAD,
                                  validate=True)
    monkeypatch.setenv("RAGDOT_VALIDATE", "1")
    with pytest.raises(ValueError, match="is negative"):
        ragdot.ragged_dot(lhs, rhs, torch.tensor([3, -2, 4]), backend=backend)
    monkeypatch.setenv("RAGDOT_VALIDATE", "0")
    out = ragdot.ragged_dot(lhs, rhs, torch.tensor([3, -2, 4]), backend=backend)  # negatives count as 0
    assert (out[7:] == 0).all()


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("0", False), ("", False), (None, False)])
def test_validate_env_is_read_on_every_call(value, on, monkeypatch):
    """RAGDOT_VALIDATE set or changed at run time counts at once (it is read from os.environ's own store)."""
    from ragdot.groups import validate_requested

    monkeypatch.setenv("RAGDOT_VALIDATE", "1")
    assert validate_requested()
    if value is None:
        monkeypatch.delenv("RAGDOT_VALIDATE")
    else:
        monkeypatch.setenv("RAGDOT_VALIDATE", value)
    assert validate_requested() is on


def test_compiled_call_ignores_unrelated_environment_changes(monkeypatch):
    """Under torch.compile RAGDOT_VALIDATE is read as the call is traced, through os.environ.get: dynamo
    guards that key only, so setting any other variable does not recompile the graph (reading os.environ's
    own store while tracing made every variable a guard)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    lhs, rhs, sizes = _args()
    fn = torch.compile(lambda a, b, s: ragdot.ragged_dot(a, b, s), backend=counter, fullgraph=True)
    want = ragdot.ragged_dot(lhs, rhs, sizes)
    torch.testing.assert_close(fn(lhs, rhs, sizes), want)
    monkeypatch.setenv("RAGDOT_SOME_UNRELATED_VARIABLE", "1")
    torch.testing.assert_close(fn(lhs, rhs, sizes), want)
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_custom_ops_pass_opcheck():
    from ragdot import ops

    a, b = torch.randn(1, 12, 8), torch.randn(1, 3, 8, 5)
    sizes = torch.tensor([4, 0, 6], dtype=torch.int32)  # 2 of 12 rows outside every group
    torch.library.opcheck(ops.ragged_m_op, (a, b, sizes, torch.float32, "reference", 1))
    torch.library.opcheck(ops.ragged_k_op, (a, torch.randn(1, 12, 6), sizes, torch.float32, "reference", 1))
    torch.library.opcheck(ops.batch_op, (a, torch.randn(1, 8, 4), torch.float32, "reference"))


@pytest.mark.parametrize("backend", GENERAL_BACKENDS)
def test_out_variants_write_every_element_of_a_poisoned_buffer(backend, device):
    gen = torch.Generator().manual_seed(3)
    dtype = torch.float32 if backend != "gluon" else torch.bfloat16
    a = torch.randn(1, 12, 8, generator=gen).to(device, dtype)  # 16-byte rows (what gluon takes)
    sizes = torch.tensor([4, 0, 6], dtype=torch.int32, device=device)  # rows 10, 11 outside every group
    a[0, 10:] = float("nan")
    cases = [
        ("ragged_m", torch.ops.ragdot.ragged_m, (a, torch.randn(1, 3, 8, 8, generator=gen).to(device, dtype), sizes)),
        ("ragged_k", torch.ops.ragdot.ragged_k, (a, torch.randn(1, 12, 8, generator=gen).to(device, dtype), sizes)),
    ]
    for name, op, (x, y, s) in cases:
        want = op.default(x, y, s, dtype, backend, 1)
        out = torch.full_like(want, float("nan"))  # what inductor hands over may hold anything
        got = op.out(x, y, s, dtype, backend, 1, out=out)
        assert got is out and torch.equal(out, want), name
    x, y = torch.randn(2, 3, 4, generator=gen).to(device, dtype), torch.randn(2, 4, 5, generator=gen).to(device, dtype)
    want = torch.ops.ragdot.batch.default(x, y, dtype, backend)
    out = torch.full_like(want, float("nan"))
    assert torch.equal(torch.ops.ragdot.batch.out(x, y, dtype, backend, out=out), want)
    args = (*cases[0][2], dtype, backend, 1)
    out = torch.empty(1, 12, 8, dtype=dtype, device=device)
    # schema and fake kernel; not traced by AOT autograd (only inductor's generated code calls an .out overload)
    torch.library.opcheck(torch.ops.ragdot.ragged_m.out, args, {"out": out},
                          test_utils=("test_schema", "test_faketensor"))


def test_inductor_finds_the_out_variants():
    out_variant = pytest.importorskip("torch._library._out_variant")
    for name in ("ragged_m", "ragged_k", "batch"):
        packet = getattr(torch.ops.ragdot, name)
        assert out_variant.to_out_variant(packet.default) is packet.out


def test_torch_compile_fullgraph_traces_a_model():
    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 8, 6))

        def forward(self, x, gs):
            return torch.relu(ragdot.ragged_dot(x, self.w, gs, backend="reference")).sum()

    model = Experts()
    x = torch.randn(10, 8, requires_grad=True)
    gs = torch.tensor([4, 0, 5])
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(x, gs)
    loss.backward()
    gx, gw = x.grad.clone(), model.w.grad.clone()
    x.grad = None
    model.w.grad = None
    model(x, gs).backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, model.w.grad)


@st.composite
def _problem(draw):
    """A random call: its mode, up to two batch and two contracting dimensions, zero to two free rhs
    dimensions, every dimension order, group sizes with negatives, zeros, tails and overflow."""
    mode = draw(st.sampled_from(["ragged_m", "ragged_k", "batch"]))
    nb = draw(st.integers(0, 2))
    sizes = {"b": draw(st.integers(1, 3)), "c": draw(st.integers(1, 2)), "m": draw(st.integers(0, 13)),
             "k": draw(st.integers(1, 9)), "k2": draw(st.integers(1, 3)), "n": draw(st.integers(1, 7)),
             "n2": draw(st.integers(1, 3)), "g": draw(st.integers(1, 5))}
    batch = ["b", "c"][:nb]
    contract = ["k", "k2"][:draw(st.integers(1, 2))]
    free = ["n", "n2"][:draw(st.integers(0 if mode != "batch" else 1, 2))]
    lhs_dims = ["m", *contract, *batch]
    rhs_dims = [*contract, *free, *batch] + (["g"] if mode == "ragged_m" else [])
    if mode == "ragged_k":
        rhs_dims.append("m2")
    if mode == "batch" and not nb:
        lhs_dims.append("b")
        rhs_dims.append("b")
        batch = ["b"]
    lperm = draw(st.permutations(lhs_dims))
    rperm = draw(st.permutations(rhs_dims))
    ragged = {"ragged_m": "m", "ragged_k": "m", "batch": "b"}[mode]
    lc, rc = tuple(lperm.index(d) for d in contract), tuple(rperm.index(d) for d in contract)
    if mode == "ragged_k":  # contract the ragged rows too: lhs [m, k...] x rhs [m, n...] over m
        lc, rc = (*lc, lperm.index("m")), (*rc, rperm.index("m2"))
    lb, rb = tuple(lperm.index(d) for d in batch), tuple(rperm.index(d) for d in batch)
    rg = (rperm.index("g"),) if mode == "ragged_m" else ()
    dn = DN(((lc, rc), (lb, rb)), (lperm.index(ragged),), rg)
    shape_of = {**sizes, "m2": sizes["m"]}
    lshape = tuple(shape_of[d] for d in lperm)
    rshape = tuple(shape_of[d] for d in rperm)
    g = sizes["g"]
    group_sizes = draw(st.lists(st.integers(-2, 6), min_size=g, max_size=g))
    return lshape, rshape, dn, group_sizes


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=_problem(), backend=st.sampled_from(GENERAL_BACKENDS), grads=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_random_dimension_numbers_match_oracle(problem, backend, grads, seed):
    """Errors are measured against the same products of the operands' absolute values (`nerr`'s scale): with
    contractions of a few random terms, what is left after they cancel can be far smaller than their rounding."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lshape, rshape, dn, group_sizes = problem
    gen = torch.Generator().manual_seed(seed)
    lhs, rhs = torch.randn(lshape, generator=gen), torch.randn(rshape, generator=gen)
    gs = torch.tensor(group_sizes, dtype=torch.int32)
    x, w = lhs.to(device).requires_grad_(grads), rhs.to(device).requires_grad_(grads)
    out = ragdot.ragged_dot_general(x, w, gs.to(device), dn, backend=backend)
    x64, w64 = lhs.double().requires_grad_(grads), rhs.double().requires_grad_(grads)
    ref = ragged_dot_general_oracle(x64, w64, gs, dn)
    xa, wa = lhs.double().abs().requires_grad_(grads), rhs.double().abs().requires_grad_(grads)
    scale = ragged_dot_general_oracle(xa, wa, gs, dn)  # sums of |products|, the same ragged structure
    assert out.shape == ref.shape
    assert nerr(out, ref, scale) <= TOL[torch.float32]
    if grads and ref.numel():
        ct = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
        got = torch.autograd.grad(out, (x, w), ct.float().to(device), allow_unused=True)
        want = torch.autograd.grad(ref, (x64, w64), ct, allow_unused=True)
        bounds = torch.autograd.grad(scale, (xa, wa), ct.abs(), allow_unused=True)
        for g, r, b, t in zip(got, want, bounds, (x64, w64)):
            g = torch.zeros(t.shape) if g is None else g
            r = torch.zeros_like(t) if r is None else r
            b = torch.zeros_like(t) if b is None else b
            assert nerr(g, r, b) <= TOL[torch.float32]


@pytest.mark.parametrize("ldt,rdt,want", [(torch.bfloat16, torch.float32, torch.float32),
                                          (torch.float16, torch.bfloat16, torch.float32),
                                          (torch.float32, torch.float64, torch.float64)])
def test_mixed_float_operands_are_promoted_as_jax_does(ldt, rdt, want):
    lhs, rhs, gs = _args()
    x, w = lhs.to(ldt).requires_grad_(), rhs.to(rdt).requires_grad_()
    out = ragdot.ragged_dot(x, w, gs)
    ref = ragged_dot_general_oracle(x.detach().to(want), w.detach().to(want), gs, FWD)
    assert out.dtype == want and nerr(out, ref) <= TOL[want]
    out.sum().backward()
    assert x.grad.dtype == ldt and w.grad.dtype == rdt


def test_dimension_numbers_hash_on_first_use_not_when_built():
    """Dimension numbers built inside a function compiled with fullgraph=True must trace: torch 2.11's dynamo
    cannot trace hash() of a tuple, so building them hashes nothing; equal ones hash equal as keys."""
    dn = ragdot.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (0,), (0,))
    assert "_hash" not in vars(dn)
    same = ragdot.RaggedDotDimensionNumbers([[[1], [1]], [[], []]], [0], [0])
    assert dn == same and hash(dn) == hash(same) and {dn: 1}[same] == 1
    assert hash(dn) == hash(dn) and "_hash" in vars(dn)

    def f(a, b, s):
        inner = ragdot.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (0,), (0,))
        return ragdot.ragged_dot_general(a, b, s, inner, backend="reference")

    a, b, s = torch.randn(6, 4), torch.randn(2, 4, 3), torch.tensor([2, 3])
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(a, b, s), f(a, b, s))


@pytest.mark.parametrize("sizes_device", ["cpu", "meta"])
def test_meta_operands_give_shapes_dtypes_and_gradients_without_running(sizes_device):
    """Meta tensors (shape inference, a model built on the meta device) take the custom ops' fake kernels, in
    all three modes and through autograd; validate checks the sizes where they hold values (not meta sizes)."""
    lhs = torch.empty(12, 8, device="meta", requires_grad=True)
    rhs = torch.empty(3, 8, 4, device="meta", requires_grad=True)
    sizes = torch.tensor([4, 4, 4], device=sizes_device)
    out = ragdot.ragged_dot(lhs, rhs, sizes, preferred_element_type=torch.float64, validate=True)
    assert (out.shape, out.device, out.dtype) == (torch.Size([12, 4]), torch.device("meta"), torch.float64)
    out.sum().backward()
    assert lhs.grad.shape == lhs.shape and rhs.grad.shape == rhs.shape and lhs.grad.is_meta
    dn = DN(dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=())
    assert ragdot.ragged_dot_general(lhs, torch.empty(12, 5, device="meta"), sizes, dn).shape == (3, 8, 5)
    offs = torch.empty(3, dtype=torch.int32, device="meta")
    assert ragdot.grouped_mm(lhs.detach(), rhs.detach(), offs).shape == (12, 4)
    with pytest.raises(ValueError, match="contracting dimensions differ"):
        ragdot.ragged_dot(lhs, torch.empty(3, 7, 4, device="meta"), sizes)
    past_m = torch.tensor([4, 9, 4], device=sizes_device)
    if sizes_device == "meta":  # no values: nothing to refuse
        assert ragdot.ragged_dot(lhs, rhs, past_m, validate=True).shape == (12, 4)
    else:  # host sizes hold values: validate reads them as for any call
        with pytest.raises(ValueError, match="beyond the ragged dimension's size 12"):
            ragdot.ragged_dot(lhs, rhs, past_m, validate=True)


def test_an_moe_layer_runs_forward_and_backward_on_the_meta_device():
    from ragdot.moe import MoELayer

    with torch.device("meta"):
        layer = MoELayer(64, 32, 8, 2, num_shared_experts=1)
        x = torch.empty(2, 16, 64, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape and y.is_meta
    (y.sum() + layer.aux_loss + layer.z_loss).backward()
    assert layer.w_gate_up.grad.shape == layer.w_gate_up.shape and x.grad.is_meta


@pytest.mark.parametrize("problem", ["ragged_m", "ragged_k", "batch"])
def test_flop_counter_counts_each_product_as_its_dense_product(problem):
    """Under torch.utils.flop_counter.FlopCounterMode an eager call is one ragdot op (the dense product's FLOPs:
    2 x rows x contraction x columns), the backward two more of the same size; the values are the eager call's."""
    from torch.utils.flop_counter import FlopCounterMode

    gen = torch.Generator().manual_seed(5)
    m, k, n, g = 12, 8, 4, 3
    lhs = torch.randn(m, k, generator=gen, requires_grad=True)
    sizes = torch.tensor([4, 0, 6])  # rows past the groups are not computed, but a shape cannot say how many
    if problem == "ragged_m":
        rhs = torch.randn(g, k, n, generator=gen)
        dn = DN(dot_dimension_numbers=(((1,), (1,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=(0,))
    elif problem == "ragged_k":
        rhs = torch.randn(m, n, generator=gen)
        dn = DN(dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=())
    else:
        lhs = torch.randn(2, m, k, generator=gen, requires_grad=True)
        rhs = torch.randn(2, k, n, generator=gen)
        dn = DN(dot_dimension_numbers=(((2,), (1,)), ((0,), (0,))), lhs_ragged_dimensions=(0,),
                rhs_group_dimensions=())
    rhs.requires_grad_(True)
    want = ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend="reference")
    with FlopCounterMode(display=False) as counter:
        out = ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend="reference")
        forward = counter.get_total_flops()
        out.sum().backward()
    dense = 2 * (2 if problem == "batch" else 1) * m * k * n
    assert forward == dense and counter.get_total_flops() == 3 * dense
    assert f"ragdot.{problem}" in {str(op) for op in counter.get_flop_counts()["Global"]}
    assert torch.equal(out, want)


def test_fake_tensor_mode_gives_shapes_and_gradients():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        lhs = torch.randn(12, 8, requires_grad=True)
        rhs = torch.randn(3, 8, 4, requires_grad=True)
        out = ragdot.ragged_dot(lhs, rhs, torch.tensor([4, 4, 4]))
        out.sum().backward()
        assert out.shape == (12, 4) and rhs.grad.shape == rhs.shape


def test_selective_checkpointing_sees_the_products_and_keeps_the_gradients():
    """torch.utils.checkpoint's selective policy (torchtitan's op-level SAC) is asked about ragdot's products as
    ops, and saving them leaves the values and gradients bitwise those of the unchecked call."""
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    seen: set[str] = set()

    def policy(ctx, op, *args, **kwargs):
        seen.add(str(op.overloadpacket) if hasattr(op, "overloadpacket") else str(op))
        return CheckpointPolicy.MUST_SAVE if str(op).startswith("ragdot.") else CheckpointPolicy.PREFER_RECOMPUTE

    gen = torch.Generator().manual_seed(2)
    lhs = torch.randn(12, 8, generator=gen, requires_grad=True)
    rhs = torch.randn(3, 8, 4, generator=gen, requires_grad=True)
    sizes = torch.tensor([4, 5, 2])

    def f(a, b):
        return torch.nn.functional.silu(ragdot.ragged_dot(a, b, sizes)).sum()

    want = torch.autograd.grad(f(lhs, rhs), (lhs, rhs))
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    got = torch.autograd.grad(checkpoint(f, lhs, rhs, use_reentrant=False, context_fn=context), (lhs, rhs))
    assert "ragdot.ragged_m" in seen
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_dtensor_operand_is_refused_naming_to_local(tmp_path):
    """DTensor operands get one clear TypeError (ragdot multiplies each rank's local tensors), not an error from
    deep inside a backend."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of another test")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        # a signature no plain call of this process has had: the check runs where a signature is first seen
        lhs, rhs, sizes = torch.randn(14, 6), torch.randn(3, 6, 5), torch.tensor([4, 4, 4])
        for which in ("lhs", "rhs"):
            args = {"lhs": lhs, "rhs": rhs}
            args[which] = distribute_tensor(args[which], mesh, [Replicate()])
            with pytest.raises(TypeError, match=f"{which} is a DTensor: .* {which}.to_local()"):
                ragdot.ragged_dot(args["lhs"], args["rhs"], sizes)
    finally:
        dist.destroy_process_group()
