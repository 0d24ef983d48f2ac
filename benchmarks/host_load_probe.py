"""Does a busy GPU change the host time of fwd+bwd calls? (host-bench's fwd+bwd ratio to raw was 1.16x on a
small problem but 1.5x on the anchor shapes.)

    python benchmarks/host_load_probe.py [SHAPE]

Host clock per call (wall time of issuing 64 back-to-back calls, median of 7 passes) for chunks of 1, 4 and 16
calls between syncs, with the GPU free or held by a spin kernel while a chunk is issued; then torch.profiler
CPU ops of 16 calls on SHAPE (default deepseek3-test; under the profiler ragdot takes its general path).
"""
import statistics
import sys

import torch

from ragdot.bench.host import make_call, make_operands
from ragdot.measure.host import _pass
from ragdot.shapes import Shape
from ragdot.shapes import get_shape as shape_by_name

dev = torch.device("cuda")
shapes = [Shape("1024,512,512,8", 1024, 512, 512, 8), shape_by_name("deepseek3-test"), shape_by_name("qwen3-30b-a3b"),
          shape_by_name("deepseek2-16b")]
systems = ["raw+cumsum", "ragdot-triton", "ragdot-torch"]
for shape in shapes:
    ops = make_operands(shape, torch.bfloat16, dev, "balanced", 0)
    calls = {s: make_call(s, "fwdbwd", ops) for s in systems}
    for c in calls.values():
        for _ in range(10):
            c()
    torch.cuda.synchronize()
    for chunk in (1, 4, 16):
        for hold in (0, 1):
            row = []
            for s, c in calls.items():
                vals = []
                for _ in range(7):
                    h, e, cov = _pass(c, 64, chunk, dev, hold_cycles=(2000 * 600 * chunk) if hold else 0)
                    vals.append(h)
                row.append(f"{s} {statistics.median(vals):7.1f}")
            print(f"{shape.name:16s} chunk {chunk:2d} {'held' if hold else 'free'}: " + " | ".join(row), flush=True)
    del ops, calls
    torch.cuda.empty_cache()

# where the host time of one fwd+bwd goes at deepseek3-test: torch.profiler CPU ops of 16 back-to-back calls
from torch.profiler import ProfilerActivity, profile  # noqa: E402

shape = shape_by_name(sys.argv[1] if len(sys.argv) > 1 else "deepseek3-test")
ops = make_operands(shape, torch.bfloat16, dev, "balanced", 0)
for s in ("ragdot-triton", "raw+cumsum"):
    c = make_call(s, "fwdbwd", ops)
    for _ in range(10):
        c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(16):
            c()
        torch.cuda.synchronize()
    print(f"---- {s} {shape.name}: CPU ops of 16 fwd+bwd calls")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
