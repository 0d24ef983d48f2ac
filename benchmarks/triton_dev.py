"""Development benchmark of the Triton kernels against torch._grouped_mm on one GPU.

For the 8 anchor shapes x 6 MoE classes (bf16) and balanced / skewed routing it checks each Triton result
against a float32 reference, then times torch._grouped_mm, the heuristic's config and (with --sweep) every
sweep config, interleaved, with CUDA events on fresh random data (median of --reps). Kernels are compiled
first in parallel worker processes (ragdot.kernels.compile_only) so the timed process only loads them.

    python benchmarks/triton_dev.py --out results_dir [--sweep] [--shapes deepseek2-16b,...] [--classes ...]

Writes a new <out>/triton_dev-<date>.json per run (triton_dev_graph-<date>.json with --graph; one record per
cell and variant, rewritten after every cell) and prints summary tables. The `sweep` suite of
benchmarks/suite.py runs the sweeps behind the shipped heuristic; `--small-cases` runs a few small checks only.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from ragdot.kernels import TileConfig, pick_config
from ragdot.kernels import batch as batch_mod
from ragdot.kernels import ragged_k as rk_mod
from ragdot.kernels import ragged_m as rm_mod
from ragdot.measure.checks import normalised_error
from ragdot.measure.records import gpu_name, new_stem, write_document
from ragdot.measure.timing import capture_graph, span, spans_ms
from ragdot.routing import group_sizes as routing_sizes
from ragdot.shapes import shapes_with_tag

SHAPES: dict[str, tuple[int, int, int, int]] = {  # (M tokens, K hidden, N intermediate, E experts)
    s.name: (s.M, s.K, s.N, s.E) for s in shapes_with_tag("anchor")
}
CLASSES = ("fwd_wi", "fwd_wo", "dgrad_wi", "dgrad_wo", "wgrad_wi", "wgrad_wo")
PEAK_FLOPS, PEAK_BYTES = 720e12, 4.2e12

RM_SWEEP = [
    TileConfig(64, 128, 64, 1, 4, 4),
    TileConfig(64, 256, 64, 8, 4, 3, tma=True),
    TileConfig(64, 256, 64, 8, 4, 4, True, 1, tma=True),
    TileConfig(64, 256, 64, 8, 8, 3, True, 1, tma=True),
    TileConfig(128, 128, 64, 8, 4, 3, True, 2, tma=True),
    TileConfig(128, 256, 64, 8, 8, 3, tma=True),
    TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True),
    TileConfig(128, 256, 64, 8, 8, 4, True, 1, tma=True),
    TileConfig(128, 256, 64, 1, 8, 3, True, 1, tma=True),
    TileConfig(256, 128, 64, 8, 8, 3, True, 1, tma=True),
    TileConfig(64, 256, 32, 8, 4, 4, True, 2, tma=True),
    TileConfig(64, 128, 64, 1, 4, 4, True, 2, tma=True, flat=True),
    TileConfig(64, 256, 64, 8, 4, 4, True, 1, tma=True, flat=True),
    TileConfig(64, 256, 32, 8, 4, 4, True, 2, tma=True, flat=True),
    TileConfig(128, 128, 64, 8, 4, 3, True, 2, tma=True, flat=True),
    TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True, flat=True),
    TileConfig(128, 256, 64, 8, 8, 4, True, 1, tma=True, flat=True),
]
RK_SWEEP = [
    TileConfig(128, 128, 32, 8, 4, 3, tma=True),
    TileConfig(128, 128, 32, 8, 4, 4, tma=True),
    TileConfig(128, 128, 32, 1, 4, 4, tma=True),
    TileConfig(128, 128, 16, 8, 4, 5, tma=True),
    TileConfig(128, 128, 32, 8, 4, 3),
    TileConfig(128, 128, 32, 8, 4, 3, True, 2, tma=True),
    TileConfig(128, 128, 32, 8, 4, 4, True, 2, tma=True),
    TileConfig(128, 128, 16, 8, 4, 5, True, 2, tma=True),
    TileConfig(128, 128, 64, 8, 8, 3, tma=True),
    TileConfig(128, 128, 32, 8, 8, 4, tma=True),
    TileConfig(64, 128, 32, 8, 4, 3, tma=True),
    TileConfig(64, 128, 32, 8, 4, 4, tma=True),
    TileConfig(64, 128, 64, 8, 4, 3, True, 4, tma=True),
    TileConfig(64, 256, 32, 8, 4, 3, tma=True),
    TileConfig(128, 64, 32, 8, 4, 3, tma=True),
    TileConfig(128, 256, 32, 8, 8, 3, True, 1, tma=True),
    TileConfig(128, 256, 32, 8, 8, 4, True, 1, tma=True),
    TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True),
    TileConfig(256, 128, 32, 8, 8, 3, True, 1, tma=True),
]


def group_sizes(m: int, e: int, routing: str) -> list[int]:
    """The project's routing generators (ragdot.routing): balanced, skewed, empty."""
    return routing_sizes(routing, m, e).tolist()


