"""In-process A/B of ragdot's C launch path in eager MoE train steps, beside the same step's CUDA-graph replay.

    PYTHONPATH=src python3 benchmarks/launch_ab.py [--configs deepseek2-16b qwen3-30b-a3b] [--rounds 6] [--out DIR]

The decoder and step of `ragdot moe-bench` (forward, backward, fused AdamW) per config and variant, timed
eagerly (CUDA events around each step, host time included) with ragdot's prepared calls replayed from C
(`c`; `ragdot.kernels.replay`) and paused (`python`: every launch through Python and Triton's launcher),
interleaved round by round in one process (each round runs one untimed step after the switch, then two timed
ones). Then the same step, on a fresh model of the same seed, is captured in a CUDA graph and its replays
timed (device time; median of `--replays`): the eager / graph ratio of each arm comes from one process, where
the host's speed is the same for all three. Writes DIR/launch-ab.json with `--out`. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from ragdot.bench.moe_train import variant_step
from ragdot.kernels import replay
from ragdot.measure.timing import capture_graph, event_ms, warm_off_stream
from ragdot.moe.model import get_config


def _graph_ms(cfg, variant: str, replays: int, dev: torch.device) -> float:
    """Median CUDA-graph replay of the step, on a model of its own: the eager arms' parameters keep the
    default stream in their gradient-accumulation nodes, which a capture on a side stream cannot take."""
    step = variant_step(cfg, variant, dev)
    warm_off_stream(step, dev)
    graph = capture_graph(step)
    return statistics.median(event_ms(graph, dev) for _ in range(replays))


def _config(name: str, variants: list[str], rounds: int, replays: int, dev: torch.device) -> list[dict]:
    cfg = get_config(name)
    rows = []
    for variant in variants:
        step = variant_step(cfg, variant, dev)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(3):
            step()
        try:
            for r in range(rounds):
                for on in ((True, False) if r % 2 == 0 else (False, True)):
                    replay.set_active(on)
                    step()
                    times[on] += [event_ms(step, dev) for _ in range(2)]
        finally:
            replay.set_active(True)
        del step
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        graph_ms = _graph_ms(cfg, variant, replays, dev)
        torch.cuda.empty_cache()
        on, off = statistics.median(times[True]), statistics.median(times[False])
        row = {"config": name, "variant": variant, "eager_c_ms": on, "eager_python_ms": off, "graph_ms": graph_ms,
               "steps_each": len(times[True])}
        rows.append(row)
        print(f"{name:16s} {variant:12s} eager step C {on:7.2f} ms, Python {off:7.2f} ms (Python / C {off / on:.3f}); "
              f"graph {graph_ms:7.2f} ms; eager / graph: C {on / graph_ms:.3f}, Python {off / graph_ms:.3f}",
              flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["deepseek2-16b", "qwen3-30b-a3b"])
    p.add_argument("--variants", nargs="+", default=["sparse-auto", "dense_drop"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rows = []
    for name in args.configs:
        rows += _config(name, args.variants, args.rounds, args.replays, torch.device("cuda"))
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "launch-ab.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
