"""The `ragdot-jax` and `tokamax` bench systems on the CPU: registered by name, checked like any system."""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("jax")
pytest.importorskip("jax.experimental.buffer_callback")

from helpers import benchmark_script
from ragdot.bench.jax_system import RagdotJaxSystem, jax_system  # noqa: E402
from ragdot.bench.systems import RAGDOT_JAX, TOKAMAX, Operands  # noqa: E402
from ragdot.cli import main  # noqa: E402
from ragdot.measure.classes import CLASSES  # noqa: E402


@pytest.mark.parametrize("cls", CLASSES, ids=[c.name for c in CLASSES])
def test_ragdot_jax_system_matches_ragdot(cls):
    import ragdot
    from ragdot.shapes import Shape

    shape = Shape("t", 24, 16, 8, 3)
    lshape, rshape, _ = cls.shapes(shape)
    gen = torch.Generator().manual_seed(0)
    sets = [Operands(torch.randn(lshape, generator=gen), torch.randn(rshape, generator=gen),
                     torch.tensor([10, 0, 9], dtype=torch.int32))]
    system = RagdotJaxSystem(torch.device("cpu"))
    out = system.to_torch(system.prepare(cls, sets, torch.float32)[0]())
    want = ragdot.ragged_dot_general(sets[0].lhs, sets[0].rhs, sets[0].group_sizes, cls.ragdot_dimension_numbers(),
                                     backend="reference")
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    system.release()


@pytest.mark.parametrize("system_cls", ["xla", RAGDOT_JAX])
def test_a_program_runs_the_call_n_times_in_one_jitted_program(system_cls, monkeypatch):
    """The program clock's programs: the call's result, with the call made n times (not hoisted out of the
    loop), n static: one compiled program per n, whose loop XLA knows the trip count of."""
    from ragdot.bench.xla import XlaSystem
    from ragdot.jax import _bridge

    forwards = []  # the forwards ragdot ran (on the CPU every call reaches the bridge, through either bridge)
    original = _bridge.Bridge.forward_tensors
    monkeypatch.setattr(_bridge.Bridge, "forward_tensors",
                        lambda self, *a: (forwards.append(1), original(self, *a))[1])
    cls = CLASSES[0]
    gen = torch.Generator().manual_seed(1)
    # a signature of its own (21x13 by 3x13x6, 19 rows in groups): no other test has traced its callbacks
    sets = [Operands(torch.randn(21, 13, generator=gen), torch.randn(3, 13, 6, generator=gen),
                     torch.tensor([10, 0, 9], dtype=torch.int32)) for _ in range(2)]
    system = (XlaSystem if system_cls == "xla" else RagdotJaxSystem)(torch.device("cpu"))
    calls = system.prepare(cls, sets, torch.float32)
    programs = system.programs(cls, sets, torch.float32)
    assert len(programs) == len(sets)
    for n in (1, 4, 7):
        forwards.clear()
        got = system.to_torch(programs[1](n))
        torch.testing.assert_close(got, system.to_torch(calls[1]()), rtol=0, atol=0)
        if system_cls == RAGDOT_JAX:
            assert len(forwards) == n + 1  # the program's n calls, then the one call compared against
    if system_cls == "xla":  # every part of the call stays inside the loop body: none hoisted as invariant
        lowered = system._looped[(cls.name, torch.float32, torch.float32)].lower(*system._args[0], n=3)
        hlo = lowered.compile().as_text()
        entry = hlo[hlo.index("\nENTRY"):].split("\n\n")[0]  # the program's top level, outside the loop
        assert " while(" in entry and "jit(call)" in hlo and "jit(call)" not in entry
    system.release()


def test_tokamax_is_left_out_with_a_reason_when_missing():
    system, reason = jax_system(TOKAMAX, torch.device("cpu"))
    try:
        import tokamax  # noqa: F401
    except Exception:
        assert system is None and "tokamax" in reason
    else:
        assert reason is None and system.name == TOKAMAX


