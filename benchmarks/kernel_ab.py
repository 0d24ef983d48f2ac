"""A/B of one kernel module against its own earlier source: same operands, same configs, both kernels and the
vendor call interleaved on the graph clock (CUDA-graph replays; a CPU dry run: the wall clock), results compared
bitwise.

    git show f072712:src/ragdot/kernels/gluon/ragged_k.py > /tmp/old_rk.py     # on a machine with the history
    python benchmarks/kernel_ab.py --module ragdot.kernels.gluon.ragged_k --old /tmp/old_rk.py --out DIR
    python benchmarks/kernel_ab.py --module ragdot.kernels.ragged_m --old old_rm.py --classes fwd_wi dgrad_wi \\
        --routing balanced skewed --configs default --out DIR
    python benchmarks/kernel_ab.py --module ragdot.kernels.ragged_m --old src/ragdot/kernels/ragged_m.py \\
        --old-set TMA_STORE=True --out DIR                  # one switch of the module: "old" has it on

`--module` is one of ragdot's kernel modules with a `Prepared` class (ragged_k: `Prepared(a, b, G, out_dtype,
config)`, ragged_m: `Prepared(a, b, out_dtype, config)`; a call `(a, b, ends) -> (c, kernel)`), `--old` the
earlier file of that module (its `from ragdot...` imports resolve against this checkout). Cells: the anchor
shapes' classes of the module's problem, bf16, group sizes by routing. Configs per cell: `tuned` (the shipped
tune's config of the module's backend for the cell, where one is stored) and/or `default` (the module's own
pick). Rows (CSV + JSON under --out): shape, cls, routing, system (`vendor`, `old:LABEL`, `new:LABEL`), clock, ms,
x_vendor, and per kernel row `bitwise` (old and new results equal) and `finite`. `--from-sizes`: the prepared
calls take the raw group sizes (as the backends' calls do: `Prepared(..., from_sizes=True)`), not the ends;
`--clocks eager graph`: also CUDA events around batches of back-to-back eager calls (host time included).
Before a kernel change goes in: write the prediction down, run this, keep the output beside the result.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODULES = {  # module -> (problem, backend whose tuned configs it takes)
    "ragdot.kernels.gluon.ragged_k": ("ragged_k", "gluon"),
    "ragdot.kernels.gluon.ragged_m": ("ragged_m", "gluon"),
    "ragdot.kernels.ragged_k": ("ragged_k", "triton"),
    "ragdot.kernels.ragged_m": ("ragged_m", "triton"),
}
CLASSES = {"ragged_k": ("wgrad_wi", "wgrad_wo"), "ragged_m": ("fwd_wi", "dgrad_wi")}  # what cell_operands builds
COLUMNS = ("shape", "cls", "routing", "system", "clock", "ms", "host_ms", "x_vendor", "bitwise", "finite", "status")


def load_old(path: Path, module: str, settings: dict | None = None):
    """The module's earlier source as a module object of its own (a name no import can collide with), with the
    module-level names in `settings` set on it (`--old-set`: a switch of the module's own, A/B'd in one run)."""
    spec = importlib.util.spec_from_file_location(f"_kernel_ab_old_{module.replace('.', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "Prepared"):
        raise ValueError(f"--old: {path} has no Prepared class")
    for name, value in (settings or {}).items():
        if not hasattr(mod, name):
            raise ValueError(f"--old-set: {path} has no module-level name {name}")
        setattr(mod, name, value)
    return mod


def parse_settings(items: list[str]) -> dict:
    """NAME=VALUE items (VALUE a Python literal) -> {NAME: value}; ValueError naming the bad item."""
    import ast

    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        try:
            if not (sep and name.isidentifier()):
                raise ValueError
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ValueError(f"--old-set: expected NAME=VALUE with VALUE a Python literal, got {item!r}") from None
    return out


def cell_configs(problem: str, backend: str, ops, e: int, which: list[str]) -> list:
    """The configs timed for one cell: the shipped tune's (if stored) and/or None (the module's default)."""
    from ragdot.tune.key import key_for
    from ragdot.tune.select import entry_config, tuned_entry

    _, a, b = ops[:3]
    out = []
    if "tuned" in which:
        cfg = entry_config(tuned_entry(key_for(problem, a, b, e, a.dtype)), backend)
        if cfg is not None:
            out.append(cfg)
    if "default" in which and None not in out:
        out.append(None)
    return out


def prepared(mod, problem: str, ops, e: int, cfg, from_sizes: bool = False):
    _, a, b = ops[:3]
    if problem == "ragged_k":
        return mod.Prepared(a, b, e, a.dtype, cfg, from_sizes=from_sizes)
    return mod.Prepared(a, b, a.dtype, cfg, from_sizes=from_sizes)


def run_cell(shape, cls: str, routing: str, mods: dict, problem: str, backend: str, which: list[str],
             seconds: float, dev, from_sizes: bool = False, clocks: tuple[str, ...] = ("graph",)) -> list[dict]:
    import torch
    from gluon_gpu import cell_operands, system_call

    from ragdot.measure.timing import Timed, measure_clocks
    from ragdot.routing import group_sizes

    name, m, k, n, e = shape.name, shape.M, shape.K, shape.N, shape.E
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # CPU: a dry run through the interpreter
    ops = cell_operands(cls, m, k, n, e, torch.Generator(device=dev).manual_seed(0), dtype)
    a, b = ops[1:3]
    sizes = group_sizes(routing, m, e, device=dev)
    ends = torch.cumsum(sizes, 0, dtype=torch.int32)
    systems = [Timed("vendor", [system_call("vendor", ops, sizes, e)])]  # raw torch._grouped_mm with its cumsum
    outs, rows = {}, []
    for cfg in cell_configs(problem, backend, ops, e, which):
        for tag, mod in mods.items():
            try:
                p = prepared(mod, problem, ops, e, cfg, from_sizes)
            except NotImplementedError as exc:
                label = "default" if cfg is None else cfg.short()
                rows.append(dict(shape=name, cls=cls, routing=routing, system=f"{tag}:{label}",
                                 status=f"refused: {exc}"))
                continue
            label = f"{tag}:{p.cfg.short()}"  # TileConfig and GluonConfig both label themselves
            call = (lambda p=p: p(a, b, sizes if from_sizes else ends)[0])
            outs[label] = call()
            systems.append(Timed(label, [call]))
    times = measure_clocks(systems, dev, clocks=clocks, warmup=3, iters=30, max_seconds=seconds)  # CPU: wall
    for clock in dict.fromkeys(c for _, c in times):  # the clocks that ran (a CPU: wall only)
        vendor = times["vendor", clock].median
        for s in systems:
            t = times[s.name, clock]
            row = dict(shape=name, cls=cls, routing=routing, system=s.name, clock=t.clock, ms=t.median,
                       host_ms=t.host, x_vendor=vendor / t.median, status="ok")
            if s.name != "vendor":
                tag, label = s.name.split(":", 1)
                twin = outs.get(f"{'new' if tag == 'old' else 'old'}:{label}")
                row["bitwise"] = None if twin is None else bool(torch.equal(twin, outs[s.name]))
                row["finite"] = bool(torch.isfinite(outs[s.name]).all())
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", required=True, choices=sorted(MODULES))
    ap.add_argument("--old", required=True, type=Path, help="the module's earlier source file")
    ap.add_argument("--old-set", nargs="+", default=[], metavar="NAME=VALUE",
                    help="module-level names set on the old module after it loads (e.g. --old src/ragdot/kernels/"
                         "ragged_m.py --old-set TMA_STORE=True: one switch of the module, A/B'd)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--classes", nargs="+", help="classes of the module's problem (default: both of them)")
    ap.add_argument("--routing", nargs="+", default=["balanced", "skewed", "empty"])
    ap.add_argument("--configs", nargs="+", choices=("tuned", "default"), default=["tuned", "default"])
    ap.add_argument("--shapes", nargs="+", default=["anchor"], help="shape names, 'M,K,N,E' or tags (default: anchor)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run: fp32, Triton's interpreter)")
    ap.add_argument("--seconds", type=float, default=0.2, help="time budget per system and cell")
    ap.add_argument("--from-sizes", action="store_true", help="calls take the raw group sizes (the backends' form)")
    ap.add_argument("--clocks", nargs="+", choices=("graph", "eager"), default=["graph"],
                    help="CUDA clocks (default graph; eager: back-to-back eager calls, host time included)")
    ap.add_argument("--cell-timeout", type=float, default=120.0,
                    help="seconds a cell may take, compiles included, before the run counts it as hung: the cell is "
                         "named and the run ends with exit status 3, its rows so far kept (default 120)")
    args = ap.parse_args(argv)
    if not args.cell_timeout > 0:
        ap.error(f"--cell-timeout: must be > 0, got {args.cell_timeout}")
    problem, backend = MODULES[args.module]
    classes = args.classes or list(CLASSES[problem])
    bad = [c for c in classes if c not in CLASSES[problem]]
    if bad:
        ap.error(f"--classes: {', '.join(bad)} are not {problem} classes")
    if not args.old.is_file():
        ap.error(f"--old: {args.old} is not a file")
    try:
        settings = parse_settings(args.old_set)
    except ValueError as exc:
        ap.error(str(exc))
    import torch

    from ragdot.cli_common import UsageError, parse_shape_args
    from ragdot.measure.records import RowWriter, run_meta
    from ragdot.measure.watchdog import Watchdog

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("kernel_ab.py: no CUDA device here (--device cpu runs a dry run), nothing to do.")
        return 0
    try:
        shapes = parse_shape_args(args.shapes)
    except UsageError as exc:
        ap.error(str(exc))
    try:
        mods = {"old": load_old(args.old, args.module, settings), "new": importlib.import_module(args.module)}
    except ValueError as exc:
        ap.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = run_meta(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32, with_triton=True)
    meta.update(module=args.module, old=str(args.old), old_set=args.old_set, from_sizes=args.from_sizes,
                clock="graph: CUDA-graph replays, CUDA events, median; eager: CUDA events around back-to-back calls")
    writer = RowWriter(args.out, "kernel-ab", meta, COLUMNS)
    dog = Watchdog("kernel_ab.py", writer.files)
    for shape in shapes:
        for cls in classes:
            for routing in args.routing:
                with dog.cell(f"cell {shape.name} {cls} {routing}", args.cell_timeout):
                    rows = run_cell(shape, cls, routing, mods, problem, backend, args.configs, args.seconds, dev,
                                    args.from_sizes, tuple(args.clocks))
                for row in rows:
                    writer.add(row)
                print(f"{shape.name:24s} {cls:9s} {routing:8s} " + "  ".join(
                    f"{r['system']}@{r['clock']}={r['ms']:.4f}" for r in rows if r["status"] == "ok"), flush=True)
    broken = [r for r in writer.rows if r.get("bitwise") is False or r.get("finite") is False]
    for line in summary(writer.rows):
        print(line)
    print(f"wrote {writer.csv} and {writer.json}; {len(broken)} kernel rows not bitwise equal or not finite")
    return 0


def summary(rows: list[dict]) -> list[str]:
    """Per clock: the geometric mean of old's time over new's over every cell-config both timed (> 1: new
    faster), with the range and the cell of each end."""
    from ragdot.bench.summary import geomean

    pairs: dict[tuple, dict[str, float]] = {}
    for r in rows:
        arm, _, cfg = r["system"].partition(":")
        if arm in ("old", "new") and r["status"] == "ok":
            pairs.setdefault((r["clock"], r["shape"], r["cls"], r["routing"], cfg), {})[arm] = r["ms"]
    lines = []
    for clock in sorted({k[0] for k in pairs}):
        ratios = {k[1:]: v["old"] / v["new"] for k, v in pairs.items() if k[0] == clock and len(v) == 2}
        if ratios:
            lo, hi = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
            lines.append(f"{clock}: old / new time, geomean {geomean(ratios.values()):.4f} over {len(ratios)} "
                         f"cell-configs (> 1: new faster); lowest {ratios[lo]:.3f} ({' '.join(lo[:3])}), "
                         f"highest {ratios[hi]:.3f} ({' '.join(hi[:3])})")
    return lines


if __name__ == "__main__":
    sys.exit(main())
