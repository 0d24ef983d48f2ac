"""Measured backend and config selection for `backend=None` / `"auto"`.

For each call: the cached measurements for its key; the heuristic order when there is no entry (the device's
candidate order; for weight gradients gluon before triton on sm_90, and the vendor first with long groups; one
warning per GPU that has no shipped results); tuning at call time only with `RAGDOT_AUTOTUNE=1`. The choice
is a pure function of the key, the cache and the clock the call runs on, hence deterministic, and it never
synchronises with the device.

Eager calls pay host time as well as device time: a candidate's eager cost is max(device time, host time
per call) (the host and the device overlap when calls come back to back), so where an entry's device times
are close, the backend that is cheaper for the host wins in eager, while a CUDA-graph capture picks by
device time alone.

A call whose result must land in a buffer of the caller's (`copy_ms` > 0: the JAX bridge writes XLA's
output buffer) adds the copy of the result to every backend that cannot write there (`writes_into` False):
on the H200 the vendor's mixtral-8x7b weight gradient (7.35 ms tuned, against triton's 8.43) took 11.0 ms a
call in `ragdot.jax` (its profile: a 3.8 ms copy of the 8 GB result), triton 8.5 ms writing in place.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from ragdot.backends import candidates, get_backend
from ragdot.tune.cache import CACHE
from ragdot.tune.key import TuneKey, key_for, layout_of

__all__ = ["plan", "tuned_entry", "entry_config", "config_from_dict", "eager_cost", "heuristic_order"]

_warned: set[str] = set()


def config_from_dict(data: dict[str, Any] | None, backend: str = "triton") -> Any:
    """A backend's config object from its stored dictionary (None stays None)."""
    return None if data is None else get_backend(backend).config_from_dict(data)


def entry_config(entry: dict[str, Any] | None, backend: str) -> Any:
    """The best measured config of `backend` in a cache entry (None: none stored, or no configs)."""
    if not entry:
        return None
    data = entry.get("configs", {}).get(backend, entry.get(f"{backend}_config"))
    return config_from_dict(data, backend)


def tuned_entry(key: TuneKey) -> dict[str, Any] | None:
    entry = CACHE.get(key.text(), key.device)
    if entry is None and os.environ.get("RAGDOT_AUTOTUNE", "") == "1":
        from ragdot.tune.tuner import tune_key

        entry = tune_key(key)
    if entry is None and key.device not in _warned and not CACHE.has_shipped(key.device):
        _warned.add(key.device)
        warnings.warn(
            f"ragdot: no tuned results for {key.device}; choosing backends and tiles by heuristics "
            "(run `ragdot tune` once to measure them, or set RAGDOT_AUTOTUNE=1)",
            stacklevel=4,
        )
    return entry


def eager_cost(entry: dict[str, Any], host: dict[str, dict[str, float]], problem: str,
               extra: dict[str, float] | None = None) -> dict[str, float]:
    """Per backend, the eager cost of its best measured candidate: summed over routings of
    max(device ms, host ms per call) + extra ms per call (`extra`, by backend: e.g. a copy of the result);
    backends without a host measurement count device time only."""
    costs: dict[str, float] = {}
    extra = extra or {}
    for label, times in entry.get("ms", {}).items():
        name = label.split(":", 1)[0]
        floor = host.get(name, {}).get(problem, 0.0)
        cost = sum(max(ms, floor) + extra.get(name, 0.0) for ms in times.values())
        costs[name] = min(cost, costs.get(name, float("inf")))
    return costs


def _winner(entry: dict[str, Any], problem: str, device: str, names: list[str], eager: bool,
            copy_ms: float = 0.0) -> str:
    if not eager and not copy_ms:
        return entry["backend"]
    extra = {n: copy_ms for n in names if not get_backend(n).writes_into} if copy_ms else None
    host = CACHE.host_ms(device) if eager else {}
    costs = {n: c for n, c in eager_cost(entry, host, problem, extra).items() if n in names}
    if costs:
        return min(sorted(costs), key=costs.__getitem__)
    return entry["backend"]


# Without a measurement, a weight gradient (ragged_k) whose groups hold this many rows or more on average runs
# the vendor before triton (first where the gluon backend is not usable). On the H200 (bf16, kernel clock)
# CUTLASS's weight gradient beat ragdot's Triton one at 480 rows a group (mixtral-8x7b's anchor, tuned:
# 1.12-1.17x), 512 (Qwen3-MoE widths at 8192 tokens, untuned: >= 1.04x) and 1024 (DeepSeek-V3-like widths:
# >= 1.19x); every tuned anchor with at most 160 rows a group went to triton (benchmarks/results/
# h200-compile-20261201/). Where gluon is usable its default tile goes first whatever the group length (the
# vendor next, for what gluon refuses): it beat the vendor at 480 rows a group too (mixtral-8x7b, shipped tune:
# 6.65 against 7.76 ms), and 1.22-1.24x at 512 and 1.10x at 1024 (graph; benchmarks/results/
# h200-late-20261201/model-widths-2a84abd/).
VENDOR_WGRAD_ROWS = 448  # between the measured points: <= 160 rows a group triton, >= 480 the vendor

