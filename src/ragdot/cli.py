"""`ragdot` command line: one subcommand per capability, each living in its own module.

A subcommand module exposes `HELP: str`, `add_arguments(parser)` and `run(args) -> int`; it is imported only
when its subcommand is used, so `ragdot --help` stays fast and a missing optional dependency of one
subcommand never breaks the others. Options shared by several subcommands are defined and checked in
`ragdot.cli_common`; a bad command line exits with status 2 and one line, ``ragdot <sub>: error: ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys

from ragdot._version import __version__
from ragdot.cli_common import OneLineParser, UsageError, error_line

SUBCOMMANDS: dict[str, str] = {
    "bench": "ragdot.bench.cli",
    "moe-bench": "ragdot.bench.moe",
    "bench-models": "ragdot.bench.models",
    "bench-mxfp8": "ragdot.bench.mxfp8",
    "tune": "ragdot.tune.cli",
    "host-bench": "ragdot.bench.host",
    "ep-bench": "ragdot.bench.ep",
}


def _parser(selected: str | None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ragdot", description="ragdot: ragged matmuls for MoE models")
    parser.add_argument("--version", action="version", version=f"ragdot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        if selected is not None and name != selected:
            sub.add_parser(name, help=f"(see ragdot {name} --help)", add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # subcommand not available in this installation
            sub.add_parser(name, help=f"unavailable: {exc}")
            continue
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    parser = _parser(selected)
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help, --version, or argparse's one-line error
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if extra:
        where = f"ragdot {args.command}" if args.command else "ragdot"
        print(f"{where}: error: unrecognized arguments: {' '.join(extra)} (see {where} --help)", file=sys.stderr)
        return 2
    module = getattr(args, "_module", None)
    if module is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        with _terminate_as_interrupt():
            return int(module.run(args) or 0)
    except UsageError as exc:
        return error_line(args.command, exc)


def _interrupt(signum: int, frame: object) -> None:
    from ragdot.measure.progress import request_stop

    request_stop()  # should this KeyboardInterrupt be swallowed, the next step boundary raises it again
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (what `timeout` and job schedulers send) stops a run as Ctrl-C does, so the rows a benchmark
    finished are kept; the previous handler comes back afterwards. Only in the main thread."""
    from ragdot.measure.progress import clear_stop

    clear_stop()
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        clear_stop()


if __name__ == "__main__":
    raise SystemExit(main())
