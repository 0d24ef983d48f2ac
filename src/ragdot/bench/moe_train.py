"""`ragdot moe-bench` (train-step mode): time the train steps of one model config over its variants.

A config's decoder is built once and every variant (a compute path and a ragdot backend, see
`ragdot.moe.variants`) is timed on it: step times, peak and temporary memory, and, in a separate profiled
forward+backward of one MoE layer, the split of its kernel time into routing, grouped GEMMs and the rest.
On CUDA the step is captured in a CUDA graph and the replays are timed (``--eager``: Python-driven steps);
each config may run in a spawned process of its own (`run_config_in_subprocess`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ragdot.cli_common import quiet_native_stderr
from ragdot.measure.checks import failure_status
from ragdot.measure.timing import capture_graph, event_ms, free_memory, synchronize
from ragdot.moe.variants import VARIANTS

__all__ = ["ROUTING_OPS", "run_config", "run_config_in_subprocess"]

ROUTING_OPS = frozenset({"ragdot::moe_permute", "ragdot::moe_combine", "ragdot::moe_combine_backward"})
Row = dict[str, Any]


def _train_step(model, opt, tokens) -> None:
    model.loss(tokens).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)  # gradients count as the step's temporary memory


def _time_steps(model, opt, tokens, args, device) -> tuple[list[float], float | None, float | None, str]:
    """Seconds of steps 1..n, the peak and temporary memory of an eager step (GB; None off CUDA), the mode.

    On CUDA the step is captured once in a CUDA graph (forward, backward and optimizer step) after two eager
    steps, and the replays are timed: no Python or launch overhead, like a compiled (XLA) train step. A step
    that cannot be captured is timed eagerly instead, and the mode says so.
    """
    if device.type != "cuda":
        return _timed_steps(lambda: _train_step(model, opt, tokens), args, device), None, None, "eager"
    # Warm-up off the default stream where a capture follows (as capture wants); eager steps warm up on the
    # stream they run on, as a training loop does: parameters' gradient-accumulation nodes keep the stream of
    # the step that made them, and a later step on another stream pays a cross-stream wait per parameter.
    side = torch.cuda.current_stream(device) if args.eager else torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            _train_step(model, opt, tokens)
            torch.cuda.synchronize(device)
            peak_bytes = torch.cuda.max_memory_allocated(device)
    torch.cuda.current_stream(device).wait_stream(side)
    peak, temp = peak_bytes / 1e9, (peak_bytes - before) / 1e9
    step, mode = (lambda: _train_step(model, opt, tokens)), "eager"
    if not args.eager:
        torch.cuda.empty_cache()  # the graph's private pool cannot reuse blocks cached by the eager steps
        try:
            step, mode = capture_graph(lambda: _train_step(model, opt, tokens)), "graph"
        except Exception as exc:  # a host sync or too little memory for the graph: time eager steps
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            mode = f"eager (capture failed: {str(exc).splitlines()[0][:80]})"
    return _timed_steps(step, args, device), peak, temp, mode


def _timed_steps(step: Callable[[], None], args: argparse.Namespace, device: torch.device) -> list[float]:
    """Seconds of up to args.steps steps; after args.max_seconds no new step starts (at least 3 are run)."""
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(args.steps):
        times.append(event_ms(step, device) / 1e3)
        if len(times) >= 3 and time.perf_counter() - start > args.max_seconds:
            break
    return times


def _kernel_split(prof, device: torch.device) -> dict[str, float]:
    """Milliseconds of the profiled region by class: routing ops, other ragdot ops (the GEMMs), the rest."""
    totals = {"routing": 0.0, "gemm": 0.0, "other": 0.0}

    def own_us(evt) -> float:
        if device.type == "cuda":
            return sum(k.duration for k in evt.kernels)
        return evt.self_cpu_time_total

    def visit(evt, cls: str | None) -> None:
        if cls is None and evt.name in ROUTING_OPS:
            cls = "routing"
        elif cls is None and evt.name.startswith("ragdot::"):
            cls = "gemm"
        totals[cls or "other"] += own_us(evt) / 1e3
        for child in evt.cpu_children:
            visit(child, cls)

    for evt in prof.events():
        if evt.cpu_parent is None and evt.device_type == torch.autograd.DeviceType.CPU:
            visit(evt, None)
    return totals


def _profile_layer(layer, cfg, dtype, device, share: bool) -> dict[str, float | None]:
    """Forward + backward of one MoE layer on fresh activations, profiled; kernel ms by class.

    ``share``: report the routing share (only meaningful on the sparse path)."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn((cfg.batch, cfg.seq_len, cfg.dim), generator=gen, device=device, dtype=dtype)
    x.requires_grad_(True)
    grad = torch.randn_like(x)

    def once() -> None:
        layer(x).backward(grad)
        synchronize(device)

    once()
    layer.zero_grad(set_to_none=True)  # as in a train step: the profiled backward writes fresh gradients
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        once()
    layer.zero_grad(set_to_none=True)
    split = _kernel_split(prof, device)
    total = sum(split.values())
    return {
        "moe_ms": total,
        "routing_ms": split["routing"],
        "gemm_ms": split["gemm"],
        "other_ms": split["other"],
        "routing_share": split["routing"] / total if total and share else None,
    }


