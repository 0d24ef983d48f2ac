"""Measuring candidates on seeded group sizes and picking winners.

Group sizes are seeded as the seed's autotuner does: balanced with the sum exactly equal to the ragged
extent (every pointer in bounds, every output written), and skewed routing as a second measurement. The
winner minimises the summed median time over both, so it does not win on balanced routing alone. On CUDA
the candidates are timed as CUDA-graph replays (device time), so Python dispatch cost cannot pick a kernel. Every
candidate's result is checked against the reference before it is timed; a wrong one is never chosen.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch

from ragdot.api import group_ends_from_sizes
from ragdot.backends import available_backends, get_backend
from ragdot.tune.key import TuneKey, key_for

__all__ = ["Candidate", "candidates_for", "pick_winner", "measure_problem", "tune_key", "ROUTINGS"]

ROUTINGS: tuple[str, ...] = ("balanced", "skewed")
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}

Candidate = tuple[str, Any]  # (backend name, TileConfig or None)


def label(candidate: Candidate) -> str:
    name, cfg = candidate
    return name if cfg is None else f"{name}:{cfg.short()}"


def candidates_for(
    problem: str, dims: tuple[int, int, int, int], dtype: torch.dtype, max_configs: int
) -> list[Candidate]:
    """The vendor kernel, the heuristic's Triton config, and up to `max_configs` - 1 more that measured well
    in the regime (`ragdot.kernels.configs.tuning_configs`). dims = (M, K, N, G) as `pick_config` reads them."""
    out: list[Candidate] = []
    names = available_backends()
    if "torch" in names:
        out.append(("torch", None))
    if "triton" not in names or problem == "batch":
        return out
    from ragdot.kernels.configs import tuning_configs

    return out + [("triton", cfg) for cfg in tuning_configs(problem, *dims, dtype, limit=max_configs)]


def pick_winner(times: dict[str, dict[str, float]]) -> str | None:
    """The label with the smallest summed time over routings (only labels timed on every routing count)."""
    if not times:
        return None
    routings = set().union(*(t.keys() for t in times.values()))
    complete = {name: t for name, t in times.items() if set(t) == routings and all(v > 0 for v in t.values())}
    if not complete:
        return None
    return min(sorted(complete), key=lambda name: sum(complete[name].values()))


def _run(candidate: Candidate, problem: str) -> Callable[..., torch.Tensor]:
    name, cfg = candidate
    fn = getattr(get_backend(name), problem)
    if cfg is None:
        return fn
    return lambda *args: fn(*args, config=cfg)


def measure_problem(
    problem: str,
    a: torch.Tensor,
    b: torch.Tensor,
    num_groups: int,
    out_dtype: torch.dtype,
    cands: Sequence[Candidate],
    *,
    routings: Sequence[str] = ROUTINGS,
    warmup: int = 5,
    iters: int = 20,
) -> dict[str, dict[str, float]]:
    """Median ms per candidate label and routing; wrong or failing candidates are left out."""
    from ragdot.bench.timing import Timed, measure
    from ragdot.routing import group_sizes

    extent = a.shape[1]
    reference = get_backend("reference")
    times: dict[str, dict[str, float]] = {}
    for routing in routings:
        ends = group_ends_from_sizes(group_sizes(routing, extent, num_groups, device=a.device), extent)
        args = (a, b, ends, out_dtype) if problem != "batch" else (a, b, out_dtype)
        ref = getattr(reference, problem)(*args).float()
        systems = []
        for cand in cands:
            fn = _run(cand, problem)
            try:
                out = fn(*args)
            except (NotImplementedError, RuntimeError):
                continue  # cannot run this case (e.g. shared memory): not a candidate here
            err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            if not err <= TOLERANCE.get(a.dtype, 2e-2):
                continue
            systems.append(Timed(label(cand), [lambda fn=fn, args=args: fn(*args)]))
        # Device time (CUDA-graph replays): host dispatch overhead must not decide between kernels.
        graphs = a.device.type == "cuda"
        for name, timing in measure(systems, a.device, warmup=warmup, iters=iters, graphs=graphs).items():
            times.setdefault(name, {})[routing] = timing.median
    return times


def entry_from_times(times: dict[str, dict[str, float]], cands: Sequence[Candidate]) -> dict[str, Any] | None:
    """The cache entry: the overall winner, and the best Triton config (used when Triton is forced)."""
    by_label = {label(c): c for c in cands}
    winner = pick_winner(times)
    if winner is None:
        return None
    triton_times = {k: v for k, v in times.items() if k.startswith("triton:")}
    best_triton = pick_winner(triton_times)
    return {
        "backend": by_label[winner][0],
        "triton_config": asdict(by_label[best_triton][1]) if best_triton else None,
        "ms": {k: {r: round(v, 5) for r, v in t.items()} for k, t in sorted(times.items())},
        "winner": winner,
        "date": _dt.date.today().isoformat(),
    }


def _operand(shape: tuple[int, ...], layout: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Random data of `shape` stored row-major ('r') or with the last two dims swapped ('c')."""
    if layout == "c":
        return torch.randn(*shape[:-2], shape[-1], shape[-2], device=device).to(dtype).transpose(-1, -2)
    return torch.randn(shape, device=device).to(dtype)


def tune_key(
    key: TuneKey, *, max_configs: int = 8, device: torch.device | None = None, warmup: int = 5, iters: int = 20
) -> dict[str, Any] | None:
    """Measure the problem a key describes (at the top of its token bucket) and store the winner.

    `device` defaults to the current CUDA device (the key names the GPU model, not an index)."""
    from ragdot.tune.cache import CACHE

    device = device or torch.device("cuda", torch.cuda.current_device())
    dtype, out_dtype = getattr(torch, key.dtype), getattr(torch, key.out_dtype)
    bt, s1, s2, g = key.sizes
    la, lb = key.layout[1], key.layout[3]
    extent = key.bucket
    if key.problem == "ragged_m":
        a = _operand((bt, extent, s1), la, dtype, device)
        b = _operand((bt, g, s1, s2), lb, dtype, device)
    elif key.problem == "ragged_k":
        a = _operand((bt, extent, s1), la, dtype, device)
        b = _operand((bt, extent, s2), lb, dtype, device)
    else:
        return None
    dims = (extent, s1, s2, g) if key.problem == "ragged_m" else (s1, extent, s2, g)
    cands = candidates_for(key.problem, dims, dtype, max_configs)
    times = measure_problem(key.problem, a, b, g, out_dtype, cands, warmup=warmup, iters=iters)
    entry = entry_from_times(times, cands)
    if entry is not None:
        if key_for(key.problem, a, b, g, out_dtype) != key:  # the operands must describe the key exactly
            raise RuntimeError(f"tuning operands do not match key {key.text()}")
        CACHE.put({key.text(): entry})
    return entry
