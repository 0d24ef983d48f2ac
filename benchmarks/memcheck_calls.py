"""A fixed set of small Triton calls through the public API, to run under `compute-sanitizer --tool memcheck`.

Skewed group sizes, empty groups, NaN-poisoned tails (sum < M), G=1, M smaller than a tile, more groups than
rows, odd K and N, in the three canonical problems (ragged_m forward and data-gradient layout, ragged_k
weight gradient, batch) with their backward, bf16 plus one fp16 and one fp32 case. Each result is also
checked against the `reference` backend on NaN-free copies of the inputs, exact zeros where the contract
says so. Exit status 1 when a check fails (the sanitizer's own errors come from --error-exitcode).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 \\
        python3 benchmarks/memcheck_calls.py

The `checks` suite of benchmarks/suite.py runs it so, after the gpu-marked tests.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

import ragdot
from ragdot import RaggedDotDimensionNumbers as DN
from ragdot.measure.checks import TOLERANCE, normalised_error
from ragdot.routing import skewed

FWD = DN((((1,), (1,)), ((), ())), (0,), (0,))  # [M, K] x [G, K, N] -> [M, N]
DGRAD = DN((((1,), (2,)), ((), ())), (0,), (0,))  # [M, N] x [G, K, N] -> [M, K]
WGRAD = DN((((0,), (0,)), ((), ())), (0,), ())  # [R, K] x [R, N] -> [G, K, N]
BATCH = DN((((2,), (1,)), ((0,), (0,))), (0,), ())  # [B, M, K] x [B, K, N] -> [B, M, N]
TOL = TOLERANCE | {torch.float16: 3e-3}  # fp16 stricter than the shared table, as these small cases always were


@dataclass(frozen=True)
class Case:
    name: str
    mode: str  # "m" (rhs has a group dim), "k" (ragged contraction) or "batch"
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    sizes: tuple[int, ...]
    dn: DN
    dtype: torch.dtype = torch.bfloat16


def _skewed(m: int, e: int) -> tuple[int, ...]:
    return tuple(skewed(m, e).tolist())


CASES: tuple[Case, ...] = (
    Case("skewed, sum == M", "m", (1000, 200), (8, 200, 264), _skewed(1000, 8), FWD),
    Case("skewed, NaN tail", "m", (1000, 200), (8, 200, 264), _skewed(896, 8), FWD),
    Case("first and last groups empty", "m", (333, 200), (5, 200, 264), (0, 37, 0, 150, 0), FWD),
    Case("every group empty", "m", (64, 32), (3, 32, 48), (0, 0, 0), FWD),
    Case("G=1 with a tail", "m", (333, 200), (1, 200, 264), (300,), FWD),
    Case("M below a tile", "m", (5, 32), (2, 32, 24), (2, 3), FWD),
    Case("one row", "m", (1, 64), (3, 64, 40), (0, 1, 0), FWD),
    Case("more groups than rows", "m", (6, 16), (11, 16, 8), (1, 0, 0, 2, 0, 1, 0, 0, 1, 0, 1), FWD),
    Case("odd K and N", "m", (37, 19), (4, 19, 13), (3, 17, 1, 16), FWD),
    Case("data-gradient layout", "m", (333, 264), (5, 200, 264), (0, 37, 0, 150, 100), DGRAD),
    Case("weight gradient, skewed, NaN tail", "k", (1000, 200), (1000, 264), _skewed(900, 8), WGRAD),
    Case("weight gradient, empty groups", "k", (333, 136), (333, 72), (5, 0, 145, 151, 0), WGRAD),
    Case("weight gradient, odd sizes", "k", (41, 19), (41, 13), (3, 5, 0, 7, 2, 11, 0, 13), WGRAD),
    Case("batch", "batch", (3, 70, 90), (3, 90, 40), (1, 1, 1), BATCH),
    Case("fp16, NaN tail", "m", (333, 200), (5, 200, 264), (0, 37, 0, 150, 0), FWD, torch.float16),
    Case("fp32, NaN tail", "k", (333, 136), (333, 72), (5, 0, 145, 151, 0), WGRAD, torch.float32),
)


def _inputs(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lhs, rhs, cotangent) with NaN in every ragged row past sum(sizes); the cotangent only where it
    maps to output rows outside every group."""
    lhs = torch.randn(case.lhs, generator=gen, device="cuda").to(case.dtype)
    rhs = (torch.randn(case.rhs, generator=gen, device="cuda") / case.rhs[-2] ** 0.5).to(case.dtype)
    total = sum(case.sizes)
    if case.mode != "batch":
        lhs[total:] = float("nan")
    if case.mode == "k":
        rhs[total:] = float("nan")
    with torch.no_grad():
        shape = ragdot.ragged_dot_general(lhs, rhs, _sizes(case), case.dn, backend="reference").shape
    dy = torch.randn(shape, generator=gen, device="cuda").to(case.dtype)
    if case.mode == "m":
        dy[total:] = float("nan")
    return lhs, rhs, dy


