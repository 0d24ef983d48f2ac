"""ragdot.jax's FFI custom call: the handler library, the launch plans it replays, and its errors.

The plans are checked without a GPU: ragdot's kernels compiled for sm_90 (`compile_only`), their launches
recorded, the program written over the recording's buffers and replayed by the library in trace mode over
buffers at other addresses: every pointer must move with its buffer, every integer and tensor map be the
kernel's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import program_trace as pt  # noqa: E402
from helpers import bundled_ptxas  # noqa: E402
from ragdot.jax import _ffi  # noqa: E402
from ragdot.kernels import record  # noqa: E402
from ragdot.kernels.configs import TileConfig  # noqa: E402
from ragdot.native import plan as _plan  # noqa: E402

needs_library = pytest.mark.skipif(not _ffi.available(), reason=f"no FFI handler library: {_ffi.reason()}")
needs_ptxas = pytest.mark.skipif(not bundled_ptxas() or os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="needs the ptxas bundled with Triton and TRITON_INTERPRET unset")
BF = torch.bfloat16
TMA = TileConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4, persistent=True,
                 tma=True, flat=True)


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None,
                    reason="no C compiler")
def test_the_handler_library_builds_and_registers_where_a_c_compiler_is(monkeypatch):
    monkeypatch.delenv("RAGDOT_JAX_BRIDGE", raising=False)
    assert _ffi.available(), _ffi.reason()
    assert _ffi.reason() is None


@needs_library
def test_the_library_is_built_in_the_temporary_folder_where_the_cache_folder_cannot_be_written(monkeypatch,
                                                                                                tmp_path):
    import tempfile

    monkeypatch.setenv("RAGDOT_CACHE_DIR", "/proc/ragdot-cannot-write-here")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    built = _ffi.build()
    assert built.parent == tmp_path / "ragdot-ffi" and built.is_file()
    assert _ffi.build() == built  # found there the next time


def test_the_bridge_mode_is_checked(monkeypatch):
    monkeypatch.setenv("RAGDOT_JAX_BRIDGE", "fast")
    with pytest.raises(ValueError, match="RAGDOT_JAX_BRIDGE must be one of ffi, callback, general"):
        _ffi.mode()
    monkeypatch.setenv("RAGDOT_JAX_BRIDGE", "callback")
    assert not _ffi.available() and _ffi.reason() == "RAGDOT_JAX_BRIDGE=callback"
    with _ffi.bridge_mode("general"):
        assert _ffi.mode() == "general"
    assert _ffi.mode() == "callback"  # as it was
    monkeypatch.delenv("RAGDOT_JAX_BRIDGE")
    with _ffi.bridge_mode("callback"):
        assert _ffi.mode() == "callback"
    assert "RAGDOT_JAX_BRIDGE" not in os.environ
    with pytest.raises(ValueError, match="bridge_mode: expected one of ffi, callback, general"), \
            _ffi.bridge_mode("fast"):
        pass


@needs_library
@needs_ptxas
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "pointer"])
def test_compiled_ragged_m_plan_moves_every_argument_with_its_buffer(tma):
    from ragdot.kernels import ragged_m as rm

    m, k, n, g = 256, 64, 128, 8
    a, b = torch.randn(1, m, k, dtype=BF), torch.randn(1, g, k, n, dtype=BF)
    sizes, out = torch.full((g,), m // g, dtype=torch.int32), torch.empty(1, m, n, dtype=BF)
    cfg = TMA if tma else TileConfig(64, 128, 64, 8, 4, 4, persistent=True)
    rec = pt.recorded(lambda: rm.Prepared(a, b, BF, cfg, from_sizes=True)(a, b, sizes, out))
    assert len(rec.steps) == 1 and rec.scratch == []
    tensors = [a, b, sizes, out, torch.empty(512, dtype=torch.uint8)]
    traced = pt.trace(_plan.program(rec, pt.buffers(tensors), 4, loaded=False), pt.NEW[:5])
    assert traced == pt.expected(rec.steps[0], tensors, pt.NEW)
    kernel = rec.steps[0].compiled.src.fn.__name__
    assert kernel == ("ragged_m_tma_flat_kernel" if tma else "ragged_m_kernel")


@needs_library
@needs_ptxas
def test_compiled_a_slot_installs_the_plan_of_a_recorded_call():
    """`_Slot._plan` over the call's buffers (address, bytes): the program goes into the library's slot table
    for that device (a kernel compiled without a GPU: function 0, never launched); a record it cannot place
    leaves the device without a plan, saying why."""
    from ragdot.jax._bridge import Bridge
    from ragdot.kernels import ragged_m as rm

    m, k, n, g = 128, 64, 128, 4
    a, b = torch.randn(1, m, k, dtype=BF), torch.randn(1, g, k, n, dtype=BF)
    sizes, out = torch.full((g,), m // g, dtype=torch.int32), torch.empty(1, m, n, dtype=BF)
    rec = pt.recorded(lambda: rm.Prepared(a, b, BF, TMA, from_sizes=True)(a, b, sizes, out))
    rec.steps[0].compiled.function = 0  # not loaded: the library stores the program, nothing launches it
    slot = _ffi._Slot(Bridge(None), False, (), index=10_000)
    workspace = torch.empty(512, dtype=torch.uint8)
    buffers = pt.buffers([a, b, sizes, out, workspace])
    assert slot._plan(rec, True, buffers, 3) and slot.planned == {3} and slot.kept[3]
    assert not slot._plan(rec, True, buffers[1:], 5) and "lies in 0" in slot.why[5]
    assert not slot._plan(rec, False, buffers, 6) and "Triton kernels alone" in slot.why[6]
    _ffi.library().ragdot_ffi_set_plan(10_000, 3, None, 0)  # the test's plan removed again


@needs_library
@needs_ptxas
def test_compiled_ragged_k_plan_puts_its_ranking_in_the_workspace():
    from ragdot.kernels import ragged_k as rk

    r, m, n, g = 256, 64, 128, 8
    a, b = torch.randn(1, r, m, dtype=BF), torch.randn(1, r, n, dtype=BF)
    sizes, out = torch.full((g,), r // g, dtype=torch.int32), torch.empty(g, 1, m, n, dtype=BF)
    cfg = TileConfig(64, 128, 64, 8, 4, 3, tma=True)
    rec = pt.recorded(lambda: rk.Prepared(a, b, g, BF, cfg, from_sizes=True)(a, b, sizes, out),
                      _plan.workspace_bytes(g))
    assert len(rec.steps) == 2 and len(rec.scratch) == 1  # the ranking kernel, then the product
    (sched,) = rec.scratch
    tensors = [a, b, sizes, out, torch.empty(_plan.workspace_bytes(g), dtype=torch.uint8)]
    traced = pt.trace(_plan.program(rec, pt.buffers(tensors), 4, loaded=False), pt.NEW[:5])
    # the schedule (a torch temporary on the recorded call) is the workspace's start on the replayed one
    placed = [*tensors[:4], sched]
    assert traced == pt.expected(rec.steps[0], placed, pt.NEW) + pt.expected(rec.steps[1], placed, pt.NEW)
    with pytest.raises(_plan.Unplannable, match="workspace"):
        _plan.program(rec, pt.buffers(tensors[:4]) + [(pt.NEW[4], 16)], 4, loaded=False)


@needs_library
@needs_ptxas
def test_compiled_nothing_to_contract_is_a_zero_fill_and_a_foreign_tensor_is_refused():
    from ragdot.kernels import ragged_m as rm

    m, n, g = 64, 32, 4
    a, b = torch.randn(1, m, 0, dtype=BF), torch.randn(1, g, 0, n, dtype=BF)
    sizes, out = torch.full((g,), 16, dtype=torch.int32), torch.empty(1, m, n, dtype=BF)
    rec = pt.recorded(lambda: rm.Prepared(a, b, BF, None, from_sizes=True)(a, b, sizes, out))
    tensors = [a, b, sizes, out, torch.empty(512, dtype=torch.uint8)]
    traced = pt.trace(_plan.program(rec, pt.buffers(tensors), 4, loaded=False), pt.NEW[:5])
    assert traced == [-1, pt.NEW[3], m * n * 2]
    lhs, rhs = torch.randn(1, 128, 64, dtype=BF), torch.randn(1, g, 64, n, dtype=BF)
    out = torch.empty(1, 128, n, dtype=BF)
    rec = pt.recorded(lambda: rm.Prepared(lhs, rhs, BF, TMA, from_sizes=True)(lhs, rhs, sizes, out))
    buffers = pt.buffers([lhs, sizes, out])  # rhs is not one of them
    with pytest.raises(_plan.Unplannable, match="lies in 0 of the call's buffers"):
        _plan.program(rec, buffers, None, loaded=False)
    with pytest.raises(_plan.Unplannable, match="launched nothing"):
        _plan.program(record.Record(), buffers, None)


@needs_library
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or not bundled_ptxas(),
                    reason="the compiled checks run in this process (no interpreter) or cannot run (no ptxas)")
def test_the_plan_checks_of_compiled_kernels_in_a_process_without_the_interpreter():
    """The `test_compiled_*` checks need Triton's compiler, which Triton's interpreter (set for the CPU runs of
    this suite) replaces: they run in a child process with it off."""
    env = {**{k: v for k, v in os.environ.items() if k != "RAGDOT_JAX_BRIDGE"}, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "compiled"], capture_output=True, text=True, env=env, timeout=900,
                          cwd=os.path.dirname(__file__))
    assert proc.returncode == 0 and "5 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


@needs_library
def test_a_program_of_another_process_and_a_failing_call_raise_in_the_caller(monkeypatch):
    monkeypatch.delenv("RAGDOT_JAX_BRIDGE", raising=False)
    x = jnp.ones((4, 2), jnp.float32)

    def call(slot):
        out = (jax.ShapeDtypeStruct((4, 2), jnp.float32),)
        return jax.ffi.ffi_call(_ffi.TARGET, out)(x, slot=np.int64(slot))[0].block_until_ready()

    with pytest.raises(Exception, match="compiled in another process"):
        call(((_ffi._TOKEN ^ 1) << 32) | 0)
    with pytest.raises(Exception, match="IndexError"):  # a slot this process never made: the resolver's error
        call((_ffi._TOKEN << 32) | 999_999)


@needs_library
def test_plans_are_not_taken_on_the_cpu_and_every_call_runs_ragdot_s_code(monkeypatch):
    import ragdot.jax as rj

    monkeypatch.delenv("RAGDOT_JAX_BRIDGE", raising=False)
    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.standard_normal((23, 5)), jnp.float32)  # a signature no other test uses
    rhs = jnp.asarray(rng.standard_normal((2, 5, 7)), jnp.float32)
    sizes = jnp.asarray([11, 9], jnp.int32)
    f = jax.jit(lambda a, b: rj.ragged_dot(a, b, sizes))
    for _ in range(3):
        got = f(lhs, rhs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.lax.ragged_dot(lhs, rhs, sizes)), rtol=1e-5,
                               atol=1e-5)
    (mine,) = [s for s in rj.bridge_stats() if s["signature"].lhs_shape == (23, 5) and not s["backward"]]
    assert mine["resolved"] == 3 and mine["planned"] == []
    rj.clear_plans()  # forgets plans (none here) and records again; the calls go on
    np.testing.assert_array_equal(np.asarray(f(lhs, rhs)), np.asarray(got))
    (mine,) = [s for s in rj.bridge_stats() if s["signature"].lhs_shape == (23, 5) and not s["backward"]]
    assert mine["resolved"] == 4


_GPU_CASES = {  # name: (lhs shape, rhs shape, ((contracting), (batch)), lhs ragged, rhs group)
    "fwd": ((1024, 256), (8, 256, 192), (((1,), (1,)), ((), ())), (0,), (0,)),
    "dgrad": ((1024, 192), (8, 256, 192), (((1,), (2,)), ((), ())), (0,), (0,)),
    "wgrad": ((1024, 256), (1024, 192), (((0,), (0,)), ((), ())), (0,), ()),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_GPU_CASES))
def test_on_the_gpu_triton_calls_replay_from_c_with_the_callback_s_bits(case, monkeypatch):
    """After its first call, a triton forward and backward run from the handler's plan alone (no Python), on
    other operands each call, with the bits of the buffer-callback bridge; NaN past sum(group_sizes) in the
    ragged operand never leaks."""
    import ragdot.jax as rj

    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax has no GPU backend here")
    lshape, rshape, ddn, lrag, rgrp = _GPU_CASES[case]
    dn = jax.lax.RaggedDotDimensionNumbers(ddn, list(lrag), list(rgrp))
    sizes = jax.device_put(jnp.asarray([200, 0, 130, 77, 0, 256, 100, 61], jnp.int32), gpu)  # 824 of 1024 rows
    rng = np.random.default_rng(11)

    def operands(seed):
        r = np.random.default_rng(seed)
        x = r.standard_normal(lshape).astype(np.float32)
        x[824:] = np.nan
        w = r.standard_normal(rshape).astype(np.float32)
        if case == "wgrad":
            w[824:] = np.nan
        return (jax.device_put(jnp.asarray(v, jnp.bfloat16), gpu) for v in (x, w))

    def run(bridge):
        monkeypatch.setenv("RAGDOT_JAX_BRIDGE", bridge)
        f = jax.jit(lambda x, w: rj.ragged_dot_general(x, w, sizes, dn, backend="triton"))
        results = []
        for seed in range(4):
            x, w = operands(seed)
            out, vjp = jax.vjp(f, x, w)
            dout = jnp.asarray(rng.standard_normal(out.shape), jnp.bfloat16)
            results.append([np.asarray(a.astype(jnp.float32)) for a in (out, *vjp(dout))])
        return results

    before = {id(s["signature"]) for s in _ffi.stats()}
    fast = run("ffi")
    mine = [s for s in _ffi.stats() if id(s["signature"]) not in before and s["signature"].lhs_shape == lshape]
    assert {s["backward"] for s in mine} == {False, True}
    for s in mine:  # the forward's first call in Python, the backward's first two (the first binds), then the plan
        print(case, "backward" if s["backward"] else "forward", s["planned"], s["resolved"], s["why"])
        # dgrad's weight gradient comes in the weight's memory order too (XLA's contiguous [G, N, K] buffer):
        # both of its products write XLA's buffers, so its backward is planned like the others
        assert s["planned"] == [gpu.id] and s["resolved"] == (2 if s["backward"] else 1), s["why"]
    rng = np.random.default_rng(11)
    slow = run("callback")
    for got, want in zip(fast, slow):
        for a, b in zip(got, want):
            assert np.array_equal(a, b, equal_nan=False)
    if case != "wgrad":
        assert np.all(fast[0][0][824:] == 0)  # the tail rows


def test_a_record_is_its_thread_s_and_a_launch_outside_the_hooks_marks_it_foreign():
    """What `ragdot.kernels.record` notes: this thread's BoundLaunches and scratch, not another thread's
    launches meanwhile; a launch through `configs.run_kernel` makes the record foreign (never replayed); a
    second thread's record waits for the first; an inner record in one thread is refused."""
    import threading

    from ragdot.kernels import configs, ends

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernels need a GPU or the interpreter")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = torch.tensor([3, 0, 5], dtype=torch.int32, device=device)
    order = []

    def other():
        ends.group_ends(sizes, 16)  # not in this thread's record
        with record.recording() as theirs:
            order.append("theirs")
        order.append(len(theirs.steps))

    with record.recording() as rec:
        got = ends.group_ends(sizes, 16)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=0.5)  # it launches, then waits for this record to end
        order.append("mine")
        with pytest.raises(RuntimeError, match="already active in this thread"), record.recording():
            pass
    thread.join(timeout=30)
    assert order == ["mine", "theirs", 0]
    assert got.tolist() == [3, 3, 8]
    assert [type(s).__name__ for s in rec.steps] == ["Launch"] and len(rec.scratch) == 1 and not rec.foreign
    with record.recording() as rec:
        out = torch.empty(3, dtype=torch.int32, device=device)
        configs.run_kernel(ends._group_ends_kernel, (1,), sizes, out, 3, 16, 1, 16, BLOCK_G=16, num_warps=1)
    assert rec.foreign and rec.steps == []
    with pytest.raises(_plan.Unplannable, match="outside ragdot's recorded launches"):
        _plan.program(rec, [], None)


