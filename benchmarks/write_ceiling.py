"""How fast the device writes, against a weight gradient whose output is most of its bytes (CUDA, graph clock).

    python benchmarks/write_ceiling.py                      # deepseek3-test's weight gradient: 256 x 512 x 512
    python benchmarks/write_ceiling.py --groups 256 --m 512 --n 512 --tokens 5120

`ragdot bench` rates a call against the speed of light from a measured copy bandwidth (reads plus writes). A
weight gradient with few tokens per group writes far more than it reads (deepseek3-test: 134 MB written, 10 MB
read), so this probe times, as medians of CUDA-graph replays on the same output size: a fill (writes only), a
copy (reads and writes), and the ragged_k call itself (triton and auto), each as bytes per second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

if __package__ is None or __package__ == "":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import ragdot  # noqa: E402
from ragdot.measure.timing import median_ms  # noqa: E402
from ragdot.routing import group_sizes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--m", type=int, default=512, help="rows of each group's output")
    parser.add_argument("--n", type=int, default=512, help="columns of each group's output")
    parser.add_argument("--tokens", type=int, default=5120, help="contracted token rows, all groups together")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("write_ceiling: needs a CUDA device", file=sys.stderr)
        return 2
    dev, dtype = torch.device("cuda"), torch.bfloat16
    out = torch.empty(args.groups, args.m, args.n, device=dev, dtype=dtype)
    src = torch.randn_like(out)
    lhs = torch.randn(args.tokens, args.m, device=dev, dtype=dtype)
    rhs = torch.randn(args.tokens, args.n, device=dev, dtype=dtype)
    sizes = group_sizes("balanced", args.tokens, args.groups, device=dev)
    wrote = out.numel() * out.element_size()
    read = (lhs.numel() + rhs.numel()) * lhs.element_size()

    dn = ragdot.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])  # contract the ragged token rows

    def wgrad(backend: str):
        return lambda: ragdot.ragged_dot_general(lhs, rhs, sizes, dn, backend=backend)

    rows = [
        ("fill (write)", lambda: out.fill_(1.0), wrote),
        ("copy (read + write)", lambda: out.copy_(src), 2 * wrote),
        ("ragged_k triton", wgrad("triton"), wrote + read),
        ("ragged_k auto", wgrad("auto"), wrote + read),
    ]
    print(f"{torch.cuda.get_device_name(dev)}; output {args.groups} x {args.m} x {args.n} bf16 ({wrote / 1e6:.1f} MB), "
          f"operands {read / 1e6:.1f} MB; graph clock, median of {args.reps} replays")
    for name, fn, nbytes in rows:
        ms = median_ms(fn, dev, graph=True, reps=args.reps)
        print(f"  {name:22s} {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:7.2f} TB/s of bytes moved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
