"""Where ragdot's replayed calls spend host time inside eager MoE train steps, replay active against paused.

    PYTHONPATH=src python3 benchmarks/replay_census.py [--configs deepseek3-test] [--rounds 4]

`benchmarks/launch_ab.py` times whole steps; on deepseek3-test's sparse step the replay (`ragdot.kernels.replay`)
measured 2.5-8% slower than the Python launch path in three processes, where single calls replay faster. This
probe wraps every `Replayed` call of the step (each prepared ragged_m / ragged_k kernel call) and counts, per
step and arm: the calls, how many ran a recorded program, how many were recorded, and the host time spent inside
them (wall clock, no sync), beside the step's time (CUDA events around the step, host time included). CUDA only.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from ragdot.bench.moe_train import variant_step
from ragdot.kernels import replay
from ragdot.measure.timing import event_ms
from ragdot.moe.model import get_config


class _Census:
    def __init__(self) -> None:
        self.on = False
        self.stats: collections.Counter = collections.Counter()
        self.host: collections.defaultdict = collections.defaultdict(float)

    def wrap(self) -> None:
        call, record = replay.Replayed.__call__, replay.Replayed._record
        census = self

        def counted_call(obj, a, b, sizes, out):
            if not census.on:
                return call(obj, a, b, sizes, out)
            path = "program" if (obj.program is not None and replay._active) else "python"
            t0 = time.perf_counter()
            result = call(obj, a, b, sizes, out)
            census.host[path] += time.perf_counter() - t0
            census.stats[path] += 1
            census.stats[type(obj.prepared).__module__.rsplit(".", 1)[-1]] += 1
            return result

        def counted_record(obj, *args):
            census.stats["recorded"] += census.on
            return record(obj, *args)

        replay.Replayed.__call__, replay.Replayed._record = counted_call, counted_record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["deepseek3-test"])
    p.add_argument("--variant", default="sparse-auto")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    dev = torch.device("cuda")
    census = _Census()
    census.wrap()
    for name in args.configs:
        step = variant_step(get_config(name), args.variant, dev)  # moe-bench's seeded step
        for _ in range(3):
            step()
        arms = {True: collections.defaultdict(list), False: collections.defaultdict(list)}
        for r in range(args.rounds):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                replay.set_active(on)
                step()
                for _ in range(2):
                    census.stats.clear()
                    census.host.clear()
                    census.on = True
                    ms = event_ms(step, dev)
                    census.on = False
                    arm = arms[on]
                    arm["step_ms"].append(ms)
                    for key, count in census.stats.items():
                        arm[key].append(count)
                    for key, seconds in census.host.items():
                        arm[f"host_us_{key}"].append(seconds * 1e6)
        replay.set_active(True)
        for on, arm in arms.items():
            cells = ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in sorted(arm.items()))
            print(f"{name} {args.variant} replay {'C' if on else 'paused'}: {cells}", flush=True)
            for path in ("program", "python"):
                n, us = arm.get(path), arm.get(f"host_us_{path}")
                if n and us:
                    print(f"    {path}: {statistics.median(us) / statistics.median(n):.1f} us host per call")
        del step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
