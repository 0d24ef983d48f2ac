"""Summarise committed `ragdot bench` CSVs: tables per routing with the clock views side by side, plots.

    python benchmarks/summarize.py RESULT.csv [MORE.csv ...] --out benchmarks/results/summary-NAME
    python benchmarks/summarize.py OLD.csv --out ... --baseline torch   # runs from before `vendor` existed
    python benchmarks/summarize.py RESULT.csv --out ... --write-tbps 3.37  # and each cell's write floor

Rows of later files replace rows of earlier ones for the same (shape, class, routing, system, clock), so a
run of the fast systems can be combined with an earlier run of the slow baselines. Each pass (fwd, dgrad,
wgrad) aggregates its two classes (geometric mean). Every ratio is against `--baseline` (default
`vendor`: raw torch._grouped_mm) in the same cell and clock view: `eager` (eager calls, host time included;
the clock `event` of older CSVs), `graph` (CUDA-graph replays, device time), `wall` (CPU). Writes
<out>.md and <out>-speedup-<routing>-<view>.png / -sol-..., only the plots that have data.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "src"
if (_SRC / "ragdot").is_dir():  # this checkout's sources first, installed or not
    sys.path.insert(0, str(_SRC))

from ragdot.bench import summary, write_floor  # noqa: E402


def load(paths: Sequence[str]) -> list[summary.Row]:
    rows: list[summary.Row] = []
    for path in paths:
        with open(path, newline="") as f:
            rows += summary.parse_rows(csv.DictReader(f))
    return summary.merge(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+")
    p.add_argument("--out", required=True, help="path prefix of the markdown summary and PNGs")
    p.add_argument("--baseline", default=summary.BASELINE, help="system every ratio is taken against (default vendor)")
    p.add_argument("--no-plots", action="store_true", help="write the markdown only")
    p.add_argument("--write-tbps", type=float, metavar="TB/s",
                   help="add the cells' write floors at this write-only bandwidth (ragdot.bench.write_floor)")
    args = p.parse_args(argv)
    rows = load(args.csv)
    if not any(r.system == args.baseline and r.timed for r in rows):
        print(f"summarize: no timed `{args.baseline}` rows: ratios are left out (try --baseline torch)",
              file=sys.stderr)
    out = Path(args.out)
    title = f"ragdot bench summary ({', '.join(Path(c).name for c in args.csv)})"
    text = summary.markdown(rows, title, args.baseline)
    if args.write_tbps:
        text += "\n" + "\n".join(write_floor.markdown(rows, args.write_tbps * 1e12))
    out.with_name(out.name + ".md").write_text(text)
    files = [] if args.no_plots else summary.plot(rows, out, "ragdot bench", args.baseline)
    print(text)
    print("plots: " + (", ".join(str(f) for f in files) or "none (no data to plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
