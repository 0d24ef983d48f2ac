"""`ragdot moe-bench`: train steps of a small MoE decoder over compute paths x ragdot backends.

    ragdot moe-bench                                   # every config of ragdot.moe.model.MODEL_CONFIGS
    ragdot moe-bench --configs qwen3-30b-a3b gemma4-26b --variants sparse-torch sparse-triton dense_drop
    ragdot moe-bench --quick                           # CPU smoke run of a tiny model, seconds
    ragdot moe-bench --routing-only --configs qwen3-30b-a3b  # permute + unpermute alone, against argsort
    ragdot moe-bench --layer                           # one MoE layer's fwd+bwd against the plain `peer` layer

Per (config, variant): step time (median of steps 5-10), tokens/s, model TFLOP/s,
peak and temporary memory of a step (temporary = peak minus what was allocated before the step,
i.e. gradients and activations), and, in a separate profiled forward+backward of one MoE layer, the split of
its kernel time into routing (permute + unpermute), grouped GEMMs (ragdot's ops) and the rest.
On CUDA the whole step (forward, backward, AdamW) is captured in a CUDA graph and the replays are timed, as a
compiled step runs (``--eager`` times Python-driven steps instead; the ``mode`` column says which was used).
Writes new files per run under --out: moe-bench-<gpu>-<date>.json and .csv (rewritten after every config, so a
cut-short run keeps its rows) and PNG figures named like them; ``--routing-only`` writes moe-routing-<gpu>-<date>.*
The acceptance targets are checked and printed on CUDA runs only.
``--layer`` times forward+backward of a single MoE layer instead (eager and torch.compile, against the
plain-PyTorch ``peer`` layer); see ``ragdot.moe.layer_bench``.
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

from ragdot.cli_common import (
    UsageError,
    add_deprecated_alias,
    add_device,
    add_dtype,
    add_out,
    add_quiet,
    check_out,
    new_stem,
    parse_device,
    parse_dtype,
    quiet_native_stderr,
    safe_name,
)
from ragdot.measure import records
from ragdot.measure.checks import failure_status
from ragdot.measure.timing import capture_graph, event_ms, free_memory, median_ms, synchronize
from ragdot.moe.layer_bench import LAYER_VARIANTS, add_layer_arguments
from ragdot.moe.variants import VARIANTS

HELP = "end-to-end MoE train-step benchmark: paths x backends over the model configs"
LAYER_STEPS = 20  # timed steps per row of --layer

ROUTING_OPS = frozenset({"ragdot::moe_permute", "ragdot::moe_combine", "ragdot::moe_combine_backward"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ragdot.moe.model import MODEL_CONFIGS

    parser.add_argument(
        "--configs", nargs="+", metavar="NAME", help=f"model configs (default all: {' '.join(MODEL_CONFIGS)})"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=[*VARIANTS, "peer"],
        metavar="VARIANT",
        help=f"path-backend variants (default all: {' '.join(VARIANTS)}; with --layer: "
        f"{' '.join(LAYER_VARIANTS)}, where peer is the plain torch._grouped_mm layer)",
    )
    parser.add_argument(
        "--steps", type=int, help=f"train steps per variant (default 10; timed steps with --layer: {LAYER_STEPS})"
    )
    parser.add_argument("--measure-from", type=int, default=5, help="first step of the median (default 5)")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=20.0,
        help="stop a variant's steps early once it has run this long (default 20)",
    )
    parser.add_argument("--layers", type=int, help="override the configs' layer count")
    parser.add_argument("--seq-len", type=int, help="override the configs' sequence length")
    parser.add_argument("--batch", type=int, help="override the configs' batch size")
    add_dtype(parser, "bf16 on CUDA, fp32 on a CPU")
    add_device(parser, "cuda if available, else cpu; cpu with --quick")
    parser.add_argument(
        "--routing-impl", choices=["triton", "torch"], help="permute/unpermute implementation"
    )
    parser.add_argument("--eager", action="store_true", help="time eager steps, not CUDA-graph replays")
    parser.add_argument(
        "--no-profile", action="store_true", help="skip the routing/GEMM split of the MoE layer"
    )
    parser.add_argument("--no-plots", action="store_true", help="write no PNG figures")
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 steps: a smoke run in seconds")
    parser.add_argument(
        "--routing-only",
        action="store_true",
        help="time only permute + unpermute (forward and backward) per config and implementation",
    )
    add_deprecated_alias(parser, "--routing", "--routing-only", "routing_only")
    add_out(parser, "out/moe-bench", "CSV, JSON and figures")
    add_quiet(parser)
    add_layer_arguments(parser)


# ------------------------------------------------------------------------------------------ measuring
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
        times = [event_ms(lambda: _train_step(model, opt, tokens), device) / 1e3 for _ in range(args.steps)]
        return times, None, None, "eager"
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
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
    times: list[float] = []
    start_all = time.perf_counter()
    for _ in range(args.steps):
        times.append(event_ms(step, device) / 1e3)
        if len(times) >= 3 and time.perf_counter() - start_all > args.max_seconds:
            break
    return times, peak, temp, mode


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


def _run_variant(model, opt, tokens, cfg, name, args, device, dtype) -> dict[str, Any]:
    import ragdot

    path, backend = VARIANTS[name]
    row: dict[str, Any] = {"variant": name, "path": path, "backend": backend or ""}
    if backend not in (None, "auto") and backend not in ragdot.backends():
        return {**row, "status": "unavailable"}
    model.set_moe(path=path, backend=backend, capacity_factor=1.25, routing_impl=args.routing_impl)
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


def _run_config(cfg, args, device, dtype, progress, task) -> list[dict[str, Any]]:
    from ragdot.moe.model import MoEDecoder

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
            progress.advance(task, len(args.variants))
            reason = f"skipped: weights+grads+AdamW need {need:.0f} GB of {have:.0f} GB"
            return [{**base, "variant": v, "status": reason} for v in args.variants]
    torch.manual_seed(0)
    model = MoEDecoder(cfg, dtype=dtype, device=device)
    fused = {"fused": True, "capturable": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **fused)
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), generator=gen, device=device)
    rows = []
    for name in args.variants:
        progress.update(task, description=f"{cfg.name} {name}")
        rows.append({**base, **_run_variant(model, opt, tokens, cfg, name, args, device, dtype)})
        free_memory(device)
        progress.advance(task)
    del model, opt
    free_memory(device)
    return rows


class _NoProgress:
    def update(self, *args: Any, **kwargs: Any) -> None:
        pass

    def advance(self, *args: Any, **kwargs: Any) -> None:
        pass


def _config_worker(cfg, args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    return _run_config(cfg, args, torch.device(device), dtype, _NoProgress(), None)


def _run_config_in_subprocess(cfg, args, device, dtype) -> list[dict[str, Any]]:
    """`_run_config` in a spawned process (CUDA state and graph memory pools die with it)."""
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


# ------------------------------------------------------------------------------------------ routing only
def _argsort_routing(x, experts, weights, num_experts):
    """The usual sparse-path pre/post-processing: argsort + gather, then inverse argsort + weighted sum."""
    from ragdot.moe.router import expert_counts

    tokens, k = experts.shape
    order = torch.argsort(experts.reshape(-1), stable=True)
    rows = x[order // k]
    expert_counts(experts, num_experts)  # the group sizes (bincount without a host sync)
    back = rows[torch.argsort(order)].view(tokens, k, -1)
    return (back * weights.to(back.dtype)[..., None]).sum(1)


def _routing_rows(cfg, device, dtype) -> list[dict[str, Any]]:
    from ragdot.moe.permute import permute, unpermute

    gen = torch.Generator(device=device).manual_seed(0)
    t, k, e, d = cfg.tokens, cfg.top_k, cfg.num_experts, cfg.dim
    x = torch.randn((t, d), generator=gen, device=device, dtype=dtype, requires_grad=True)
    logits = torch.randn((t, e), generator=gen, device=device)
    weights, experts = torch.softmax(logits, -1).topk(k, dim=-1)
    weights.requires_grad_(True)
    grad = torch.randn_like(x)
    min_bytes = (4 * t + 5 * t * k) * d * dtype.itemsize  # each row pass read/written once, fwd + bwd

    def ragdot_routing(impl: str) -> torch.Tensor:
        rows, routing = permute(x, experts, e, impl=impl)
        return unpermute(rows, routing, weights)

    impls = {"argsort": lambda: _argsort_routing(x, experts, weights, e)}
    for impl in ("triton", "torch") if device.type == "cuda" else ("torch",):
        impls[impl] = functools.partial(ragdot_routing, impl)
    rows = []
    for name, fwd in impls.items():

        def step(fwd=fwd) -> None:
            fwd().backward(grad)

        fwd_ms, step_ms = median_ms(fwd, device, graph=True), median_ms(step, device, graph=True)
        eager_ms = median_ms(step, device, graph=False)
        rows.append(
            {
                "config": cfg.name,
                "tokens": t,
                "top_k": k,
                "experts": e,
                "dim": d,
                "impl": name,
                "fwd_ms": fwd_ms,
                "fwd_bwd_ms": step_ms,
                "eager_fwd_bwd_ms": eager_ms,
                "min_gb": min_bytes / 1e9,
                "tb_per_s": min_bytes / step_ms / 1e9,
            }
        )
    return rows


def _relative(rows: list[dict[str, Any]]) -> None:
    """Speedups against sparse-padded and dense_drop of the same config, in place."""
    steps = {(r["config"], r["variant"]): r.get("step_s") for r in rows}
    for r in rows:
        for ref, key in (("sparse-padded", "speedup_vs_padded"), ("dense_drop", "speedup_vs_dense_drop")):
            base, own = steps.get((r["config"], ref)), r.get("step_s")
            r[key] = base / own if base and own else None


def check_targets(rows: list[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """The issue's four targets, each (description, passed or None when not measured, numbers)."""
    by_cfg: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok":
            by_cfg.setdefault(r["config"], {})[r["variant"]] = r
    out = []
    for cfg, v in by_cfg.items():
        fast = [v[n] for n in ("sparse-torch", "sparse-triton", "sparse-auto") if n in v]
        if not fast:
            continue
        best = min(fast, key=lambda r: r["step_s"])
        tag = f"{cfg} ({best['variant']})"
        if "dense_drop" in v:
            ratio = v["dense_drop"]["step_s"] / best["step_s"]
            out.append((f"{tag}: >= 1.2x faster than dense_drop", ratio >= 1.2, f"{ratio:.2f}x"))
        if best["experts"] >= 64 and "sparse-padded" in v:
            ratio = v["sparse-padded"]["step_s"] / best["step_s"]
            out.append((f"{tag}: >= 4x faster than sparse-padded", ratio >= 4, f"{ratio:.2f}x"))
        share = best.get("routing_share")
        if share is not None and not math.isnan(share):
            out.append((f"{tag}: routing <= 15% of MoE layer time", share <= 0.15, f"{100 * share:.1f}%"))
        if cfg.startswith("qwen3-235b") and best.get("temp_gb") is not None:
            for ref, limit in (("dense_drop", 1.0), ("sparse-padded", 0.3)):
                if ref in v and v[ref].get("temp_gb"):
                    frac = best["temp_gb"] / v[ref]["temp_gb"]
                    out.append((f"{tag}: temp memory <= {limit:.0%} of {ref}", frac <= limit, f"{frac:.0%}"))
    return out


