"""Routing metadata and the permute / unpermute ops, Triton kernels (interpreter on CPU) against torch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import nerr
from ragdot.moe import permute, unpermute
from ragdot.moe import routing_kernels as rk

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
IMPLS = ["torch"] + (["triton"] if rk.HAS_TRITON else [])

# (tokens, top_k, experts, pattern): each case commented with what it exercises
CASES = {
    "random": (37, 2, 5, "random"),  # 74 assignments: one partial sort block
    "multi_block": (300, 4, 16, "random"),  # 1200 assignments: ten sort blocks, scan across blocks
    "one_token": (1, 1, 1, "random"),  # smallest problem, one expert
    "top_k_equals_e": (50, 6, 6, "random"),  # every token picks every expert
    "one_hot_expert": (200, 1, 9, "one"),  # all tokens to one expert, the others empty
    "many_empty": (20, 2, 130, "random"),  # E > assignments, E not a power of two
    "skewed_sorted": (160, 3, 7, "sorted"),  # already grouped input keeps its order
}


def _experts(tokens: int, k: int, e: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    if pattern == "one":
        return torch.full((tokens, k), e // 2, dtype=torch.int64)
    if pattern == "sorted":
        return (torch.arange(tokens * k) * e // (tokens * k)).view(tokens, k)
    return torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)])


def _case(name: str, dtype=torch.float32, dim: int = 24):
    tokens, k, e, pattern = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    x = torch.randn(tokens, dim, generator=gen).to(DEV, dtype)
    experts = _experts(tokens, k, e, pattern, gen).to(DEV)
    weights = torch.rand(tokens, k, generator=gen).to(DEV)
    return x, experts, weights, e


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(CASES))
def test_metadata_invariants(case, impl):
    x, experts, _, e = _case(case)
    tokens, k = experts.shape
    rows, routing = permute(x, experts, e, impl=impl)
    sizes, slots = routing.group_sizes.cpu(), routing.slots.cpu().long()
    assert sizes.dtype == torch.int32 and routing.slots.dtype == torch.int32
    assert torch.equal(sizes.long(), torch.bincount(experts.flatten().cpu(), minlength=e))
    assert int(sizes.sum()) == tokens * k
    assert torch.equal(slots.sort().values, torch.arange(tokens * k))  # a bijection onto the rows
    order = routing.order().cpu()
    assert torch.equal(order[slots], torch.arange(tokens * k))  # the inverse restores assignment order
    held = experts.flatten().cpu()[order]
    assert (held[1:] >= held[:-1]).all()  # rows grouped by expert, in expert order
    same = held[1:] == held[:-1]
    assert (order[1:][same] > order[:-1][same]).all()  # stable: assignment order kept inside each expert
    assert torch.equal(rows.cpu()[slots], x.cpu().repeat_interleave(k, dim=0))  # rows are exact copies


@settings(max_examples=12, deadline=None)
@given(
    tokens=st.integers(1, 90),
    experts=st.integers(1, 40),
    top_k=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    impl=st.sampled_from(IMPLS),
)
def test_random_routings_keep_the_invariants(tokens, experts, top_k, seed, impl):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen).to(DEV)  # repeats allowed: still exact
    x = torch.randn(tokens, 8, generator=gen).to(DEV)
    rows, routing = permute(x, ids, experts, impl=impl)
    sizes, slots = routing.group_sizes.cpu().long(), routing.slots.cpu().long()
    assert torch.equal(sizes, torch.bincount(ids.flatten().cpu(), minlength=experts))
    assert torch.equal(slots.sort().values, torch.arange(tokens * top_k))
    held = ids.flatten().cpu()[routing.order().cpu()]
    assert torch.equal(held, ids.flatten().cpu().sort(stable=True).values)
    assert torch.equal(routing.order().cpu(), ids.flatten().cpu().sort(stable=True).indices)  # stable order
    assert nerr(unpermute(rows, routing), x * top_k) <= 1e-6


@pytest.mark.skipif(not rk.HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "case,dim",
    [
        ("multi_block", 40),  # dim not a multiple of the column block
        ("multi_block", 300),  # several column slices per row block: split grid, partial weight grads
        ("one_hot_expert", 40),
        ("many_empty", 40),
    ],
)
def test_triton_matches_torch(case, dim, dtype):
    x, experts, weights, e = _case(case, dtype, dim=dim)
    out = {}
    for impl in ("triton", "torch"):
        xg = x.clone().requires_grad_(True)
        wg = weights.clone().requires_grad_(True)
        rows, routing = permute(xg, experts, e, impl=impl)
        scaled = rows * torch.linspace(
            0.5, 1.5, rows.shape[1], device=DEV, dtype=dtype
        )  # rows get distinct grads
        y = unpermute(scaled, routing, wg)
        y.backward(torch.ones_like(y))
        out[impl] = (rows, routing.slots, routing.group_sizes, y, xg.grad, wg.grad)
    t, r = out["triton"], out["torch"]
    for i in range(3):  # metadata and copied rows: bitwise
        assert torch.equal(t[i], r[i])
    for a, b in zip(t[3:], r[3:], strict=True):
        assert nerr(a, b) <= (1e-6 if dtype == torch.float32 else 1e-3)


@pytest.mark.parametrize("impl", IMPLS)
def test_unpermute_and_gradients_match_dense_reference(impl):
    x, experts, weights, e = _case("multi_block", torch.float32)
    xg = x.clone().double().requires_grad_(True)
    wg = weights.clone().double().requires_grad_(True)
    # reference: y[t] = sum_j w[t, j] * f(x[t], expert) with f = per-expert scale, computed densely
    scale = torch.arange(1, e + 1, device=DEV, dtype=torch.float64)
    ref = (xg[:, None, :] * scale[experts][..., None] * wg[..., None]).sum(1)
    ref_gx, ref_gw = torch.autograd.grad(ref.square().sum(), (xg, wg))
    xf = x.clone().requires_grad_(True)
    wf = weights.clone().requires_grad_(True)
    rows, routing = permute(xf, experts, e, impl=impl)
    expert_of_row = torch.repeat_interleave(torch.arange(e, device=DEV), routing.group_sizes.long())
    y = unpermute(rows * scale[expert_of_row, None].float(), routing, wf)
    gx, gw = torch.autograd.grad(y.square().sum(), (xf, wf))
    assert nerr(y, ref) <= 1e-6 and nerr(gx, ref_gx) <= 1e-6 and nerr(gw, ref_gw) <= 1e-6


@pytest.mark.parametrize("impl", IMPLS)
def test_unweighted_unpermute_is_adjoint_sum(impl):
    x, experts, _, e = _case("random")
    rows, routing = permute(x, experts, e, impl=impl)
    y = unpermute(rows, routing)  # every choice counted once: k * x
    assert nerr(y, x * experts.shape[1]) <= 1e-7


@pytest.mark.parametrize("impl", IMPLS)
def test_deterministic_run_to_run(impl):
    x, experts, weights, e = _case("multi_block")
    results = []
    for _ in range(2):
        xg, wg = x.clone().requires_grad_(True), weights.clone().requires_grad_(True)
        rows, routing = permute(xg, experts, e, impl=impl)
        y = unpermute(rows * 1.5, routing, wg)
        y.backward(torch.full_like(y, 0.25))
        results.append((y, xg.grad, wg.grad))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("impl", IMPLS)
def test_out_of_range_experts_are_clamped_or_rejected(impl):
    x, experts, _, e = _case("random")
    bad = experts.clone()
    bad[0, 0], bad[1, 1] = -3, e + 7
    rows, routing = permute(x, bad, e, impl=impl)  # memory safe: clamped into [0, E)
    assert torch.equal(routing.slots.cpu().long().sort().values, torch.arange(bad.numel()))
    with pytest.raises(ValueError, match="outside"):
        permute(x, bad, e, impl=impl, validate=True)


def test_bad_arguments_raise():
    x, experts, weights, e = _case("random")
    with pytest.raises(TypeError, match="x must be"):
        permute(x[0], experts, e)
    with pytest.raises(TypeError, match="experts must be"):
        permute(x, experts.float(), e)
    with pytest.raises(ValueError, match="rows but x has"):
        permute(x, experts[:-1], e)
    with pytest.raises(ValueError, match="num_experts"):
        permute(x, experts, 0)
    with pytest.raises(ValueError, match="impl="):
        permute(x, experts, e, impl="cuda")
    rows, routing = permute(x, experts, e)
    with pytest.raises(ValueError, match="weights must have shape"):
        unpermute(rows, routing, weights[:, :1])
    with pytest.raises(ValueError, match="assignments"):
        unpermute(rows[1:], routing, weights)
    with pytest.raises(TypeError, match="routing must be"):
        unpermute(rows, (routing.group_sizes, routing.slots), weights)


def test_empty_input():
    x = torch.empty(0, 8, device=DEV)
    experts = torch.empty(0, 2, dtype=torch.int64, device=DEV)
    rows, routing = permute(x, experts, 4)
    assert rows.shape == (0, 8) and routing.group_sizes.tolist() == [0, 0, 0, 0]
    assert unpermute(rows, routing, torch.empty(0, 2, device=DEV)).shape == (0, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_routing_bf16_on_gpu(dtype):
    gen = torch.Generator().manual_seed(3)
    tokens, k, e, d = 4096, 8, 128, 1024
    x = torch.randn(tokens, d, generator=gen).to(DEV, dtype)
    experts = torch.rand(tokens, e, generator=gen).topk(k, dim=1).indices.to(DEV)
    weights = torch.rand(tokens, k, generator=gen).to(DEV)
    got = {}
    for impl in ("triton", "torch"):
        xg, wg = x.clone().requires_grad_(True), weights.clone().requires_grad_(True)
        rows, routing = permute(xg, experts, e, impl=impl)
        y = unpermute(rows * 2, routing, wg)
        y.backward(torch.ones_like(y))
        got[impl] = (rows, routing.slots, y, xg.grad, wg.grad)
    assert torch.equal(got["triton"][0], got["torch"][0]) and torch.equal(got["triton"][1], got["torch"][1])
    for a, b in zip(got["triton"][2:], got["torch"][2:], strict=True):
        assert nerr(a, b) <= 1e-2


@pytest.mark.skipif(not rk.HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("case", ["random", "multi_block", "one_hot_expert", "top_k_equals_e"])
def test_routing_index_is_the_torch_forms(case):
    """One launch for the token of each permuted row and the permuted row of each assignment: bitwise the
    division and the inverse permutation it replaces, and each consistent with the order it came from."""
    _, experts, _, e = _case(case)
    tokens_n, k = experts.shape
    _, order = rk.sort_order(experts.to(DEV), e, "torch")
    got = rk.routing_index(order, k, "triton")
    want = rk.routing_index(order, k, "torch")
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype == torch.int32 and torch.equal(g, w)
    tokens, slots = got
    assert torch.equal(tokens.long(), order.long() // k) and int(tokens.max()) < tokens_n
    assert torch.equal(slots[order.long()], torch.arange(order.numel(), dtype=torch.int32, device=DEV))


@pytest.mark.skipif(not rk.HAS_TRITON, reason="needs triton")
def test_routing_index_and_combine_stay_in_bounds_for_an_order_that_is_no_permutation():
    """fused_experts takes the order it is given: out-of-range and repeated entries must not send the index
    kernel's scatter or the combine's reads out of bounds (the values are then unspecified, the memory safe)."""
    a, k, d = 12, 3, 8
    order = torch.tensor([0, 99, -5, 3, 3, 3, 7, 11, 2, 1, 40, 6], dtype=torch.int32, device=DEV)
    tokens, slots = rk.routing_index(order, k, "triton")
    # the tokens row shares one buffer with the slots row after it: a scatter at a negative row would land in it
    assert torch.equal(tokens, (order.long().clamp(0, a - 1) // k).to(torch.int32))
    for r in (6, 8, 9, 11):  # a value no other entry clamps to: its slot is its row
        assert int(slots[int(order[r])]) == r
    rows = torch.randn(a, d, device=DEV)
    garbage = torch.tensor([0, 1 << 30, -(1 << 30), 5] * (a // 4), dtype=torch.int32, device=DEV)
    y = rk.combine(rows, garbage, None, k, "triton")  # would read far out of bounds without the clamp
    assert torch.equal(y, rows[garbage.long().clamp(0, a - 1)].view(a // k, k, d).sum(1))