def _sizes(case: Case) -> torch.Tensor:
    return torch.tensor(case.sizes, dtype=torch.int32, device="cuda")


def _clean(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.isnan(), torch.zeros_like(t), t)


def _forward_backward(case: Case, lhs, rhs, dy, backend: str) -> tuple[torch.Tensor, ...]:
    x, w = lhs.detach().requires_grad_(True), rhs.detach().requires_grad_(True)
    out = ragdot.ragged_dot_general(x, w, _sizes(case), case.dn, backend=backend)
    out.backward(dy)
    return out.detach(), x.grad, w.grad


def _zeros_problems(case: Case, out, dx, dw) -> list[str]:
    """Where the contract asks for exact zeros: output/gradient rows past the groups, empty groups."""
    total, bad = sum(case.sizes), []
    if case.mode == "m":
        if (out[total:] != 0).any():
            bad.append("output rows past the groups are not zero")
        if (dx[total:] != 0).any():
            bad.append("lhs-gradient rows past the groups are not zero")
        empty = [g for g, size in enumerate(case.sizes) if size == 0 and (dw[g] != 0).any()]
        bad += [f"weight gradient of empty group {g} is not zero" for g in empty]
    if case.mode == "k":
        empty = [g for g, size in enumerate(case.sizes) if size == 0 and (out[g] != 0).any()]
        bad += [f"output of empty group {g} is not zero" for g in empty]
        if (dx[total:] != 0).any() or (dw[total:] != 0).any():
            bad.append("gradient rows past the groups are not zero")
    return bad


def run_case(case: Case, gen: torch.Generator) -> list[str]:
    """The problems found in one case (empty when it passes)."""
    lhs, rhs, dy = _inputs(case, gen)
    got = _forward_backward(case, lhs, rhs, dy, "triton")
    ref = _forward_backward(case, _clean(lhs), _clean(rhs), _clean(dy), "reference")
    bad = [f"{what} has NaN" for what, t in zip(("output", "lhs gradient", "rhs gradient"), got) if t.isnan().any()]
    bad += _zeros_problems(case, *got)
    for what, g, r in zip(("output", "lhs gradient", "rhs gradient"), got, ref):
        err = normalised_error(g, r)
        if not err <= TOL[case.dtype]:
            bad.append(f"{what}: normalised error {err:.2e} against the reference")
    return bad


def main() -> int:
    if not torch.cuda.is_available():
        print("memcheck_calls: needs a CUDA device", file=sys.stderr)
        return 2
    if "triton" not in ragdot.backends():
        print(f"memcheck_calls: the triton backend is not usable here ({ragdot.backends()})", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    failed = 0
    for case in CASES:
        bad = run_case(case, gen)
        torch.cuda.synchronize()
        print(f"{'FAIL' if bad else 'ok  '} {case.name} ({str(case.dtype).removeprefix('torch.')})", flush=True)
        for line in bad:
            print(f"     {line}", flush=True)
        failed += bool(bad)
    print(f"memcheck calls: {len(CASES)} cases, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
