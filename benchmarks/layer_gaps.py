"""Where one MoE layer's forward+backward (`ragdot moe-bench --layer`'s step) loses to its device time: the GPU's
idle time inside the step, by phase and by the host op whose launch ended each idle gap.

    python benchmarks/layer_gaps.py --configs gpt-oss-like qwen3-30b-a3b --variants sparse-auto peer --out DIR

Per config, variant and mode (``--modes eager compile``; compile: ``torch.compile`` of the forward as
`moe-bench --layer` compiles it: inductor, fullgraph, static shapes), on x [tokens, dim] and a cotangent dy (bf16;
the layer's weights random):
- ``eager_ms``: CUDA events around each step (``fn(x).backward(dy)``, gradients unset before it, as in
  `moe-bench --layer`; host time included), median of ``--steps``;
- ``syncs``: the host synchronisations of one step (torch's sync debug mode), each with its Python stack;
- ``graph_ms``: the same step captured in a CUDA graph and replayed (device time, no host in it);
- the profiled step's GPU span, busy and idle time, the idle time by phase (``fwd``, ``bwd``) and by the host op
  whose launch ended each gap (``step_gaps.gaps_of_trace``); ``host_fwd_ms`` / ``host_bwd_ms``: the calling
  thread's wall time per phase in the eager steps (no profiler).
Writes ``layer-gaps-<date>.json`` and a text summary to DIR (stdout too). CUDA only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

if not os.environ.get("PYTHONPATH"):  # this checkout's ragdot unless PYTHONPATH names one
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_gaps import _summary as _step_summary  # noqa: E402
from step_gaps import profile_gaps, syncs_of, write_rows  # noqa: E402

from ragdot.bench.moe_layer import _forward, bench_layer, layer_inputs  # noqa: E402
from ragdot.measure.timing import capture_graph, event_ms, free_memory, warm_off_stream  # noqa: E402
from ragdot.moe.model import get_config  # noqa: E402


def _step(fn, x, dy, ranges: bool = False, clock: list | None = None) -> None:
    """One forward+backward; `ranges`: each phase in a profiler range; `clock`: appends each phase's host s."""
    from torch.profiler import record_function

    ctx = record_function if ranges else (lambda _name: contextlib.nullcontext())
    t0 = time.perf_counter()
    with ctx("fwd"):
        y = fn(x)
    t1 = time.perf_counter()
    with ctx("bwd"):
        y.backward(dy)
    if clock is not None:
        clock.append((t1 - t0, time.perf_counter() - t1))


def layer_setup(cfg_name: str, tokens: int):
    """(layer, x, dy, reset) as `moe-bench --layer` times a config on CUDA in bf16: reset() unsets the gradients
    before a step."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    cfg = get_config(cfg_name)
    layer = bench_layer(cfg, device, dtype)
    x, dy = layer_inputs(cfg, tokens, device, dtype)

    def reset() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None

    return layer, x, dy, reset


def run(cfg_name: str, tokens: int, variants: list[str], steps: int, modes: tuple[str, ...] = ("eager",)) -> list[dict]:
    device = torch.device("cuda")
    layer, x, dy, reset = layer_setup(cfg_name, tokens)
    rows = []
    for name, mode in [(v, m) for v in variants for m in modes]:
        fn = _forward(layer, name)
        if mode == "compile":
            torch._dynamo.reset()
            fn = torch.compile(fn, fullgraph=True, dynamic=False)
        for _ in range(3):
            reset()
            _step(fn, x, dy)
        clock: list = []
        eager = []
        for _ in range(steps):
            reset()
            eager.append(event_ms(lambda fn=fn, clock=clock: _step(fn, x, dy, clock=clock), device))
        reset()
        syncs = syncs_of(lambda fn=fn: _step(fn, x, dy))
        reset()
        gaps = profile_gaps(lambda fn=fn: _step(fn, x, dy, ranges=True))
        reset()
        layer.aux_loss = layer.z_loss = None
        graph = [float("nan")]
        try:  # device time: the step replayed from a CUDA graph
            warm_off_stream(lambda fn=fn: _step(fn, x, dy), device)
            reset()
            torch.cuda.empty_cache()
            replay = capture_graph(lambda fn=fn: _step(fn, x, dy))
            graph = [event_ms(replay, device) for _ in range(steps)]
            del replay
        except RuntimeError as exc:  # report the eager side anyway
            print(f"{cfg_name} {name}: no graph replay ({str(exc).splitlines()[0][:200]})", flush=True)
        reset()
        layer.aux_loss = layer.z_loss = None
        free_memory(device)
        row = {"config": cfg_name, "variant": name if mode == "eager" else f"{name} (compiled)", "mode": mode,
               "tokens": tokens, "layers": 1,
               "eager_ms": statistics.median(eager), "graph_ms": statistics.median(graph),
               "host_fwd_ms": statistics.median(c[0] for c in clock) * 1e3,
               "host_bwd_ms": statistics.median(c[1] for c in clock) * 1e3, "host_opt_ms": 0.0, "syncs": syncs, **gaps}
        row["eager_over_graph"] = row["eager_ms"] / row["graph_ms"]
        rows.append(row)
        print(_step_summary(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["gpt-oss-like", "qwen3-30b-a3b"])
    ap.add_argument("--variants", nargs="+", default=["sparse-auto", "peer"])
    ap.add_argument("--modes", nargs="+", choices=("eager", "compile"), default=["eager"])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("layer_gaps.py: needs a CUDA device", file=sys.stderr)
        return 2
    modes = tuple(args.modes)
    rows = [row for name in args.configs for row in run(name, args.tokens, args.variants, args.steps, modes)]
    if args.out is not None:
        write_rows(args.out, "layer-gaps", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
