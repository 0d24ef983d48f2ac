"""Where an eager MoE train step loses to its CUDA-graph replay: the GPU's idle time inside the step, by phase and
by the host op whose launch ended each idle gap.

    python benchmarks/step_gaps.py --configs deepseek3-test deepseek2-16b --variants sparse-auto dense_drop --out DIR

Per config and variant (the decoder and step of `ragdot moe-bench`: forward, backward, fused AdamW):
- ``eager_ms``: CUDA events around each eager step, median of ``--steps``, every step issued on the default stream
  after warm-up steps on that same stream (what a training loop does);
- ``graph_ms``: the same step captured in a CUDA graph and replayed, median (device time);
- from torch.profiler's trace of one more eager step: the device time of its kernels by name and phase; the
  step's span on the GPU (first launch to last kernel end),
  the union of its GPU activity (``busy_ms``) and the rest (``idle_ms``), split by phase (``fwd``, ``bwd``,
  ``opt``: the phase in which the kernel that ended the gap was launched) and by the innermost host op around
  that launch; ``host_ms`` per phase is the wall time of the phase on the calling thread.
Writes ``step-gaps-<date>.json`` and a text summary to DIR (stdout too). CUDA only.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

if not os.environ.get("PYTHONPATH"):  # this checkout's ragdot unless PYTHONPATH names one
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ragdot.bench.moe_train import training_setup, use_variant
from ragdot.measure import records
from ragdot.measure.timing import capture_graph, event_ms, free_memory, warm_off_stream
from ragdot.moe.model import get_config
from ragdot.moe.variants import VARIANTS

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
PHASES = ("fwd", "bwd", "opt")


def _step(model, opt, tokens, ranges: bool = False, clock: list | None = None) -> None:
    """One train step; `ranges`: each phase in a profiler range; `clock`: appends each phase's host seconds."""
    from torch.profiler import record_function

    ctx = record_function if ranges else (lambda _name: contextlib.nullcontext())
    t0 = time.perf_counter()
    with ctx("fwd"):
        loss = model.loss(tokens)
    t1 = time.perf_counter()
    with ctx("bwd"):
        loss.backward()
    t2 = time.perf_counter()
    with ctx("opt"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    if clock is not None:
        clock.append((t1 - t0, t2 - t1, time.perf_counter() - t2))


def syncs_of(step) -> list[str]:
    """The host synchronisations of one call of `step()`: torch's sync debug mode's warnings, each with the last
    frames of its Python stack (the backward's are on autograd's thread: their stack starts there)."""
    found: list[str] = []

    def show(message, category, filename, lineno, file=None, line=None):
        if str(message).startswith("Synchronization debug mode is a prototype"):  # the mode's own notice
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-6:][::-1])
        found.append(f"{str(message).splitlines()[0][:80]} at {where}")

    torch.cuda.synchronize()
    with warnings.catch_warnings():  # restores showwarning and the filters on exit
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return found


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def gaps_of_trace(events: list[dict], min_gap_us: float = 2.0) -> dict:
    """The idle time of the GPU in one profiled step (a Chrome trace's events, timestamps in µs)."""
    phases = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") == "user_annotation" and e.get("name") in PHASES}
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    ops_by_tid: dict = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and "dur" in e:
            ops_by_tid[e["tid"]].append(e)
    for ops in ops_by_tid.values():
        ops.sort(key=lambda e: e["ts"])
    starts_by_tid = {tid: [e["ts"] for e in ops] for tid, ops in ops_by_tid.items()}
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS and "dur" in e), key=lambda e: e["ts"])
    if not gpu or not phases:
        return {"kernels": len(gpu), "span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "phases": {}, "owners": [],
                "host_ops": []}

    def phase_of(ts: float) -> str:
        for name, (s, e) in phases.items():
            if s <= ts <= e:
                return name
        return "other"

    def owner_of(launch: dict | None) -> str:
        if launch is None:
            return "?"
        tid, ts = launch["tid"], launch["ts"]
        ops, starts = ops_by_tid.get(tid, []), starts_by_tid.get(tid, [])
        best = None
        for i in range(bisect.bisect_right(starts, ts) - 1, -1, -1):  # innermost op containing the launch
            op = ops[i]
            if op["ts"] + op["dur"] >= ts:
                best = op
                break
            if ts - op["ts"] > 1e6:
                break
        return best["name"] if best is not None else "?"

    first = min((launches[e["args"]["correlation"]]["ts"] for e in gpu if e["args"].get("correlation") in launches),
                default=gpu[0]["ts"])
    start = min(first, gpu[0]["ts"])
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    end = busy[-1][1]
    idle_by_phase: dict = collections.Counter()
    owners: dict = collections.defaultdict(lambda: [0.0, 0])
    kernels_by_phase: dict = collections.Counter()
    by_start = {e["ts"]: e for e in gpu}
    cursor = start
    for s, e in busy:
        gap = s - cursor
        nxt = by_start.get(s)
        launch = launches.get(nxt["args"].get("correlation")) if nxt is not None else None
        if gap >= min_gap_us:
            where = phase_of(launch["ts"]) if launch is not None else "other"
            idle_by_phase[where] += gap
            o = owners[f"{where}: {owner_of(launch)}"]
            o[0] += gap
            o[1] += 1
        cursor = e
    device_by_name: dict = collections.defaultdict(lambda: [0.0, 0])
    for e in gpu:
        launch = launches.get(e["args"].get("correlation"))
        where = phase_of(launch["ts"]) if launch is not None else "other"
        kernels_by_phase[where] += 1
        d = device_by_name[f"{where}: {_short(e['name'])}"]
        d[0] += e["dur"]
        d[1] += 1
    busy_us = sum(e - s for s, e in busy)
    host: dict = collections.defaultdict(lambda: [0.0, 0])
    for ops in ops_by_tid.values():
        for op, own in _self_times(ops):
            where = phase_of(op["ts"])
            if where != "other":
                h = host[f"{where}: {op['name']}"]
                h[0] += own
                h[1] += 1
    runtime: dict = collections.defaultdict(lambda: [0.0, 0, 0.0])
    for e in events:  # CUDA runtime and driver calls: a slow one (a malloc, a sync) stands out here
        if e.get("cat") in LAUNCH_CATS:
            r = runtime[e["name"]]
            r[0] += e.get("dur", 0.0)
            r[1] += 1
            r[2] = max(r[2], e.get("dur", 0.0))
    return {
        "runtime_calls": sorted(([k, v[0] / 1e3, v[1], v[2]] for k, v in runtime.items()), key=lambda r: -r[1])[:10],
        "kernels": len(gpu),
        "span_ms": (end - start) / 1e3,
        "busy_ms": busy_us / 1e3,
        "idle_ms": (end - start - busy_us) / 1e3,
        "phases": {
            name: {"host_ms": (phases[name][1] - phases[name][0]) / 1e3 if name in phases else None,
                   "idle_ms": idle_by_phase.get(name, 0.0) / 1e3, "kernels": kernels_by_phase.get(name, 0)}
            for name in (*PHASES, "other")
        },
        "owners": _ranked(owners, 15),
        "host_ops": _ranked(host, 25),
        "device_ops": _ranked(device_by_name, 30),
    }


