"""Random dimension numbers: `ragged_dot_general` in all three modes with batch, contracting and free dimensions
in random order and number, against the float64 oracle (values, NaN outside the groups, both gradients), and the
oracle against `jax.lax.ragged_dot_general` where jax is installed (an independent implementation).

Each case is drawn from its seed alone, so a failure names a case that can be rerun by itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

import ragdot
from helpers import cpu_backends, nerr
from oracle import ragged_dot_general_oracle
from ragdot import RaggedDotDimensionNumbers as DN

SEEDS = range(24)
TRITON_SEEDS = range(0, 24, 4)  # the interpreter is slow: every fourth case


@dataclass(frozen=True)
class Case:
    mode: str  # "ragged_m" (a free lhs dimension), "ragged_k" (a contracting one), "batch" (a batch one)
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    dn: DN
    sizes: tuple[int, ...]


def draw(seed: int, wide: bool = False) -> Case:
    """Dimensions labelled (kind, index), shuffled on each side; sizes that stop short of the ragged extent or
    cover it, some groups empty. `wide`: extents up to 40 and up to 10 groups (several tiles of the kernels)."""
    rng = random.Random(seed)
    mode = ("ragged_m", "ragged_k", "batch")[seed % 3]
    n_batch = rng.randint(1 if mode == "batch" else 0, 2)
    size = {("b", i): rng.randint(1, 3) for i in range(n_batch)}
    size |= {("c", i): rng.randint(1, 40 if wide else 5) for i in range(rng.randint(1, 2))}
    size |= {("f", i): rng.randint(1, 40 if wide else 6) for i in range(rng.randint(1, 2))}
    size |= {("r", i): rng.randint(1, 40 if wide else 4) for i in range(rng.randint(1, 2))}
    groups = rng.randint(1, 10 if wide else 4)
    lhs = [d for d in size if d[0] in "bcf"]
    rhs = [d for d in size if d[0] in "bcr"] + ([("g", 0)] if mode == "ragged_m" else [])
    size[("g", 0)] = groups
    rng.shuffle(lhs)
    rng.shuffle(rhs)
    kind = {"ragged_m": "f", "ragged_k": "c", "batch": "b"}[mode]
    ragged = rng.choice([d for d in lhs if d[0] == kind])
    contract = [d for d in lhs if d[0] == "c"]
    batch = [d for d in lhs if d[0] == "b"]
    dn = DN(
        dot_dimension_numbers=((tuple(lhs.index(d) for d in contract), tuple(rhs.index(d) for d in contract)),
                               (tuple(lhs.index(d) for d in batch), tuple(rhs.index(d) for d in batch))),
        lhs_ragged_dimensions=(lhs.index(ragged),),
        rhs_group_dimensions=(rhs.index(("g", 0)),) if mode == "ragged_m" else (),
    )
    extent = size[ragged]
    sizes = [rng.randint(0, extent) for _ in range(groups)]
    while sum(sizes) > extent:  # take rows back from a random non-empty group
        sizes[rng.choice([i for i, s in enumerate(sizes) if s > 0])] -= 1
    if rng.random() < 0.5:
        sizes[rng.randrange(groups)] += extent - sum(sizes)
    return Case(mode, tuple(size[d] for d in lhs), tuple(size[d] for d in rhs), dn, tuple(sizes))


def operands(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lhs = torch.randn(case.lhs_shape, generator=gen, dtype=torch.float64)
    rhs = torch.randn(case.rhs_shape, generator=gen, dtype=torch.float64)
    return lhs, rhs, torch.tensor(case.sizes, dtype=torch.int32)


def poisoned(case: Case, lhs: torch.Tensor, rhs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN at every position of the ragged dimension past the groups' sum (lhs, and rhs's matching contracting
    dimension in ragged_k mode): no result may see them."""
    if case.mode == "batch":
        return lhs, rhs
    (r,) = case.dn.lhs_ragged_dimensions
    total = sum(case.sizes)
    lhs = lhs.clone()
    lhs.narrow(r, total, lhs.shape[r] - total).fill_(float("nan"))
    if case.mode == "ragged_k":
        (lc, rc), _ = case.dn.dot_dimension_numbers
        rr = rc[lc.index(r)]
        rhs = rhs.clone()
        rhs.narrow(rr, total, rhs.shape[rr] - total).fill_(float("nan"))
    return lhs, rhs


def _params() -> list:
    out = []
    for backend in cpu_backends():
        seeds = TRITON_SEEDS if backend == "triton" else SEEDS
        out += [pytest.param(backend, s, id=f"{backend}-{s}") for s in seeds]
    return out


