"""Group sizes with leading dimensions (jax's [slices..., G] form): values, gradients and errors.

References: `jax.lax.ragged_dot_general` where jax is installed (an independent implementation; float64), and
otherwise the float64 oracle applied slice by slice with the slices written out by hand in each case.
"""

from __future__ import annotations

import pytest
import torch

import ragdot
from helpers import cpu_backends, nerr
from oracle import ragged_dot_general_oracle
from ragdot import RaggedDotDimensionNumbers as DN

G = 3
# (lhs shape, rhs shape, dimension numbers, leading shape of the group sizes)
CASES = {
    "vmap_ragged_m": ((3, 16, 8), (3, G, 8, 6), DN((((2,), (2,)), ((0,), (0,))), (1,), (1,)), (3,)),
    "free_prefix": ((4, 11, 5), (G, 5, 7), DN((((2,), (1,)), ((), ())), (1,), (0,)), (4,)),
    "free_prefix_and_trailing": ((4, 11, 5, 2), (G, 5, 7), DN((((2,), (1,)), ((), ())), (1,), (0,)), (4,)),
    "batch_and_free_prefix": ((5, 4, 11, 6), (G, 5, 6, 7), DN((((3,), (2,)), ((0,), (1,))), (2,), (0,)), (5, 4)),
    "ragged_k_batch": ((2, 11, 5), (2, 11, 7), DN((((1,), (1,)), ((0,), (0,))), (1,), ()), (2,)),
    "ragged_k_contract_prefix": ((3, 6, 11, 5), (3, 6, 11, 7), DN((((1, 2), (1, 2)), ((0,), (0,))), (2,), ()),
                                 (3, 6)),
    "batch_mode": ((2, 5, 4, 7), (2, 5, 7, 6), DN((((3,), (2,)), ((0, 1), (0, 1))), (1,), ()), (2,)),
}


