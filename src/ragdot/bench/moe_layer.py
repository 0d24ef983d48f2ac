"""`ragdot moe-bench --layer`: forward + backward of ONE MoE layer, ragdot's sparse path against `peer`.

    ragdot moe-bench --layer                          # default configs, 8192 and 32768 tokens, eager and compile
    ragdot moe-bench --layer --configs qwen3-30b-a3b --tokens 8192 --modes eager
    ragdot moe-bench --layer --quick                  # CPU smoke run of a tiny layer, seconds

A step is ``y = layer(x); y.backward(dy)`` on x [tokens, dim] (gradients of x, the router and the expert
weights; all set to None before each step, outside the clock). The layer shapes are the expert shapes (dim,
expert hidden width, experts, top-k) of ``ragdot.moe.model.LAYER_CONFIGS``, without shared experts.
Variants: ``peer`` (``ragdot.moe.peer``: the plain layer on ``torch._grouped_mm``, on the very parameters of
the ragdot layer) and ragdot's ``MoELayer(path="sparse")`` per backend (``sparse-torch``, ``sparse-triton``,
``sparse-auto``: the layer's default, which on CUDA with 16-bit inputs is the fused block), ``sparse-unfused``
(auto with ``MoELayer(fused=False)``: permute, two ragged_dot calls, SwiGLU, combine), ``sparse-recompute`` (the
unfused path with the rows and the SwiGLU output remade in the backward, ``MoELayer(recompute=True)``; on
request) and ``sparse-fused`` (the fused block forced, ``MoELayer(fused=True)``); ragdot's layer also
computes its router losses in the forward (not back-propagated here).
Modes: ``eager`` (Python-driven calls) and ``compile`` (``torch.compile`` of the forward, so that AOTAutograd
compiles forward and backward; ``fullgraph=True`` unless ``--allow-graph-breaks``, ``dynamic=False``, dynamo
reset before each row; ``graphs`` counts the graphs dynamo made for the row).

Work (per row): ``tflops`` = the expert GEMMs' useful FLOPs of forward and backward over ``ms``: 18 x tokens x
top-k x dim x hidden (the forward's up projection to 2 x hidden and down projection, 6 x ..., and the backward's
data and weight gradients of both, twice that; the router left out); ``sol_pct`` = that rate over the dense
matmul rate measured at the start of the run (``ragdot.bench.ceilings``, in the run's meta); ``peak_mib`` = on
CUDA, the peak allocation of one more step above what was allocated before it (activations, gradients,
temporaries; not x, dy or the weights), ``mem_vs_peer`` = that peak over peer's; ``act_peak_mib`` = that peak
less the gradients the step leaves (of x and of the layer's parameters: its results, the same in every variant),
i.e. the activations and temporaries at the peak, ``act_vs_peer`` = that over peer's; ``saved_mib`` = what the same
step holds between its forward and its backward (the output and the activations kept for the backward),
``saved_vs_peer`` = that over peer's.

Clocks (the ``clock`` column): ``event`` on CUDA = CUDA events around each step, the device synchronised
before it, so the host time of the Python-driven step is included; ``host_ms`` = wall time of the step's
call without a sync (the Python and launch work; a host sync inside the step, such as peer's bincount, adds
its wait; ``host_bound`` marks host_ms >= 0.9 ms). ``wall`` off CUDA = wall clock of each step. Reported:
the median over ``--steps`` steps after ``--warmup`` warm-up steps (the first warm-up step of a compile row
is its compile time, ``compile_s``). ``loop_ms`` (the loop clock, ``ragdot.measure.timing.loop_ms``): as many
steps as were timed, issued back to back as a training loop issues them (CUDA events around the whole run, no
synchronisation between steps, so the host issues a step while the device still runs the one before; a sync
inside a step, such as peer's, stops that there), per step, median of up to three runs (as many as
``--max-seconds`` holds, at least one); ``loop_vs_peer`` = peer's
over the variant's. The event clock charges every step its host time up to its first kernel; the loop clock
charges only the host time the device cannot hide. On the CPU, torch 2.13's fake kernel of ``_grouped_mm`` takes bf16
only, so compile rows of ``peer`` need ``--dtype bf16`` there (the row's note says so otherwise).
Rows go to a new timestamped ``layer-<date>.csv`` / ``.json`` under ``--out`` as they finish, each with a
progress line and the time left, so a run cut short (``--budget``, Ctrl-C) keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ragdot.cli_common import UsageError, count
from ragdot.measure import records
from ragdot.measure.checks import failure_status
from ragdot.measure.progress import KeepOnInterrupt, Progress
from ragdot.measure.timing import free_memory, loop_ms, synchronize, timed_call

__all__ = ["LAYER_VARIANTS", "DEFAULT_TOKENS", "MODES", "add_layer_arguments", "default_configs", "run_layer"]

LAYER_VARIANTS: tuple[str, ...] = ("peer", "sparse-torch", "sparse-triton", "sparse-auto", "sparse-unfused",
                                   "sparse-fused")
DEFAULT_TOKENS: tuple[int, ...] = (8192, 32768)
MODES: tuple[str, ...] = ("eager", "compile")
PREFERRED_CONFIGS: tuple[str, ...] = ("qwen3-30b-a3b", "deepseek2-16b", "gpt-oss-like")
QUICK_TOKENS = 256
LOOP_REPEATS = 3  # most runs of back-to-back steps on the loop clock (fewer where --max-seconds is short)
COLUMNS: tuple[str, ...] = (
    "config", "dim", "hidden", "experts", "top_k", "tokens", "variant", "mode", "status", "ms", "host_ms",
    "clock", "vs_peer", "loop_ms", "loop_vs_peer", "tflops", "sol_pct", "saved_mib", "saved_vs_peer", "peak_mib",
    "mem_vs_peer", "act_peak_mib", "act_vs_peer",
    "host_bound", "steps", "compile_s", "graphs", "dtype", "gpu", "commit", "date", "torch", "note",
)  # fmt: skip


def add_layer_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("layer mode (--layer)")
    group.add_argument(
        "--layer", action="store_true", help="time forward+backward of one MoE layer against the peer layer"
    )
    group.add_argument(
        "--tokens", type=count(1), nargs="+", metavar="T", help="tokens per step (default 8192 32768; 256 with --quick)"
    )
    group.add_argument(
        "--modes", nargs="+", choices=MODES, help="eager and/or compile (default both; eager with --quick)"
    )
    group.add_argument("--warmup", type=count(0), default=3, help="warm-up steps before the timed ones (default 3)")
    group.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    group.add_argument(
        "--allow-graph-breaks",
        action="store_true",
        help="compile with fullgraph=False (default fullgraph=True: one graph per variant, or the row fails)",
    )


def default_configs() -> list[str]:
    """qwen3-30b-a3b, deepseek2-16b and gpt-oss-like where present, else every config with 64+ experts."""
    from ragdot.moe.model import LAYER_CONFIGS as MODEL_CONFIGS

    if all(n in MODEL_CONFIGS for n in PREFERRED_CONFIGS):
        return list(PREFERRED_CONFIGS)
    named = [n for n in PREFERRED_CONFIGS if n in MODEL_CONFIGS]
    return named + [n for n, c in MODEL_CONFIGS.items() if c.num_experts >= 64 and n not in named]


# ------------------------------------------------------------------------------------------ timing
def time_step(step, reset, device: torch.device, warmup: int, steps: int, max_seconds: float) -> dict[str, Any]:
    """Median ms and host ms of step() after warm-up; reset() runs before every call, outside the clock."""
    first = None
    for i in range(warmup):
        reset()
        t0 = time.perf_counter()
        step()
        synchronize(device)
        if i == 0:
            first = time.perf_counter() - t0
    ms, host = [], []
    begin = time.perf_counter()
    for _ in range(steps):
        reset()
        ms_i, host_i = timed_call(step, device)
        ms.append(ms_i)
        host.append(host_i)
        if len(ms) >= 3 and time.perf_counter() - begin > max_seconds:
            break

    def looped() -> None:
        reset()
        step()

    # as many steps back to back as were timed one by one; as many runs (up to LOOP_REPEATS) as max_seconds holds
    run_s = len(ms) * statistics.median(ms) / 1e3
    fit = max_seconds / run_s if run_s > 0 else math.inf  # runs the budget holds (inf without one)
    repeats = max(1, int(min(LOOP_REPEATS, fit)))
    loop = loop_ms(looped, device, len(ms), repeats)
    clock = "event" if device.type == "cuda" else "wall"
    return {"ms": statistics.median(ms), "host_ms": statistics.median(host), "steps": len(ms), "clock": clock,
            "first_s": first, "loop_ms": loop}  # fmt: skip


def _forward(layer, variant: str):
    """The x [T, dim] -> y [T, dim] callable of a variant (peer on the layer's own parameters)."""
    from ragdot.moe.peer import peer_moe
    from ragdot.moe.variants import VARIANTS

    if variant == "peer":
        return lambda x: peer_moe(x, layer.router.weight, layer.w_gate_up, layer.w_down, layer.top_k)
    VARIANTS[variant].apply(layer)
    return layer


def _unavailable(variant: str) -> str | None:
    import ragdot
    from ragdot.moe.variants import VARIANTS

    if variant == "peer":
        return None if hasattr(torch, "_grouped_mm") else "this torch has no torch._grouped_mm"
    backend = VARIANTS[variant].backend
    if backend not in (None, "auto") and backend not in ragdot.backends():
        return f"ragdot backend {backend!r} is not usable here"
    return None


def measure_row(layer, x, dy, variant: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Time one (variant, mode) on x [T, dim] with cotangent dy [T, dim]; a failure becomes the row's status."""
    from torch._dynamo.utils import counters


    reason = _unavailable(variant)
    if reason is not None:
        return {"status": "unavailable", "note": reason}
    fn = _forward(layer, variant)
    graphs0 = counters["stats"]["unique_graphs"]
    if mode == "compile":
        torch._dynamo.reset()
        fullgraph = not args.allow_graph_breaks
        fn = torch.compile(fn, backend=args.compile_backend, fullgraph=fullgraph, dynamic=False)

    def reset() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None

    def step() -> None:
        fn(x).backward(dy)

    try:
        t = time_step(step, reset, x.device, args.warmup, args.steps, args.max_seconds)
        reset()
        memory = step_memory(fn, x, dy, layer.parameters())
    except Exception as exc:  # OOM, a backend that cannot serve, a compile failure: report it, run on
        status, note = failure_status(exc)
        return {"status": status, "note": _root_cause(exc) if status == "error" else note}
    finally:
        reset()
    row = {"status": "ok", **{k: t[k] for k in ("ms", "host_ms", "steps", "clock", "loop_ms")}, **memory}
    if mode == "compile":
        row["compile_s"] = t["first_s"]
        row["graphs"] = counters["stats"]["unique_graphs"] - graphs0
    if t["clock"] == "event":
        row["host_bound"] = t["host_ms"] >= 0.9 * t["ms"]
    return row


def step_memory(fn, x: torch.Tensor, dy: torch.Tensor, params=()) -> dict[str, float | None]:
    """One more step on CUDA (x's and `params`' gradients unset before it), its memory in MiB above what was
    allocated before it (x, dy, the weights): ``saved_mib`` held between the forward and the backward (the output
    and what the backward keeps), ``peak_mib`` at the peak of the whole step (weight gradients and temporaries
    too), ``act_peak_mib`` that peak less the gradients of x and `params` the step leaves. None off CUDA."""
    device = x.device
    params = [p for p in params if p is not x]
    if device.type != "cuda":
        fn(x).backward(dy)
        return {"saved_mib": None, "peak_mib": None, "act_peak_mib": None}
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    y = fn(x)
    torch.cuda.synchronize(device)
    saved = torch.cuda.memory_allocated(device) - base
    y.backward(dy)
    del y
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    grads = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
             for g in (t.grad for t in (x, *params)) if g is not None}
    return {"saved_mib": saved / 2**20, "peak_mib": peak / 2**20, "act_peak_mib": (peak - sum(grads.values())) / 2**20}


def _root_cause(exc: BaseException) -> str:
    """'Outer: innermost message' (torch.compile wraps the real error in two or three layers)."""
    root, seen = exc, {id(exc)}
    while (inner := root.__cause__ or root.__context__) is not None and id(inner) not in seen:
        root = inner
        seen.add(id(inner))
    lines = str(root).strip().splitlines()
    inner = f"{type(root).__name__}: {lines[0] if lines else ''}"
    return (inner if root is exc else f"{type(exc).__name__} <- {inner}")[:300]


# ------------------------------------------------------------------------------------------ output
class RowWriter(records.RowWriter):
    """CSV and JSON of one run in new files ``layer-<date>`` (an earlier run is never overwritten)."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        super().__init__(out, "layer", meta, COLUMNS)


def useful_flops(row: dict[str, Any]) -> int:
    """The expert GEMMs' FLOPs of one layer step, forward and backward: 18 x tokens x top-k x dim x hidden."""
    return 18 * row["tokens"] * row["top_k"] * row["dim"] * row["hidden"]


def speedups(rows: list[dict[str, Any]], peak_tflops: float | None = None) -> None:
    """In place: vs_peer = peer ms / variant ms (loop_vs_peer: the same on the loop clock), mem_vs_peer,
    act_vs_peer and saved_vs_peer = the variant's peak, activation peak and saved MiB over peer's, of the same
    (config, tokens, mode) (None without both); tflops and, given the measured matmul rate, sol_pct of ok rows."""
    peer = {(r["config"], r["tokens"], r["mode"]): r for r in rows if r["variant"] == "peer"}
    for r in rows:
        ref, ok = peer.get((r["config"], r["tokens"], r["mode"]), {}), r.get("status") == "ok"
        for key, ratio in (("ms", "vs_peer"), ("loop_ms", "loop_vs_peer")):
            base, own = ref.get(key), r.get(key)
            r[ratio] = base / own if ok and base and own else None
        own = r.get("ms")
        for key, ratio in (("peak_mib", "mem_vs_peer"), ("saved_mib", "saved_vs_peer"),
                           ("act_peak_mib", "act_vs_peer")):
            base_mib, own_mib = ref.get(key), r.get(key)
            r[ratio] = own_mib / base_mib if ok and base_mib and own_mib is not None else None
        r["tflops"] = useful_flops(r) / own / 1e9 if ok and own else None
        r["sol_pct"] = 100 * r["tflops"] / peak_tflops if r["tflops"] is not None and peak_tflops else None


def print_table(rows: list[dict[str, Any]], device: torch.device) -> None:
    clock = (
        "CUDA events around each step, host time included; host = wall time of the call without a sync"
        if device.type == "cuda"
        else "wall clock per step"
    )
    title = f"MoE layer forward+backward, median ms ({clock}; loop = steps issued back to back)"
    head = ("config", "tokens", "mode", "variant", "ms", "host ms", "vs peer", "loop ms", "loop vs peer", "TFLOP/s",
            "% SOL", "saved MiB",
            "peak MiB", "act MiB", "compile s", "graphs", "status")
    body = [_cells(r) for r in rows]
    from ragdot.measure.console import Console, Table  # plain text where rich is not installed

    table = Table(title=title)
    for i, h in enumerate(head):
        table.add_column(h, justify="left" if i < 4 or h == "status" else "right")
    for cells in body:
        table.add_row(*cells)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 130))
    console.print(table)


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    def num(key: str, fmt: str) -> str:
        v = r.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    host = num("host_ms", "{:.3f}") + (" (host-bound)" if r.get("host_bound") else "")
    status = r.get("status", "")
    if r.get("note") and status != "ok":
        status += f": {str(r['note'])[:60]}"
    return (r["config"], str(r["tokens"]), r["mode"], r["variant"], num("ms", "{:.3f}"), host,
            num("vs_peer", "{:.2f}x"), num("loop_ms", "{:.3f}"), num("loop_vs_peer", "{:.2f}x"),
            num("tflops", "{:.0f}"), num("sol_pct", "{:.1f}"), num("saved_mib", "{:.0f}"), num("peak_mib", "{:.0f}"),
            num("act_peak_mib", "{:.0f}"),
            num("compile_s", "{:.1f}"), num("graphs", "{}"), status)  # fmt: skip


