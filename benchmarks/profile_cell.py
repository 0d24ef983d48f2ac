"""One ragged-dot cell under Nsight Compute: the vendor call and ragdot backends or configs, one call each.

    ncu --clock-control none --profile-from-start off --nvtx --set full -o DIR/mixtral-fwd_wi \\
        python3 benchmarks/profile_cell.py --shape mixtral-8x7b --cls fwd_wi \\
        --systems vendor "triton:128x128x32 g8 w4 s3 tma" gluon:128x256x64s3w8g8r24
    python3 benchmarks/profile_cell.py --shape qwen3-235b-a22b --cls wgrad_wi --list-configs gluon

Systems: `vendor` (raw torch._grouped_mm with its offsets' cumsum), a backend name (its default config for the
cell; the tune cache is not read) or `backend:label` with a config label as `ragdot tune` and the tune cache
write them (`--list-configs BACKEND` prints the labels that backend tries for the cell). Operands: the anchor
shape's (or an inline 'M,K,N,E') of one class, bf16, group sizes by `--routing`. Every system is compiled and
called twice outside the profiled range, then `--calls` times inside torch.cuda.profiler.start() / stop()
(CUDA), each call inside an NVTX range named after its system, so `ncu --profile-from-start off` sees only
those launches (`--nvtx-include` picks one system). Prints one line per system with its own check against
the vendor's result (normalised error), so a wrong config is not profiled silently.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_gpu import CELL_CLASSES, named_cell, system_call, tuning_dims  # noqa: E402

from ragdot.cli_common import error_line  # noqa: E402


def _labels(backend: str, ops, e: int) -> dict[str, object]:
    """label -> config of every config `backend` tries for this cell (its tuning candidates)."""
    from ragdot.backends import get_backend

    impl = get_backend(backend)
    configs = impl.tuning_configs(ops[0], tuning_dims(ops, e), ops[1].dtype, 64) if impl.config_type else []
    return {impl.config_label(c): c for c in configs}


def resolve(system: str, ops, e: int) -> tuple[str, object]:
    """(system, config or None); ValueError naming the system when its backend or label is unknown here."""
    import ragdot

    if system == "vendor":
        return system, None
    backend = system.split(":", 1)[0]
    if backend not in ragdot.backends():
        raise ValueError(f"--systems: {system!r}: backend {backend!r} is not usable here "
                         f"(usable: {', '.join(ragdot.backends())})")
    if ":" not in system:
        return system, None
    labels = _labels(backend, ops, e)
    if system not in labels:
        known = ", ".join(labels) or "none"
        raise ValueError(f"--systems: {system!r} is not a config {backend} tries for this cell (labels: {known})")
    return system, labels[system]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="mixtral-8x7b", help="anchor shape name or 'M,K,N,E'")
    parser.add_argument("--cls", default="fwd_wi", choices=CELL_CLASSES)
    parser.add_argument("--routing", default="balanced", choices=("balanced", "skewed", "empty"))
    parser.add_argument("--systems", nargs="+", default=["vendor", "triton"], metavar="SYSTEM")
    parser.add_argument("--calls", type=int, default=1, help="profiled calls per system (default 1)")
    parser.add_argument("--list-configs", metavar="BACKEND", help="print the config labels BACKEND tries, exit")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run, fp32)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ValueError as exc:
        return error_line("profile_cell", exc)


def _run(args: argparse.Namespace) -> int:
    from ragdot.measure.checks import normalised_error
    from ragdot.routing import group_sizes

    if args.calls < 1:
        raise ValueError(f"--calls must be >= 1, got {args.calls}")
    shape, ops = named_cell(args.shape, args.cls, args.device)
    dev, m, e = ops[1].device, shape.M, shape.E
    if args.list_configs:
        for label in _labels(args.list_configs, ops, e):
            print(label)
        return 0
    sizes = group_sizes(args.routing, m, e, device=dev)
    calls = [(system, system_call(system, ops, sizes, e, config))
             for system, config in (resolve(s, ops, e) for s in args.systems)]
    outs = {}
    for system, fn in calls:  # compile and warm up outside the profiled range
        fn()
        outs[system] = fn().float()
    ref = outs.get("vendor")
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.profiler.start()
    for system, fn in calls:
        for _ in range(args.calls):
            if cuda:
                torch.cuda.nvtx.range_push(system)
            fn()
            if cuda:
                torch.cuda.nvtx.range_pop()
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.profiler.stop()
    for system, _ in calls:
        err = "-" if ref is None else f"{normalised_error(outs[system].reshape(ref.shape), ref):.2e}"
        print(f"{shape.name} {args.cls} {args.routing} {system}: profiled {args.calls} call(s), error vs vendor {err}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
