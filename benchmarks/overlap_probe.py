"""The MoE layer backward's three independent GEMMs, one after another against two streams at once.

    python benchmarks/overlap_probe.py [--layer gpt-oss-like] [--tokens 8192] [--rounds 5] [--out FILE]
    python benchmarks/overlap_probe.py --device cpu --tokens 64 --layer tiny   # a smoke run (interpreter)

After dSwiGLU the fused block's backward runs three products that do not depend on each other: w_down's weight
gradient (ragged_k: per expert (w * act)^T dy_rows), the data gradient of x (ragged_m: dpre @ w_gate_up^T), and
w_gate_up's weight gradient (ragged_k: x_rows^T dpre). The weight gradients of fine-grained experts are bound by
their output's writes, the data gradient by the tensor cores. Question: does running the data gradient on a
second stream beside the two weight gradients, each kernel at one program per SM so that one program of each can
share every SM, beat running them one after another at their two programs per SM?

Systems (the Triton persistent TMA kernels at the tile the H100 tune file picks for these products; p = programs
per SM): `seq p2` and `seq p1` (one stream: w_down grad, x grad, w_gate_up grad), `conc p1` (x grad on a second
stream, the weight gradients on the first), `conc p1 rk-first` (the same with the weight gradients issued
first), and every kernel alone at p1 and p2. Clocks: graph (median of CUDA-graph replays, device time) and eager
(median of CUDA events around one issue of the system, the device synchronised before it). Rounds interleave the
systems. Every concurrent result is checked bitwise against the sequential one.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ragdot.kernels import ragged_k as rk
from ragdot.kernels import ragged_m as rm
from ragdot.kernels.configs import TileConfig
from ragdot.measure.timing import capture_graph, event_ms, warm_off_stream
from ragdot.moe.model import LAYER_CONFIGS
from ragdot.routing import group_sizes

# the tiles the H100 tune file picks for gpt-oss-like's products at <= 32768 rows (ragged_m 1x5760x2880x128 arbc
# and ragged_k 1x2880x5760x128 / 1x2880x2880x128: the two-programs flat tiles lead on balanced sizes)
RM_TILE = dict(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=3, persistent=True,
               tma=True, flat=True)
RK_TILE = dict(block_m=128, block_n=128, block_k=32, group_m=8, num_warps=4, num_stages=4, persistent=True,
               tma=True, flat=True)
TINY = (64, 32, 4, 2)  # dim, hidden, experts, top-k of the CPU smoke run


def _operands(layer: str, tokens: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    if layer == "tiny":
        d, h, e, k = TINY
    else:
        cfg = LAYER_CONFIGS[layer]
        d, h, e, k = cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k
    a = tokens * k
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.5).to(device=device, dtype=dtype)

    return dict(sizes=group_sizes("balanced", a, e, device=device).to(torch.int32), x_rows=rand(a, d),
                dpre=rand(a, 2 * h), act_w=rand(a, h), dy_rows=rand(a, d), w_gate_up=rand(e, d, 2 * h), e=e,
                flops=2 * a * (d * h + 2 * 2 * d * h))


def _products(ops: dict[str, Any], pps: int, interpret: bool) -> dict[str, Callable[[], Any]]:
    """name -> one call writing its preallocated output, for `pps` programs per SM."""
    dtype, e, sizes = ops["x_rows"].dtype, ops["e"], ops["sizes"]
    rm_cfg = TileConfig(**RM_TILE, programs_per_sm=pps) if not interpret else None
    rk_cfg = TileConfig(**RK_TILE, programs_per_sm=pps) if not interpret else None
    a_dx, b_dx = ops["dpre"][None], ops["w_gate_up"].transpose(1, 2)[None]
    pairs = {"dwd": (ops["act_w"][None], ops["dy_rows"][None]), "dwgu": (ops["x_rows"][None], ops["dpre"][None])}
    prepared = {"dx": rm.Prepared(a_dx, b_dx, dtype, rm_cfg, from_sizes=True)}
    for name, (a, b) in pairs.items():
        prepared[name] = rk.Prepared(a, b, e, dtype, rk_cfg, from_sizes=True)
    outs = ops.setdefault("outs", {})
    calls: dict[str, Callable[[], Any]] = {}
    for name, prep in prepared.items():
        args = (a_dx, b_dx) if name == "dx" else pairs[name]
        key = (name, pps)
        outs[key] = torch.empty(prep.shape, dtype=dtype, device=a_dx.device)
        calls[name] = lambda prep=prep, args=args, key=key: prep(*args, sizes, outs[key])
    return calls


def _systems(ops: dict[str, Any], interpret: bool) -> tuple[dict[str, Callable[[], Any]], dict[str, tuple]]:
    """name -> system call; name -> the output keys whose values it leaves (for the bitwise checks)."""
    p1, p2 = _products(ops, 1, interpret), _products(ops, 2, interpret)
    cuda = ops["x_rows"].is_cuda
    side = torch.cuda.Stream() if cuda else None

    def seq(calls: dict[str, Callable[[], Any]]) -> Callable[[], None]:
        def run() -> None:
            for name in ("dwd", "dx", "dwgu"):
                calls[name]()
        return run

    def conc(rk_first: bool) -> Callable[[], None]:
        def run() -> None:
            if side is None:
                return seq(p1)()
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            if rk_first:
                p1["dwd"]()
                with torch.cuda.stream(side):
                    p1["dx"]()
                p1["dwgu"]()
            else:
                with torch.cuda.stream(side):
                    p1["dx"]()
                p1["dwd"]()
                p1["dwgu"]()
            main.wait_stream(side)
        return run

    systems: dict[str, Callable[[], Any]] = {"seq p2": seq(p2), "seq p1": seq(p1), "conc p1": conc(False),
                                             "conc p1 rk-first": conc(True)}
    for pps, calls in ((1, p1), (2, p2)):
        for name, fn in calls.items():
            systems[f"{name} p{pps}"] = fn
    keys = {"seq p2": ((n, 2) for n in ("dwd", "dx", "dwgu"))}
    keys.update({s: ((n, 1) for n in ("dwd", "dx", "dwgu")) for s in ("seq p1", "conc p1", "conc p1 rk-first")})
    return systems, {k: tuple(v) for k, v in keys.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", default="gpt-oss-like", choices=[*LAYER_CONFIGS, "tiny"])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10, help="replays (or eager issues) per system per round")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    for name in ("tokens", "rounds", "reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    device = torch.device(args.device)
    interpret = device.type != "cuda"
    dtype = torch.bfloat16 if not interpret else torch.float16
    ops = _operands(args.layer, args.tokens, device, dtype)
    systems, keys = _systems(ops, interpret)
    graphs: dict[str, Callable[[], Any]] = {}
    for name, fn in systems.items():
        warm_off_stream(fn, device)
        if not interpret:
            graphs[name] = capture_graph(fn)
    checks = {}
    outs = ops["outs"]
    ref = {}
    for name in ("seq p2", "seq p1", "conc p1", "conc p1 rk-first"):
        systems[name]()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        got = [outs[k].clone() for k in keys[name]]
        if not ref:
            ref = {"dwd": got[0], "dx": got[1], "dwgu": got[2]}
        checks[name] = all(torch.equal(g, r) for g, r in zip(got, ref.values()))
    times: dict[str, dict[str, list[float]]] = {n: {"graph": [], "eager": []} for n in systems}
    for r in range(args.rounds):
        order = list(systems) if r % 2 == 0 else list(reversed(systems))
        for name in order:
            if not interpret:
                times[name]["graph"].append(statistics.median(event_ms(graphs[name], device)
                                                              for _ in range(args.reps)))
            times[name]["eager"].append(statistics.median(event_ms(systems[name], device) for _ in range(args.reps)))
    rows = []
    base = {c: statistics.median(times["seq p2"][c]) if times["seq p2"][c] else None for c in ("graph", "eager")}
    print(f"{args.layer}, {args.tokens} tokens, {ops['e']} experts; ms (median of {args.rounds} rounds of "
          f"{args.reps}); x = the time over `seq p2`'s on the same clock")
    for name, clocks in times.items():
        row: dict[str, Any] = {"system": name, "layer": args.layer, "tokens": args.tokens, "check": checks.get(name)}
        text = []
        for clock, values in clocks.items():
            if not values:
                continue
            ms = statistics.median(values)
            row[f"{clock}_ms"] = ms
            row[f"{clock}_spread"] = (min(values), max(values))
            text.append(f"{clock} {ms:8.3f} ({ms / base[clock]:.3f}x)")
            if name in checks:  # the three products: useful TFLOP/s on this clock
                row[f"{clock}_tflops"] = ops["flops"] / ms / 1e9
                text.append(f"{row[f'{clock}_tflops']:5.0f} TFLOP/s")
        rows.append(row)
        check = "" if name not in checks else ("  bitwise equal" if checks[name] else "  DIFFERS")
        print(f"  {name:18s} " + "  ".join(text) + check)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(device) if not interpret else "cpu",
                                        "rows": rows}, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