def operands(cls: str, shape: tuple[int, int, int, int], device: str, fill: bool) -> tuple:
    """(problem, a, b, torch_args) of one class; the same strides on any device (for compile warm-up)."""
    m, k, n, e = shape
    mk = lambda *s: torch.randn(*s, device=device, dtype=torch.bfloat16) if fill else torch.empty(
        *s, device=device, dtype=torch.bfloat16
    )
    if cls in ("fwd_wi", "dgrad_wo", "wgrad_wi", "wgrad_wo"):
        x = mk(m, k)
    if cls in ("fwd_wo", "dgrad_wi", "wgrad_wi", "wgrad_wo"):
        h = mk(m, n)
    if cls == "fwd_wi":
        w = mk(e, k, n)
        return "ragged_m", x[None], w[None], (x, w)
    if cls == "fwd_wo":
        w = mk(e, n, k)
        return "ragged_m", h[None], w[None], (h, w)
    if cls == "dgrad_wi":
        w = mk(e, k, n).transpose(-1, -2)
        return "ragged_m", h[None], w[None], (h, w)
    if cls == "dgrad_wo":
        w = mk(e, n, k).transpose(-1, -2)
        return "ragged_m", x[None], w[None], (x, w)
    if cls == "wgrad_wi":
        return "ragged_k", x[None], h[None], (x.t(), h)
    return "ragged_k", h[None], x[None], (h.t(), x)


def run_triton(problem: str, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, cfg: TileConfig | None):
    if problem == "ragged_m":
        return rm_mod.ragged_m(a, b, ends, config=cfg)
    return rk_mod.ragged_k(a, b, ends, config=cfg)


def configs_for(problem: str, shape: tuple[int, int, int, int], sweep: bool) -> list[TileConfig]:
    m, k, n, e = shape
    heur = pick_config(problem, m, k, n, e, torch.bfloat16)  # shape orientation does not change the pick
    out = [heur]
    if sweep:
        out += [c for c in (RM_SWEEP if problem == "ragged_m" else RK_SWEEP) if c != heur]
    return out


def _warm_jobs(args: tuple) -> int:
    """Worker: compile (not run) every kernel of a list of jobs for the GPU arch, filling Triton's cache."""
    arch, jobs = args
    os.environ.pop("TRITON_INTERPRET", None)
    from ragdot.kernels import compile_only

    done = 0
    with compile_only(arch):
        for cls, shape, cfg in jobs:
            problem, a, b, _ = operands(cls, shape, "cpu", fill=False)
            ends = torch.zeros(shape[3], dtype=torch.int32)
            try:
                if problem == "ragged_m":
                    rm_mod.launch(a, b, ends, config=cfg)
                else:
                    rk_mod.launch(a, b, ends, config=cfg, sched=torch.zeros(3, shape[3], dtype=torch.int32))
                done += 1
            except Exception as exc:  # report and keep warming the others
                print(f"warm-up failed: {cls} {shape} {cfg.short()}: {exc!r}"[:300], flush=True)
        rk_mod.longest_first(torch.zeros(8, dtype=torch.int32))
        batch_mod.launch(torch.empty(2, 64, 64, dtype=torch.bfloat16), torch.empty(2, 64, 64, dtype=torch.bfloat16))
    return done


