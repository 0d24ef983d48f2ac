"""What every `ragdot` subcommand shares: one spelling, one check and one error format per common option.

Options: `--shapes` (space-separated shape names, 'M,K,N,E' or tag:NAME), `--dtype` (bf16/fp16/fp32 or
bfloat16/float16/float32), `--device`, `--out` (a folder; files inside are named per run and never
overwritten), `--targets` (a JSON file of reference numbers) and `--quiet`; counts (`count(low)`: an int >= low) and
durations (`seconds`: a finite number >= 0, `positive`: a finite number > 0) as argparse types. A bad value raises
`UsageError` (or argparse's own error); `ragdot.cli.main` prints it as one line, ``ragdot <sub>: error: ...``,
and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DTYPES", "OneLineParser", "UsageError", "add_deprecated_alias", "add_device", "add_dtype", "add_out",
    "add_quiet", "add_shapes", "add_targets", "check_out", "count", "error_line", "new_stem", "parse_device",
    "parse_dtype", "parse_shape_args", "positive", "quiet_native_stderr", "safe_name", "seconds",
]  # fmt: skip

#: every accepted --dtype spelling -> the torch dtype's name
DTYPES: dict[str, str] = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
SHAPES_HELP = "space-separated shape names, 'M,K,N,E' or tag:NAME (tags: seed, anchor, tiny)"


class UsageError(ValueError):
    """A bad command line: reported as one line naming the option, exit status 2, no traceback."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown option, a bad int) as one line on stderr, exit status 2, beginning with
    the option as ragdot's own errors do (`--flag: ...`, not argparse's `argument --flag: ...`)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = message.removeprefix("argument ")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def error_line(command: str, exc: BaseException) -> int:
    """Print ``ragdot <command>: error: <first line of exc>`` to stderr; the exit status 2."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    print(f"ragdot {command}: error: {lines[0]}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------------------------------ numeric types
def count(low: int) -> Callable[[str], int]:
    """An argparse type: an int >= `low` (argparse reports a bad one as `argument --flag: ...`, exit status 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {value}")
        return value

    return parse


def _number(text: str, zero: bool) -> float:
    bound = ">= 0" if zero else "> 0"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite number >= 0 (a duration, a budget; what 0 means is the option's to say)."""
    return _number(text, zero=True)


def positive(text: str) -> float:
    """An argparse type: a finite number > 0 (a rate given instead of measured)."""
    return _number(text, zero=False)


# ------------------------------------------------------------------------------------------ adding options
def add_shapes(parser: argparse.ArgumentParser, default: str, **kwargs: Any) -> None:
    parser.add_argument("--shapes", nargs="+", metavar="SHAPE", help=f"{SHAPES_HELP} (default: {default})", **kwargs)


def add_dtype(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--dtype", metavar="DTYPE", help=f"bf16, fp16 or fp32 (or bfloat16, ...; default {default})")


def add_device(parser: argparse.ArgumentParser, default: str = "cuda if available, else cpu") -> None:
    parser.add_argument("--device", metavar="DEVICE", help=f"torch device: cpu, cuda, cuda:N (default {default})")


def add_out(parser: argparse.ArgumentParser, default: str, what: str = "results") -> None:
    parser.add_argument(
        "--out", type=Path, default=Path(default), metavar="DIR",
        help=f"output folder; {what} go to new files named by GPU and date (default {default})",
    )  # fmt: skip


def add_targets(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--targets", type=Path, metavar="FILE",
        help=f"JSON file of reference numbers to compare {what} against, where its 'gpu' matches this device "
        "(e.g. benchmarks/targets-h200.json; see ragdot.measure.targets)",
    )  # fmt: skip


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress or tables: only warnings and the files written"
    )


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, dest: str) -> None:
    """A hidden flag `old` that sets `dest` like `new` does, with a one-line deprecation note on stderr."""
    command = parser.prog

    class _Alias(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *_: Any) -> None:
            print(f"{command}: {old} is deprecated, use {new}", file=sys.stderr)
            setattr(namespace, dest, True)

    parser.add_argument(old, action=_Alias, nargs=0, dest=f"_alias_{dest}", help=argparse.SUPPRESS)


# ------------------------------------------------------------------------------------------ checking values
def parse_dtype(name: str | None, default: str, flag: str = "--dtype") -> Any:
    """The torch dtype of a --dtype spelling (None: `default`); errors name `flag`."""
    import torch

    key = (name or default).strip().lower()
    if key not in DTYPES:
        raise UsageError(f"{flag}: {name!r} is unknown; expected one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[key])


def _available(torch: Any, kind: str) -> bool:
    if kind == "cpu":
        return True
    if kind == "mps":
        return bool(torch.backends.mps.is_available())
    module = getattr(torch, kind, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


def parse_device(spec: str | None, allowed: Sequence[str] = ("cuda", "cpu")) -> Any:
    """The torch device of --device (None: cuda if available, else cpu); present here and of an allowed type."""
    import torch

    if spec is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device: {spec!r} is not a torch device; expected e.g. cpu, cuda or cuda:1") from None
    kind = device.type
    if kind == "meta" or (kind not in allowed and not _available(torch, kind)):
        raise UsageError(f"--device {spec}: {kind.upper()} is not available here")
    if kind not in allowed:
        raise UsageError(f"--device {spec}: this command runs on {' or '.join(allowed)} only")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {spec}: CUDA is not available here (no GPU or no driver)")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise UsageError(f"--device {spec}: this machine has {count} CUDA device(s)")
    return device


def check_out(path: Path | str, flag: str = "--out") -> Path:
    """An output folder that exists or can be made (nothing is created here): not a file, nor under one."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            where = "is a file" if p == path else f"is under the file {p}"
            raise UsageError(f"{flag} {path}: {where}; expected a folder (each run writes new files into it)")
    return path


def parse_shape_args(specs: Sequence[str], catalog: Mapping[str, Any] | None = None) -> list[Any]:
    """Shapes of --shapes: `ragdot.shapes` names, 'M,K,N,E', tag:NAME or a bare tag name.

    With `catalog` (a command's own named problems), a name found there is returned as that name (a str),
    and a comma list of such names ('16B,tiny', the older spelling) is split into them.
    """
    from ragdot.shapes import TAGS, parse_shapes

    out: list[Any] = []
    for spec in specs:
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        if catalog is not None and parts and all(p in catalog for p in parts):
            found: list[Any] = parts
        else:
            text = f"tag:{spec}" if spec in TAGS else spec
            try:
                found = parse_shapes([text])
            except (TypeError, ValueError) as exc:
                known = f"; or one of this command's: {', '.join(catalog)}" if catalog else ""
                raise UsageError(f"--shapes: {exc}{known}") from None
        out.extend(s for s in found if s not in out)
    if not out:
        raise UsageError("--shapes: no shape given")
    return out


# ------------------------------------------------------------------------------------------ output files
def safe_name(text: str) -> str:
    """Only file-name-safe characters ('NVIDIA H200' -> 'NVIDIA-H200')."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "unknown"


def new_stem(out: Path, prefix: str, suffixes: Sequence[str] = (".csv", ".json")) -> str:
    """``<prefix>-<date>`` (``_2``, ``_3`` ... on a clash) such that no ``<stem><suffix>`` exists in `out` yet.

    The first suffix's file is created empty, exclusively, so that two runs started in one second never
    share a name; `out` is created if needed.
    """
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        name = stem if n == 1 else f"{stem}_{n}"
        if any((out / f"{name}{s}").exists() for s in suffixes[1:]):
            continue
        try:
            with open(out / f"{name}{suffixes[0]}", "x"):
                return name
        except FileExistsError:
            continue
    raise UsageError(f"--out {out}: no free file name for {stem}")


@contextlib.contextmanager
def quiet_native_stderr(enabled: bool = True) -> Iterator[None]:
    """Send what native code writes to file descriptor 2 (the profiler's log lines) to /dev/null meanwhile."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
