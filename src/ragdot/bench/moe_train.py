"""`ragdot moe-bench` (train-step mode): time the train steps of one model config over its variants.

A config's decoder is built once and every variant (a compute path and a ragdot backend, see
`ragdot.moe.variants`) is timed on it: step times, peak and temporary memory, and, in a separate profiled
forward+backward of one MoE layer, the split of its kernel time into routing, grouped GEMMs and the rest.
On CUDA the step is captured in a CUDA graph and the replays are timed, one variant after another.

``--eager`` times Python-driven steps instead, whose host-bound time drifts on a shared host (up to 1.5x between
minutes on the benchmark host), so two or more available variants are timed interleaved: each is warmed up
(two steps, their memory measured), then rounds visit every variant in turn, the first one rotating from round
to round; a visit switches the model to the variant, runs one untimed step (the first step after a switch pays
allocator and autotune-cache effects) and times STEPS_PER_VISIT steps, each on CUDA events after a
synchronisation, then as many more back to back with events around them (the loop clock, as a training loop
issues its steps: the host issues a step while the device still runs the one before). Rounds go on until every
variant has ``--steps`` timed steps or ``--max-seconds`` per variant (summed over the variants) are spent, with at
least MIN_STEPS timed steps each; a variant that fails leaves the rotation. Their rows say mode "eager
(interleaved)"; ``step_s`` is the median of the steps timed one by one, ``loop_step_s`` that of the visits' loop
times (``loop_vs_dense_drop``: dense_drop's over the row's).
Each config may run in a spawned process of its own (`run_config_in_subprocess`).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ragdot.cli_common import quiet_native_stderr
from ragdot.measure.checks import failure_status
from ragdot.measure.timing import capture_graph, event_ms, free_memory, loop_ms, rotated, synchronize
from ragdot.moe.variants import VARIANTS, Variant, give_floor_grads, no_routed_experts

__all__ = ["ROUTING_OPS", "run_config", "run_config_in_subprocess"]

# the routing's named ranges (`ragdot.ops.profiled` and the custom ops); every other ragdot name is a GEMM's
ROUTING_OPS = frozenset({"ragdot::moe_permute", "ragdot::moe_combine", "ragdot::moe_combine_backward",
                         "ragdot::moe_sort", "ragdot::moe_gather"})
Row = dict[str, Any]
STEPS_PER_VISIT = 2  # timed steps of a variant per round of the interleaved eager timing
MIN_STEPS = 3  # timed steps of every variant whatever the time budget (or --steps, if fewer)
INTERLEAVED = "eager (interleaved)"
SKIPPED: Row = {"status": "skipped", "note": "the run's --budget was spent"}
Timed = tuple[list[float], float | None, float | None, str]  # step seconds, peak GB, temporary GB, mode


class _Setup(NamedTuple):
    """What every variant of a config is timed with: one decoder, its AdamW, one batch."""

    model: Any
    opt: torch.optim.Optimizer
    tokens: torch.Tensor
    cfg: Any
    args: argparse.Namespace
    device: torch.device
    dtype: torch.dtype


@dataclass
class _Lane:
    """One variant in the interleaved eager timing: its row (a status once it has failed), warm-up memory, steps."""

    variant: Variant
    row: Row
    peak: float | None = None
    temp: float | None = None
    times: list[float] = field(default_factory=list)
    loops: list[float] = field(default_factory=list)  # seconds per step on the loop clock, one per visit

    @property
    def live(self) -> bool:
        return "status" not in self.row


def _train_step(model, opt, tokens) -> None:
    model.loss(tokens).backward()
    if getattr(model, "_floor", False):  # the floor's expert weights: zero gradients, so AdamW updates them
        give_floor_grads(model.parameters())
    opt.step()
    opt.zero_grad(set_to_none=True)  # gradients count as the step's temporary memory


def _warm_up(model, opt, tokens, device: torch.device) -> tuple[float | None, float | None]:
    """Two eager steps on the current stream; the peak and temporary memory of the second (GB; None off CUDA)."""
    cuda = device.type == "cuda"
    peak_bytes = before = 0
    for _ in range(2):
        synchronize(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        _train_step(model, opt, tokens)
        synchronize(device)
        if cuda:
            peak_bytes = torch.cuda.max_memory_allocated(device)
    return (peak_bytes / 1e9, (peak_bytes - before) / 1e9) if cuda else (None, None)


def _time_steps(model, opt, tokens, args, device) -> Timed:
    """Seconds of steps 1..n of one variant, the peak and temporary memory of an eager step (GB; None off
    CUDA), the mode.

    On CUDA the step is captured once in a CUDA graph (forward, backward and optimizer step) after two eager
    steps, and the replays are timed: no Python or launch overhead, like a compiled (XLA) train step. A step
    that cannot be captured is timed eagerly instead, and the mode says so. With args.eager the steps after
    the two warm-up steps (on the current stream) are timed eagerly, back to back: `run_config` takes this
    path for a single available variant only and times several interleaved (`_run_interleaved`). Off CUDA
    the steps are timed at once, without warm-up.
    """
    if device.type != "cuda":
        return _timed_steps(lambda: _train_step(model, opt, tokens), args, device), None, None, "eager"
    # Warm-up off the default stream where a capture follows (as capture wants); eager steps warm up on the
    # stream they run on, as a training loop does: parameters' gradient-accumulation nodes keep the stream of
    # the step that made them, and a later step on another stream pays a cross-stream wait per parameter.
    side = torch.cuda.current_stream(device) if args.eager else torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        peak, temp = _warm_up(model, opt, tokens, device)
    torch.cuda.current_stream(device).wait_stream(side)
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
        if len(times) >= MIN_STEPS and time.perf_counter() - start > args.max_seconds:
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


def _variant_row(name: str) -> tuple[Variant, Row]:
    variant = VARIANTS[name]
    path = variant.path if variant.experts else "none"  # the floor
    return variant, {"variant": name, "path": path, "backend": variant.backend or ""}


def _available(variant: Variant) -> bool:
    import ragdot

    return variant.backend in (None, "auto") or variant.backend in ragdot.backends()


CAPACITY_FACTOR = 1.25  # the dense paths' expert capacity in every train-step measurement


def use_variant(model, variant: str | Variant, **settings: object) -> None:
    """Every MoE layer of `model` runs `variant` (a name in VARIANTS or a Variant) at CAPACITY_FACTOR, with
    further layer `settings` (e.g. routing_impl)."""
    if isinstance(variant, str):
        variant = VARIANTS[variant]
    model.set_moe(**variant.settings, capacity_factor=CAPACITY_FACTOR, **settings)
    for layer in model.moe_layers:
        no_routed_experts(layer, not variant.experts)
    model._floor = not variant.experts  # `_train_step` then gives the expert weights their zero gradients


def _use(model, variant: Variant, args: argparse.Namespace) -> None:
    use_variant(model, variant, routing_impl=args.routing_impl)


def _attempt(row: Row, opt: torch.optim.Optimizer, work: Callable[[], None]) -> bool:
    """work(); whether it went well. A failure (OOM, a backend that cannot serve) becomes row's status and
    note instead of ending the run, and clears the AdamW state, which a step cut short can leave half made."""
    try:
        work()
        return True
    except Exception as exc:
        status, note = failure_status(exc)
        row.update(status=status, note=note)
        opt.state.clear()  # the next variant starts afresh
        return False
    finally:
        opt.zero_grad(set_to_none=True)


def _finish(s: _Setup, row: Row, variant: Variant, timed: Timed) -> None:
    """A timed variant's row: the median step of its steps from args.measure_from on, throughput, memory, mode,
    and (unless args.no_profile) the kernel split of the model's first MoE layer as it is set now."""
    times, peak, temp, mode = timed
    step = statistics.median(times[min(s.args.measure_from, len(times)) - 1 :])
    row.update(
        status="ok",
        step_s=step,
        steps=len(times),
        tokens_per_s=s.cfg.tokens / step,
        tflops=s.cfg.train_flops() / step / 1e12 if variant.experts else None,  # the floor skips the routed work
        moe_gflop=s.cfg.moe_flops() / 1e9,
        peak_gb=peak,
        temp_gb=temp,
        mode=mode,
    )
    if not s.args.no_profile and variant.experts:  # the floor has no routed work to split
        with quiet_native_stderr(s.device.type == "cpu"):  # the CPU profiler logs its start and stop there
            row.update(_profile_layer(s.model.moe_layers[0], s.cfg, s.dtype, s.device, share=variant.path == "sparse"))


