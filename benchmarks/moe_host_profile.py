"""Host time of one sparse MoE layer step (forward, forward+backward): where it goes and what it launches.

    PYTHONPATH=src python3 benchmarks/moe_host_profile.py [--out DIR]                   # CPU, tiny widths
    PYTHONPATH=src python3 benchmarks/moe_host_profile.py --device cuda --out DIR       # GPU, < 4 min

Per case (a layer shape, a token count, a variant), for ``layer(x)`` (no grad) and ``layer(x).backward(dy)``:
- host time per step (``ragdot.measure.host.time_host``: wall time of back-to-back steps without a sync,
  median of 5 passes; on CUDA in chunks of 4 steps with a sync before each chunk, and the eager column is
  CUDA events around the same chunks);
- the aten ops a step dispatches (a TorchDispatchMode that also counts inside ragdot's custom ops), the
  compute ops (torch.profiler's leaf ``aten::`` events that are not views: kernel calls and allocations),
  and on CUDA the kernels it launches (torch.profiler's CUDA activity);
- the Python function calls per step (cProfile's count: a host-work measure that the machine's load does
  not change);
- on CUDA, the CUDA-graph replay time of the same forward+backward step (``ragdot.measure.timing.median_ms``:
  CUDA events around each replay, median of 20) beside the eager time.
A cProfile top list of 200 forward+backward steps of the first case closes the run (the backward runs on
the calling thread on the CPU; on CUDA on autograd's device thread, which cProfile does not see).

CPU cases: dim 32, hidden 32, float32, backend ``torch``, one torch thread (``--threads``); 8 experts top-2
at 64 tokens, and 64 experts top-8 at 256 tokens. The arithmetic is negligible, so the time is host work,
except CPU ``torch._grouped_mm``, which loops over the experts. CUDA cases: the layer shapes of
qwen3-30b-a3b, deepseek2-16b and gpt-oss-like at 8192 tokens, bf16, ragdot's sparse layer (backend auto)
and ``peer`` (``ragdot.moe.peer``). With ``--out``, rows go to ``moe-host-<date>.csv/.json`` there and the
cProfile text to ``moe-host-cprofile-<date>.txt``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not os.environ.get("PYTHONPATH"):  # this checkout's ragdot unless PYTHONPATH names one
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ragdot.measure import records
from ragdot.measure.host import time_host
from ragdot.measure.timing import free_memory, median_ms
from ragdot.moe import MoELayer
from ragdot.moe.model import get_config
from ragdot.moe.peer import peer_moe

COLUMNS = (
    "case", "variant", "dim", "hidden", "experts", "top_k", "tokens", "dtype", "fwd_host_us", "fwdbwd_host_us",
    "fwd_eager_us", "fwdbwd_eager_us", "fwdbwd_graph_us", "eager_over_graph", "fwd_ops", "fwdbwd_ops",
    "fwd_kernels", "fwdbwd_kernels", "fwd_py_calls", "fwdbwd_py_calls", "clock", "device", "commit", "torch", "note",
)  # fmt: skip
CPU_CASES = (("tiny-8x2", 32, 32, 8, 2, 64), ("tiny-64x8", 32, 32, 64, 8, 256))
GPU_CONFIGS = ("qwen3-30b-a3b", "deepseek2-16b", "gpt-oss-like")
GPU_TOKENS = 8192


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched under it; ragdot's custom ops are counted and entered (their insides too)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.ops[name] += 1
        if name.startswith("ragdot."):  # run its kernel under this mode, past the Python key
            key = torch._C.DispatchKey.CUDA if _on_cuda(args) else torch._C.DispatchKey.CPU
            with self:
                return func.redispatch(torch._C.DispatchKeySet(key), *args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))

    @property
    def leaf_ops(self) -> int:
        return sum(n for name, n in self.ops.items() if not name.startswith("ragdot."))


def _on_cuda(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


class Case:
    """One layer, its input and cotangent, and the forward of one variant."""

    def __init__(self, name, dim, hidden, experts, top_k, tokens, variant, device, dtype) -> None:
        self.name, self.variant, self.device = name, variant, device
        self.shape = dict(dim=dim, hidden=hidden, experts=experts, top_k=top_k, tokens=tokens, dtype=str(dtype))
        backend = "torch" if device.type == "cpu" else "auto"
        self.layer = MoELayer(dim, hidden, experts, top_k, backend=backend, dtype=dtype, device=device)
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.x = torch.randn(tokens, dim, generator=gen).to(device, dtype).requires_grad_()
        self.dy = torch.randn(tokens, dim, generator=gen).to(device, dtype)
        self.params = [*self.layer.parameters(), self.x]

    def forward(self) -> torch.Tensor:
        if self.variant == "peer":
            layer = self.layer
            return peer_moe(self.x, layer.router.weight, layer.w_gate_up, layer.w_down, layer.top_k)
        return self.layer(self.x)

    def fwd(self) -> None:
        with torch.no_grad():
            self.forward()

    def fwdbwd(self) -> None:
        for p in self.params:
            p.grad = None
        self.forward().backward(self.dy)


def count_ops(fn) -> tuple[int, int, collections.Counter[str]]:
    """(aten ops, compute ops, aten ops by name) of one fn() call, after a warm call.

    aten ops: what a TorchDispatchMode sees (inside custom ops it sees them before their decomposition, so
    compare these counts only between runs of one code path). compute ops: torch.profiler's leaf ``aten::``
    events that are not views (a kernel call or an allocation on the CPU), the same at every dispatch level."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm: first calls may dispatch extra work
    counter = OpCounter()
    with counter:
        fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    compute = sum(1 for e in prof.events() if not e.cpu_children and _is_compute(e.name))
    return counter.leaf_ops, compute, counter.ops