# Untuned weight gradients on sm_90 run the gluon backend's default tile (cooperative 128x256, 32-deep chunks,
# six stages) before triton's: on the H200 (bf16, untuned against untuned, benchmarks/results/h200-evening-
# 20261201/gluon-sweep-36cf7ee/) it was 1.01-1.42x triton's heuristic tile on graph replays in all 12 anchor
# cells where it ran (20-480 rows a group), and 0.94-1.38x in eager (the two below 1.0 on deepseek3-test, where
# eager calls are host-bound); at 480 rows a group (mixtral-8x7b) 1.07-1.08x the vendor as well.
GLUON_WGRAD_FIRST = True


def heuristic_order(problem: str, names: list[str], a: torch.Tensor, num_groups: int,
                    copy_ms: float = 0.0, b: torch.Tensor | None = None) -> list[str]:
    """`names` (the device's candidate order) for a call with no measured entry; a [Bt, R, M] (ragged_k) or
    [Bt, M, K] (ragged_m), b [Bt, G, K, N] (ragged_m; None: the order for a row-major B of 64-byte rows).

    Weight gradients (ragged_k): where the gluon backend is usable (sm_90) its default tile goes first, before
    triton and the vendor (`GLUON_WGRAD_FIRST`); with long groups (`VENDOR_WGRAD_ROWS`; CUDA builds, where it
    was measured) the vendor goes before triton (first where gluon is not usable), unless the result must be
    copied into the caller's buffer (the vendor cannot write there). ragged_m: the vendor first where it beat
    every tile measured (`kernels.configs.vendor_beats_tiles`: narrow outputs of a row-major B whose rows are
    no 64-byte multiple), on the same terms."""
    # the vendor may move ahead: it is a candidate, writes its own result, and runs a CUDA build (where measured)
    vendor_ok = "torch" in names and not copy_ms and torch.version.hip is None
    if problem == "ragged_m":
        if vendor_ok and b is not None and _vendor_beats_tiles(a, b, num_groups):
            return ["torch", *[n for n in names if n != "torch"]]
        return names
    if problem != "ragged_k":
        return names
    order = list(names)
    gluon_first = GLUON_WGRAD_FIRST and "gluon" in order and "triton" in order
    if gluon_first:  # before triton and the vendor
        order.remove("gluon")
        order.insert(min(order.index(n) for n in ("triton", "torch") if n in order), "gluon")
    long_groups = num_groups > 0 and a.shape[1] >= VENDOR_WGRAD_ROWS * num_groups
    if long_groups and vendor_ok:
        # the vendor before triton: first, or right after gluon's tile (which refuses what it cannot take:
        # dtypes other than bf16/fp16, strided rows; the vendor then runs, as without gluon)
        order.remove("torch")
        order.insert(order.index("gluon") + 1 if gluon_first else 0, "torch")
    return order


def _vendor_beats_tiles(a: torch.Tensor, b: torch.Tensor, num_groups: int) -> bool:
    """`kernels.configs.vendor_beats_tiles` for ragged_m operands a [Bt, M, K], b [Bt, G, K, N] (a row-major B
    taken to have rows of N elements, as the tile heuristic takes it); False where Triton is not installed."""
    try:
        from ragdot.kernels.configs import vendor_beats_tiles
    except ImportError:
        return False
    return vendor_beats_tiles(a.shape[1], b.shape[3], num_groups, b.dtype, layout_of(b) != "r")


def plan(
    problem: str, requested: str, a: torch.Tensor, b: torch.Tensor, num_groups: int, out_dtype: torch.dtype,
    *, eager: bool = True, copy_ms: float = 0.0, replay: bool = False,
) -> list[tuple[str, Any]]:
    """The (backend, config) pairs to try in order; `eager` says the call runs outside a graph capture;
    `copy_ms`: what copying the result into the caller's buffer costs a backend that cannot write it; `replay`:
    the call's launches are recorded and replayed (the JAX bridge), which gluon's are not."""
    if a.device.type != "cuda":
        names = candidates(a.device) if requested == "auto" else [requested]
        return [(name, None) for name in names]
    if requested != "auto" and get_backend(requested).config_type is None:
        return [(requested, None)]
    key = key_for(problem, a, b, num_groups, out_dtype)
    entry = tuned_entry(key)
    if requested != "auto":
        return [(requested, entry_config(entry, requested))]
    names = candidates(a.device)
    if replay:  # ragdot.jax, writing XLA's buffers, replays recorded launches: gluon's are not recordable yet
        names = [n for n in names if n != "gluon"]
    if entry is not None:
        first = _winner(entry, problem, key.device, names, eager, copy_ms)
        if first in names:  # else the measured winner cannot run here: the device order
            names = [first, *[n for n in names if n != first]]
    else:
        names = heuristic_order(problem, names, a, num_groups, copy_ms, b)
    return [(name, entry_config(entry, name)) for name in names]
