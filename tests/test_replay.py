"""Eager calls replayed from C (`ragdot.kernels.replay`): the programs they write (checked without a GPU, the
kernels compiled for sm_90) and, on a GPU, replayed calls against the Python launch path, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import program_trace as pt
from helpers import bundled_ptxas
from ragdot import native
from ragdot.kernels.configs import TileConfig
from ragdot.native import plan as _plan

needs_library = pytest.mark.skipif(native.library() is None, reason=f"no replay library: {native.reason()}")
needs_ptxas = pytest.mark.skipif(not bundled_ptxas() or os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="needs the ptxas bundled with Triton and TRITON_INTERPRET unset")
BF = torch.bfloat16
PERSISTENT = TileConfig(128, 128, 64, 8, 4, 4, persistent=True, tma=True, flat=True)


@needs_library
@needs_ptxas
def test_compiled_an_eager_weight_gradient_is_one_launch_with_its_ranking_in_the_workspace():
    """Recorded for an eager replay (no fixed workspace), ragged_k from raw sizes keeps its inline ranking: one
    launch, each program's rows of the ranking in the per-call workspace, every pointer moving with its buffer."""
    from ragdot.kernels import ragged_k as rk

    r, m, n, g = 512, 128, 128, 8
    a, b = torch.randn(1, r, m, dtype=BF), torch.randn(1, r, n, dtype=BF)
    sizes, out = torch.full((g,), r // g, dtype=torch.int32), torch.empty(g, 1, m, n, dtype=BF)
    made = []

    def run():
        made.append(rk.Prepared(a, b, g, BF, PERSISTENT, from_sizes=True))
        made[0](a, b, sizes, out)

    rec = pt.recorded(run)
    (prepared,) = made
    assert prepared.inline and len(rec.steps) == 1
    (sched,) = rec.scratch
    assert tuple(sched.shape) == (prepared.programs, 4, g)
    workspace = _plan.scratch_bytes(rec)
    assert workspace >= sched.numel() * 4 and workspace % 256 == 0
    tensors = [a, b, sizes, out]
    words = _plan.program(rec, [_plan.buffer(t) for t in tensors] + [(0, workspace)], 4, loaded=False)
    assert pt.trace(words, pt.NEW[:5]) == pt.expected(rec.steps[0], [*tensors, sched], pt.NEW)


@needs_library
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or not bundled_ptxas(),
                    reason="the compiled checks run in this process (no interpreter) or cannot run (no ptxas)")
def test_the_compiled_checks_in_a_process_without_the_interpreter():
    """The `test_compiled_*` checks need Triton's compiler, which Triton's interpreter (set for the CPU runs of
    this suite) replaces: they run in a child process with it off."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "compiled"], capture_output=True, text=True, env=env, timeout=900,
                          cwd=os.path.dirname(__file__))
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_replay_can_be_turned_off(monkeypatch):
    from ragdot.kernels import replay

    monkeypatch.setenv("RAGDOT_REPLAY", "0")
    assert not replay.enabled()
    monkeypatch.setenv("RAGDOT_REPLAY", "1")
    assert replay.enabled()


# ---- on the GPU -------------------------------------------------------------------------------------------
def _kernel_call(backend: str, problem: str, a: torch.Tensor, b: torch.Tensor, g: int, config: TileConfig | None):
    from ragdot.backends import get_backend

    return get_backend(backend).prepare(problem, a, b, g, BF, config)


def _operands(problem: str, rows: int, k: int, n: int, g: int, gen: torch.Generator, offset: int = 0):
    """Fresh operands for one call (user layouts: [M, K] and [G, K, N], or [R, M] and [R, N]); rows past the
    groups' end hold NaN; `offset` elements into a larger buffer (an unaligned start for offset 1)."""
    dev = torch.device("cuda")
    shape_a = (rows, k)
    shape_b = (g, k, n) if problem == "ragged_m" else (rows, n)
    a = torch.randn(rows * k + offset, device=dev, generator=gen).to(BF)[offset:].view(shape_a)
    b = torch.randn(shape_b, device=dev, generator=gen).to(BF)
    return a, b


