"""Host time of ragdot's bound Triton launch itself (`ragdot.kernels.launch.BoundLaunch`), on any machine.

    python benchmarks/launch_overhead.py                  # this checkout's BoundLaunch
    python benchmarks/launch_overhead.py --old FILE       # and another launch.py beside it, interleaved

The kernel, its compiled form and its C launcher are stand-ins whose launch does nothing, so what is timed
is the Python a repeated launch runs between its caller and the C launch function (the specialization key,
the cache lookup, the device, hook and stream queries, the argument list): the part of a launch's host time
that ragdot owns. The arguments are a group-ends launch's (two int32 tensors, four integers). Clock: host
(wall time around back-to-back calls, per call; median of --repeats passes, the variants interleaved pass by
pass), beside a bare call of the no-op launcher with the same arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ragdot.cli_common import count


class FakeLauncher:
    """A Triton 3.x CUDA launcher without scratch buffers whose C launch function records (or ignores) its call."""

    global_scratch_size = 0
    profile_scratch_size = 0
    launch_cooperative_grid = False
    launch_pdl = False
    num_ctas = 1

    def __init__(self, record: list | None = None):
        self.record = record
        self.launch = (lambda *a: None) if record is None else (lambda *a: record.append(a))


class FakeCompiled:
    """A compiled kernel: `run` its launcher, `function` and `packed_metadata` what the C launch takes."""

    def __init__(self, launcher: Any):
        self.run, self.function, self.packed_metadata = launcher, 0x1234, ("packed",)


def fake_kernel(n_runtime: int, constexprs: dict[str, Any], compiled: Any, jit_calls: list | None = None) -> Any:
    """A @triton.jit stand-in with `n_runtime` runtime parameters then `constexprs` (name -> default): indexing
    it with a grid gives Triton's launch path, which returns `compiled` (and notes its call in `jit_calls`)."""
    params = [SimpleNamespace(name=f"a{i}", is_constexpr=False, default=None) for i in range(n_runtime)]
    params += [SimpleNamespace(name=k, is_constexpr=True, default=v) for k, v in constexprs.items()]

    class Kernel:
        __name__ = "fake_kernel"

        def __getitem__(self, grid):
            def jit(*args, **kwargs):
                if jit_calls is not None:
                    jit_calls.append((grid, args, kwargs))
                return compiled
            return jit

    kernel = Kernel()
    kernel.params = params
    return kernel


@contextlib.contextmanager
def on_a_fake_gpu() -> Iterator[None]:
    """Inside: a BoundLaunch takes its direct path on a machine without CUDA (device 0 current, raw stream 0)."""
    names = ("_cuda_getDevice", "_cuda_getCurrentRawStream")
    saved = {n: getattr(torch._C, n) for n in names if hasattr(torch._C, n)}
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    try:
        yield
    finally:
        for n in names:
            if n in saved:
                setattr(torch._C, n, saved[n])
            else:
                delattr(torch._C, n)


def bound(module: Any, record: list | None = None) -> Any:
    kernel = fake_kernel(6, {"BLOCK": 16}, FakeCompiled(FakeLauncher(record)))
    launch = module.BoundLaunch(kernel, (1,), {"BLOCK": 16}, {"num_warps": 1}, torch.device("cuda", 0))
    launch._direct = True
    return launch


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _timed(modules: dict[str, Any], calls: int, repeats: int) -> dict[str, list[float]]:
    """µs per call of each module's bound launch and of the bare launcher, `repeats` interleaved passes."""
    sizes, ends = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    fns: dict[str, Any] = {}
    for name, module in modules.items():
        launch = bound(module)
        launch(sizes, ends, 8, 4096, 1, 4096)  # the first call: Triton's path, then bound
        fns[name] = lambda launch=launch: launch(sizes, ends, 8, 4096, 1, 4096)
    noop = FakeLauncher().launch
    fns["bare launcher"] = lambda: noop(1, 1, 1, 0, 0x1234, False, False, None, None, ("packed",), None, None, None,
                                        sizes, ends, 8, 4096, 1, 4096, 16)  # fmt: skip
    for fn in fns.values():
        _per_call_us(fn, max(calls // 10, 1))  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_per_call_us(fn, calls))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", type=Path, help="another launch.py to time beside this checkout's")
    parser.add_argument("--calls", type=count(1), default=100_000, help="calls per pass (default 100000)")
    parser.add_argument("--repeats", type=count(1), default=9, help="interleaved passes (default 9)")
    args = parser.parse_args(argv)
    from ragdot.kernels import launch as new

    modules = {"new": new} | ({"old": _load(args.old, "ragdot_old_launch")} if args.old else {})
    with on_a_fake_gpu():
        times = _timed(modules, args.calls, args.repeats)
    print(f"host clock, µs per call (median of {args.repeats} interleaved passes of {args.calls} calls; "
          f"torch {torch.__version__}, Python {sys.version.split()[0]})")
    for name, ts in times.items():
        print(f"  {name:14s} {statistics.median(ts):7.3f}  (min {min(ts):.3f}, max {max(ts):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
