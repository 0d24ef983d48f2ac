"""`ragdot.kernels.launch.BoundLaunch`'s direct path on stand-ins of a compiled kernel and its C launcher
(`benchmarks/launch_overhead.py`'s): what reaches the C launch function, when a call goes through Triton's own
launch instead, and one compiled kernel per specialization (tensor dtypes and 16-byte alignment). The real
launches run in the GPU tests; this machine needs no GPU."""

from __future__ import annotations

import pytest
import torch

from helpers import benchmark_script
from ragdot.kernels import launch as launch_mod

fakes = benchmark_script("launch_overhead")


@pytest.fixture
def gpu(monkeypatch):
    """Device 0 current, raw stream 77: BoundLaunch's direct path on any machine."""
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)


def _bound(n_runtime: int, launcher, jit_calls: list, constexprs=None):
    constexprs = {"BLOCK": 16, "SPLIT": 2} if constexprs is None else constexprs
    kernel = fakes.fake_kernel(n_runtime, constexprs, fakes.FakeCompiled(launcher), jit_calls)
    bound = launch_mod.BoundLaunch(kernel, (3, 2), {"SPLIT": 4}, {"num_warps": 8}, torch.device("cuda", 0))
    bound._direct = True
    return bound


def test_a_repeated_launch_calls_the_c_launcher_with_triton_s_argument_list(gpu):
    calls, jit = [], []
    bound = _bound(4, fakes.FakeLauncher(calls), jit)
    a, b = torch.zeros(8), torch.zeros(8, dtype=torch.int32)
    bound(a, b, 5, 6)  # the first call of a specialization: Triton's launch, which compiles
    assert jit == [((3, 2, 1), (a, b, 5, 6), {"SPLIT": 4, "num_warps": 8})] and calls == []
    bound(a, b, 7, 8)
    (args,) = calls
    head = (3, 2, 1, 77, 0x1234, False, False, None, None, ("packed",), None, None, None)
    assert args[:13] == head and args[13:] == (a, b, 7, 8, 16, 4)  # runtime args, then constexprs in order
    assert len(jit) == 1


def test_a_launcher_with_scratch_buffers_is_called_through_its_own_run(gpu):
    calls, jit = [], []

    class Scratch(fakes.FakeLauncher):
        global_scratch_size = 128  # Triton's launcher allocates it: not the bare C function's job

        def __call__(self, *args):
            calls.append(("run", *args))

    bound = _bound(2, Scratch([]), jit, {})
    t = torch.zeros(4)
    bound(t, 3)
    bound(t, 4)
    assert calls == [("run", 3, 2, 1, 77, 0x1234, ("packed",), None, None, None, t, 4)]


def test_each_dtype_and_alignment_compiles_once(gpu):
    calls, jit = [], []
    bound = _bound(3, fakes.FakeLauncher(calls), jit, {})
    base = torch.zeros(64)
    a, b = base[:16], torch.zeros(4, dtype=torch.int64)
    for t in (a, a, base[1:17], base[1:17], a.half(), b, b):
        bound(t, b, 1)
    assert len(jit) == 4  # float32 aligned, float32 off by 4 bytes, float16, int64: one Triton launch each
    assert len(calls) == 3
    three = _bound(4, fakes.FakeLauncher(calls), jit, {})  # three tensors: the generic key
    for t in (a, a, base[1:17]):
        three(t, b, a, 2)
    assert len(jit) == 6 and len(calls) == 4


def test_a_listening_profiler_gets_triton_s_own_launch(gpu, monkeypatch):
    calls, jit = [], []
    bound = _bound(2, fakes.FakeLauncher(calls), jit, {})
    t = torch.zeros(4)
    bound(t, 1)
    monkeypatch.setattr(launch_mod, "hooked", lambda: True)
    bound(t, 2)
    assert calls == [] and len(jit) == 2


def test_the_probe_runs():
    assert fakes.main(["--calls", "200", "--repeats", "1"]) == 0
