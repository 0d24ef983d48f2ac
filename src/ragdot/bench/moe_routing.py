"""`ragdot moe-bench --routing-only`: permute + unpermute alone, ragdot's against the argsort + gather idiom.

Per config (its tokens, top-k, experts and width) and implementation (``argsort``; ragdot's ``torch`` and, on
CUDA, ``triton``): forward and forward+backward time (CUDA-graph replays on CUDA) and eager forward+backward,
with the fewest bytes such a pass must move and the bandwidth that makes. Rows go to a new
``moe-routing-<gpu>-<date>.csv`` / ``.json`` as each config finishes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from ragdot.measure.progress import KeepOnInterrupt, Progress
from ragdot.measure.records import RowWriter, safe_name
from ragdot.measure.timing import median_ms

__all__ = ["routing_rows", "run_routing"]


def _argsort_routing(x, experts, weights, num_experts):
    """The usual sparse-path pre/post-processing: argsort + gather, then inverse argsort + weighted sum."""
    from ragdot.moe.router import expert_counts

    tokens, k = experts.shape
    order = torch.argsort(experts.reshape(-1), stable=True)
    rows = x[order // k]
    expert_counts(experts, num_experts)  # the group sizes (bincount without a host sync)
    back = rows[torch.argsort(order)].view(tokens, k, -1)
    return (back * weights.to(back.dtype)[..., None]).sum(1)


def routing_rows(cfg, device, dtype) -> list[dict[str, Any]]:
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


def run_routing(configs, device: torch.device, dtype: torch.dtype, meta: dict[str, Any], out: Path, console,
                budget: float = 0.0) -> int:
    """Rows of every config, written as each finishes; the table at the end. Exit status (130: Ctrl-C)."""
    writer = RowWriter(out, f"moe-routing-{safe_name(meta['gpu'])}", meta)
    progress = Progress(len(configs), budget=budget, say=None if console.quiet else console.print)
    with KeepOnInterrupt(writer.rows) as kept:
        for cfg in progress.until_spent(configs, "configs", lambda c: c.name):
            for row in routing_rows(cfg, device, dtype):
                writer.add(row)
            progress.done(cfg.name)
    _table(writer.rows, device, console)
    print(f"wrote {writer.csv}, {writer.json}")
    return kept.status


def _table(rows: list[dict[str, Any]], device: torch.device, console) -> None:
    from ragdot.measure.console import Table

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