def warm_cache(cells: list[tuple[str, tuple]], sweep: bool, workers: int) -> None:
    cap = torch.cuda.get_device_capability()
    jobs = []
    for cls, shape in cells:
        problem = "ragged_m" if cls.startswith(("fwd", "dgrad")) else "ragged_k"
        jobs += [(cls, shape, cfg) for cfg in configs_for(problem, shape, sweep)]
    chunks = [jobs[i::workers] for i in range(workers)]
    t0 = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        done = sum(pool.map(_warm_jobs, [(cap[0] * 10 + cap[1], c) for c in chunks if c]))
    print(f"compile warm-up: {done}/{len(jobs)} kernels in {time.time() - t0:.1f}s ({workers} workers)", flush=True)


def reference(problem: str, a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    out = []
    s = 0
    for gi, size in enumerate(sizes):
        if problem == "ragged_m":
            out.append(a[0, s : s + size].float() @ b[0, gi].float())
        else:
            out.append((a[0, s : s + size].float().t() @ b[0, s : s + size].float())[None])
        s += size
    return torch.cat(out, 0)


def time_variants(
    fns: list[Callable[[int], object]], nsets: int, reps: int, graph: bool = False
) -> list[float]:
    """Median microseconds per call of each fn(set_index), interleaved, CUDA events.

    With `graph`, each variant's calls are captured once in a CUDA graph and replayed, which removes the
    host's launch cost from the measurement (what a model captured in a graph would see).
    """
    for fn in fns:
        fn(0)
        fn(1 % nsets)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fns[0](0)
    torch.cuda.synchronize()
    est = time.perf_counter() - t0
    inner = max(1, min(20, int(300e-6 / max(est, 1e-6))))
    graph = graph and est < 2e-3  # a call of milliseconds gains nothing from a graph, whose pool holds its output
    runs: list[Callable[[], object]] = []
    for fn in fns:
        batch = lambda fn=fn: [fn(j % nsets) for j in range(inner)]  # noqa: E731
        runs.append(capture_graph(batch) if graph else batch)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for i, ms in enumerate(spans_ms([span(run) for run in runs])):
            times[i].append(ms * 1e3 / inner)
    return [statistics.median(t) for t in times]


def bench_cell(
    sname: str, cls: str, routing: str, sizes: list[int], ends: torch.Tensor, sol_us: float, flops: float,
    sweep: bool, reps: int, graph: bool = False,
) -> list[dict]:
    """Check (balanced routing) and time torch and the Triton configs on one (shape, class, routing) cell."""
    shape = SHAPES[sname]
    m, k, n, e = shape
    problem = "ragged_m" if cls.startswith(("fwd", "dgrad")) else "ragged_k"
    in_bytes = 2.0 * (m * k + m * n + e * k * n)
    nsets = max(1, min(4, math.ceil(200e6 / in_bytes)))
    sets = [operands(cls, shape, "cuda", fill=True) for _ in range(nsets)]
    cfgs = configs_for(problem, shape, sweep)
    errs: dict[str, float] = {}
    if routing == "balanced":
        _, a, b, targs = sets[0]
        ref = reference(problem, a, b, sizes)
        errs["torch"] = normalised_error(torch._grouped_mm(*targs, offs=ends), ref)
        for cfg in cfgs:
            out = run_triton(problem, a, b, ends, cfg)
            errs[cfg.short()] = normalised_error(out[:, 0] if problem == "ragged_k" else out[0], ref)
    fns: list[Callable[[int], object]] = [lambda i: torch._grouped_mm(*sets[i][3], offs=ends)]
    for cfg in cfgs:
        fns.append(lambda i, cfg=cfg: run_triton(problem, sets[i][1], sets[i][2], ends, cfg))
    us = time_variants(fns, nsets, reps, graph)
    names = ["torch"] + [c.short() for c in cfgs]
    records = [
        dict(shape=sname, cls=cls, routing=routing, graph=graph, variant=name, heuristic=i == 1, us=us[i],
             tflops=flops / us[i] / 1e6, ratio=us[0] / us[i], sol_pct=100 * sol_us / us[i],
             err=errs.get(name), config=asdict(cfgs[i - 1]) if i else None)
        for i, name in enumerate(names)
    ]
    best = min(range(1, len(us)), key=lambda i: us[i])
    print(f"{routing[:4]} {sname:18s} {cls:8s} torch {us[0]:8.1f}us heur {us[1]:8.1f}us "
          f"x{us[0] / us[1]:.2f} best x{us[0] / us[best]:.2f} [{names[best]}] "
          f"sol {100 * sol_us / us[best]:.0f}% err {max(errs.values()) if errs else 0:.1e}", flush=True)
    bad = {name: err for name, err in errs.items() if not err < 2e-2}
    if bad:
        print(f"  CHECK FAILED {sname} {cls}: {bad}", flush=True)
    return records


def small_cases() -> None:
    """A few small problems through every kernel (odd sizes, empty groups, NaN tails): for compute-sanitizer."""
    from ragdot.kernels import zero_tail_rows_

    torch.manual_seed(1)
    bf = torch.bfloat16
    ends = torch.tensor([5, 5, 150, 301], dtype=torch.int32, device="cuda")
    for tma in (False, True):
        for bt in (False, True):
            a = torch.randn(1, 333, 200, device="cuda", dtype=bf)
            a[:, 301:] = float("nan")
            b = torch.randn(1, 4, 264, 200, device="cuda", dtype=bf).transpose(-1, -2) if bt else torch.randn(
                1, 4, 200, 264, device="cuda", dtype=bf)
            base = pick_config("ragged_m", 333, 200, 264, 4, bf)
            cfg = TileConfig(**{**base.__dict__, "tma": tma, "flat": base.flat and tma})
            c = rm_mod.ragged_m(a, b, ends, config=cfg)
            assert not c.isnan().any() and (c[:, 301:] == 0).all()
    for cfg in (None, TileConfig(128, 128, 32, 8, 4, 4, True, 2, tma=True)):
        xa, xb = torch.randn(1, 333, 136, device="cuda", dtype=bf), torch.randn(1, 333, 72, device="cuda", dtype=bf)
        xa[:, 301:] = float("nan")
        w = rk_mod.ragged_k(xa, xb, ends, config=cfg)
        assert (w[1] == 0).all() and not w.isnan().any()
    a = torch.randn(1, 333, 200, device="cuda", dtype=bf)
    for flat in (False, True):
        for cfg in (TileConfig(64, 256, 64, 8, 4, 4, True, 1, tma=True, flat=flat),
                    TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True, flat=flat)):
            c = rm_mod.ragged_m(a, torch.randn(1, 4, 200, 264, device="cuda", dtype=bf), ends, config=cfg)
            assert (c[:, 301:] == 0).all()
    batch_mod.batch(torch.randn(3, 70, 90, device="cuda", dtype=bf), torch.randn(3, 90, 40, device="cuda", dtype=bf))
    zero_tail_rows_(torch.randn(2, 333, 72, device="cuda"), ends)
    torch.cuda.synchronize()
    print("small cases done")