def _persistent_gb(cfg, itemsize: int) -> float:
    """Weights, gradients and two AdamW states, all in the parameter dtype."""
    return cfg.params() * itemsize * 4 / 1e9


def _run_variant(model, opt, tokens, cfg, name, args, device, dtype) -> Row:
    import ragdot

    variant = VARIANTS[name]
    path, backend = variant.path, variant.backend
    row: dict[str, Any] = {"variant": name, "path": path, "backend": backend or ""}
    if backend not in (None, "auto") and backend not in ragdot.backends():
        return {**row, "status": "unavailable"}
    model.set_moe(**variant._asdict(), capacity_factor=1.25, routing_impl=args.routing_impl)
    try:
        times, peak, temp, mode = _time_steps(model, opt, tokens, args, device)
        window = times[min(args.measure_from, len(times)) - 1 :]
        step = statistics.median(window)
        row.update(
            status="ok",
            step_s=step,
            steps=len(times),
            tokens_per_s=cfg.tokens / step,
            tflops=cfg.train_flops() / step / 1e12,
            peak_gb=peak,
            temp_gb=temp,
            mode=mode,
        )
        if not args.no_profile:
            with quiet_native_stderr(device.type == "cpu"):  # the CPU profiler logs its start and stop there
                row.update(_profile_layer(model.moe_layers[0], cfg, dtype, device, share=path == "sparse"))
    except Exception as exc:  # one variant's failure (OOM, a backend that cannot serve) must not end the run
        status, note = failure_status(exc)
        row.update(status=status, note=note)
        opt.state.clear()  # a step cut short can leave AdamW state half made; the next variant starts afresh
    finally:
        opt.zero_grad(set_to_none=True)
    return row


def run_config(
    cfg, args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
    emit: Callable[[Row], None] | None = None, stop: Callable[[], bool] | None = None,
) -> list[Row]:
    """Every variant of args.variants on config `cfg`; each row is passed to `emit` as it finishes. Once
    `stop()` says so (a spent budget), the variants not yet run are rows of status "skipped"."""
    rows: list[Row] = []

    def done(row: Row) -> None:
        rows.append(row)
        if emit is not None:
            emit(row)

    base = {
        "config": cfg.name,
        "dim": cfg.dim,
        "moe_hidden": cfg.moe_hidden,
        "experts": cfg.num_experts,
        "top_k": cfg.top_k,
        "shared": cfg.num_shared,
        "layers": cfg.layers,
        "tokens": cfg.tokens,
    }
    if device.type == "cuda":
        need = _persistent_gb(cfg, dtype.itemsize)
        have = torch.cuda.get_device_properties(device).total_memory / 1e9
        if need > 0.9 * have:
            reason = f"skipped: weights+grads+AdamW need {need:.0f} GB of {have:.0f} GB"
            for v in args.variants:
                done({**base, "variant": v, "status": reason})
            return rows
    from ragdot.moe.model import MoEDecoder

    torch.manual_seed(0)
    model = MoEDecoder(cfg, dtype=dtype, device=device)
    fused = {"fused": True, "capturable": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **fused)
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), generator=gen, device=device)
    for name in args.variants:
        if stop is not None and stop():
            done({**base, "variant": name, "status": "skipped", "note": "the run's --budget was spent"})
            continue
        done({**base, **_run_variant(model, opt, tokens, cfg, name, args, device, dtype)})
        free_memory(device)
    del model, opt
    free_memory(device)
    return rows


def _config_worker(cfg, args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[Row]:
    return run_config(cfg, args, torch.device(device), dtype)


def run_config_in_subprocess(cfg, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[Row]:
    """`run_config` in a spawned process (CUDA state and graph memory pools die with it)."""
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    args = argparse.Namespace(**{k: v for k, v in vars(args).items() if not k.startswith("_")})  # picklable
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        try:
            return pool.submit(_config_worker, cfg, args, str(device), dtype).result()
        except Exception as exc:  # the process died (e.g. a driver error): report it, keep the run going
            note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            return [{"config": cfg.name, "variant": v, "status": "error", "note": note} for v in args.variants]
