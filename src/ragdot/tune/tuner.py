"""Measuring candidates on seeded group sizes and picking winners.

Group sizes are seeded (`ragdot.routing`), each set summing exactly to the ragged extent (every pointer in
bounds, every output written): balanced, skewed, and routed (one seeded draw of a uniform router). The winner
minimises the summed median time over the three, so it does not win on balanced routing alone: balanced sizes
are exact multiples of every chunk depth wherever M / E is one, and a router's never are (on an H100 a 64-deep
ping-pong tile led gpt-oss-like's weight gradient by 10% on balanced sizes and trailed by 16% on routed ones,
benchmarks/results/h100-20261207g/c/). On CUDA
the candidates are timed as CUDA-graph replays (device time), so Python dispatch cost cannot pick a kernel. Every
candidate's result is checked against the reference before it is timed; a wrong one is never chosen. The
candidates within `FINALIST_MARGIN` of the best summed time are then timed again among themselves, and those
times decide: in a pass over every candidate the H200 timed one Triton tile 7% slower than the same tile timed
beside two others (benchmarks/results/h200-20261205), enough to flip a pick between tiles 2-4% apart.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ragdot.backends import available_backends, get_backend
from ragdot.groups import group_ends_from_sizes
from ragdot.measure.checks import normalised_error, within_tolerance
from ragdot.tune.key import TuneKey, key_for

__all__ = ["Candidate", "candidates_for", "pick_winner", "measure_problem", "tune_key", "ROUTINGS"]

ROUTINGS: tuple[str, ...] = ("balanced", "skewed", "routed")
# Candidates whose summed time is within 10% of the best are timed again, among themselves: in the H200's
# weight-gradient tunes the tile that won beside two others read up to 7.7% over the best in the full pass.
FINALIST_MARGIN = 0.10
# ... with this many times the iterations: finalists can be 1% apart in their summed time, where a pass of 20
# replays each put qwen3-30b-a3b's weight-gradient pair in one order and the benchmark's in the other.
FINALIST_ITERS = 3

Candidate = tuple[str, Any]  # (backend name, that backend's config or None)


def label(candidate: Candidate) -> str:
    name, cfg = candidate
    return get_backend(name).config_label(cfg)


def candidates_for(
    problem: str, dims: tuple[int, int, int, int], dtype: torch.dtype, max_configs: int,
    device: torch.device | None = None, b_kmajor: bool = False,
) -> list[Candidate]:
    """Every usable fast backend with up to `max_configs` of its own tuning configs (the vendor kernel has
    one, itself; Triton its heuristic's pick and configs that measured well in the regime; Gluon, on Hopper,
    its warp-specialized tiles), each list starting with the tile a call on `device` runs untuned. dims =
    (M, K, N, G) for ragged_m, (M, R, N, G) for ragged_k; `b_kmajor`: ragged_m's B is column-major."""
    out: list[Candidate] = []
    for name in ("torch", "triton", "gluon"):
        if name in available_backends():
            configs = get_backend(name).tuning_configs(problem, dims, dtype, max_configs, device, b_kmajor)
            out += [(name, cfg) for cfg in configs]
    return out