def _print_table(rows: list[dict[str, Any]], console) -> None:
    from ragdot.bench.text import Table

    table = Table(title="MoE train step")
    cols = [
        ("config", "config", "{}"),
        ("variant", "variant", "{}"),
        ("step ms", "step_s", "ms"),
        ("tok/s", "tokens_per_s", "{:,.0f}"),
        ("TFLOP/s", "tflops", "{:.1f}"),
        ("peak GB", "peak_gb", "{:.1f}"),
        ("temp GB", "temp_gb", "{:.2f}"),
        ("vs padded", "speedup_vs_padded", "{:.2f}x"),
        ("vs drop", "speedup_vs_dense_drop", "{:.2f}x"),
        ("MoE ms", "moe_ms", "{:.2f}"),
        ("routing", "routing_share", "pct"),
        ("mode", "mode", "{}"),
        ("status", "status", "{}"),
    ]
    for title, _, _ in cols:
        table.add_column(
            title, justify="left" if title in ("config", "variant", "status", "mode") else "right"
        )
    for r in rows:
        cells = []
        for _, key, fmt in cols:
            value = r.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("-")
            elif fmt == "ms":
                cells.append(f"{1e3 * value:.1f}")
            elif fmt == "pct":
                cells.append(f"{100 * value:.1f}%")
            else:
                cells.append(fmt.format(value))
        table.add_row(*cells)
    console.print(table)