def aux_timings() -> None:
    """Cost of the auxiliary launches: zero_tail_rows_ when the groups cover every row, longest_first."""
    from ragdot.kernels import zero_tail_rows_

    c = torch.randn(1, 10240, 2880, device="cuda", dtype=torch.bfloat16)
    ends = torch.tensor(group_sizes(10240, 128, "balanced"), device="cuda").cumsum(0).to(torch.int32)
    us = time_variants([lambda i: zero_tail_rows_(c, ends), lambda i: rk_mod.longest_first(ends),
                        lambda i: torch.empty(1, device="cuda").zero_()], 1, 15)
    print(f"aux: zero_tail_rows_ (sum == M) {us[0]:.1f}us, longest_first G=128 {us[1]:.1f}us, "
          f"one tiny torch kernel {us[2]:.1f}us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--classes", default=",".join(CLASSES))
    parser.add_argument("--routing", default="balanced,skewed")
    parser.add_argument("--sweep", action="store_true", help="time every sweep config, not only the heuristic")
    parser.add_argument("--sweep-routing", default="balanced", help="routings that get the sweep")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no host launch cost)")
    parser.add_argument("--small-cases", action="store_true", help="only run small checks (for memcheck)")
    args = parser.parse_args()
    if args.small_cases:
        small_cases()
        return 0
    torch.manual_seed(0)
    dev = gpu_name()
    print(f"{dev} torch {torch.__version__} sms {torch.cuda.get_device_properties(0).multi_processor_count}")
    shapes = [s for s in args.shapes.split(",") if s]
    classes = [c for c in args.classes.split(",") if c]
    cells = [(c, SHAPES[s]) for s in shapes for c in classes]
    warm_cache(cells, args.sweep, args.workers)
    records = []
    out = Path(args.out)
    path = out / f"{new_stem(out, 'triton_dev_graph' if args.graph else 'triton_dev', ('.json',))}.json"
    t_start = time.time()
    for routing in args.routing.split(","):
        sweep = args.sweep and routing in args.sweep_routing.split(",")
        for sname in shapes:
            shape = SHAPES[sname]
            m, k, n, e = shape
            sizes = group_sizes(m, e, routing)
            ends = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
            flops = 2.0 * m * k * n
            nbytes = 2.0 * (m * k + m * n + e * k * n)
            sol_us = max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e6
            for cls in classes:
                records += bench_cell(sname, cls, routing, sizes, ends, sol_us, flops, sweep, args.reps, args.graph)
                torch.cuda.empty_cache()
                save(str(path), dev, records)  # after every cell: a later failure keeps these
    print(f"timing phase {time.time() - t_start:.0f}s")
    aux_timings()
    summarize(records)
    return 0


