"""Burst against sustained matmul rate: is a compute-bound cell's gap to its speed of light the kernel's or the clock's?

    python benchmarks/sustained_rate.py                                  # mixtral-8x7b fwd_wi and wgrad_wi
    python benchmarks/sustained_rate.py --shapes mixtral-8x7b --classes fwd_wi --seconds 3

`ragdot bench` rates every cell against a matmul ceiling measured as `ragdot.bench.ceilings` does: the fastest of
ten 8192^3 `torch.mm` calls, about 1.4 ms each, on a GPU that has just been idle. A cell that runs for milliseconds
on end (mixtral-8x7b: 6 ms a call, replayed 50 times) may run at a lower clock than that burst (power or thermal
limits). For each cell this times, side by side and on the same clocks:

- `ceiling`: the 8192^3 `torch.mm` of the ceiling;
- `dense`: one `torch.mm` with the cell's FLOPs ([M, K] x [K, N], or [K, M] x [M, N] for a weight gradient):
  what cuBLAS does with the same work and no groups;
- `vendor`: the raw `torch._grouped_mm` call with its cumsum (`ragdot bench`'s `vendor`);
- `auto`: `ragdot.ragged_dot_general` with ragdot's own choice.

Three clocks per system: **burst** (the fastest of 10 single calls after a 2 s pause, as the ceiling is measured),
**graph** (median of 50 CUDA-graph replays after warm-up, as `ragdot bench --cuda-graphs` times a cell), and
**sustained** (CUDA-graph replays back to back for `--seconds`, the time per call over the second half). Beside
each clock, the medians of the SM clock and board power (instant where nvidia-smi reports it) that `nvidia-smi`
sampled every 100 ms during it (blank where it is not installed). TFLOP/s and % of the ceiling's burst rate are
printed for each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ is None or __package__ == "":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ragdot.bench.ceilings import _best_seconds  # noqa: E402
from ragdot.bench.runner import BenchConfig, make_operands  # noqa: E402
from ragdot.bench.systems import RagdotSystem, VendorSystem  # noqa: E402
from ragdot.measure.classes import flops, parse_classes  # noqa: E402
from ragdot.measure.timing import capture_graph, event_ms, span, spans_ms, warm_off_stream  # noqa: E402
from ragdot.shapes import get_shape  # noqa: E402

_FIELDS = ("clocks.sm,power.draw.instant", "clocks.sm,power.draw")  # instant power where nvidia-smi knows it


def _smi_query() -> tuple[str, ...] | None:
    """The nvidia-smi sampling command: instant board power where this nvidia-smi has it (`power.draw` is an
    average over about a second, longer than a graph phase), None where nvidia-smi is missing."""
    for fields in _FIELDS:
        try:
            done = subprocess.run(("nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"),
                                  capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0:
            return ("nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "100")
    return None


_SMI = _smi_query() if torch.cuda.is_available() else None


class Sampler:
    """`nvidia-smi` sampling SM MHz and watts every 100 ms while in a `with` block (nothing where it is missing)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.samples: list[tuple[float, float]] = []

    def __enter__(self) -> Sampler:
        self.proc = None
        if _SMI is not None:
            self.proc = subprocess.Popen(_SMI, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=5)
        for line in out.splitlines():
            try:
                mhz, watts = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((mhz, watts))

    def text(self) -> str:
        if not self.samples:
            return ""
        mhz = statistics.median(s[0] for s in self.samples)
        watts = statistics.median(s[1] for s in self.samples)
        return f"{mhz:5.0f} MHz {watts:4.0f} W"


def _clocks(fn: Callable[[], Any], device: torch.device, seconds: float) -> dict[str, tuple[float, str]]:
    """{clock: (ms per call, sampled SM clock and power)} for burst, graph and sustained."""
    out: dict[str, tuple[float, str]] = {}
    warm_off_stream(fn, device)
    time.sleep(2.0)  # idle, as before the ceiling's measurement
    with Sampler() as s:
        seconds_best, _ = _best_seconds(fn, device, reps=10)  # as `measure_ceilings` times its matmul
    out["burst"] = (seconds_best * 1e3, s.text())
    graph = capture_graph(fn)
    with Sampler() as s:
        for _ in range(5):
            graph()
        ms = statistics.median(event_ms(graph, device) for _ in range(50))
    out["graph"] = (ms, s.text())
    reps = max(2, int(seconds / 2 / max(ms, 1e-3) * 1e3))

    def batch() -> None:
        for _ in range(reps):
            graph()

    with Sampler() as s:
        first, second = spans_ms([span(batch), span(batch)])
    out["sustained"] = (second / reps, s.text())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["mixtral-8x7b"])
    parser.add_argument("--classes", nargs="+", default=["fwd_wi", "wgrad_wi"])
    parser.add_argument("--routing", default="balanced")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of the sustained run (default 2)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("sustained_rate: needs a CUDA device", file=sys.stderr)
        return 2
    try:
        shapes = [get_shape(name) for name in args.shapes]
        classes = parse_classes(args.classes)
    except (KeyError, ValueError) as exc:
        print(f"sustained_rate: {exc}", file=sys.stderr)
        return 2
    dev, dtype = torch.device("cuda"), torch.bfloat16
    cfg = BenchConfig(device=dev, dtype=dtype, ceilings=None)  # type: ignore[arg-type]  # operands only
    n = 8192
    sq = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    rows = [("ceiling 8192^3", "torch.mm", 2 * n**3, _clocks(lambda: torch.mm(*sq), dev, args.seconds))]
    peak = 2 * n**3 / (rows[0][3]["burst"][0] * 1e-3)
    for shape in shapes:
        for cls in classes:
            ops = make_operands(cls, shape, args.routing, cfg)
            work = flops(shape)
            x, w = VendorSystem._operands(cls, ops)  # the vendor's matrices: [M, K] x [E, K, N], or [K, M] x [M, N]
            if cls.rhs_group:  # one expert's weight for all M rows
                w = w[0]
            systems = {"dense": lambda x=x, w=w: torch.mm(x, w),
                       "vendor": VendorSystem().prepare(cls, [ops], dtype)[0],
                       "auto": RagdotSystem("auto").prepare(cls, [ops], dtype)[0]}
            for name, fn in systems.items():
                rows.append((f"{shape.name} {cls.name}", name, work, _clocks(fn, dev, args.seconds)))
            del ops, systems
            torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name(dev)}, bf16, {args.routing} routing; ceiling burst {peak / 1e12:.1f} TFLOP/s; "
          "per clock: ms per call, TFLOP/s, % of the ceiling's burst rate, median SM clock and power sampled")
    for cell, name, work, clocks in rows:
        parts = []
        for clock, (ms, smi) in clocks.items():
            rate = work / (ms * 1e-3)
            parts.append(f"{clock} {ms:8.3f} ms {rate / 1e12:6.1f} {100 * rate / peak:5.1f}% {smi}")
        print(f"{cell:24s} {name:8s} | " + " | ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
