"""Summarise committed `ragdot bench` CSVs: per-pass table, target checks, plots.

    python benchmarks/summarize.py RESULT.csv [MORE.csv ...] --out benchmarks/results/summary-NAME

Rows of later files replace rows of earlier ones for the same (shape, class, routing, backend), so a run of
the fast backends can be combined with an earlier run of the slow baselines. Each pass (fwd, dgrad, wgrad)
is the geometric mean of its two classes' TFLOP/s, as on the anchor page.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

PASSES = {"fwd": ("fwd_wi", "fwd_wo"), "dgrad": ("dgrad_wi", "dgrad_wo"), "wgrad": ("wgrad_wi", "wgrad_wo")}


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def load(paths):
    cells = {}
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                cells[(row["shape"], row["cls"], row["routing"], row["backend"])] = row
    return cells


def ms(cells, key):
    row = cells.get(key)
    return float(row["ms"]) if row and row["status"] in ("ok", "unchecked") and row["ms"] else None


def tflops(cells, key):
    row = cells.get(key)
    return float(row["tflops"]) if row and row["status"] in ("ok", "unchecked") and row["tflops"] else None


def per_pass_table(cells, shapes, backends, routing):
    lines = ["| shape (M,K,N,E) | SOL | " + " | ".join(f"{b} fwd/dgrad/wgrad" for b in backends) + " |",
             "|---|---|" + "---|" * len(backends)]
    for shape in shapes:
        any_row = next(r for (s, _, rt, _), r in cells.items() if s == shape and rt == routing)
        dims = f"{any_row['M']},{any_row['K']},{any_row['N']},{any_row['E']}"
        sol = geomean(float(r["sol_tflops"]) for (s, _, rt, _), r in cells.items() if s == shape and rt == routing)
        parts = []
        for b in backends:
            vals = [geomean(tflops(cells, (shape, c, routing, b)) for c in pair) for pair in PASSES.values()]
            parts.append("/".join("-" if math.isnan(v) else f"{v:.0f}" for v in vals))
        lines.append(f"| {shape} ({dims}) | {sol:.0f} | " + " | ".join(parts) + " |")
    return lines


def targets(cells, shapes, routing):
    ratios, wgrad, sols, worst, auto_gap = [], [], [], (math.inf, ""), (math.inf, "")
    for shape in shapes:
        for pair in PASSES.values():
            for cls in pair:
                t, tr, au = (ms(cells, (shape, cls, routing, b)) for b in ("torch", "triton", "auto"))
                if not (t and tr):
                    continue
                ratio = t / tr
                ratios.append(ratio)
                sols.append(float(cells[(shape, cls, routing, "triton")]["pct_sol"]))
                if cls.startswith("wgrad"):
                    wgrad.append(ratio)
                if ratio < worst[0]:
                    worst = (ratio, f"{shape} {cls}")
                if au:
                    gap = min(t, tr) / au
                    if gap < auto_gap[0]:
                        auto_gap = (gap, f"{shape} {cls}")
    within = sum(1 for shape in shapes for pair in PASSES.values() for cls in pair
                 if all(ms(cells, (shape, cls, routing, b)) for b in ("torch", "triton", "auto"))
                 and min(ms(cells, (shape, cls, routing, "torch")), ms(cells, (shape, cls, routing, "triton")))
                 / ms(cells, (shape, cls, routing, "auto")) >= 0.97)
    return [
        f"- {routing}: triton vs torch time-ratio geometric mean {geomean(ratios):.3f} over {len(ratios)} cells; "
        f"worst cell {worst[0]:.2f} ({worst[1]}); weight-gradient geometric mean {geomean(wgrad):.3f}; "
        f"triton mean {sum(sols) / max(len(sols), 1):.1f}% of speed of light",
        f"- {routing}: auto within 3% of the faster of torch and triton in {within} of {len(ratios)} cells; "
        f"lowest best/auto {auto_gap[0]:.3f} ({auto_gap[1]})",
    ]


def plots(cells, shapes, routing, out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = [c for pair in PASSES.values() for c in pair]
    fig, axes = plt.subplots(1, len(classes), figsize=(3.2 * len(classes), 4), sharey=True)
    for ax, cls in zip(axes, classes):
        for i, b in enumerate(("torch", "triton", "auto")):
            vals = []
            for shape in shapes:
                base, mine = ms(cells, (shape, cls, routing, "padded")), ms(cells, (shape, cls, routing, b))
                vals.append(base / mine if base and mine else 0)
            ax.bar([x + 0.27 * i for x in range(len(shapes))], vals, width=0.27, label=b)
        ax.set_yscale("log")
        ax.set_title(cls)
        ax.set_xticks(range(len(shapes)), shapes, rotation=75, fontsize=7)
    axes[0].set_ylabel("speedup over padded (log)")
    axes[-1].legend()
    fig.tight_layout()
    fig.savefig(out.with_name(out.name + f"-speedup-{routing}.png"), dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 4))
    backends = ["padded", "xla", "torch", "triton", "auto"]
    for i, b in enumerate(backends):
        vals = [geomean(float(cells[(s, c, routing, b)]["pct_sol"]) for c in classes
                        if ms(cells, (s, c, routing, b))) for s in shapes]
        ax.bar([x + 0.17 * i for x in range(len(shapes))], [0 if math.isnan(v) else v for v in vals], width=0.17,
               label=b)
    ax.set_xticks(range(len(shapes)), shapes, rotation=30, fontsize=8)
    ax.set_ylabel("% of speed of light (geomean of 6 classes)")
    ax.legend(ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_name(out.name + f"-sol-{routing}.png"), dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+")
    p.add_argument("--out", required=True, help="path prefix of the markdown summary and PNGs")
    args = p.parse_args()
    cells = load(args.csv)
    shapes = list(dict.fromkeys(s for (s, _, _, _) in cells))
    routings = list(dict.fromkeys(rt for (_, _, rt, _) in cells))
    out = Path(args.out)
    lines = [f"# ragdot bench summary ({', '.join(Path(c).name for c in args.csv)})", ""]
    for routing in routings:
        present = [b for b in ("padded", "xla", "torch", "triton", "auto")
                   if any(k[2] == routing and k[3] == b for k in cells)]
        lines += [f"## {routing}: TFLOP/s per pass", ""] + per_pass_table(cells, shapes, present, routing) + [""]
        lines += targets(cells, shapes, routing) + [""]
        plots(cells, shapes, routing, out)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
