"""Reliability of the public ops on a GPU: operands past 2**31 elements, no host synchronisation, NaN-poisoned
tails and empty groups in bfloat16.

Every test needs CUDA (`gpu` marker, skipped without it). The large-operand tests allocate one 4-5 GB operand
(under 15 GB in all) and check a float32 reference on sampled rows or on whole small groups only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import ragdot
from helpers import TOL, nerr
from ragdot import RaggedDotDimensionNumbers as DN

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
NAN = float("nan")
RAGGED_M = DN((((1,), (1,)), ((), ())), (0,), (0,))  # [M, K] x [G, K, N] -> [M, N]
RAGGED_K = DN((((0,), (0,)), ((), ())), (0,), ())  # [R, K] x [R, N] -> [G, K, N]
BATCH = DN((((2,), (1,)), ((0,), (0,))), (0,), ())  # [B, M, K] x [B, K, N] -> [B, M, N]
BIG_ROWS = (1 << 19) + 256  # x 4096 columns: 2**31 + 2**20 elements
BIG_SIZES = [300, (1 << 19) - 572, 400]  # a tail of 128 rows; the last group straddles element 2**31


@pytest.fixture(autouse=True)
def _free_memory() -> Iterator[None]:
    yield
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _need(backend: str) -> None:
    if backend != "auto" and backend not in ragdot.backends():
        pytest.skip(f"backend {backend!r} is not usable here")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _randn(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device="cuda", dtype=BF16).mul_(scale)


def _sizes(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def _bounds(values: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every group, in rows."""
    out, start = [], 0
    for size in values:
        out.append((start, start + size))
        start += size
    return out


def _call(lhs: torch.Tensor, rhs: torch.Tensor, values: list[int], dn: DN, backend: str) -> torch.Tensor:
    try:
        return ragdot.ragged_dot_general(lhs, rhs, _sizes(values), dn, backend=backend)
    except NotImplementedError as exc:  # a backend may decline a case; it must never compute it wrongly
        pytest.skip(f"backend {backend!r} declines: {exc}")


# ------------------------------------------------------------------------------------ past 2**31 elements


def _sampled_rows(bounds: list[tuple[int, int]]) -> Iterator[tuple[int, int, int]]:
    """(group, first row, end row) windows: whole small groups, three 32-row windows of a large one."""
    for g, (s, e) in enumerate(bounds):
        if e - s <= 512:
            if e > s:
                yield g, s, e
            continue
        mid = (s + e) // 2
        yield from ((g, s, s + 32), (g, mid, mid + 32), (g, e - 32, e))


RAGGED_M_BIG = {
    "lhs": (BIG_ROWS, 4096, 64, BIG_SIZES),  # lhs [M, K]: M*K > 2**31
    "rhs": (640, 16384, 16384, [64, 0, 0, 0, 0, 0, 0, 256, 256]),  # rhs [G, K, N]: group 8 starts at 2**31
    "out": (BIG_ROWS, 64, 4096, BIG_SIZES),  # out [M, N]: M*N > 2**31
}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", list(RAGGED_M_BIG))
def test_ragged_m_past_2_31_elements(backend: str, case: str) -> None:
    _need(backend)
    m, k, n, values = RAGGED_M_BIG[case]
    total, gen = sum(values), _gen()
    lhs = _randn(m, k, gen=gen)  # [M, K]
    lhs[total:] = NAN
    rhs = _randn(len(values), k, n, gen=gen, scale=k**-0.5)  # [G, K, N]
    out = _call(lhs, rhs, values, RAGGED_M, backend)  # [M, N]
    assert out.shape == (m, n) and out.dtype == BF16
    assert (out[total:] == 0).all() and not out.isnan().any()
    for g, s, e in _sampled_rows(_bounds(values)):
        ref = lhs[s:e].float() @ rhs[g].float()
        assert nerr(out[s:e], ref) <= TOL[BF16], (case, g, s, e)


def _group_ref(a: torch.Tensor, b: torch.Tensor, s: int, e: int, step: int = 1 << 16) -> torch.Tensor:
    """float32 a[s:e]^T @ b[s:e], accumulated over row chunks to bound the float32 copies."""
    acc = torch.zeros(a.shape[1], b.shape[1], device=a.device, dtype=torch.float32)
    for c in range(s, e, step):
        stop = min(c + step, e)
        acc += a[c:stop].float().t() @ b[c:stop].float()
    return acc


RAGGED_K_BIG = {
    "lhs": (BIG_ROWS, 4096, 64, BIG_SIZES),  # lhs [R, K]: R*K > 2**31
    # out [G, K, N]: G*K*N > 2**31, groups 128 and 129 past element 2**31, most groups empty
    "out": (2048, 4096, 4096, [500 if g in (0, 64, 128) else 300 if g == 129 else 0 for g in range(130)]),
}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", list(RAGGED_K_BIG))
def test_ragged_k_past_2_31_elements(backend: str, case: str) -> None:
    _need(backend)
    r, k, n, values = RAGGED_K_BIG[case]
    total, gen = sum(values), _gen(1)
    lhs = _randn(r, k, gen=gen)  # [R, K]
    rhs = _randn(r, n, gen=gen, scale=r**-0.5)  # [R, N]
    lhs[total:] = NAN
    rhs[total:] = NAN
    out = _call(lhs, rhs, values, RAGGED_K, backend)  # [G, K, N]
    assert out.shape == (len(values), k, n) and out.dtype == BF16
    assert not out.isnan().any()
    for g, (s, e) in enumerate(_bounds(values)):
        if s == e:
            assert int(out[g].count_nonzero()) == 0, f"empty group {g} is not zero"
        else:
            assert nerr(out[g], _group_ref(lhs, rhs, s, e)) <= TOL[BF16], (case, g)


