"""What is alive at the memory peak of one transformers train step, per experts implementation (CUDA).

    python benchmarks/peak_probe.py --model gpt-oss --impls grouped_mm ragdot --modes compile eager --layers 2
    python benchmarks/peak_probe.py --modes compile --timeline 256    # and the large blocks in order

Builds the `ragdot bench-models` model, runs warm-up train steps, then records the CUDA caching allocator's
history (`torch.cuda.memory._record_memory_history`, Python stacks) over one more step, replays its
allocation and free events to find the moment the most bytes were allocated in that step, and prints the
largest blocks alive then, each with the innermost frames of the Python stack that allocated it. Rows:
peak bytes over the step, bytes alive before it (weights, gradients kept from the warm-up), and the blocks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

if __package__ is None or __package__ == "":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _replay(events: list[dict]):
    """Yields (action, block, bytes allocated during the trace after it, the blocks alive after it by address)
    for each allocation and each free of a block allocated during the trace, in trace order (other actions, and
    frees of blocks allocated before the trace started, are skipped)."""
    live: dict[int, dict] = {}
    now = 0
    for e in events:
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = e
            now += e["size"]
            yield action, e, now, live
        elif action == "free_completed" and e["addr"] in live:
            block = live.pop(e["addr"])
            now -= block["size"]
            yield action, block, now, live


def live_at_peak(events: list[dict], top: int = 12) -> dict:
    """From allocator trace events (action 'alloc' / 'free_completed', addr, size, frames; others are skipped),
    the peak of the bytes allocated during the trace and the `top` largest blocks alive at that moment (blocks
    allocated before the trace started are not in it: the peak is relative to the start)."""
    peak = 0
    peak_blocks: list[dict] = []
    for _, _, now, live in _replay(events):
        if now > peak:  # only an allocation raises the total
            peak = now
            peak_blocks = sorted(live.values(), key=lambda b: -b["size"])[:top]
    return {"peak_bytes": peak, "blocks": [{"size": b["size"], "where": _where(b)} for b in peak_blocks]}


def timeline(events: list[dict], min_bytes: int) -> list[dict]:
    """The allocations and frees of blocks of at least `min_bytes` in trace order, each with the bytes allocated
    during the trace just after it (all blocks counted) and where the block was allocated."""
    return [{"action": action, "mib": block["size"] / 2**20, "now_gib": now / 2**30, "where": _where(block, 2)}
            for action, block, now, _ in _replay(events) if block["size"] >= min_bytes]


def _where(block: dict, frames: int = 4) -> str:
    """The innermost frames of a block's stack outside torch's own files, innermost first."""
    out = []
    for f in block.get("frames", []):
        name = f.get("filename", "")
        if "/torch/" in name or name.startswith("??") or not name.endswith(".py"):
            continue
        out.append(f"{Path(name).name}:{f.get('line')} {f.get('name')}")
        if len(out) == frames:
            break
    return " <- ".join(out) or "(no Python frame)"


def probe(model_name: str, impl: str, mode: str, layers: int, device: torch.device, min_mib: float = 0) -> dict:
    from ragdot.bench.models import MODELS, _ids, build_model
    spec = MODELS[model_name]
    spec = dataclasses.replace(spec, config={**spec.config, "num_hidden_layers": layers})
    model = build_model(spec, device, torch.bfloat16)
    model.set_experts_implementation(impl)
    model.train()
    run = torch.compile(model) if mode == "compile" else model
    ids = _ids(spec, spec.train_batch, spec.seq_len, device)

    def step():
        model.zero_grad(set_to_none=True)
        run(ids, labels=ids).loss.backward()

    for _ in range(2):
        step()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    try:
        step()
        torch.cuda.synchronize(device)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated(device)
    events = [e for trace in snap.get("device_traces", []) for e in trace]
    found = live_at_peak(events)
    return {"model": model_name, "impl": impl, "mode": mode, "layers": layers, "before_gib": base / 2**30,
            "peak_gib": peak / 2**30, "step_peak_gib": found["peak_bytes"] / 2**30,
            "blocks": [{"mib": b["size"] / 2**20, "where": b["where"]} for b in found["blocks"]],
            "timeline": timeline(events, int(min_mib * 2**20)) if min_mib > 0 else []}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss")
    ap.add_argument("--impls", nargs="+", default=["grouped_mm", "ragdot"])
    ap.add_argument("--modes", nargs="+", default=["compile", "eager"], choices=["compile", "eager"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--timeline", type=float, default=0, metavar="MIB",
                    help="also print every allocation and free of a block of at least MIB MiB, in order")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("peak_probe.py: needs a CUDA device", file=sys.stderr)
        return 2
    import ragdot.integrations.transformers as rt

    rt.register()
    rows = []
    from ragdot.measure.timing import free_memory

    for mode in args.modes:
        for impl in args.impls:
            row = probe(args.model, impl, mode, args.layers, torch.device("cuda"), args.timeline)
            torch._dynamo.reset()
            free_memory(torch.device("cuda"))
            rows.append(row)
            print(f"{row['model']} {mode} {impl}: peak {row['peak_gib']:.2f} GiB ({row['before_gib']:.2f} before "
                  f"the step; {row['step_peak_gib']:.2f} allocated during it at its peak); largest blocks then:",
                  flush=True)
            for b in row["blocks"]:
                print(f"  {b['mib']:9.1f} MiB  {b['where']}", flush=True)
            if row["timeline"]:
                print("  timeline (block, then GiB allocated during the step after it):")
            for t in row["timeline"]:
                print(f"    {t['action']:>14} {t['mib']:9.1f} MiB -> {t['now_gib']:6.2f}  {t['where']}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "peak-probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