def check_against_the_oracle(backend: str, case: Case, seed: int, dtype: torch.dtype = torch.float32) -> None:
    """Values (NaN past the groups never read) and both gradients of `case` with operands in `dtype` against the
    float64 oracle. float32: the default result dtype, the oracle on the unrounded operands, 1e-5 everywhere.
    16-bit: a float32 result (`preferred_element_type`), the oracle on the same rounded operands, gradients in the
    operands' dtype to 16-bit rounding (1e-2)."""
    lhs, rhs, sizes = operands(case, seed)
    preferred, grad_tol = (None, 1e-5) if dtype == torch.float32 else (torch.float32, 1e-2)
    if dtype != torch.float32:
        lhs, rhs = lhs.to(dtype).double(), rhs.to(dtype).double()  # the values the 16-bit operands hold
    want = ragged_dot_general_oracle(lhs, rhs, sizes, case.dn)
    bad_lhs, bad_rhs = poisoned(case, lhs, rhs)
    got = ragdot.ragged_dot_general(bad_lhs.to(dtype), bad_rhs.to(dtype), sizes, case.dn, backend=backend,
                                    preferred_element_type=preferred)
    assert got.shape == want.shape and got.dtype == torch.float32, (case, got.shape, want.shape)
    assert not got.isnan().any(), case
    assert nerr(got, want) < 1e-5, case

    lo, ro = lhs.to(dtype).requires_grad_(), rhs.to(dtype).requires_grad_()
    l64, r64 = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    ragdot.ragged_dot_general(lo, ro, sizes, case.dn, backend=backend,
                              preferred_element_type=preferred).backward(cot.float())
    ragged_dot_general_oracle(l64, r64, sizes, case.dn).backward(cot)
    for name, g, w in (("lhs", lo.grad, l64.grad), ("rhs", ro.grad, r64.grad)):
        assert g is not None and g.shape == w.shape and g.dtype == dtype, (name, case)
        assert nerr(g, w) < grad_tol, (name, case)


@pytest.mark.parametrize("backend,seed", _params())
def test_values_nan_and_gradients_match_the_oracle(backend, seed):
    check_against_the_oracle(backend, draw(seed), seed)


WIDE_SEEDS = range(6)


def _wide_params() -> list:
    out = []
    for backend in cpu_backends():
        for seed in ((1, 3, 5) if backend == "triton" else WIDE_SEEDS):  # interpreted: small grids (0: 80 s)
            for dtype in (torch.float16, torch.bfloat16):
                if not (backend == "triton" and dtype == torch.bfloat16):  # the interpreter refuses bf16 dots
                    out.append(pytest.param(backend, seed, dtype, id=f"{backend}-{seed}-{str(dtype)[6:]}"))
    return out


@pytest.mark.parametrize("backend,seed,dtype", _wide_params())
def test_wide_16_bit_cases_accumulate_in_float32_and_match_the_oracle(backend, seed, dtype):
    check_against_the_oracle(backend, draw(seed, wide=True), seed, dtype)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_oracle_agrees_with_jax(seed):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    case = draw(seed)
    lhs, rhs, sizes = operands(case, seed)
    jdn = jax.lax.RaggedDotDimensionNumbers(case.dn.dot_dimension_numbers, case.dn.lhs_ragged_dimensions,
                                            case.dn.rhs_group_dimensions)
    out = jax.lax.ragged_dot_general(jnp.asarray(lhs.numpy()), jnp.asarray(rhs.numpy()), jnp.asarray(sizes.numpy()),
                                     jdn)
    ref = torch.from_numpy(jax.device_get(out).copy())
    assert ref.shape == ragged_dot_general_oracle(lhs, rhs, sizes, case.dn).shape, case
    assert nerr(ragged_dot_general_oracle(lhs, rhs, sizes, case.dn), ref) < 1e-12, case


def test_the_draws_cover_every_mode_and_empty_groups_and_short_sums():
    cases = [draw(s) for s in SEEDS]
    assert {c.mode for c in cases} == {"ragged_m", "ragged_k", "batch"}
    assert any(0 in c.sizes for c in cases)
    extents = [c.lhs_shape[c.dn.lhs_ragged_dimensions[0]] for c in cases]
    assert any(sum(c.sizes) < e for c, e in zip(cases, extents))
    assert any(sum(c.sizes) == e for c, e in zip(cases, extents))
    assert any(len(c.dn.dot_dimension_numbers[1][0]) == 2 for c in cases)  # two batch dimensions somewhere
    wide = [draw(s, wide=True) for s in WIDE_SEEDS]
    assert {c.mode for c in wide} == {"ragged_m", "ragged_k", "batch"}
    assert max(max(c.lhs_shape) for c in wide) > 16  # more than one 16-row tile somewhere
