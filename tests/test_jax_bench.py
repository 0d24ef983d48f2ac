"""The `ragdot-jax` and `tokamax` bench systems on the CPU: registered by name, checked like any system."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("jax")
pytest.importorskip("jax.experimental.buffer_callback")

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


def test_switch_interval_is_set_for_ragdot_jax_cells_only(monkeypatch):
    import sys

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
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "jax_host_profile.py"
    spec = importlib.util.spec_from_file_location("jax_host_profile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--out", str(tmp_path), "--cpu", "--calls", "10", "--shapes", "16,8,8,2", "--sync-shape", "32,8,8,2",
            "--sync-calls", "5"]
    assert module.main(argv) == 0
    rows = json.loads((tmp_path / "host_profile.json").read_text())["rows"]
    assert {r["section"] for r in rows} == {"per_call", "inside", "gil", "sync"}
    assert any("prepared bridge" in r["what"] for r in rows) and any("general bridge" in r["what"] for r in rows)
    assert (tmp_path / "profile-16x8x8x2.txt").read_text().startswith("cProfile")
    from ragdot.jax import _bridge

    assert _bridge.PREPARED  # restored after the before/after rows