_EXIT_CHILD = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import ragdot.jax as rj
from ragdot.jax import _ffi
mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
lhs, rhs, sizes = np.ones((16, 4), np.float32), np.ones((2, 4, 3), np.float32), np.array([5, 9], np.int32)
with jax.set_mesh(mesh):
    x = jax.device_put(lhs, NamedSharding(mesh, P("x", None)))
    w = jax.device_put(rhs, NamedSharding(mesh, P("x")))
    f = jax.jit(lambda a, w: rj.ragged_dot(a, w, sizes))
    print(float(np.asarray(f(x, w)).sum()))  # one replica read; the other may still be running at exit
    g = jax.jit(jax.grad(lambda a, w: (f(a, w) ** 2).sum(), (0, 1)))(x, w)
    print(float(np.asarray(g[0]).sum()), float(np.asarray(g[1]).sum()))
    f(x * 2, w)  # dispatched and never read: still running as the interpreter exits
if CLOSE:
    _ffi._close(_ffi.library())
    try:
        jax.jit(lambda a: rj.ragged_dot(a, rhs, sizes))(lhs * 3).block_until_ready()
    except Exception as e:
        print("refused:", "interpreter is exiting" in str(e))
"""


@needs_library
@pytest.mark.parametrize("close", [False, True])
def test_a_call_still_queued_at_interpreter_exit_does_not_abort_the_process(close):
    """Sharded over two host devices, a replica whose result nobody reads can still be calling into Python when
    the interpreter finalizes, which aborted the process ("terminate called without an active exception"):
    about a third of runs, nearly every run with a call dispatched and never read. The exit hook stops new
    calls into Python and waits for those inside; after it, a call fails with its reason."""
    env = {**{k: v for k, v in os.environ.items() if k != "RAGDOT_JAX_BRIDGE"},
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}  # host devices
    for _ in range(1 if close else 3):
        proc = subprocess.run([sys.executable, "-c", f"CLOSE = {close}\n" + _EXIT_CHILD], capture_output=True,
                              text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert proc.stdout.split()[:3] == ["168.0", "1344.0", "1344.0"]
        assert ("refused: True" in proc.stdout) == close