def _summed(times: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each label's time summed over the routings, for the labels timed (above zero) on every routing."""
    routings = set().union(*(t.keys() for t in times.values())) if times else set()
    return {name: sum(t.values()) for name, t in times.items() if set(t) == routings and all(v > 0 for v in t.values())}


def pick_winner(times: dict[str, dict[str, float]]) -> str | None:
    """The label with the smallest summed time over routings (only labels timed on every routing count)."""
    sums = _summed(times)
    return min(sorted(sums), key=sums.__getitem__) if sums else None


def _run(
    candidate: Candidate, problem: str, a: torch.Tensor, b: torch.Tensor, num_groups: int, out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> Callable[[torch.Tensor | None], torch.Tensor]:
    """The candidate prepared for these operands, as the dispatcher runs it: group sizes -> output. With `out`
    (the canonical output), a backend whose prepared kernels write into a given buffer writes there, so the
    candidates' CUDA graphs do not each hold an output (mixtral-8x7b's weight gradient: 7.5 GiB apiece)."""
    name, cfg = candidate
    backend = get_backend(name)
    prepared = backend.prepare(problem, a, b, num_groups, out_dtype, cfg)
    kernel = getattr(prepared, "prepared", None)
    if out is not None and backend.writes_into and kernel is not None:
        return lambda sizes: kernel(a, b, sizes, out)[0]
    return lambda sizes: prepared(a, b, sizes)


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
    finals: bool = True,
) -> dict[str, dict[str, float]]:
    """Median ms per candidate label and routing; wrong or failing candidates are left out. With `finals`, the
    finalists' times are those of a second pass that times only them."""
    from ragdot.measure.timing import Timed, measure
    from ragdot.routing import group_sizes

    extent = a.shape[1]
    reference = get_backend("reference")
    runs: dict[str, list[Timed]] = {}  # routing -> the candidates that ran right, ready to time
    shared: torch.Tensor | None = None  # one output for every routing's candidates that write into a buffer
    for routing in routings:
        sizes = group_sizes(routing, extent, num_groups, device=a.device)
        ends = group_ends_from_sizes(sizes, extent)
        ref_args = (a, b, ends, out_dtype) if problem != "batch" else (a, b, out_dtype)
        ref = getattr(reference, problem)(*ref_args).float()
        sizes_arg = sizes if problem != "batch" else None
        if shared is None and problem != "batch":
            shared = torch.empty(ref.shape, dtype=out_dtype, device=a.device)
        runs[routing] = []
        for cand in cands:
            try:
                fn = _run(cand, problem, a, b, num_groups, out_dtype, shared)
                out = fn(sizes_arg)
            except (NotImplementedError, RuntimeError):
                continue  # cannot run this case (e.g. shared memory): not a candidate here
            if not within_tolerance(normalised_error(out, ref), a.dtype, default=2e-2):
                continue
            runs[routing].append(Timed(label(cand), [lambda fn=fn, sizes=sizes_arg: fn(sizes)]))
    # Device time (CUDA-graph replays): host dispatch overhead must not decide between kernels.
    graphs = a.device.type == "cuda"

    def timed(names: set[str] | None, n_iters: int) -> dict[str, dict[str, float]]:
        times: dict[str, dict[str, float]] = {}
        for routing, systems in runs.items():
            chosen = [s for s in systems if names is None or s.name in names]
            for name, timing in measure(chosen, a.device, warmup=warmup, iters=n_iters, graphs=graphs).items():
                times.setdefault(name, {})[routing] = timing.median
        return times

    times = timed(None, iters)
    finalists = _finalists(times) if finals else set()
    if 1 < len(finalists) < len(times):  # a second pass over the whole set would tell nothing new
        times.update(timed(finalists, iters * FINALIST_ITERS))
    return times


def _finalists(times: dict[str, dict[str, float]]) -> set[str]:
    """The labels timed on every routing whose summed time is within FINALIST_MARGIN of the best."""
    sums = _summed(times)
    best = min(sums.values(), default=0.0)
    return {name for name, total in sums.items() if total <= best * (1 + FINALIST_MARGIN)}


def entry_from_times(times: dict[str, dict[str, float]], cands: Sequence[Candidate]) -> dict[str, Any] | None:
    """The cache entry: the overall winner, each configurable backend's best config (used when that backend
    is forced, and by `auto` when it picks that backend), and every candidate's times."""
    by_label = {label(c): c for c in cands}
    winner = pick_winner(times)
    if winner is None:
        return None
    configs = {}
    for name in sorted({n for n, cfg in cands if cfg is not None}):
        best = pick_winner({k: v for k, v in times.items() if by_label.get(k, ("", None))[0] == name})
        configs[name] = get_backend(name).config_to_dict(by_label[best][1]) if best else None
    return {
        "backend": by_label[winner][0],
        "configs": configs,
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
    cands = candidates_for(key.problem, dims, dtype, max_configs, device, key.b_kmajor)
    times = measure_problem(key.problem, a, b, g, out_dtype, cands, warmup=warmup, iters=iters)
    entry = entry_from_times(times, cands)
    if entry is not None:
        if key_for(key.problem, a, b, g, out_dtype) != key:  # the operands must describe the key exactly
            raise RuntimeError(f"tuning operands do not match key {key.text()}")
        CACHE.put({key.text(): entry})
    return entry
