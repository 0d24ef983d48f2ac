"""`ragdot moe-bench` output (train-step mode): speed ratios, the terminal table, the target checks, figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ragdot.moe.variants import FLOOR

__all__ = ["relative", "routed_sol_s", "check_targets", "print_table", "plot"]

Row = dict[str, Any]


def routed_sol_s(cfg: Any, peak_flops: float, bandwidth: float, itemsize: int) -> float:
    """Speed of light of one train step's routed-expert GEMMs (seconds): per layer, the up projection ([E, dim,
    2*hidden]) and the down projection ([E, hidden, dim]) over the step's routed rows, each in its forward, data-
    gradient and weight-gradient pass, every pass at max(useful FLOPs / matmul rate, fewest bytes / copy
    bandwidth) (`ragdot.measure.classes`: both operands read once, the output written once)."""
    from ragdot.measure.classes import flops, get_class, min_bytes
    from ragdot.shapes import Shape

    rows, h = cfg.tokens * cfg.top_k, cfg.moe_hidden
    total = 0.0
    for k, n in ((cfg.dim, 2 * h), (h, cfg.dim)):
        shape = Shape("routed", rows, k, n, cfg.num_experts)
        for name in ("fwd_wi", "dgrad_wi", "wgrad_wi"):
            total += max(flops(shape) / peak_flops, min_bytes(get_class(name), shape, itemsize) / bandwidth)
    return cfg.layers * total


def relative(rows: list[Row], matmul_tflops: float | None = None) -> None:
    """Speedups against sparse-padded and dense_drop of the same config, in place (``loop_vs_dense_drop`` on the
    loop clock where rows carry ``loop_step_s``: eager interleaved rows); with the floor's row (FLOOR,
    the step without routed-expert work) of the config, also what follows from it:

    - the floor's row: ``bound_vs_dense_drop`` = dense_drop's step over the floor's, the largest speedup over
      dense_drop any implementation of the routed experts could reach on that step; on CUDA-graph replays (mode
      "graph": device time) and where rows carry ``routed_sol_ms`` (`routed_sol_s`), ``bound_at_sol`` =
      dense_drop's step over the floor's plus that: the largest one with the routed GEMMs at speed of light and
      nothing else routed (permute, activation, combine);
    - every other row, on graph replays: ``routed_ms`` = its step minus the floor's (what its routed experts add:
      permute, GEMMs, activation, combine), ``routed_tflops`` = the useful routed FLOPs (``moe_gflop``) over that
      time, its share of `matmul_tflops` (the dense matmul rate measured in the run) as ``routed_pct``, and
      ``routed_sol_pct`` = ``routed_sol_ms`` over ``routed_ms``, in %.

    Eager steps get the bound only: the floor's eager step is host time (far less device work than launches),
    which a real step's device work hides, so a step minus the floor is no routed time there (measured on an
    H100: qwen3-235b-a22b's eager sparse step 50.5 ms against a floor of 40.3 ms plus 10.5 ms of routed speed of
    light)."""
    steps = {(r["config"], r["variant"]): r.get("step_s") for r in rows}
    loops = {(r["config"], r["variant"]): r.get("loop_step_s") for r in rows}  # eager interleaved rows only
    # device time only: a host-bound floor (eager steps) hides no host time of the step it is subtracted from
    device = {r["config"] for r in rows if r["variant"] == FLOOR and r.get("mode") == "graph"}
    for r in rows:
        own, floor = r.get("step_s"), steps.get((r["config"], FLOOR)) if r["config"] in device else None
        if r["variant"] == FLOOR:
            _floor_bounds(r, steps.get((r["config"], "dense_drop")), r["config"] in device)
            continue
        for ref, key in (("sparse-padded", "speedup_vs_padded"), ("dense_drop", "speedup_vs_dense_drop")):
            base = steps.get((r["config"], ref))
            r[key] = base / own if base and own else None
        base, looped = loops.get((r["config"], "dense_drop")), r.get("loop_step_s")
        r["loop_vs_dense_drop"] = base / looped if base and looped else None
        routed = 1e3 * (own - floor) if own and floor and own > floor else None
        sol, rate = r.get("routed_sol_ms"), r["moe_gflop"] / routed if routed and r.get("moe_gflop") else None
        r["routed_ms"], r["routed_tflops"] = routed, rate
        r["routed_pct"] = 100 * rate / matmul_tflops if rate and matmul_tflops else None
        r["routed_sol_pct"] = 100 * sol / routed if sol and routed else None


def _floor_bounds(r: Row, drop: float | None, device: bool) -> None:
    own, sol = r.get("step_s"), r.get("routed_sol_ms") if device else None
    r["bound_vs_dense_drop"] = drop / own if drop and own else None
    r["bound_at_sol"] = drop / (own + sol / 1e3) if drop and own and sol else None


def check_targets(rows: list[Row], goals: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """The goals of a targets file's ``moe-bench`` section, each (description, passed, numbers) per config.

    `goals`: ``fast_variants`` (the candidates; the fastest counts), ``faster_than`` (``baseline``,
    ``min_ratio`` and optionally ``min_experts``: baseline step time over the fastest's), ``max_routing_share``
    (of the profiled MoE layer's kernel time) and ``temp_memory`` (``configs``: a config-name prefix,
    ``baseline``, ``max_share``: the fastest's temporary memory over the baseline's). Nothing is claimed for
    what was not measured."""
    by_cfg: dict[str, dict[str, Row]] = {}
    for r in rows:
        if r.get("status") == "ok":
            by_cfg.setdefault(r["config"], {})[r["variant"]] = r
    out = []
    for cfg, v in by_cfg.items():
        fast = [v[n] for n in goals.get("fast_variants", ()) if n in v]
        if fast:
            out += _config_checks(cfg, v, min(fast, key=lambda r: r["step_s"]), goals)
    return out


def _config_checks(cfg: str, v: dict[str, Row], best: Row, goals: dict[str, Any]) -> list[tuple[str, bool, str]]:
    tag = f"{cfg} ({best['variant']})"
    out = []
    for goal in goals.get("faster_than", ()):
        ref, low = goal["baseline"], goal["min_ratio"]
        if ref in v and best["experts"] >= goal.get("min_experts", 0):
            ratio = v[ref]["step_s"] / best["step_s"]
            out.append((f"{tag}: >= {low:g}x faster than {ref}", ratio >= low, f"{ratio:.2f}x" + _bound(v, ref)))
    share, most = best.get("routing_share"), goals.get("max_routing_share")
    if most is not None and share is not None and not math.isnan(share):
        out.append((f"{tag}: routing <= {most:.0%} of MoE layer time", share <= most, f"{100 * share:.1f}%"))
    for goal in goals.get("temp_memory", ()):
        ref, limit = goal["baseline"], goal["max_share"]
        if cfg.startswith(goal.get("configs", "")) and best.get("temp_gb") is not None and v.get(ref, {}).get(
            "temp_gb"
        ):
            frac = best["temp_gb"] / v[ref]["temp_gb"]
            out.append((f"{tag}: temp memory <= {limit:.0%} of {ref}", frac <= limit, f"{frac:.0%}"))
    return out


def _bound(v: dict[str, Row], ref: str) -> str:
    """The floor's bounds on a speedup over `ref` (dense_drop), as the check's numbers show them; "" without."""
    floor = v.get(FLOOR, {})
    if ref != "dense_drop" or floor.get("bound_vs_dense_drop") is None:
        return ""
    sol = floor.get("bound_at_sol")
    at_rate = f", {sol:.2f}x with the routed GEMMs at speed of light" if sol else ""
    return f" (floor: at most {floor['bound_vs_dense_drop']:.2f}x{at_rate})"


def print_table(rows: list[Row], console) -> None:
    from ragdot.measure.console import Table

    table = Table(title=f"MoE train step (routed: step minus {FLOOR}'s; bound: dense_drop's step over {FLOOR}'s; "
                        "@sol: over that plus the routed GEMMs' speed of light; tokens/s in the files)")
    cols = [
        ("config", "config", "{}"),
        ("variant", "variant", "{}"),
        ("step ms", "step_s", "ms"),
        ("TFLOP/s", "tflops", "{:.1f}"),
        ("peak GB", "peak_gb", "{:.1f}"),
        ("temp GB", "temp_gb", "{:.2f}"),
        ("vs padded", "speedup_vs_padded", "{:.2f}x"),
        ("vs drop", "speedup_vs_dense_drop", "{:.2f}x"),
        ("loop ms", "loop_step_s", "ms"),
        ("loop vs drop", "loop_vs_dense_drop", "{:.2f}x"),
        ("routed TF/s", "routed_tflops", "{:.3g}"),
        ("bound", "bound_vs_dense_drop", "{:.2f}x"),
        ("@sol", "bound_at_sol", "{:.2f}x"),
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


def plot(rows: list[Row], out: Path, stem: str) -> list[Path]:
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
    paths = []
    for key, ylabel, name in (
        ("step_s", "step time (s)", "step_time.png"),
        ("speedup_vs_padded", "speedup over sparse-padded", "speedup.png"),
        ("temp_gb", "temporary memory (GB)", "memory.png"),
    ):
        if not any(get[c, v].get(key) for (c, v) in get):
            continue
        shown = [v for v in variants if any((get.get((c, v)) or {}).get(key) for c in configs)]
        width = 0.8 / max(len(shown), 1)
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(configs)), 4))
        for i, v in enumerate(shown):
            vals = [(get.get((c, v)) or {}).get(key) or 0.0 for c in configs]
            ax.bar(x + (i - (len(shown) - 1) / 2) * width, vals, width, label=v)
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
