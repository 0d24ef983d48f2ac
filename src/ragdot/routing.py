"""Deterministic group sizes (tokens per expert) for benchmarks and tests.

Every generator returns an int32 tensor of E sizes that sum to exactly M:

- ``balanced``: ``M // E`` each and one more for the first ``M % E`` experts;
- ``skewed``: a linear ramp, the busiest expert at 1.5x the mean and the least busy at 0.5x, rounded so
  the sum stays exact (largest remainders get the leftover tokens);
- ``empty``: every eighth expert (indices 7, 15, ...) gets no tokens, the others the skewed ramp, the
  busiest at 1.5x the mean of the non-empty experts;
- ``routed``: one seeded draw of a uniform router (each token row to an expert drawn at random), so the sizes
  scatter about the mean by about its square root and are rarely multiples of a kernel's chunk, as a trained
  router's are; ``balanced`` sizes are exact multiples of every chunk depth wherever M / E is one.

``round_to=r`` makes every size a multiple of r (M must then be one too): the rule is applied to M / r
blocks of r tokens. Real routing is never balanced: benchmark more than ``balanced``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["ROUTINGS", "balanced", "skewed", "empty", "routed", "group_sizes"]

ROUTINGS: tuple[str, ...] = ("balanced", "skewed", "empty", "routed")

#: the busiest expert's load over the mean load in the ramped routings
RAMP_PEAK = 1.5
#: one expert in this many is empty in the ``empty`` routing
EMPTY_EVERY = 8
#: the seed of the ``routed`` draw
ROUTED_SEED = 0


def _check(m: int, e: int, round_to: int) -> int:
    for name, value, low in (("M", m, 0), ("E", e, 1), ("round_to", round_to, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if m % round_to:
        raise ValueError(f"M={m} must be a multiple of round_to={round_to} to keep the sum exact")
    return m // round_to


def _split_even(units: int, e: int) -> list[int]:
    base, rem = divmod(units, e)
    return [base + 1 if i < rem else base for i in range(e)]


def _split_ramp(units: int, e: int) -> list[int]:
    """Integer ramp from 0.5x to RAMP_PEAK x the mean (ascending), summing to `units` exactly."""
    if e == 1:
        return [units]
    mean = units / e
    low = 2.0 - RAMP_PEAK  # keeps the mean of the ramp at 1
    targets = [mean * (low + (RAMP_PEAK - low) * i / (e - 1)) for i in range(e)]
    sizes = [math.floor(t) for t in targets]
    leftover = units - sum(sizes)
    # Hand the leftover units to the largest fractional parts; ties go to the later (busier) expert.
    order = sorted(range(e), key=lambda i: (targets[i] - sizes[i], i), reverse=True)
    for i in order[:leftover]:
        sizes[i] += 1
    return sizes


def _finish(units: list[int], round_to: int, device: torch.device | str | None) -> torch.Tensor:
    return torch.tensor([u * round_to for u in units], dtype=torch.int32, device=device)


def balanced(m: int, e: int, *, device: torch.device | str | None = None, round_to: int = 1) -> torch.Tensor:
    """The balanced partition: M // E tokens each, the first M % E experts one more."""
    units = _check(m, e, round_to)
    return _finish(_split_even(units, e), round_to, device)


def skewed(m: int, e: int, *, device: torch.device | str | None = None, round_to: int = 1) -> torch.Tensor:
    """A linear ramp over the experts, the busiest at 1.5x the mean."""
    units = _check(m, e, round_to)
    return _finish(_split_ramp(units, e), round_to, device)


def empty(m: int, e: int, *, device: torch.device | str | None = None, round_to: int = 1) -> torch.Tensor:
    """Every eighth expert (7, 15, ...) empty, the skewed ramp over the others."""
    units = _check(m, e, round_to)
    live = [i for i in range(e) if (i + 1) % EMPTY_EVERY != 0]
    sizes = [0] * e
    for i, size in zip(live, _split_ramp(units, len(live)), strict=True):
        sizes[i] = size
    return _finish(sizes, round_to, device)


def routed(m: int, e: int, *, device: torch.device | str | None = None, round_to: int = 1) -> torch.Tensor:
    """One seeded draw of a uniform router: each of the M / round_to blocks goes to an expert drawn at random."""
    units = _check(m, e, round_to)
    picks = torch.randint(0, e, (units,), generator=torch.Generator().manual_seed(ROUTED_SEED))
    return _finish(torch.bincount(picks, minlength=e).tolist(), round_to, device)


_GENERATORS = {"balanced": balanced, "skewed": skewed, "empty": empty, "routed": routed}


def group_sizes(
    routing: str, m: int, e: int, *, device: torch.device | str | None = None, round_to: int = 1
) -> torch.Tensor:
    """Group sizes by routing name (one of ROUTINGS)."""
    if routing not in _GENERATORS:
        raise ValueError(f"routing={routing!r} is unknown; expected one of {', '.join(ROUTINGS)}")
    return _GENERATORS[routing](m, e, device=device, round_to=round_to)