def _ranked(totals: dict, top: int) -> list[list]:
    """[name, ms, count] of the `top` largest of {name: [µs, count]}, largest first."""
    return sorted(([k, v[0] / 1e3, v[1]] for k, v in totals.items()), key=lambda r: -r[1])[:top]


def _short(name: str) -> str:
    """A kernel's name without its template arguments and parameter list (CUTLASS names run to kilobytes)."""
    name = name.replace("(anonymous namespace)::", "")
    for cut in ("<", "("):
        name = name.split(cut, 1)[0]
    return name[:90]


def _self_times(ops: list[dict]) -> list[list]:
    """[op, its duration less that of the ops nested directly inside it] for one thread's ops sorted by start."""
    out: list[list] = []
    stack: list[list] = []
    for op in ops:
        end = op["ts"] + op["dur"]
        while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] < end:
            stack.pop()
        entry = [op, op["dur"]]
        if stack:
            stack[-1][1] -= op["dur"]
        stack.append(entry)
        out.append(entry)
    return out


def trace_events(fn, cpu: bool = True) -> list[dict]:
    """The Chrome-trace events (timestamps in µs) of one profiled call of fn(), CUDA activity always, CPU ops and
    runtime calls with `cpu` (without them the host keeps its own pace)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cpu else [ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def profile_gaps(step) -> dict:
    """`gaps_of_trace` of one profiled call of `step()` (which opens its phases' profiler ranges itself)."""
    return gaps_of_trace(trace_events(step))


def write_rows(out: Path, name: str, rows: list[dict]) -> None:
    """`<name>-<date>.json` (meta and rows) and the text summary of `rows` in folder `out`."""
    out.mkdir(parents=True, exist_ok=True)
    stem = records.new_stem(out, name, (".json", ".txt"))
    doc = {"meta": records.run_meta(torch.device("cuda"), torch.bfloat16), "rows": rows}
    records.write_document(out / f"{stem}.json", doc)
    (out / f"{stem}.txt").write_text("\n".join(_summary(r) for r in rows) + "\n")


def _drop_losses(model) -> None:
    """Release the router losses the MoE layers keep, and with them the autograd graph of the last step (whose
    gradient-accumulation nodes would carry that step's stream into the next one)."""
    for layer in model.moe_layers:
        layer.aux_loss = layer.z_loss = None


def run(cfg_name: str, variants: list[str], steps: int) -> list[dict]:
    device = torch.device("cuda")
    cfg = get_config(cfg_name)
    model, opt, tokens = training_setup(cfg, device, torch.bfloat16)
    rows = []
    for name in variants:
        use_variant(model, name)
        for _ in range(3):  # warm-up on the default stream, as a training loop runs
            _step(model, opt, tokens)
        clock: list = []
        eager = [event_ms(lambda clock=clock: _step(model, opt, tokens, clock=clock), device) for _ in range(steps)]
        host = [statistics.median(c[i] for c in clock) * 1e3 for i in range(3)]
        syncs = syncs_of(lambda: _step(model, opt, tokens))
        gaps = profile_gaps(lambda: _step(model, opt, tokens, ranges=True))
        _drop_losses(model)  # the last step's graph goes before the capture's own warm-up
        warm_off_stream(lambda: _step(model, opt, tokens), device)
        torch.cuda.empty_cache()
        replay = capture_graph(lambda: _step(model, opt, tokens))
        graph = [event_ms(replay, device) for _ in range(steps)]
        del replay
        _drop_losses(model)
        free_memory(device)
        row = {"config": cfg_name, "variant": name, "tokens": cfg.tokens, "layers": cfg.layers,
               "eager_ms": statistics.median(eager), "graph_ms": statistics.median(graph),
               "host_fwd_ms": host[0], "host_bwd_ms": host[1], "host_opt_ms": host[2], "syncs": syncs, **gaps}
        row["eager_over_graph"] = row["eager_ms"] / row["graph_ms"]
        rows.append(row)
        print(_summary(row), flush=True)
    return rows


def _summary(row: dict) -> str:
    lines = [f"{row['config']} {row['variant']}: eager {row['eager_ms']:.2f} ms, graph {row['graph_ms']:.2f} ms "
             f"({row['eager_over_graph']:.3f}x); host per phase (eager steps, no profiler) fwd "
             f"{row['host_fwd_ms']:.2f} / bwd {row['host_bwd_ms']:.2f} / opt {row['host_opt_ms']:.2f} ms; "
             f"{len(row['syncs'])} host syncs"]
    lines += [f"  sync: {s}" for s in row["syncs"][:12]]
    lines.append(f"  profiled step: span {row['span_ms']:.2f} ms, GPU busy {row['busy_ms']:.2f}, idle "
                 f"{row['idle_ms']:.2f}, {row['kernels']} GPU activities (under the profiler ragdot's backward "
                 "takes its general path)")
    for name, p in row["phases"].items():
        if p["kernels"] or p["idle_ms"]:
            host = "-" if p["host_ms"] is None else f"{p['host_ms']:.2f}"
            lines.append(f"  {name:5s} host {host} ms, idle {p['idle_ms']:.2f} ms, {p['kernels']} activities")
    for owner, ms, n in row["owners"]:
        lines.append(f"    {ms:7.3f} ms in {n:4d} gaps ended by {owner}")
    lines.append("  CUDA runtime calls (profiled step): " + "; ".join(
        f"{name} {ms:.2f} ms / {n} (max {mx:.0f} us)" for name, ms, n, mx in row.get("runtime_calls", [])))
    lines.append("  host time by op (self, profiled step):")
    for name, ms, n in row.get("host_ops", []):
        lines.append(f"    {ms:7.3f} ms in {n:4d} calls of {name}")
    lines.append("  device time by kernel (profiled step; phase of its launch):")
    for name, ms, n in row.get("device_ops", []):
        lines.append(f"    {ms:7.3f} ms in {n:4d} runs of {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["deepseek3-test", "deepseek2-16b"])
    ap.add_argument("--variants", nargs="+", default=["sparse-auto", "dense_drop"], choices=sorted(VARIANTS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("step_gaps.py: needs a CUDA device", file=sys.stderr)
        return 2
    rows = [row for name in args.configs for row in run(name, args.variants, args.steps)]
    if args.out is not None:
        write_rows(args.out, "step-gaps", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