def _plot(rows: list[dict[str, Any]], out: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ok = [r for r in rows if r.get("status") == "ok"]
    configs = list(dict.fromkeys(r["config"] for r in ok))
    variants = list(dict.fromkeys(r["variant"] for r in ok))
    if not configs:
        return []
    get = {(r["config"], r["variant"]): r for r in ok}
    x = np.arange(len(configs))
    width = 0.8 / max(len(variants), 1)
    paths = []
    for key, ylabel, name in (
        ("step_s", "step time (s)", "step_time.png"),
        ("speedup_vs_padded", "speedup over sparse-padded", "speedup.png"),
        ("temp_gb", "temporary memory (GB)", "memory.png"),
    ):
        if not any(get[c, v].get(key) for (c, v) in get):
            continue
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(configs)), 4))
        for i, v in enumerate(variants):
            vals = [(get.get((c, v)) or {}).get(key) or 0.0 for c in configs]
            ax.bar(x + (i - (len(variants) - 1) / 2) * width, vals, width, label=v)
        ax.set_xticks(x, configs, rotation=20, ha="right")
        ax.set_ylabel(ylabel)
        if key == "step_s":
            ax.set_yscale("log")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{stem}-{name}", dpi=120)
        plt.close(fig)
        paths.append(out / f"{stem}-{name}")
    prof = [r for r in ok if r.get("moe_ms")]
    if prof:
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(prof)), 4))
        labels = [f"{r['config']}\n{r['variant']}" for r in prof]
        bottom = np.zeros(len(prof))
        for part in ("routing_ms", "gemm_ms", "other_ms"):
            vals = np.array([r[part] / r["moe_ms"] for r in prof])
            ax.bar(labels, vals, bottom=bottom, label=part.removesuffix("_ms"))
            bottom += vals
        ax.set_ylabel("share of MoE layer kernel time")
        ax.tick_params(axis="x", labelsize=6, rotation=60)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{stem}-routing_share.png", dpi=120)
        plt.close(fig)
        paths.append(out / f"{stem}-routing_share.png")
    return paths