@pytest.mark.gpu
@pytest.mark.parametrize("backend,problem,config", [
    ("triton", "ragged_m", None), ("triton", "ragged_m", TileConfig(64, 128, 64, 8, 4, 4)),
    ("triton", "ragged_k", None), ("triton", "ragged_k", PERSISTENT), ("gluon", "ragged_m", None),
    ("gluon", "ragged_k", None)], ids=["m-default", "m-pointer", "k-default", "k-inline", "gluon-m", "gluon-k"])
def test_on_the_gpu_replayed_calls_give_the_python_path_s_bits(backend, problem, config):
    from ragdot.kernels.replay import Replayed

    if backend == "gluon" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the gluon kernels are sm_90 only")
    gen = torch.Generator("cuda").manual_seed(5)
    rows, k, n, g = 1000, 256, 256, 8
    sizes = torch.tensor([200, 0, 130, 77, 0, 256, 100, 61], dtype=torch.int32, device="cuda")  # 824 rows
    a, b = _operands(problem, rows, k, n, g, gen)
    canon_a = a.unsqueeze(0)
    canon_b = b.unsqueeze(0)
    call = _kernel_call(backend, problem, canon_a, canon_b, g, config)
    launch = call.launch
    assert isinstance(launch, Replayed)
    out_shape = (rows, n) if problem == "ragged_m" else (g, k, n)
    for i in range(6):
        a, b = _operands(problem, rows, k, n, g, gen)
        a[824:] = float("nan")
        if problem == "ragged_k":
            b[824:] = float("nan")
        want = call.prepared(a.unsqueeze(0), b.unsqueeze(0), sizes)[0].view(out_shape)
        got = call.direct(a, b, sizes, out_shape)
        assert torch.equal(got, want), i
        assert not got.isnan().any()
        assert (launch.program is not None) == (i >= 1), (i, launch.why)
    # calls the program does not cover take the Python path: an unaligned operand, int64 sizes
    for offset, dtype in ((1, torch.int32), (0, torch.int64)):
        a, b = _operands(problem, rows, k, n, g, gen, offset)
        s = sizes.to(dtype)
        want = call.prepared(a.unsqueeze(0), b.unsqueeze(0), s)[0].view(out_shape)
        assert torch.equal(call.direct(a, b, s, out_shape), want), (offset, dtype)


@pytest.mark.gpu
def test_on_the_gpu_forward_and_backward_replay_with_the_first_call_s_bits_and_under_capture():
    """ragged_dot on triton, forward and backward: the replayed calls' output and gradients are the bits of the
    first (Python) call on the same inputs; a CUDA graph captured after them (its calls take the Python path:
    nothing is recorded while capturing) computes them too."""
    import ragdot

    gen = torch.Generator("cuda").manual_seed(9)
    m, k, n, g = 2048, 512, 384, 16
    x = torch.randn(m, k, device="cuda", generator=gen).to(BF).requires_grad_()
    w = (torch.randn(g, k, n, device="cuda", generator=gen) * k**-0.5).to(BF).requires_grad_()
    sizes = torch.randint(0, 2 * m // g, (g,), device="cuda", generator=gen, dtype=torch.int32)
    dy = torch.randn(m, n, device="cuda", generator=gen).to(BF)

    def step():
        x.grad = w.grad = None
        y = ragdot.ragged_dot(x, w, sizes, backend="triton")
        y.backward(dy)
        return y.detach().clone(), x.grad.clone(), w.grad.clone()

    first = step()
    for _ in range(4):
        again = step()
        for want, got in zip(first, again):
            assert torch.equal(got, want)
    with torch.no_grad():
        static = ragdot.ragged_dot(x, w, sizes, backend="triton")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                ragdot.ragged_dot(x, w, sizes, backend="triton")
            with torch.cuda.graph(graph, stream=stream):
                static = ragdot.ragged_dot(x, w, sizes, backend="triton")
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, first[0])
