"""Eager against graph in a loop: is the eager MoE layer step's extra time an idle GPU or slower kernels?

    python benchmarks/loop_gaps.py --configs gpt-oss-like --variants sparse-auto peer --steps 8

Per config and variant (8192 tokens, bf16, the step of `ragdot moe-bench --layer`: gradients unset, then
``fn(x).backward(dy)``):
- ``loop_ms``: CUDA events around ``--steps`` eager steps issued back to back, per step (as a training loop issues
  them); ``host_ms``: the host's wall time to issue such a loop, per step (below ``loop_ms``: the host kept
  ahead); ``graph_ms``: the same around as many replays of the step captured in a CUDA graph (device time);
- a profile of as many eager steps and as many replays with CUDA activity only (no CPU ops recorded, so the host
  keeps its pace): per step, the first step left out (it starts from an idle device), the GPU's span, busy and idle
  time, and the kernels whose summed time per step differs most between the eager steps and the replays;
- one eager step from a synchronised device (as `moe-bench --layer`'s event clock times each step), profiled the
  same way: its idle GPU time and its largest gaps, each with the kernel whose late launch ended it.

If the loop's extra time over the graph is idle time, the host does not keep ahead of the device; if it is busy
time, kernels run slower when launched one by one (or different kernels run). Writes ``loop-gaps-<date>.json`` and
the text to ``--out`` (stdout too). CUDA only.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import torch

if not os.environ.get("PYTHONPATH"):  # this checkout's ragdot unless PYTHONPATH names one
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from layer_gaps import layer_setup  # noqa: E402
from step_gaps import GPU_CATS, _union, trace_events  # noqa: E402

from ragdot.bench.moe_layer import _forward  # noqa: E402
from ragdot.measure import records  # noqa: E402
from ragdot.measure.timing import capture_graph, free_memory, loop_ms, warm_off_stream  # noqa: E402


def _cuda_trace(fn) -> list[dict]:
    """The GPU activities of fn() (CUDA activity profiled alone), sorted by start."""
    return sorted((e for e in trace_events(fn, cpu=False) if e.get("cat") in GPU_CATS and "dur" in e),
                  key=lambda e: e["ts"])


def _occupancy(acts: list[dict]) -> tuple[float, float, float]:
    """(first start, last end, busy time) in µs of GPU activities sorted by start (overlaps counted once)."""
    busy = sum(b - a for a, b in _union([(e["ts"], e["ts"] + e["dur"]) for e in acts]))
    return acts[0]["ts"], max(e["ts"] + e["dur"] for e in acts), busy


def steady_steps(gpu: list[dict], steps: int) -> dict:
    """Per-step span, busy and idle time (ms) and kernel time by name of `steps` equal steps' GPU activities
    (sorted by start), the first step left out. Raises if the activities do not split into equal steps."""
    if steps < 2 or len(gpu) % steps:
        raise ValueError(f"{len(gpu)} GPU activities do not split into {steps} equal steps")
    per, n = len(gpu) // steps, steps - 1
    kept = gpu[per:]
    start, end, busy = _occupancy(kept)
    by_name: dict[str, float] = collections.defaultdict(float)
    for e in kept:
        by_name[e["name"]] += e["dur"] / 1e3 / n
    return {"activities_per_step": per, "span_ms": (end - start) / 1e3 / n, "busy_ms": busy / 1e3 / n,
            "idle_ms": (end - start - busy) / 1e3 / n, "kernels_ms": dict(by_name)}


def cold_gaps(gpu: list[dict], min_gap_us: float = 10.0) -> dict:
    """One step's GPU activities (sorted by start) from a synchronised, idle device: its span, busy and idle time
    (ms) and every gap of at least `min_gap_us`, as (ms idle, activity that ended it, ms into the step)."""
    if not gpu:
        return {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "gaps": []}
    t0, t1, busy = _occupancy(gpu)
    end, gaps = t0 + gpu[0]["dur"], []
    for e in gpu[1:]:
        if e["ts"] - end >= min_gap_us:
            gaps.append(((e["ts"] - end) / 1e3, e["name"], (e["ts"] - t0) / 1e3))
        end = max(end, e["ts"] + e["dur"])
    return {"span_ms": (t1 - t0) / 1e3, "busy_ms": busy / 1e3, "idle_ms": (t1 - t0 - busy) / 1e3, "gaps": gaps}


def _repeated(fn, times: int):
    """A callable that calls fn() `times` times back to back."""
    def run() -> None:
        for _ in range(times):
            fn()

    return run


def run(cfg_name: str, tokens: int, variants: list[str], steps: int) -> list[dict]:
    device = torch.device("cuda")
    layer, x, dy, reset = layer_setup(cfg_name, tokens)
    rows = []
    for name in variants:
        fn = _forward(layer, name)

        def step(fn=fn) -> None:
            reset()
            fn(x).backward(dy)

        for _ in range(3):
            step()
        loop = loop_ms(step, device, steps)  # the loop clock: steps back to back, per step
        issue = _repeated(step, steps)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        issue()  # the host's issue time: returns before the device is done if the host keeps ahead
        host_ms = (time.perf_counter() - t0) * 1e3 / steps
        torch.cuda.synchronize()
        eager = steady_steps(_cuda_trace(issue), steps)
        cold = cold_gaps(_cuda_trace(step))  # one step from a synchronised device, as the event clock times it
        layer.aux_loss = layer.z_loss = None
        graph_ms, graph = float("nan"), None
        try:
            warm_off_stream(step, device)
            reset()
            torch.cuda.empty_cache()
            replay = capture_graph(step)
            graph_ms = loop_ms(replay, device, steps)
            graph = steady_steps(_cuda_trace(_repeated(replay, steps)), steps)
            del replay
        except (RuntimeError, ValueError) as exc:
            print(f"{cfg_name} {name}: no graph replay ({str(exc).splitlines()[0][:200]})", flush=True)
        reset()
        layer.aux_loss = layer.z_loss = None
        free_memory(device)
        rows.append({"config": cfg_name, "variant": name, "tokens": tokens, "steps": steps, "loop_ms": loop,
                     "host_ms": host_ms, "graph_ms": graph_ms, "eager": eager, "graph": graph, "cold": cold})
        print(summary(rows[-1]), flush=True)
    return rows


def summary(row: dict, top: int = 12) -> str:
    e, g = row["eager"], row["graph"]
    lines = [f"{row['config']} {row['variant']} T={row['tokens']}: loop {row['loop_ms']:.3f} ms/step, graph "
             f"{row['graph_ms']:.3f} (events), host issues a step in {row['host_ms']:.3f} (host clock); profiled, "
             f"steps 2-{row['steps']}, per step (device clock):"]
    for label, s in (("eager", e), ("graph", g)):
        if s is not None:
            lines.append(f"  {label}: span {s['span_ms']:.3f} ms, busy {s['busy_ms']:.3f}, idle {s['idle_ms']:.3f}, "
                         f"{s['activities_per_step']} activities")
    c = row["cold"]
    lines.append(f"  one step from a synchronised device: span {c['span_ms']:.3f} ms, busy {c['busy_ms']:.3f}, idle "
                 f"{c['idle_ms']:.3f}; its largest gaps (ms idle, ended by, at ms):")
    largest = sorted(c["gaps"], key=lambda t: -t[0])[:top]
    lines += [f"    {ms:.3f}  {name[:70]}  at {at:.3f}" for ms, name, at in largest]
    if g is not None:
        names = set(e["kernels_ms"]) | set(g["kernels_ms"])
        diff = sorted(((e["kernels_ms"].get(k, 0.0), g["kernels_ms"].get(k, 0.0), k) for k in names),
                      key=lambda t: -abs(t[0] - t[1]))
        lines.append("  kernels, eager - graph ms per step (eager / graph):")
        lines += [f"    {a - b:+.3f}  ({a:.3f} / {b:.3f})  {k[:90]}" for a, b, k in diff[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["gpt-oss-like"])
    ap.add_argument("--variants", nargs="+", default=["sparse-auto"])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be at least 2")
    if not torch.cuda.is_available():
        print("loop_gaps.py: needs a CUDA device", file=sys.stderr)
        return 2
    rows = [row for name in args.configs for row in run(name, args.tokens, args.variants, args.steps)]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = records.new_stem(args.out, "loop-gaps", (".json", ".txt"))
        records.write_document(args.out / f"{stem}.json",
                               {"meta": records.run_meta(torch.device("cuda"), torch.bfloat16), "rows": rows})
        (args.out / f"{stem}.txt").write_text("\n".join(summary(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
