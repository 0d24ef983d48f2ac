"""benchmarks/suite.py: every step of every suite names files that exist and arguments its command accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import benchmark_script
from ragdot import cli

ROOT = Path(__file__).resolve().parent.parent


def _suite_module():
    return benchmark_script("suite")


SUITE = _suite_module()
STEPS = [(name, step) for name, suite in SUITE.SUITES.items() for step in suite.steps]


@pytest.mark.parametrize(("suite", "step"), STEPS, ids=[f"{n}-{s.name}" for n, s in STEPS])
def test_a_step_names_existing_files_and_arguments_its_command_accepts(suite, step, tmp_path):
    argv, _ = SUITE.resolve(step, tmp_path / "out", tmp_path / "cache")
    for arg in argv:  # scripts and test files of this checkout (not the outputs under {out})
        if arg.startswith(("benchmarks/", "tests/", "src/")) and arg.endswith((".py", ".json")):
            assert (ROOT / arg).is_file(), f"{suite}/{step.name}: {arg} does not exist"
    if argv[1:3] == ["-m", "ragdot"]:
        sub = argv[3]
        assert sub in cli.SUBCOMMANDS, f"{suite}/{step.name}: ragdot has no subcommand {sub}"
        _, extra = cli._parser(sub).parse_known_args(argv[3:])
        assert extra == [], f"{suite}/{step.name}: ragdot {sub} does not take {extra}"


def test_the_sol_suite_times_the_write_paths_then_the_routings_in_one_process():
    steps = {s.name: s for s in SUITE.SUITES["sol"].steps}
    assert list(steps) == ["write-deepseek3", "write-qwen3", "tma-store", "routing"]
    routing = steps["routing"].argv
    i = routing.index("--routing")
    assert routing[i + 1:i + 4] == ("balanced", "skewed", "empty")


def test_require_gpu_runs_nothing_on_another_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(SUITE, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    out = tmp_path / "out"
    assert SUITE.main(["smoke", "--require-gpu", "H200", "--out", str(out)]) == 3
    assert "not H200: nothing run" in capsys.readouterr().out
    assert not out.exists()


def test_require_gpu_names_the_missing_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(SUITE, "gpu_names", lambda: [])
    assert SUITE.main(["smoke", "--require-gpu", "h200", "--out", str(tmp_path / "o")]) == 3
    assert "the GPU is none, not h200" in capsys.readouterr().out


def test_the_headline_suite_measures_the_readme_table_s_rows():
    steps = {s.name: s.argv for s in SUITE.SUITES["headline"].steps}
    assert list(steps) == ["host", "anchors", "steps", "steps-eager", "layer"]
    anchors = steps["anchors"]
    i = anchors.index("--routing")
    assert anchors[i + 1:i + 4] == ("balanced", "skewed", "empty")
    assert "no_experts" in steps["steps"] and "--eager" in steps["steps-eager"] and "peer" in steps["layer"]
