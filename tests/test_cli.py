"""The `ragdot` command line: --version, shared option spellings, and one-line errors with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ragdot
from ragdot import cli_common
from ragdot.cli import _parser, main

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
NO_MPS = pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the message on a machine without MPS")

# Each subcommand with options that keep a run short (or make it a plan only) once the checks pass.
FAST = {
    "bench": ["--dry-run", "--no-xla"],
    "host-bench": ["--calls", "1", "--repeats", "1", "--warmup", "0"],
    "tune": [],
    "moe-bench": ["--quick"],
    "bench-mxfp8": ["--passes", "1", "--seconds", "0"],
}
SHAPED = ("bench", "host-bench", "tune", "bench-mxfp8")


def _misuses() -> list:
    cases = []
    for sub in FAST:
        cases += [
            pytest.param(sub, ["--device", "foo"], "--device", id=f"{sub}-device-foo"),
            pytest.param(sub, ["--device", "mps"], "--device mps", id=f"{sub}-device-mps", marks=NO_MPS),
            pytest.param(sub, ["--device", "cuda"], "CUDA is not available", id=f"{sub}-device-cuda", marks=NO_CUDA),
            pytest.param(sub, ["--out", "FILE"], "is a file", id=f"{sub}-out-file"),
            pytest.param(sub, ["--no-such-option"], "unrecognized arguments", id=f"{sub}-unknown-option"),
        ]
        if sub != "bench-mxfp8":  # it has no --dtype: its operands are bf16 by design
            cases.append(pytest.param(sub, ["--dtype", "fp64"], "--dtype", id=f"{sub}-dtype"))
    for sub in SHAPED:
        cases += [
            pytest.param(sub, ["--shapes", "no-such-shape"], "--shapes", id=f"{sub}-shape-name"),
            pytest.param(sub, ["--shapes", "1,2,3"], "--shapes", id=f"{sub}-shape-three"),
            pytest.param(sub, ["--shapes", "64,0,32,4"], "--shapes", id=f"{sub}-shape-zero"),
        ]
    cases += [
        pytest.param("tune", ["--device", "cpu"], "--device cpu", id="tune-device-cpu"),
        pytest.param("bench", ["--iters", "many"], "--iters", id="bench-bad-int"),
        pytest.param("moe-bench", ["--configs", "no-such-model"], "--configs", id="moe-bench-config"),
        pytest.param("moe-bench", ["--layer", "--configs", "no-such-model"], "--configs", id="moe-layer-config"),
        pytest.param("bench-mxfp8", ["--shapes", "100,64,64,4"], "multiple of 256", id="mxfp8-shape-align"),
        pytest.param("bench-mxfp8", ["--routings", "zipf"], "--routings", id="mxfp8-routing"),
        pytest.param("tune", ["--routings", "zipf"], "--routings", id="tune-routing"),
    ]
    return cases


def _one_error_line(capsys: pytest.CaptureFixture[str], sub: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert "\n" not in err, err
    assert err.startswith(f"ragdot {sub}: error: "), err
    return err


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench-mxfp8 reaches its other checks on a CPU only with the interpreter on."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize(("sub", "argv", "needle"), _misuses())
def test_misuse_is_one_line_and_exit_2(sub, argv, needle, tmp_path, capsys, interpreted):
    file = tmp_path / "a-file"
    file.write_text("an earlier result\n")
    argv = [str(file) if a == "FILE" else a for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    assert main([sub, *argv, *out, *FAST[sub]]) == 2
    assert needle in _one_error_line(capsys, sub)
    assert file.read_text() == "an earlier result\n"
    assert not (tmp_path / "out").exists()  # a refused run writes nothing


# Every count and duration option: a value out of its range, NaN and inf included, never starts a run.
BAD_NUMBERS = [
    ("bench", "--iters", "0"), ("bench", "--warmup", "-1"), ("bench", "--rounds", "0"),
    ("bench", "--max-seconds", "-1"), ("bench", "--max-seconds", "nan"), ("bench", "--peak-tflops", "0"),
    ("bench", "--bandwidth-gbs", "inf"),
    ("host-bench", "--chunk", "-2"), ("host-bench", "--max-seconds", "inf"),
    ("tune", "--max-configs", "0"), ("tune", "--iters", "0"), ("tune", "--warmup", "-1"),
    ("moe-bench", "--max-seconds", "-1"), ("moe-bench", "--budget", "nan"), ("moe-bench", "--steps", "0"),
    ("moe-bench", "--measure-from", "0"), ("moe-bench", "--batch", "0"), ("moe-bench", "--tokens", "0"),
    ("bench-mxfp8", "--seconds", "-1"), ("bench-mxfp8", "--passes", "0"), ("bench-mxfp8", "--compile-jobs", "-1"),
    ("bench-models", "--budget", "inf"), ("bench-models", "--steps", "0"), ("bench-models", "--seq-len", "0"),
    ("ep-bench", "--steps", "0"), ("ep-bench", "--warmup", "-1"), ("ep-bench", "--tokens-per-rank", "0"),
]


@pytest.mark.parametrize(("sub", "flag", "value"), BAD_NUMBERS, ids=[f"{s}{f}={v}" for s, f, v in BAD_NUMBERS])
def test_a_count_or_duration_out_of_range_is_one_line_naming_the_option(sub, flag, value, tmp_path, capsys):
    argv = [sub, *FAST.get(sub, []), *(["--layer"] if flag == "--tokens" else []), flag, value]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert _one_error_line(capsys, sub).startswith(f"ragdot {sub}: error: {flag}: expected ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["0", "2.5", "1e3"])
def test_durations_take_zero_and_counts_take_their_bound(text):
    assert cli_common.seconds(text) == float(text)
    assert cli_common.count(0)("0") == 0 and cli_common.count(1)("7") == 7
    assert cli_common.positive("0.5") == 0.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of bench-mxfp8")
def test_mxfp8_on_cpu_without_the_interpreter(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for argv in (["--device", "cpu"], []):
        assert main(["bench-mxfp8", *argv, "--shapes", "tiny", "--out", str(tmp_path)]) == 2
        err = _one_error_line(capsys, "bench-mxfp8")
        assert "TRITON_INTERPRET=1" in err or "triton is not installed" in err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ragdot {ragdot.__version__}"


def test_version_from_the_shell():
    env = {**os.environ, "PYTHONPATH": str(Path(ragdot.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-m", "ragdot", "--version"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == f"ragdot {ragdot.__version__}"


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "bench" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(cli_common.DTYPES))
def test_every_dtype_spelling(name):
    assert cli_common.parse_dtype(name, "fp32") == getattr(torch, cli_common.DTYPES[name])


@pytest.mark.parametrize("sub", list(FAST))
def test_common_options_are_spelled_alike(sub):
    options = {o for a in _parser(sub)._subparsers._group_actions[0].choices[sub]._actions for o in a.option_strings}
    assert {"--device", "--out", "--quiet"} <= options
    if sub in SHAPED:
        assert "--shapes" in options
    if sub != "bench-mxfp8":
        assert "--dtype" in options


def test_bench_accepts_long_dtype_names_and_quiet(capsys):
    assert main(["bench", "--dtype", "float16", "--shapes", "tiny-8e", "--dry-run", "--no-xla"]) == 0
    assert "float16" in capsys.readouterr().out
    assert main(["bench", "--dtype", "bfloat16", "--shapes", "tag:tiny", "--dry-run", "--no-xla", "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_moe_bench_old_routing_switch_is_a_hidden_alias(capsys):
    parser = _parser("moe-bench")
    args = parser.parse_args(["moe-bench", "--routing"])
    assert args.routing_only is True
    assert capsys.readouterr().err.strip() == "ragdot moe-bench: --routing is deprecated, use --routing-only"
    assert parser.parse_args(["moe-bench", "--routing-only"]).routing_only is True
    sub = parser._subparsers._group_actions[0].choices["moe-bench"]
    assert "--routing " not in sub.format_help() and "--routing-only" in sub.format_help()


def test_mxfp8_shapes_space_or_comma_separated():
    from ragdot.bench.mxfp8 import SHAPES, _problems

    assert _problems(["16B", "tiny"]) == _problems(["16B,tiny"]) == {"16B": SHAPES["16B"], "tiny": SHAPES["tiny"]}
    assert _problems(["2048,192,128,4"]) == {"2048,192,128,4": (128, 192, 4, 2048)}  # (N, K, experts, tokens)
    assert "qwen3-30b-a3b" in _problems(["tag:anchor"])


def test_shape_args_take_names_specs_and_tags():
    from ragdot.shapes import shapes_with_tag

    assert cli_common.parse_shape_args(["seed"]) == cli_common.parse_shape_args(["tag:seed"]) == shapes_with_tag("seed")
    (shape,) = cli_common.parse_shape_args(["64, 32, 32, 4"])
    assert shape.dims == (64, 32, 32, 4)


def test_device_checks():
    assert cli_common.parse_device("cpu") == torch.device("cpu")
    assert cli_common.parse_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    for spec in ("meta", "cuda:x", ""):
        with pytest.raises(cli_common.UsageError, match="--device"):
            cli_common.parse_device(spec)


def test_out_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(cli_common.UsageError, match="under the file"):
        cli_common.check_out(tmp_path / "f" / "sub")
    assert cli_common.check_out(tmp_path / "new") == tmp_path / "new"
    assert not (tmp_path / "new").exists()


def test_new_stem_never_reuses_a_name(tmp_path):
    stems = [cli_common.new_stem(tmp_path, "run") for _ in range(3)]
    assert len(set(stems)) == 3 and all((tmp_path / f"{s}.csv").exists() for s in stems)
    assert cli_common.safe_name("NVIDIA H200 (x)") == "NVIDIA-H200-x"


def test_quiet_native_stderr_restores_the_stream(capfd):
    with cli_common.quiet_native_stderr():
        os.write(2, b"hidden\n")
    os.write(2, b"shown\n")
    err = capfd.readouterr().err
    assert "hidden" not in err and "shown" in err


# An unknown name in a list option: one line that names the option and what it accepts, exit 2, nothing written.
UNKNOWN_NAMES = [
    ("bench", "--shapes"), ("tune", "--shapes"), ("moe-bench", "--configs"), ("host-bench", "--systems"),
    ("bench", "--backends"), ("ep-bench", "--configs"),
]


@pytest.mark.parametrize(("sub", "flag"), UNKNOWN_NAMES, ids=[f"{s}{f}" for s, f in UNKNOWN_NAMES])
def test_an_unknown_name_is_one_line_naming_the_option(sub, flag, tmp_path, capsys):
    assert main([sub, *FAST.get(sub, []), flag, "no-such-name", "--out", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys, sub)
    assert err.startswith(f"ragdot {sub}: error: {flag}") and "no-such-name" in err
    assert not (tmp_path / "out").exists()