def test_bench_cli_times_ragdot_jax(tmp_path):
    assert main(["bench", "--quick", "--device", "cpu", "--shapes", "tiny-8e", "--classes", "fwd_wi", "wgrad_wi",
                 "--backends", "reference", RAGDOT_JAX, "--no-xla", "--out", str(tmp_path)]) == 0
    (result,) = tmp_path.glob("*.json")
    rows = [r for r in json.loads(result.read_text())["rows"] if r["backend"] == RAGDOT_JAX]
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)


def test_bench_times_the_jax_systems_on_the_program_clock_where_offered(tmp_path, monkeypatch):
    """The bench's program-clock path, on the CPU: the clocks a CUDA device would give (batch and program for
    the asynchronous systems) stood in for the CPU's one wall clock."""
    from ragdot.bench import runner
    from ragdot.measure import timing

    def cuda_like(system, device, clocks):
        if system.sync is None:
            return ["wall"]
        return ["batch", "program"] if system.programs else ["batch"]

    monkeypatch.setattr(timing, "lane_clocks", cuda_like)
    monkeypatch.setattr(runner, "lane_clocks", cuda_like)
    assert main(["bench", "--quick", "--device", "cpu", "--shapes", "tiny-8e", "--classes", "fwd_wi",
                 "--backends", "reference", "xla", RAGDOT_JAX, "--out", str(tmp_path)]) == 0
    (result,) = tmp_path.glob("*.json")
    rows = {(r["backend"], r["clock"]): r for r in json.loads(result.read_text())["rows"]}
    for name in (RAGDOT_JAX, "xla"):
        assert rows[(name, "batch")]["status"] == "ok" and rows[(name, "program")]["status"] == "ok"
        assert rows[(name, "program")]["ms"] > 0 and rows[(name, "program")]["batch"] >= 1


def test_switch_interval_is_set_for_ragdot_jax_cells_only(monkeypatch):

    from ragdot.bench.jax_system import SWITCH_ENV
    from ragdot.measure.classes import CLASSES as classes

    before = sys.getswitchinterval()
    sets = [Operands(torch.randn(24, 16), torch.randn(3, 16, 8), torch.tensor([10, 0, 9], dtype=torch.int32))]
    system = RagdotJaxSystem(torch.device("cpu"))
    monkeypatch.setenv(SWITCH_ENV, "1e-4")
    calls = system.prepare(classes[0], sets, torch.float32)
    assert sys.getswitchinterval() == pytest.approx(1e-4)
    system.to_torch(calls[0]())
    system.release()
    assert sys.getswitchinterval() == before
    monkeypatch.setenv(SWITCH_ENV, "soon")
    with pytest.raises(ValueError, match=SWITCH_ENV):
        system.prepare(classes[0], sets, torch.float32)


def test_host_profile_script_runs_every_section_on_the_cpu(tmp_path):

    module = benchmark_script("jax_host_profile")
    argv = ["--out", str(tmp_path), "--cpu", "--calls", "10", "--shapes", "16,8,8,2", "--sync-shape", "32,8,8,2",
            "--sync-calls", "5"]
    assert module.main(argv) == 0
    rows = json.loads((tmp_path / "host_profile.json").read_text())["rows"]
    assert {r["section"] for r in rows} == {"per_call", "inside", "gil", "sync", "program", "ffi"}
    ffi = [r for r in rows if r["section"] == "ffi"]  # built where a C++ compiler is, else one row saying why
    assert (len(ffi) == 2 and all(r["us_per_call"] > 0 for r in ffi)) or (
        len(ffi) == 1 and ffi[0]["us_per_call"] is None and ffi[0]["note"])
    assert len([r for r in rows if r["section"] == "program"]) == 4 and all(
        r["us_per_call"] > 0 for r in rows if r["section"] == "program")
    assert any("prepared bridge" in r["what"] for r in rows) and any("general bridge" in r["what"] for r in rows)
    assert (tmp_path / "profile-16x8x8x2.txt").read_text().startswith("cProfile")
    from ragdot.jax import _bridge

    assert _bridge.PREPARED  # restored after the before/after rows