# ------------------------------------------------------------------------------------------ entry
def _settings(args: argparse.Namespace) -> tuple[list[int], list[str], list[str]]:
    tokens = args.tokens or ([QUICK_TOKENS] if args.quick else list(DEFAULT_TOKENS))
    modes = args.modes or (["eager"] if args.quick else list(MODES))
    variants = args.variants or list(LAYER_VARIANTS)
    if any(isinstance(t, bool) or t < 1 for t in tokens):
        raise UsageError(f"--tokens must be positive, got {tokens}")
    if args.warmup < 1 or args.steps < 1:
        raise UsageError(f"--warmup, --steps: need both >= 1, got {args.warmup} and {args.steps}")
    variants = sorted(dict.fromkeys(variants), key=lambda v: v != "peer")  # peer first: speedups as rows finish
    return tokens, list(dict.fromkeys(modes)), variants


def _weights_gb(cfg, itemsize: int) -> float:
    """Expert and router weights plus their gradients."""
    return 2 * (cfg.num_experts * cfg.dim * (3 * cfg.moe_hidden + 1)) * itemsize / 1e9


def bench_layer(cfg, device: torch.device, dtype: torch.dtype, routing_impl: str | None = None):
    """The MoE layer this mode times for `cfg` (a LayerConfig): path "sparse", parameters from seed 0."""
    from ragdot.moe.layer import MoELayer

    torch.manual_seed(0)
    return MoELayer(cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, path="sparse", dtype=dtype, device=device,
                    routing_impl=routing_impl)