def _run_variant(model, opt, tokens, cfg, name, args, device, dtype) -> Row:
    """One variant timed on its own (`_time_steps`)."""
    s = _Setup(model, opt, tokens, cfg, args, device, dtype)
    variant, row = _variant_row(name)
    if not _available(variant):
        return {**row, "status": "unavailable"}
    _use(model, variant, args)
    _attempt(row, opt, lambda: _finish(s, row, variant, _time_steps(model, opt, tokens, args, device)))
    return row


def _interleaves(args: argparse.Namespace) -> bool:
    """Whether run_config times the variants interleaved: eager steps of two or more available variants."""
    return bool(args.eager) and sum(_available(VARIANTS[name]) for name in args.variants) >= 2


def _run_interleaved(s: _Setup, stop: Callable[[], bool] | None) -> list[Row]:
    """The rows of args.variants, their eager steps timed in interleaved rounds (see the module docstring).
    Once `stop()` says so, the variants not yet warmed up are skipped."""
    lanes = [_Lane(*_variant_row(name)) for name in s.args.variants]
    for lane in lanes:
        if not _available(lane.variant):
            lane.row["status"] = "unavailable"
        elif stop is not None and stop():
            lane.row.update(SKIPPED)
        elif not _attempt(lane.row, s.opt, functools.partial(_warm_lane, s, lane)):
            free_memory(s.device)
    _rounds(s, [lane for lane in lanes if lane.live])
    for lane in lanes:
        if lane.live:
            _use(s.model, lane.variant, s.args)  # the profiled layer runs as this variant
            _attempt(lane.row, s.opt, functools.partial(_finish, s, lane.row, lane.variant, _lane_timed(lane)))
            if lane.row.get("status") == "ok" and lane.loops:
                lane.row["loop_step_s"] = statistics.median(lane.loops)
    return [lane.row for lane in lanes]