def _meta(args, device, dtype) -> dict[str, Any]:
    return records.run_meta(device, dtype, with_triton=True) | {
        "steps": args.steps,
        "measure_from": args.measure_from,
        "capacity_factor": 1.25,
        "optimizer": "AdamW",
    }


# ------------------------------------------------------------------------------------------ entry
def run(args: argparse.Namespace) -> int:
    if getattr(args, "layer", False):
        return _run_layer(args)
    _reject_layer_options(args)
    from ragdot.bench.text import Console, Progress
    from ragdot.moe.model import MODEL_CONFIGS, QUICK_CONFIG

    console = Console(quiet=args.quiet)
    if not console.is_terminal:
        console = Console(width=max(console.width, 150), quiet=args.quiet)
    if args.steps is None:
        args.steps = 10
    if args.quick:
        args.steps, args.measure_from = min(args.steps, 4), min(args.measure_from, 2)
    if args.steps < 1 or not 1 <= args.measure_from <= args.steps:
        raise UsageError(
            f"--steps, --measure-from: need steps >= 1 and 1 <= measure-from <= steps, got {args.steps}, "
            f"{args.measure_from}"
        )
    device, dtype = _device_dtype(args)
    names = args.configs or ([QUICK_CONFIG.name] if args.quick else list(MODEL_CONFIGS))
    configs = _configs(names, args)
    args.variants = args.variants or list(VARIANTS)
    out = check_out(args.out)
    meta = _meta(args, device, dtype)
    gpu = safe_name(meta["gpu"])
    if args.routing_only:
        return _run_routing(configs, device, dtype, meta, out, new_stem(out, f"moe-routing-{gpu}"), console)
    stem = new_stem(out, f"moe-bench-{gpu}")
    rows: list[dict[str, Any]] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("moe-bench", total=len(configs) * len(args.variants))
        isolate = device.type == "cuda" and len(configs) > 1
        for cfg in configs:
            if isolate:  # a fresh process per config: memory one config leaves behind cannot starve the next
                progress.update(task, description=f"{cfg.name} (own process)")
                rows.extend(_run_config_in_subprocess(cfg, args, device, dtype))
                progress.advance(task, len(args.variants))
            else:
                rows.extend(_run_config(cfg, args, device, dtype, progress, task))
            _relative(rows)
            _save(rows, meta, out, stem)  # after every config: a cut-short run keeps its results
    _print_table(rows, console)
    if device.type == "cuda":  # the targets are about GPU step times: meaningless on a CPU
        for text, passed, numbers in check_targets(rows):
            mark = {True: "[green]PASS[/]", False: "[red]MISS[/]", None: "[yellow]n/a[/]"}[passed]
            console.print(f"{mark} {text}: {numbers}")
    files = [out / f"{stem}.csv", out / f"{stem}.json"]
    if not args.no_plots:
        try:
            files += _plot(rows, out, stem)
        except ImportError as exc:  # matplotlib (and numpy) are optional: the tables are written anyway
            console.print(f"plots skipped: {exc.name or exc} is not installed (it comes with ragdot's bench extra)")
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _device_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """--device (default cuda if available and not --quick) and --dtype (default bf16 on CUDA, else fp32)."""
    device = parse_device(args.device or ("cpu" if args.quick or not torch.cuda.is_available() else None))
    return device, parse_dtype(args.dtype, "bf16" if device.type == "cuda" else "fp32")


