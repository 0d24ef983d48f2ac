"""`ragdot.grouped_mm` against the raw `torch._grouped_mm` call in its four operand forms, both clocks.

    python3 benchmarks/grouped_forms.py --out /tmp/grouped-forms                 # on a GPU (about a minute)
    python3 benchmarks/grouped_forms.py --out /tmp/grouped-forms --tiny          # a CPU dry run

One MoE layer's products at qwen3-30b-a3b widths (hidden 2048, expert width 768, 128 experts, 2048 tokens
at top-8: 16384 routed rows, 120 a group, so 6% of the rows are a tail outside every group):

    2d_3d   x [R, K] by w [G, K, N]            the experts' forward (rows split by offs)
    3d_2d   w [G, N, K] by x^T [K, R]          the same product transposed (columns split by offs)
    2d_2d   x^T [K, R] by dy [R, N]            the weight gradient (K split by offs)
    3d_3d   [G, 128, K] by [G, K, N]           per-expert batched products (no offs)

Each form is checked against the vendor on the rows or columns torch defines, then the two systems are timed
interleaved (`ragdot.measure.timing.measure_clocks`): `eager` (CUDA events around back-to-back calls, host
time included) and `graph` (CUDA-graph replays: device time), with the host time per call; the CPU has the
wall clock only. Writes grouped-forms.json / .csv under --out and prints one line per form and clock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import ragdot
from ragdot.cli_common import error_line
from ragdot.measure import records
from ragdot.measure.checks import normalised_error
from ragdot.measure.timing import CLOCKS, Timed, measure_clocks


def _forms(device: torch.device, dtype: torch.dtype, tiny: bool) -> dict[str, tuple]:
    """form -> (mat_a, mat_b, offs, the slice of the result torch defines)."""
    k, n, g, rows, per_group = (32, 24, 4, 96, 8) if tiny else (2048, 768, 128, 16384, 128)
    gen = torch.Generator(device=device).manual_seed(0)
    # a tail past the groups; each group a multiple of 8 rows: the vendor asserts on the device (and the CUDA
    # context is lost) where a group of the 3d_2d output's columns is not a multiple of 16 bytes
    sizes = torch.full((g,), (rows * 19 // 20) // g // 8 * 8, dtype=torch.int32, device=device)
    offs = torch.cumsum(sizes, 0, dtype=torch.int32)
    end = int(offs[-1])
    x = torch.randn(rows, k, device=device, dtype=dtype, generator=gen)
    w = torch.randn(g, k, n, device=device, dtype=dtype, generator=gen) / k ** 0.5
    dy = torch.randn(rows, n, device=device, dtype=dtype, generator=gen)
    x_offs = torch.cumsum(torch.full((g,), rows // g, dtype=torch.int32, device=device), 0, dtype=torch.int32)
    every = slice(None)
    return {
        "2d_3d": (x, w, offs, (slice(0, end),)),
        "3d_2d": (w.transpose(1, 2).contiguous(), x.t(), offs, (every, slice(0, end))),
        "2d_2d": (x.t(), dy, x_offs, (every,)),
        "3d_3d": (x[: g * per_group].view(g, per_group, k), w, None, (every,)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for grouped-forms.json / .csv")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a dry run, e.g. on the CPU)")
    parser.add_argument("--max-seconds", type=float, default=0.3, help="time budget per form and clock")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if not cuda and not args.tiny:
        return error_line("grouped_forms.py", ValueError("no CUDA device: pass --tiny for a dry run"))
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for form, (a, b, offs, defined) in _forms(device, dtype, args.tiny).items():
        vendor = lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
        ours = lambda a=a, b=b, offs=offs: ragdot.grouped_mm(a, b, offs)  # noqa: E731
        err = normalised_error(ours()[defined].float(), vendor()[defined].float())
        timings = measure_clocks([Timed("vendor", [vendor]), Timed("ragdot", [ours])], device, clocks=CLOCKS,
                                 warmup=3, iters=50, max_seconds=args.max_seconds)
        for clock in sorted({c for _, c in timings}):
            v, r = timings[("vendor", clock)], timings[("ragdot", clock)]
            rows.append({"form": form, "clock": clock, "vendor_ms": v.median, "ragdot_ms": r.median,
                         "vendor_over_ragdot": v.median / r.median, "vendor_host_ms": v.host,
                         "ragdot_host_ms": r.host, "err_vs_vendor": err, "shape_a": list(a.shape),
                         "shape_b": list(b.shape)})
            print(f"{form:6s} {clock:5s} vendor {v.median:.4f} ms  ragdot {r.median:.4f} ms  "
                  f"x{v.median / r.median:.3f}  err {err:.1e}")
    meta = records.run_meta(device, dtype, with_triton=True)
    records.write_json(args.out / "grouped-forms.json", meta, rows)
    records.write_csv(rows, args.out / "grouped-forms.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