def _sizes(extent: int, lead: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random partitions per slice: some cover the whole extent, some stop short, some groups are empty."""
    ends = torch.randint(0, extent + 1, (*lead, G), generator=gen).sort(-1).values
    ends[..., -1] = torch.where(torch.rand(lead, generator=gen) < 0.5, extent, ends[..., -1])
    return torch.diff(ends, dim=-1, prepend=torch.zeros(*lead, 1, dtype=ends.dtype)).to(torch.int32)


def _operands(name: str, dtype=torch.float64, seed=0):
    lshape, rshape, dn, lead = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    lhs = torch.randn(lshape, generator=gen, dtype=torch.float64).to(dtype)
    rhs = torch.randn(rshape, generator=gen, dtype=torch.float64).to(dtype)
    return lhs, rhs, _sizes(lshape[dn.lhs_ragged_dimensions[0]], lead, gen), dn


def _jax_reference(lhs, rhs, sizes, dn):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    jdn = jax.lax.RaggedDotDimensionNumbers(dn.dot_dimension_numbers, dn.lhs_ragged_dimensions,
                                            dn.rhs_group_dimensions)
    out = jax.lax.ragged_dot_general(jnp.asarray(lhs.double().numpy()), jnp.asarray(rhs.double().numpy()),
                                     jnp.asarray(sizes.numpy()), jdn)
    return torch.from_numpy(jax.device_get(out).copy())


@pytest.mark.parametrize("name", list(CASES))
def test_values_match_jax(name):
    lhs, rhs, sizes, dn = _operands(name)
    out = ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend="reference")
    ref = _jax_reference(lhs, rhs, sizes, dn)
    assert out.shape == ref.shape and nerr(out, ref) <= 1e-12


def _by_hand(name, lhs, rhs, sizes):
    """The oracle slice by slice, each case's slicing written out (not ragdot's)."""
    one = ragged_dot_general_oracle
    if name == "vmap_ragged_m":
        dn = DN((((1,), (1,)), ((), ())), (0,), (0,))
        return torch.stack([one(lhs[b], rhs[b], sizes[b], dn) for b in range(3)])
    if name == "free_prefix":
        dn = DN((((1,), (1,)), ((), ())), (0,), (0,))
        return torch.stack([one(lhs[i], rhs, sizes[i], dn) for i in range(4)])
    if name == "ragged_k_batch":
        dn = DN((((0,), (0,)), ((), ())), (0,), ())
        return torch.stack([one(lhs[b], rhs[b], sizes[b], dn) for b in range(2)], dim=1)
    if name == "ragged_k_contract_prefix":
        dn = DN((((0,), (0,)), ((), ())), (0,), ())
        per_b = [sum(one(lhs[b, c], rhs[b, c], sizes[b, c], dn) for c in range(6)) for b in range(3)]
        return torch.stack(per_b, dim=1)
    raise KeyError(name)


@pytest.mark.parametrize("name", ["vmap_ragged_m", "free_prefix", "ragged_k_batch", "ragged_k_contract_prefix"])
@pytest.mark.parametrize("backend", cpu_backends())  # CPU operands
def test_values_and_gradients_match_the_oracle_slice_by_slice(name, backend):
    dtype = torch.float32 if backend in ("torch", "triton") else torch.float64
    lhs, rhs, sizes, dn = _operands(name, dtype)
    x, w = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    out = ragdot.ragged_dot_general(x, w, sizes, dn, backend=backend)
    xr, wr = lhs.double().requires_grad_(), rhs.double().requires_grad_()
    ref = _by_hand(name, xr, wr, sizes)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert out.shape == ref.shape and out.dtype == dtype and nerr(out, ref) <= tol
    cot = torch.randn(ref.shape, dtype=torch.float64)
    out.backward(cot.to(dtype))
    ref.backward(cot)
    assert nerr(x.grad, xr.grad) <= tol and nerr(w.grad, wr.grad) <= tol


def test_half_outputs_sum_contracting_slices_in_float32():
    lhs, rhs, sizes, dn = _operands("ragged_k_contract_prefix", torch.float16)
    out = ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend="reference")
    ref = _by_hand("ragged_k_contract_prefix", lhs.double(), rhs.double(), sizes)
    assert out.dtype == torch.float16 and nerr(out, ref) <= 3e-3


def test_rows_past_each_slices_sum_are_zero_and_nan_never_leaks():
    lhs, rhs, sizes, dn = _operands("vmap_ragged_m", torch.float32)
    sizes[1] = torch.tensor([2, 0, 5], dtype=torch.int32)  # slice 1 covers rows 0..6 of 16
    lhs[1, 7:] = float("nan")
    out = ragdot.ragged_dot_general(lhs, rhs, sizes, dn)
    assert torch.equal(out[1, 7:], torch.zeros_like(out[1, 7:])) and not out.isnan().any()


def test_a_zero_size_leading_dimension():
    lhs, rhs = torch.randn(0, 11, 5), torch.randn(G, 5, 7)
    dn = CASES["free_prefix"][2]
    out = ragdot.ragged_dot_general(lhs, rhs, torch.zeros(0, G, dtype=torch.int32), dn)
    assert out.shape == (0, 11, 7)


@pytest.mark.parametrize("shape,pattern", [((5, G), r"expected group_sizes to have shape \(4, 3\), got \(5, 3\)"),
                                           ((4, 2), "group dimension 0 has size 3")])
def test_wrong_leading_shapes_raise_shape_errors(shape, pattern):
    lhs, rhs, _, dn = _operands("free_prefix")
    with pytest.raises(ragdot.ShapeError, match=pattern) as info:
        ragdot.ragged_dot_general(lhs, rhs, torch.ones(shape, dtype=torch.int32), dn)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_scalar_group_sizes_are_rejected():
    lhs, rhs, _, dn = _operands("free_prefix")
    with pytest.raises(ValueError, match="group_sizes must be 1-D"):
        ragdot.ragged_dot_general(lhs, rhs, torch.tensor(3), dn)


def test_stacked_sizes_under_torch_compile_fullgraph():
    lhs, rhs, sizes, dn = _operands("vmap_ragged_m", torch.float32)
    fn = torch.compile(lambda a, b, s: ragdot.ragged_dot_general(a, b, s, dn, backend="torch"), fullgraph=True)
    out = fn(lhs, rhs, sizes)
    ref = _by_hand("vmap_ragged_m", lhs.double(), rhs.double(), sizes)
    assert nerr(out, ref) <= 1e-5