def _configs(names: list[str], args: argparse.Namespace) -> list[Any]:
    from ragdot.moe.model import get_config

    try:
        return [get_config(n, layers=args.layers, seq_len=args.seq_len, batch=args.batch) for n in names]
    except ValueError as exc:
        raise UsageError(f"--configs: {exc}") from None


def _reject_layer_options(args: argparse.Namespace) -> None:
    if args.variants and "peer" in args.variants:
        raise UsageError("--variants: 'peer' is the layer-level baseline: use it with --layer")
    for name in ("tokens", "modes"):
        if getattr(args, name, None):
            raise UsageError(f"--{name} applies to the layer mode only: add --layer")


def _run_layer(args: argparse.Namespace) -> int:
    from ragdot.moe.layer_bench import run_layer

    if args.routing_only:
        raise UsageError("--routing-only and --layer are two different modes; pick one")
    if args.steps is None:
        args.steps = LAYER_STEPS
    if args.quick:
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    device, dtype = _device_dtype(args)
    check_out(args.out)
    return run_layer(args, device, dtype)


def _run_routing(configs, device, dtype, meta, out: Path, stem: str, console) -> int:
    from ragdot.bench.text import Table

    rows = [r for cfg in configs for r in _routing_rows(cfg, device, dtype)]
    _save(rows, meta, out, stem)
    graphed = device.type == "cuda"
    table = Table(
        title="permute + unpermute" + (" (CUDA-graph replays; eager = with launch overhead)" * graphed)
    )
    for col in ("config", "T", "k", "E", "dim", "impl", "fwd ms", "fwd+bwd ms", "eager ms", "min GB", "TB/s"):
        table.add_column(col, justify="left" if col in ("config", "impl") else "right")
    for r in rows:
        table.add_row(r["config"], str(r["tokens"]), str(r["top_k"]), str(r["experts"]), str(r["dim"]),
                      r["impl"], f"{r['fwd_ms']:.3f}", f"{r['fwd_bwd_ms']:.3f}",
                      f"{r['eager_fwd_bwd_ms']:.3f}", f"{r['min_gb']:.3f}",
                      f"{r['tb_per_s']:.2f}")  # fmt: skip
    console.print(table)
    print(f"wrote {out / f'{stem}.csv'}, {out / f'{stem}.json'}")
    return 0


def _save(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path, stem: str) -> None:
    records.write_json(out / f"{stem}.json", meta, rows)
    records.write_csv(rows, out / f"{stem}.csv")