def _is_compute(event: str) -> bool:
    if not event.startswith("aten::"):
        return False
    packet = getattr(torch.ops.aten, event[len("aten::"):], None)
    overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
    return not overloads or not all(o.is_view for o in overloads)


def count_kernels(fn, device: torch.device) -> int | None:
    """GPU activities of one fn() call (kernels, memsets, copies: torch.profiler's CUDA events); None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def python_calls(fn, steps: int = 20) -> int:
    """Python function calls per step (cProfile's count over `steps` steps after one warm step): a host-work
    measure that does not depend on the machine's load."""
    fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fn()
    prof.disable()
    return round(pstats.Stats(prof).total_calls / steps)


def graph_us(case: Case) -> tuple[float | None, str]:
    """CUDA-graph replay µs of the fwd+bwd step, or None and why (peer's bincount syncs, so it cannot be captured)."""
    try:
        return 1e3 * median_ms(case.fwdbwd, case.device, graph=True), ""
    except Exception as exc:  # a host sync in the step, too little memory
        torch.cuda.synchronize(case.device)
        return None, f"graph capture failed: {str(exc).splitlines()[0][:100]}"


def host_row(case: Case, calls: int, max_seconds: float) -> dict[str, Any]:
    dev = case.device
    chunk = 4 if dev.type == "cuda" else 0
    budget = dict(calls=calls, repeats=5, warmup=5, chunk=chunk, max_seconds=max_seconds)
    fwd = time_host(case.fwd, dev, **budget)
    both = time_host(case.fwdbwd, dev, **budget)
    fwd_ops, fwd_compute, _ = count_ops(case.fwd)
    both_ops, both_compute, _ = count_ops(case.fwdbwd)
    row: dict[str, Any] = {
        "case": case.name, "variant": case.variant, **case.shape, "fwd_host_us": round(fwd.host_us, 1),
        "fwdbwd_host_us": round(both.host_us, 1), "fwd_ops": fwd_ops, "fwdbwd_ops": both_ops,
        "fwd_compute_ops": fwd_compute, "fwdbwd_compute_ops": both_compute,
        "fwd_py_calls": python_calls(case.fwd), "fwdbwd_py_calls": python_calls(case.fwdbwd),
        "clock": "host (wall, back-to-back, median of 5 passes)", "device": str(dev),
    }  # fmt: skip
    if dev.type == "cuda":
        replay, note = graph_us(case)
        row.update(
            fwd_eager_us=round(fwd.eager_us, 1), fwdbwd_eager_us=round(both.eager_us, 1), note=note,
            fwdbwd_graph_us=None if replay is None else round(replay, 1),
            eager_over_graph=None if replay is None else round(both.eager_us / replay, 3),
            fwd_kernels=count_kernels(case.fwd, dev), fwdbwd_kernels=count_kernels(case.fwdbwd, dev),
            clock="host (wall, back-to-back, chunks of 4); eager: CUDA events around the chunks; "
            "graph: CUDA events around each replay, median of 20",
        )  # fmt: skip
    return row


def cprofile_text(case: Case, steps: int = 200) -> str:
    case.fwdbwd()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        case.fwdbwd()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    body = "\n".join(line for line in text.getvalue().splitlines() if line.strip())
    return f"---- cProfile, {steps} fwd+bwd steps of {case.name} {case.variant}, sorted by tottime\n{body}\n"


def case_specs(device: torch.device) -> list[tuple]:
    """(name, dim, hidden, experts, top_k, tokens, variant, dtype) of every case on `device`."""
    if device.type == "cpu":
        return [(n, d, h, e, k, t, "sparse", torch.float32) for n, d, h, e, k, t in CPU_CASES]
    specs = []
    for name in GPU_CONFIGS:
        cfg = get_config(name)
        for variant in ("sparse", "peer"):
            specs.append((name, cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, GPU_TOKENS, variant,
                          torch.bfloat16))  # fmt: skip
    return specs


def print_row(row: dict[str, Any]) -> None:
    keys = ("fwd_host_us", "fwdbwd_host_us", "fwd_ops", "fwdbwd_ops", "fwd_compute_ops", "fwdbwd_compute_ops",
            "fwd_py_calls", "fwdbwd_py_calls",
            "fwd_kernels", "fwdbwd_kernels",
            "fwdbwd_eager_us", "fwdbwd_graph_us", "eager_over_graph")  # fmt: skip
    cells = " ".join(f"{k}={row[k]}" for k in keys if row.get(k) is not None)
    note = f"  ({row['note']})" if row.get("note") else ""
    print(f"{row['case']:>16} {row['variant']:>6}  {cells}{note}", flush=True)


def first_profile(case: Case, args: argparse.Namespace) -> None:
    """The aten ops by name (with --ops) and the cProfile top list of the first case."""
    if args.ops:
        for label, fn in (("fwd", case.fwd), ("fwd+bwd", case.fwdbwd)):
            _, _, ops = count_ops(fn)
            print(f"---- aten ops of one {label} step: " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
    text = cprofile_text(case, 10 if args.quick else 200)
    print(text)
    if args.out is not None:
        (args.out / f"{records.new_stem(args.out, 'moe-host-cprofile')}.txt").write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--out", type=Path, default=None, help="directory for the CSV/JSON rows and the cProfile text")
    p.add_argument("--calls", type=int, default=200, help="steps per timing pass (cut to fit the time budget)")
    p.add_argument("--max-seconds", type=float, default=5.0, help="time budget of each host-time measurement")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU runs; 1: steadier host times)")
    p.add_argument("--quick", action="store_true", help="a smoke run: the first case only, few steps")
    p.add_argument("--cases", type=int, default=0, help="run only the first N cases (0: all)")
    p.add_argument("--ops", action="store_true", help="also print the aten op counts by name of the first case")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    specs = case_specs(device)[: 1 if args.quick else (args.cases or None)]
    if args.quick:
        args.calls, args.max_seconds = min(args.calls, 10), min(args.max_seconds, 0.5)
    writer = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = records.run_meta(device, with_triton=device.type == "cuda")
        writer = records.RowWriter(args.out, "moe-host", meta, COLUMNS)
    for i, (*shape, dtype) in enumerate(specs):
        case = Case(*shape, device, dtype)  # one layer at a time: the GPU cases hold ~1 GB of weights each
        row = host_row(case, args.calls, args.max_seconds)
        row.update(commit=records.commit(), torch=torch.__version__)
        print_row(row)
        if writer is not None:
            writer.add(row)
        if i == 0:
            first_profile(case, args)
        del case
        free_memory(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