# ------------------------------------------------------------------------------------ no host syncs


def _small_problem(mode: str) -> tuple[torch.Tensor, torch.Tensor, list[int], DN]:
    """bf16 operands of one mode with an empty group and a tail of rows outside every group."""
    gen = _gen(2)
    if mode in ("ragged_dot", "ragged_m"):
        return _randn(256, 128, gen=gen), _randn(4, 128, 64, gen=gen), [60, 0, 100, 50], RAGGED_M
    if mode == "ragged_k":
        return _randn(256, 128, gen=gen), _randn(256, 64, gen=gen), [60, 0, 100, 50], RAGGED_K
    return _randn(3, 64, 128, gen=gen), _randn(3, 128, 64, gen=gen), [1, 1, 1], BATCH


def _run(mode: str, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor, dn: DN, backend: str):
    if mode == "ragged_dot":
        return ragdot.ragged_dot(lhs, rhs, sizes, backend=backend)
    return ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
@pytest.mark.parametrize("mode", ["ragged_dot", "ragged_m", "ragged_k", "batch"])
def test_no_host_sync(mode: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a warm-up call, forward and backward never synchronise with the host (group sizes on the GPU)."""
    _need(backend)
    monkeypatch.delenv("RAGDOT_VALIDATE", raising=False)
    lhs, rhs, values, dn = _small_problem(mode)
    sizes = _sizes(values)
    x, w = lhs.detach().requires_grad_(True), rhs.detach().requires_grad_(True)
    try:
        dy = torch.randn_like(_run(mode, lhs, rhs, sizes, dn, backend))  # warm-up: compiles, fills caches
        _run(mode, x, w, sizes, dn, backend).backward(dy)
    except NotImplementedError as exc:
        pytest.skip(f"backend {backend!r} declines: {exc}")
    x.grad = w.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = _run(mode, lhs, rhs, sizes, dn, backend)
        _run(mode, x, w, sizes, dn, backend).backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert not out.isnan().any() and x.grad is not None and w.grad is not None


# ------------------------------------------------------------------------------------ NaN tails, empty groups

M, K, N = 333, 200, 264
PATTERNS = {
    "first_and_last_empty": [0, 37, 0, 150, 0],  # tail of 146 rows
    "all_empty": [0, 0, 0, 0, 0],  # every row is in the tail
    "one_group": [290, 0, 0, 0, 0],  # G=1 in effect, then empty groups and a tail of 43
    "skewed": [1, 2, 3, 250, 40],  # groups smaller than a tile beside a large one, tail of 37
}


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


def _close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert not got.isnan().any(), f"{what}: NaN"
    assert nerr(got, ref) <= TOL[BF16], f"{what}: {nerr(got, ref)}"


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_nan_tail_and_empty_groups_ragged_m(backend: str, pattern: str) -> None:
    _need(backend)
    values, gen = PATTERNS[pattern], _gen(3)
    total, bounds = sum(values), _bounds(values)
    x = _randn(M, K, gen=gen)  # [M, K]
    w = _randn(len(values), K, N, gen=gen, scale=K**-0.5)  # [G, K, N]
    dy = _randn(M, N, gen=gen)  # [M, N]
    x[total:] = NAN
    dy[total:] = NAN
    xl, wl = _leaf(x), _leaf(w)
    out = _call(xl, wl, values, RAGGED_M, backend)
    out.backward(dy)
    ref = torch.zeros(M, N, device="cuda")
    dx = torch.zeros(M, K, device="cuda")
    dw = torch.zeros(len(values), K, N, device="cuda")
    for g, (s, e) in enumerate(bounds):
        ref[s:e] = x[s:e].float() @ w[g].float()
        dx[s:e] = dy[s:e].float() @ w[g].float().t()
        dw[g] = x[s:e].float().t() @ dy[s:e].float()
    assert (out[total:] == 0).all() and (xl.grad[total:] == 0).all()
    for g, (s, e) in enumerate(bounds):
        assert s < e or (wl.grad[g] == 0).all(), f"empty group {g}: weight gradient not zero"
    _close(out, ref, "out")
    _close(xl.grad, dx, "lhs gradient")
    _close(wl.grad, dw, "rhs gradient")


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_nan_tail_and_empty_groups_ragged_k(backend: str, pattern: str) -> None:
    _need(backend)
    values, gen = PATTERNS[pattern], _gen(4)
    total, bounds = sum(values), _bounds(values)
    a = _randn(M, K, gen=gen)  # [R, K]
    b = _randn(M, N, gen=gen, scale=M**-0.5)  # [R, N]
    dout = _randn(len(values), K, N, gen=gen)  # [G, K, N]
    a[total:] = NAN
    b[total:] = NAN
    al, bl = _leaf(a), _leaf(b)
    out = _call(al, bl, values, RAGGED_K, backend)
    out.backward(dout)
    ref = torch.zeros(len(values), K, N, device="cuda")
    da = torch.zeros(M, K, device="cuda")
    db = torch.zeros(M, N, device="cuda")
    for g, (s, e) in enumerate(bounds):
        ref[g] = a[s:e].float().t() @ b[s:e].float()
        da[s:e] = b[s:e].float() @ dout[g].float().t()
        db[s:e] = a[s:e].float() @ dout[g].float()
    for g, (s, e) in enumerate(bounds):
        assert s < e or (out[g] == 0).all(), f"empty group {g}: output not zero"
    assert (al.grad[total:] == 0).all() and (bl.grad[total:] == 0).all()
    _close(out, ref, "out")
    _close(al.grad, da, "lhs gradient")
    _close(bl.grad, db, "rhs gradient")
