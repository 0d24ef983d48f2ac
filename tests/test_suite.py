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