def save(path: str, dev: str, records: list[dict]) -> None:
    """The records so far, replacing this run's file whole."""
    write_document(Path(path), dict(device=dev, torch=torch.__version__, records=records), indent=None)


def summarize(records: list[dict]) -> None:
    """Geometric means of the time ratio vs torch (heuristic and best-of-sweep) per routing and class."""
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")
    for routing in sorted({r["routing"] for r in records}):
        rows = [r for r in records if r["routing"] == routing]
        cells = sorted({(r["shape"], r["cls"]) for r in rows})
        heur = {(r["shape"], r["cls"]): r for r in rows if r["heuristic"]}
        best = {}
        for r in rows:
            if r["variant"] != "torch" and (r["shape"], r["cls"]) not in best or (
                r["variant"] != "torch" and r["us"] < best[(r["shape"], r["cls"])]["us"]
            ):
                best[(r["shape"], r["cls"])] = r
        for label, table in (("heuristic", heur), ("best", best)):
            ratios = [table[c]["ratio"] for c in cells]
            sols = [table[c]["sol_pct"] / 100 for c in cells]
            wg = [table[c]["ratio"] for c in cells if c[1].startswith("wgrad")]
            print(f"{routing} {label}: ratio geomean {gm(ratios):.3f} min {min(ratios):.2f} "
                  f"wgrad geomean {gm(wg):.3f} SOL geomean {100 * gm(sols):.1f}%")


if __name__ == "__main__":
    raise SystemExit(main())