def layer_inputs(cfg, tokens: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [tokens, dim] requiring grad, cotangent dy [tokens, dim]) as this mode draws them (seed: tokens)."""
    gen = torch.Generator(device=device).manual_seed(tokens)
    x = torch.randn((tokens, cfg.dim), generator=gen, device=device, dtype=dtype).requires_grad_(True)
    return x, torch.randn((tokens, cfg.dim), generator=gen, device=device, dtype=dtype)


def _config_rows(cfg, tokens, modes, variants, args, device, dtype, base, emit, spent=lambda: False) -> None:
    info = {**base, "config": cfg.name, "dim": cfg.dim, "hidden": cfg.moe_hidden, "experts": cfg.num_experts,
            "top_k": cfg.top_k}  # fmt: skip
    if device.type == "cuda":
        need, have = _weights_gb(cfg, dtype.itemsize), torch.cuda.get_device_properties(device).total_memory / 1e9
        if need > 0.8 * have:
            for t in tokens:
                for m in modes:
                    for v in variants:
                        emit({**info, "tokens": t, "mode": m, "variant": v, "status": "skipped",
                              "note": f"weights+grads need {need:.0f} GB of {have:.0f} GB"})  # fmt: skip
            return
    layer = bench_layer(cfg, device, dtype, args.routing_impl)
    for t in tokens:
        x, dy = layer_inputs(cfg, t, device, dtype)
        for m in modes:
            for v in variants:
                if spent():
                    emit({**info, "tokens": t, "mode": m, "variant": v, "status": "skipped",
                          "note": "the run's --budget was spent"})  # fmt: skip
                    continue
                emit({**info, "tokens": t, "mode": m, "variant": v, **measure_row(layer, x, dy, v, m, args)})
                free_memory(device)
        del x, dy
    del layer
    torch._dynamo.reset()
    free_memory(device)


def _meta(device: torch.device, dtype: torch.dtype, args: argparse.Namespace) -> dict[str, Any]:
    from ragdot.bench.ceilings import measure_ceilings

    ceilings = measure_ceilings(device, dtype)
    return records.run_meta(device, dtype) | {
        "matmul_tflops": round(ceilings.peak_tflops, 3),
        "ceilings": ceilings.label,
        "warmup": args.warmup,
        "steps": args.steps,
        "compile_backend": args.compile_backend,
        "fullgraph": not args.allow_graph_breaks,
        "routing_impl": args.routing_impl,
    }


def run_layer(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> int:
    """The layer mode of ``ragdot moe-bench``; returns the exit status (130 when interrupted)."""
    from ragdot.moe.model import QUICK_CONFIG, get_config

    tokens, modes, variants = _settings(args)
    names = args.configs or ([QUICK_CONFIG.name] if args.quick else default_configs())
    try:
        configs = [get_config(n) for n in names]
    except ValueError as exc:
        raise UsageError(f"--configs: {exc}") from None
    quiet = getattr(args, "quiet", False)
    meta = _meta(device, dtype, args)
    base = {k: meta[k] for k in ("dtype", "gpu", "commit", "date", "torch")}
    writer = RowWriter(args.out, meta)
    progress = Progress(len(configs) * len(tokens) * len(modes) * len(variants), budget=getattr(args, "budget", 0.0),
                        say=None if quiet else functools.partial(print, flush=True))  # fmt: skip

    def emit(row: dict[str, Any]) -> None:
        speedups([*writer.rows, row], meta["matmul_tflops"])
        writer.add(row)
        result = f"{row['ms']:.3f} ms" if row.get("status") == "ok" else row.get("status", "")
        progress.done(f"{row['config']} T={row['tokens']} {row['mode']} {row['variant']} {result}")

    with KeepOnInterrupt(writer.rows) as kept:
        for cfg in configs:
            _config_rows(cfg, tokens, modes, variants, args, device, dtype, base, emit, progress.spent)
    if not quiet:
        print_table(writer.rows, device)
    print(f"wrote {writer.csv} and {writer.json}")
    return kept.status
