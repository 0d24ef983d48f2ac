"""CUDA-graph capture of one MoE layer's forward+backward, fused and unfused, each case in a fresh process.

    python benchmarks/capture_probe.py          # one line per case: OK, or FAILED with the traceback

Written to find out why benchmarks/fused_gpu.py's graph-clock rows failed at capture (AcceleratorError) on the
H200; each case here captures in a process of its own. The "eager steps first" cases run two eager steps on the
default stream before the warm-up and capture, which is what failed (docs/fused-moe.md, "Status").
"""
import sys
import traceback

import torch

from ragdot.measure.timing import capture_graph, warm_off_stream
from ragdot.moe import MoELayer

dev = torch.device("cuda")


def attempt(name, dim, hidden, experts, k, tokens, fused, how, empty_cache, eager_first=False):
    torch.manual_seed(0)
    layer = MoELayer(dim, hidden, experts, k, path="sparse", dtype=torch.bfloat16, device=dev, fused=fused)
    x = torch.randn(tokens, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    cot = torch.randn(tokens, dim, device=dev, dtype=torch.bfloat16)
    params = (layer.router.weight, layer.w_gate_up, layer.w_down)

    def step():
        y = layer(x)
        if how == "grad":
            return (y.detach(), *torch.autograd.grad(y, (x, *params), cot))
        y.backward(cot)
        return y.detach()

    try:
        if eager_first:  # eager steps on the default stream first, as a benchmark timing both clocks does
            for _ in range(2):
                step()
            torch.cuda.synchronize()
        warm_off_stream(step, dev)
        if empty_cache:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        replay = capture_graph(step)
        replay()
        torch.cuda.synchronize()
        print(f"{name}: OK", flush=True)
    except Exception:
        print(f"{name}: FAILED\n{traceback.format_exc()[-3000:]}", flush=True)
        torch.cuda.synchronize()
        return False
    return True


cases = [
    ("small unfused grad", 64, 32, 8, 2, 64, None, "grad", False),
    ("small fused grad", 64, 32, 8, 2, 64, True, "grad", False),
    ("qwen3 unfused grad", 2048, 768, 128, 8, 8192, None, "grad", False),
    ("qwen3 unfused backward", 2048, 768, 128, 8, 8192, None, "backward", False),
    ("qwen3 unfused grad empty_cache", 2048, 768, 128, 8, 8192, None, "grad", True),
    ("medium unfused grad, eager steps first", 256, 128, 16, 4, 512, None, "grad", False, True),
    ("medium unfused backward, eager steps first", 256, 128, 16, 4, 512, None, "backward", False, True),
    ("qwen3 unfused grad, eager steps first", 2048, 768, 128, 8, 8192, None, "grad", False, True),
    ("qwen3 fused grad empty_cache", 2048, 768, 128, 8, 8192, True, "grad", True),
]
if len(sys.argv) > 1:
    attempt(*cases[int(sys.argv[1])])
else:  # each case in its own process: a failed capture can leave the process's CUDA state unusable
    import subprocess
    for i in range(len(cases)):
        subprocess.run([sys.executable, __file__, str(i)], timeout=120, check=False)