def _warm_lane(s: _Setup, lane: _Lane) -> None:
    _use(s.model, lane.variant, s.args)
    lane.peak, lane.temp = _warm_up(s.model, s.opt, s.tokens, s.device)


def _lane_timed(lane: _Lane) -> Timed:
    return lane.times, lane.peak, lane.temp, INTERLEAVED


def _rounds(s: _Setup, lanes: list[_Lane]) -> None:
    """Rounds of visits (`_visit`) to the live lanes, the first lane rotating, until no lane wants more steps."""
    deadline = time.perf_counter() + s.args.max_seconds * len(lanes)
    for r in itertools.count():
        live = [lane for lane in lanes if lane.live]
        if not live:
            return
        visited = False
        for lane in rotated(live, r):
            n = _visit_steps(len(lane.times), s.args.steps, time.perf_counter() > deadline)
            if n > 0:
                visited = True
                if not _attempt(lane.row, s.opt, functools.partial(_visit, s, lane, n)):
                    free_memory(s.device)
        if not visited:
            return


def _visit_steps(done: int, steps: int, spent: bool) -> int:
    """Timed steps of a lane's next visit: up to STEPS_PER_VISIT towards `steps`, towards MIN_STEPS only once
    the time budget is spent."""
    goal = min(MIN_STEPS, steps) if spent else steps
    return max(0, min(STEPS_PER_VISIT, goal - done))


def _visit(s: _Setup, lane: _Lane, n: int) -> None:
    """Switch the model to the lane's variant, run one untimed step (the first step after a switch pays
    allocator and autotune-cache effects), then time n steps one by one (each from an idle device), then n more
    back to back (the loop clock: events around the n)."""
    _use(s.model, lane.variant, s.args)
    step = functools.partial(_train_step, s.model, s.opt, s.tokens)
    step()
    for _ in range(n):
        lane.times.append(event_ms(step, s.device) / 1e3)
    lane.loops.append(loop_ms(step, s.device, n, repeats=1) / 1e3)


def training_setup(cfg, device: torch.device, dtype: torch.dtype):
    """(model, optimizer, tokens) of a train step of config `cfg`: the decoder seeded with 0, AdamW (fused and
    capturable on CUDA) and one seeded batch of `cfg.batch` sequences of `cfg.seq_len + 1` tokens. What
    `moe-bench` and the train-step benchmarks in benchmarks/ time."""
    from ragdot.moe.model import MoEDecoder

    torch.manual_seed(0)
    model = MoEDecoder(cfg, dtype=dtype, device=device)
    fused = {"fused": True, "capturable": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **fused)
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), generator=gen, device=device)
    return model, opt, tokens


def variant_step(cfg, variant: str, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> Callable[[], None]:
    """One train step (forward, backward, AdamW) of a fresh `training_setup` running `variant`."""
    model, opt, tokens = training_setup(cfg, device, dtype)
    use_variant(model, variant)
    return functools.partial(_train_step, model, opt, tokens)


def run_config(
    cfg, args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
    emit: Callable[[Row], None] | None = None, stop: Callable[[], bool] | None = None,
) -> list[Row]:
    """Every variant of args.variants on config `cfg`; each row is passed to `emit` as it finishes (eager
    steps of several variants: all rows after the interleaved timing, in args.variants order). Once `stop()`
    says so (a spent budget), the variants not yet run are rows of status "skipped"."""
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
    model, opt, tokens = training_setup(cfg, device, dtype)
    if _interleaves(args):
        for row in _run_interleaved(_Setup(model, opt, tokens, cfg, args, device, dtype), stop):
            done({**base, **row})
    else:
        for name in args.variants:
            if stop is not None and stop():
                done({**base, "variant": name, **SKIPPED})
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
