"""ragdot.inductor_lowering: the canonical ops lowered to calls of their `.out` overloads on inductor's buffers."""

from __future__ import annotations

import pytest
import torch

import ragdot
from ragdot import inductor_lowering
from ragdot.inductor_lowering import direct_out_name


def _step(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    h = torch.relu(ragdot.ragged_dot(x, w1, sizes, backend="reference"))
    return (ragdot.ragged_dot(h, w2, sizes, backend="reference") ** 2).sum()


def test_installed_lowering_calls_the_out_overloads_with_the_same_results():
    pytest.importorskip("torch._inductor")
    from torch._inductor.utils import run_and_get_code

    assert inductor_lowering.install()  # replaces the lowering of torch releases that have their own
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(24, 8, generator=gen).requires_grad_()
    w1 = torch.randn(3, 8, 16, generator=gen).requires_grad_()
    w2 = torch.randn(3, 16, 8, generator=gen).requires_grad_()
    sizes = torch.tensor([9, 0, 11])  # 4 rows past the last group: their products are zero
    torch._dynamo.reset()
    compiled = torch.compile(_step, fullgraph=True, backend="inductor")

    def run():
        loss = compiled(x, w1, w2, sizes)
        loss.backward()
        return loss

    before = inductor_lowering._state["lowered"]
    with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph would skip the lowering
        loss, codes = run_and_get_code(run)
    assert inductor_lowering._state["lowered"] - before == 6  # 2 forward products, 2 data and 2 weight gradients
    got = (loss.detach(), x.grad, w1.grad, w2.grad)
    x.grad = w1.grad = w2.grad = None
    want_loss = _step(x, w1, w2, sizes)
    want_loss.backward()
    for g, w in zip(got, (want_loss.detach(), x.grad, w1.grad, w2.grad)):
        torch.testing.assert_close(g, w)
    code = "\n".join(codes)
    # the `.out` overloads' implementations, called directly (no dispatcher round trip)
    assert f"torch.ops.ragdot.{direct_out_name('ragged_m')}(" in code
    assert f"torch.ops.ragdot.{direct_out_name('ragged_k')}(" in code
    assert "ragged_k.default(" not in code and "ragged_m.default(" not in code


def test_dynamic_shapes_compile_and_run_no_kernel_while_compiling(monkeypatch):
    """torch 2.13's own `.out` lowering fails on symbolic sizes; ragdot's takes them, and its example output is
    a fake tensor: the only kernel calls are the compiled graph's own, one per call."""
    from torch._inductor.utils import run_and_get_code

    from ragdot import ops

    assert inductor_lowering.install()
    calls = []
    real = ops.runner
    monkeypatch.setattr(ops, "runner", lambda *a, **k: calls.append(1) or real(*a, **k))

    def fwd(x, w, sizes):
        return ragdot.ragged_dot(x, w, sizes, backend="reference")

    gen = torch.Generator().manual_seed(3)
    w = torch.randn(4, 16, 8, generator=gen)
    torch._dynamo.reset()
    compiled = torch.compile(fwd, dynamic=True, fullgraph=True)
    for m in (12, 21, 30):
        x = torch.randn(m, 16, generator=gen)
        x[m - 2:] = float("nan")  # past the groups: never read into the result
        sizes = torch.tensor([(m - 2) // 4] * 3 + [(m - 2) - 3 * ((m - 2) // 4)])
        calls.clear()
        with torch._inductor.config.patch(force_disable_caches=True), torch.no_grad():
            got, codes = run_and_get_code(compiled, x, w, sizes)
        assert len(calls) == 1
        if m == 12:
            assert f"torch.ops.ragdot.{direct_out_name('ragged_m')}(" in "\n".join(codes)
        torch.testing.assert_close(got, fwd(x, w, sizes))


@pytest.mark.parametrize("env, installs", [(None, True), ("1", True), ("0", False)])
def test_maybe_install_unless_switched_off(env, installs, monkeypatch):
    import sys

    calls = []
    monkeypatch.setitem(inductor_lowering._state, "done", False)
    monkeypatch.setitem(sys.modules, "torch._inductor.lowering", sys.modules.get("torch._inductor.lowering", object()))
    monkeypatch.setattr(inductor_lowering, "install", lambda: calls.append(1) or True)
    if env is None:
        monkeypatch.delenv("RAGDOT_INDUCTOR_OUT", raising=False)
    else:
        monkeypatch.setenv("RAGDOT_INDUCTOR_OUT", env)
    inductor_lowering.maybe_install()
    inductor_lowering.maybe_install()  # once per process
    assert calls == ([1] if installs else [])


def test_run_into_copies_where_the_buffer_is_not_the_kernels_layout():
    from ragdot import ops

    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(1, 10, 4, generator=gen), torch.randn(1, 2, 4, 6, generator=gen)
    sizes = torch.tensor([3, 5])
    want = ops.run("ragged_m", a, b, sizes, torch.float32, "auto")
    out = torch.full((1, 6, 10), float("nan")).transpose(1, 2)  # [1, 10, 6], not contiguous
    assert ops.run_into("ragged_m", a, b, sizes, torch.float32, "auto", 1, out) is out
    assert torch.equal(out, want)


@pytest.mark.gpu
def test_installed_lowering_on_cuda_matches_eager_in_bfloat16():
    from torch._inductor.utils import run_and_get_code

    assert inductor_lowering.install()
    gen = torch.Generator().manual_seed(2)
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    x = torch.randn(512, 64, generator=gen).to(dev, bf16).requires_grad_()
    w = torch.randn(8, 64, 128, generator=gen).to(dev, bf16).requires_grad_()
    sizes = torch.tensor([70, 0, 90, 64, 64, 100, 20, 50], device=dev)  # 54 rows past the last group
    x.data[458:] = float("nan")  # never read into a result

    def step(x, w, sizes):
        return ragdot.ragged_dot(x, w, sizes).float().square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)

    def run():
        loss = compiled(x, w, sizes)
        loss.backward()
        return loss

    with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph would skip the lowering
        loss, codes = run_and_get_code(run)
    got = (loss.detach(), x.grad[:458], w.grad)
    x.grad = w.grad = None
    want = step(x, w, sizes)
    want.backward()
    torch.testing.assert_close(got[0], want.detach(), rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(got[1], x.grad[:458], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[2], w.grad, rtol=2e-2, atol=2e-2)
    assert f"torch.ops.ragdot.{direct_out_name('ragged_k')}(" in "\n".join(codes)


@pytest.mark.gpu
def test_compiled_weight_gradient_runs_gluon_into_the_buffer_where_eager_does():
    """The `.out` path (compiled code's buffer) plans as eager calls do, gluon included where it runs (sm_90): the
    weight gradient runs the same kernel as the eager call's and gives its bits."""
    from ragdot import ops

    if "gluon" not in ragdot.backends():
        pytest.skip("the gluon backend does not run here")
    gen = torch.Generator().manual_seed(3)
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    a = torch.randn(1, 1024, 256, generator=gen).to(dev, bf16)
    b = torch.randn(1, 1024, 512, generator=gen).to(dev, bf16)
    sizes = torch.tensor([300, 0, 200, 400, 124, 0, 0, 0], device=dev)
    want = ops.run("ragged_k", a, b, sizes, bf16, "auto")
    out = torch.full_like(want, float("nan"))
    assert ops.run_into("ragged_k", a, b, sizes, bf16, "auto", 1, out) is out
    chosen = ops.runner("ragged_k", "auto", a, b, 8, bf16, 1, into=True, replay=False).label
    assert chosen.startswith("gluon") == ops.runner("ragged_k", "auto", a, b, 8, bf16).label.startswith("gluon")
    assert chosen.startswith("gluon"), chosen
    assert torch.equal(out, want)


@pytest.mark.parametrize("name", ["ragged_m", "ragged_k", "batch"])
def test_direct_entry_is_the_out_overload(name):
    """What generated code calls (`torch.ops.ragdot._<op>_out_direct`) writes and returns the buffer the
    `.out` overload does, with the same values."""
    gen = torch.Generator().manual_seed(3)
    sizes = torch.tensor([5, 0, 4])
    if name == "ragged_m":
        a, b, shape = torch.randn(1, 12, 8, generator=gen), torch.randn(1, 3, 8, 6, generator=gen), (1, 12, 6)
        args = (a, b, sizes, torch.float32, "reference", 1)
    elif name == "ragged_k":
        a, b, shape = torch.randn(1, 12, 5, generator=gen), torch.randn(1, 12, 6, generator=gen), (3, 1, 5, 6)
        args = (a, b, sizes, torch.float32, "reference", 1)
    else:
        a, b, shape = torch.randn(2, 4, 8, generator=gen), torch.randn(2, 8, 6, generator=gen), (2, 4, 6)
        args = (a, b, torch.float32, "reference")
    direct = getattr(torch.ops.ragdot, direct_out_name(name))
    got = torch.full(shape, float("nan"))
    want = torch.full(shape, float("nan"))
    assert direct(*args, out=got) is got
    getattr(torch.ops.ragdot, name).out(*args, out=want)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


class _ThreeProblems(torch.nn.Module):
    """ragged_m (NaN in the rows past the last group), ragged_k and a batch product: an inference module."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.w = torch.nn.Parameter(torch.randn(4, 16, 8, generator=gen).to(device, dtype))

    def forward(self, x: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = ragdot.ragged_dot(x, self.w, sizes)
        dn = ragdot.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), (0,), ())
        per_group = ragdot.ragged_dot_general(x, y, sizes, dn)  # [G, 16, 8]
        return y, per_group, ragdot.grouped_mm(per_group, per_group.transpose(1, 2))


def _needs_aot_torch() -> None:
    from ragdot.inductor_lowering import AOT_MIN_TORCH, torch_release

    if torch_release() < AOT_MIN_TORCH:  # torch 2.11 crashes loading the package (ragdot refuses to compile it)
        pytest.skip(f"AOTInductor with ragdot's ops needs torch >= {AOT_MIN_TORCH}")


def _aoti(module: torch.nn.Module, args: tuple) -> object:
    """`module` exported and compiled ahead of time by AOTInductor (C++ wrapper), then loaded."""
    if not hasattr(torch._inductor, "aoti_compile_and_package"):
        pytest.skip("this torch has no AOTInductor packaging")
    _needs_aot_torch()
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("AOTInductor needs a C++ compiler")
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        program = torch.export.export(module, args)
        return torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(program))


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_aot_inductor_runs_ragdot_s_ops_through_its_proxy_executor(device):
    """AOTInductor's C++ wrapper called ragdot's ops through a C shim they do not have (torch 2.13 lowers a custom
    op with a `.out` overload to one): the generated C++ did not compile. They now stay fallback kernels that it
    calls through the dispatcher, and the compiled model gives the eager bits."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    module = _ThreeProblems(dtype, torch.device(device))
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(20, 16, generator=gen).to(device, dtype)
    x[18:] = float("nan")  # past the groups' 18 rows: never in a result
    sizes = torch.tensor([5, 0, 7, 6], device=device)
    compiled = _aoti(module, (x, sizes))
    with torch.no_grad():
        want = module(x, sizes)
    got = compiled(x, sizes)
    assert len(got) == 3
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(got[0][18:], torch.zeros_like(got[0][18:]))


def test_aot_inductor_compiles_an_moe_layer():
    from ragdot.moe import MoELayer

    torch.manual_seed(7)
    layer = MoELayer(16, 8, 4, 2, path="sparse", dtype=torch.float32).eval()
    x = torch.randn(12, 16)
    compiled = _aoti(layer, (x,))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x))


def test_aot_inductor_on_an_older_torch_refuses_at_compile_time(monkeypatch):
    """On a torch before 2.13 a package calling ragdot would crash the process that loads it: the compile fails
    first, saying why; torch.compile, which is no AOT compile, is untouched."""
    from ragdot import inductor_lowering

    if not hasattr(torch._inductor, "aoti_compile_and_package"):
        pytest.skip("this torch has no AOTInductor packaging")
    monkeypatch.setattr(inductor_lowering, "torch_release", lambda: (2, 11))
    module = _ThreeProblems(torch.float32, torch.device("cpu"))
    x, sizes = torch.randn(20, 16), torch.tensor([5, 0, 7, 6])
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        program = torch.export.export(module, (x, sizes))
        with pytest.raises(Exception, match=r"AOTInductor with ragdot's ops needs torch >= 2\.13"):
            torch._inductor.aoti_compile_and_package(program)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(compiled(x, sizes), module(x, sizes)))

