"""The Gluon weight gradient on the GPU: its tests, then its speed against the triton backend and the vendor.

    python benchmarks/gluon_gpu.py --out DIR [--routing balanced] [--budget 345] [--classes ...]

1. runs tests/test_gluon.py, test_gluon_ragged_m.py and test_gluon_gather.py (the GPU-marked checks against
   float64 included) in a subprocess with a timeout;
2. times, on the 8 anchor shapes (ragdot.catalog, tag "anchor") and both weight-gradient classes (wgrad_wi:
   [M, K] x [M, N] -> [E, K, N]; wgrad_wo: [M, N] x [M, K] -> [E, N, K]), bf16, three systems:
   `gluon` and `triton` (the backends' prepared ragged_k calls, fed the raw group sizes) and `vendor` (raw
   torch._grouped_mm(a.t(), b, offs=cumsum(sizes)), offsets formed in the call as a user must). Clocks:
   `graph` = CUDA-graph replays of one call, `eager` = eager calls, each timed by CUDA events, median of
   --reps after 2 warm-up calls (ragdot.measure.timing.median_ms), the same inputs every call (no L2
   rotation). The gluon output is checked against the vendor's (normalised error, bf16 bound).
   `--classes wgrad_wi wgrad_wo fwd_wi dgrad_wi` times the ragged_m kernel too (forward and data-gradient
   weight layouts; raise --budget then). `--configs single` times every candidate Gluon config with one
   consumer partition as its own system (`gluon:<config>`), `--configs all` the ping-pong ones as well; the
   summary then also counts `gluon-best`, the fastest Gluon config of each cell on that clock.

The shapes run in one child process that reports each cell as it finishes; a cell with no answer within
--cell-timeout seconds counts as a hang: the child is killed and a new one goes on with the next shape.
Writes DIR/gluon_gpu-<date>.csv / .json (one row per shape, class and system), DIR/gluon_gpu-summary.json,
DIR/gluon_gpu-tests.txt (the pytest output) and DIR/gluon_gpu-stderr.txt (the timing children's stderr);
with --memcheck also DIR/gluon_gpu-memcheck.txt (a few Gluon calls under compute-sanitizer memcheck);
prints one line per cell and the geometric means of the speed ratios against the vendor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "CELL "
SYSTEMS = ("gluon", "triton", "vendor")
CLASSES = ("wgrad_wi", "wgrad_wo")
EXTRA_CLASSES = ("fwd_wi", "dgrad_wi")  # the ragged_m kernel, forward and data-gradient weight layouts
CELL_CLASSES = (*EXTRA_CLASSES, *CLASSES)  # every class `cell_operands` builds
COLUMNS = ("shape", "cls", "system", "routing", "M", "K", "N", "E", "status", "graph_ms", "eager_ms",
           "graph_tflops", "eager_tflops", "graph_vs_vendor", "eager_vs_vendor", "error_vs_vendor", "message")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def _shapes() -> list[tuple[str, int, int, int, int]]:
    from ragdot.catalog import with_tag

    return [s for model in with_tag("anchor") for s in model.shapes()]


# ---- child: the timed cells ----------------------------------------------------------------------------------


def cell_operands(cls: str, m: int, k: int, n: int, e: int, gen, dtype=None):
    """(problem, ragdot a, ragdot b, vendor mat_a, vendor mat_b) of one class on gen's device, bf16 unless
    `dtype` (docs of ragdot.bench.systems)."""
    import torch

    dev, dtype = gen.device, dtype or torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dtype, generator=gen)
    dy = torch.randn(m, n, device=dev, dtype=dtype, generator=gen)
    if cls in ("wgrad_wi", "wgrad_wo"):
        a, b = (x, dy) if cls == "wgrad_wi" else (dy, x)
        return "ragged_k", a[None], b[None], a.t(), b
    w = torch.randn(e, k, n, device=dev, dtype=dtype, generator=gen)
    wb = w if cls == "fwd_wi" else w.transpose(1, 2)  # dgrad_wi: dy [M, N] @ w[g]^T, w stored [E, K, N]
    a = x if cls == "fwd_wi" else dy
    return "ragged_m", a[None], wb[None], a, wb


def named_cell(shape_text: str, cls: str, device):
    """(shape, cell_operands of it) for a script's --shape (an anchor name or 'M,K,N,E'), --cls and --device:
    bf16 on CUDA, float32 elsewhere (a CPU dry run); ValueError naming --shape unless it is exactly one shape."""
    import torch

    from ragdot.cli_common import parse_shape_args

    shapes = parse_shape_args([shape_text])
    if len(shapes) != 1:
        raise ValueError(f"--shape: one shape, got {len(shapes)} from {shape_text!r}")
    (shape,) = shapes
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return shape, cell_operands(cls, shape.M, shape.K, shape.N, shape.E, torch.Generator(device=dev).manual_seed(0),
                                dtype)


def tuning_dims(ops, e: int) -> tuple[int, int, int, int]:
    """The dims a backend's `tuning_configs` takes for the problem of `ops` (cell_operands): (M, K, N, G) for
    ragged_m, (M, R, N, G) for ragged_k, as the tuner passes them."""
    problem, a, b = ops[:3]
    if problem == "ragged_k":
        return a.shape[2], a.shape[1], b.shape[2], e
    return a.shape[1], a.shape[2], b.shape[3], e


def _systems(ops, e: int, configs: str) -> list[tuple[str, object]]:
    """(label, Gluon config or None) per timed system: the Gluon ones (--configs), then triton and vendor."""
    import torch

    from ragdot.backends.gluon_gmm import BACKEND

    if configs == "default":
        return [(name, None) for name in SYSTEMS]
    cfgs = [c for c in BACKEND.tuning_configs(ops[0], tuning_dims(ops, e), torch.bfloat16, None)
            if configs == "all" or c.consumers == 1]
    return [(f"gluon:{c.short()}", c) for c in cfgs] + [("triton", None), ("vendor", None)]


def system_call(system: str, ops, sizes, e: int, config=None):
    """A zero-argument call of one system on `ops` (cell_operands): `vendor` (raw torch._grouped_mm with its
    offsets' cumsum) or a ragdot backend's prepared call with `config` (None: its default)."""
    import torch

    problem, a, b, mat_a, mat_b = ops
    if system == "vendor":
        return lambda: torch._grouped_mm(mat_a, mat_b, offs=torch.cumsum(sizes, 0, dtype=torch.int32))
    from ragdot.backends import get_backend

    call = get_backend(system.split(":")[0]).prepare(problem, a, b, e, a.dtype, config)
    return lambda: call(a, b, sizes)


def _cell(shape, cls: str, routing: str, reps: int, configs: str = "default") -> list[dict]:
    import torch

    from ragdot.measure.checks import failure_status, normalised_error, within_tolerance
    from ragdot.measure.timing import median_ms
    from ragdot.routing import group_sizes

    name, m, k, n, e = shape
    dev = torch.device("cuda")
    ops = cell_operands(cls, m, k, n, e, torch.Generator(device=dev).manual_seed(0))
    sizes = group_sizes(routing, m, e, device=dev)
    out_shape = (e, ops[1].shape[2], ops[2].shape[2]) if ops[0] == "ragged_k" else (m, ops[2].shape[3])
    flop = 2 * m * k * n
    rows, outs = [], {}
    for system, config in _systems(ops, e, configs):
        row = dict(shape=name, cls=cls, system=system, routing=routing, M=m, K=k, N=n, E=e)
        try:
            fn = system_call(system, ops, sizes, e, config)
            outs[system] = fn().reshape(out_shape)
            torch.cuda.synchronize()
            for clock in ("graph", "eager"):
                ms = median_ms(fn, dev, graph=clock == "graph", reps=reps)
                row[f"{clock}_ms"], row[f"{clock}_tflops"] = ms, flop / ms / 1e9
            row["status"] = "ok"
        except Exception as exc:  # one system failing must not lose the others
            row["status"], row["message"] = failure_status(exc)
        rows.append(row)
    vendor = rows[-1]
    for row in rows:
        if row["status"] != "ok" or vendor["status"] != "ok":
            continue
        for clock in ("graph", "eager"):
            row[f"{clock}_vs_vendor"] = vendor[f"{clock}_ms"] / row[f"{clock}_ms"]
        if row["system"] != "vendor":
            err = normalised_error(outs[row["system"]], outs["vendor"])
            row["error_vs_vendor"] = err
            if not within_tolerance(err, torch.bfloat16):
                row["status"] = "wrong"
    return rows


def child(first: int, routing: str, reps: int, classes: list[str], configs: str) -> int:
    for shape in _shapes()[first:]:
        for cls in classes:
            print(MARK + json.dumps(_cell(shape, cls, routing, reps, configs)), flush=True)
    return 0


def memcheck_calls() -> int:
    """A few small Gluon calls (NaN tails, empty groups, group edges inside chunks and tiles, both ragged_m
    layouts, fp32 output; the default, cooperative and ping-pong tiles), for compute-sanitizer; exit status 1
    when a result breaks the contract."""
    import torch

    from ragdot.kernels.gluon.config import GluonConfig
    from ragdot.kernels.gluon.ragged_k import ragged_k
    from ragdot.kernels.gluon.ragged_m import ragged_m

    gen = torch.Generator(device="cuda").manual_seed(5)
    sizes = [70, 0, 129, 1, 64, 0, 33]
    used = sum(sizes)
    ends = torch.tensor(sizes).cumsum(0).to(device="cuda", dtype=torch.int32)
    a = torch.randn(1, 400, 192, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(1, 400, 136, device="cuda", dtype=torch.bfloat16, generator=gen)
    a[:, used:], b[:, used:] = float("nan"), float("nan")
    tiles = (None, GluonConfig(128, 256, 32, 6, 8), GluonConfig(128, 128, 64, 4, 4, consumers=2))
    bad, calls = [], 0
    for cfg in tiles:
        for out_dtype in (torch.bfloat16, torch.float32):
            if cfg is not None and out_dtype == torch.float32:  # the larger epilogue tiles fit 16-bit outputs
                continue
            c = ragged_k(a, b, ends, out_dtype, config=cfg)
            calls += 1
            if not torch.isfinite(c).all() or (c[1] != 0).any() or (c[5] != 0).any():
                bad.append(f"ragged_k {out_dtype} {cfg}: NaN or nonzero empty groups")
    bad += _gather_and_tma2_calls(a, b, ends, gen)
    calls += 4
    w = torch.randn(1, len(sizes), 192, 136, device="cuda", dtype=torch.bfloat16, generator=gen)
    for cfg in tiles:
        for b4 in (w, w.transpose(2, 3).contiguous().transpose(2, 3)):
            c = ragged_m(a, b4, ends, config=cfg)
            calls += 1
            if not torch.isfinite(c).all() or (c[:, used:] != 0).any():
                bad.append(f"ragged_m {cfg} (b strides {b4.stride()}): NaN or nonzero rows past the groups")
    torch.cuda.synchronize()
    for line in bad:
        print(f"memcheck calls: {line}", file=sys.stderr)
    print(f"memcheck calls: {calls} Gluon calls, {len(bad)} broke the contract")
    return 1 if bad else 0


def _gather_and_tma2_calls(a, b, ends, gen) -> list[str]:
    """Four more calls for `memcheck_calls`: the weight gradient that gathers x's rows through an index (indices
    past the groups far out of range, one negative: both clamped into x) at two one-consumer tiles, each checked
    bitwise against the TMA-fed kernel on the gathered copy; and the two-buffer TMA epilogue ("tma2") against the
    default epilogue."""
    import torch
    from wgrad_anatomy import epilogue  # EPILOGUE set for the calls inside, restored after

    from ragdot.kernels.gluon import ragged_k as rk
    from ragdot.kernels.gluon.config import GluonConfig
    from ragdot.kernels.gluon.ragged_k_gather import ragged_k_gather

    rows = b.shape[1]
    x = torch.randn(90, a.shape[2], device="cuda", dtype=torch.bfloat16, generator=gen)
    idx = torch.randint(0, 90, (rows,), device="cuda", dtype=torch.int32, generator=gen)
    idx[int(ends[-1]):] = 1 << 30
    idx[3] = -5
    copy = x[idx.clamp(0, 89).long()][None]
    bad = []
    for cfg in (GluonConfig(128, 256, 32, 6, 8), GluonConfig(128, 128, 64, 4, 4)):
        got = ragged_k_gather(x, idx, b[0], ends, config=cfg)
        want = rk.ragged_k(copy, b, ends, config=cfg)[:, 0]
        if not torch.equal(got, want):
            bad.append(f"ragged_k_gather {cfg.short()}: differs from ragged_k on the gathered rows")
    cfg = GluonConfig(128, 256, 32, 4, 8)
    with epilogue("tma2"):
        two = rk.ragged_k(a, b, ends, config=cfg)
    if not torch.equal(two, rk.ragged_k(a, b, ends, config=cfg)):
        bad.append("ragged_k tma2: differs from the default epilogue")
    return bad


def _sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    return next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer")) if p.is_file()), None)


def run_memcheck(out: Path, timeout: float) -> dict:
    tool = _sanitizer()
    if tool is None:
        return {"verdict": "skipped (compute-sanitizer not found: PATH, /usr/local/cuda*/bin)"}
    cmd = [tool, "--tool", "memcheck", "--error-exitcode", "3", "--print-limit", "50", sys.executable, __file__,
           "--memcheck-child"]
    env = dict(_env(), PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
        text = proc.stdout + proc.stderr
        verdict = {0: "passed", 1: "wrong results", 3: "memcheck errors"}.get(proc.returncode, f"rc {proc.returncode}")
    except subprocess.TimeoutExpired as exc:
        text, verdict = str(exc.stdout or "") + str(exc.stderr or ""), f"hang (no end within {timeout:.0f} s)"
    (out / "gluon_gpu-memcheck.txt").write_text(text)
    return {"verdict": verdict}


# ---- parent: tests, then the cells with a watchdog -------------------------------------------------------------


def run_tests(out: Path, timeout: float) -> dict:
    files = [str(ROOT / "tests" / name)
             for name in ("test_gluon.py", "test_gluon_ragged_m.py", "test_gluon_gather.py")]
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", *files, "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, cwd=ROOT)
        text = proc.stdout + proc.stderr
        verdict = "passed" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
    except subprocess.TimeoutExpired as exc:
        text, verdict = str(exc.stdout or "") + str(exc.stderr or ""), f"hang (no end within {timeout:.0f} s)"
    (out / "gluon_gpu-tests.txt").write_text(text)
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
    return {"verdict": verdict, "seconds": round(time.perf_counter() - t0, 1), "summary": tail[0]}


def _reader(proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def run_cells(routing: str, reps: int, classes: list[str], cell_timeout: float, deadline: float, on_rows,
              log: Path, configs: str = "default") -> list[str]:
    """Cells in child processes (their stderr appended to `log`); returns the notes on hangs, crashes and
    what the budget left out."""
    shapes, notes, first = _shapes(), [], 0
    while first < len(shapes):
        with open(log, "a") as err:
            proc = subprocess.Popen([sys.executable, __file__, "--child", str(first), "--routing", routing,
                                     "--reps", str(reps), "--configs", configs, "--classes", *classes],
                                    stdout=subprocess.PIPE,
                                    stderr=err, text=True, env=_env(), cwd=ROOT)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc, lines), daemon=True).start()
        done_cells = 0
        while True:
            wait = min(cell_timeout, deadline - time.monotonic())
            try:
                line = lines.get(timeout=max(wait, 0.1))
            except queue.Empty:
                line = "TIMEOUT"
            if line == "TIMEOUT" or line is None:
                break
            if line.startswith(MARK):
                on_rows(json.loads(line[len(MARK):]))
                done_cells += 1
        shape_now = first + done_cells // len(classes)
        if line is None and proc.wait() == 0:
            break
        proc.kill()
        proc.wait()
        if time.monotonic() >= deadline:
            notes.append(f"budget spent: shapes from {shapes[shape_now][0]} on not measured")
            break
        last = [ln for ln in log.read_text().splitlines() if ln.strip()][-1:] or [""]
        why = "hang" if line == "TIMEOUT" else f"crash (rc {proc.returncode}): {last[0][-300:]}"
        notes.append(f"{shapes[shape_now][0]}: {why}")
        first = shape_now + 1
    return notes


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(rows: list[dict], classes: list[str]) -> dict[str, dict]:
    """Per pass kind, system and clock: geometric mean and lowest cell of the speed against the vendor; with
    several Gluon configs also `gluon-best` (per cell the best Gluon config on that clock)."""
    ok = [r for r in rows if r["status"] == "ok"]
    systems = list(dict.fromkeys(r["system"] for r in rows if r["system"] != "vendor"))
    best: dict[tuple, dict[str, float]] = {}
    for r in ok:
        if r["system"].startswith("gluon:"):
            cell = best.setdefault((r["shape"], r["cls"]), {})
            for clock in ("graph", "eager"):
                if r.get(f"{clock}_vs_vendor"):
                    cell[clock] = max(cell.get(clock, 0.0), r[f"{clock}_vs_vendor"])
    summary = {}
    kinds = dict.fromkeys("wgrad" if c.startswith("wgrad") else c for c in classes)
    for kind, clock in ((k, c) for k in kinds for c in ("graph", "eager")):
        per = {s: [r[f"{clock}_vs_vendor"] for r in ok if r["system"] == s and r["cls"].startswith(kind)
                   and r.get(f"{clock}_vs_vendor")] for s in systems}
        if best:
            per["gluon-best"] = [v[clock] for (_, cls), v in best.items() if cls.startswith(kind) and clock in v]
        for system, ratios in per.items():
            summary[f"{kind} {system} {clock}"] = {"geomean_vs_vendor": _geomean(ratios), "cells": len(ratios),
                                                   "min_vs_vendor": min(ratios) if ratios else None}
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--routing", default="balanced", help="group sizes: balanced, skewed or empty")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per clock (median)")
    ap.add_argument("--budget", type=float, default=345.0, help="seconds for the whole run (tests included)")
    ap.add_argument("--tests-timeout", type=float, default=180.0)
    ap.add_argument("--cell-timeout", type=float, default=60.0, help="seconds without a finished cell = hang")
    ap.add_argument("--classes", nargs="+", choices=CLASSES + EXTRA_CLASSES, default=list(CLASSES),
                    help="classes to time (default: the weight gradient; fwd_wi / dgrad_wi time the ragged_m kernel)")
    ap.add_argument("--configs", choices=("default", "single", "all"), default="default",
                    help="Gluon configs timed: the default one, every one-consumer candidate, or all (ping-pong too)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--memcheck", action="store_true",
                    help="also run a few Gluon calls under compute-sanitizer memcheck (up to 120 s more)")
    ap.add_argument("--memcheck-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    if args.child is not None:
        return child(args.child, args.routing, args.reps, args.classes, args.configs)
    if args.memcheck_child:
        return memcheck_calls()
    if args.out is None:
        ap.error("--out: a directory is required")
    import torch

    from ragdot.measure.records import RowWriter, run_meta, write_document

    deadline = time.monotonic() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    tests = {"verdict": "skipped"} if args.skip_tests else run_tests(args.out, args.tests_timeout)
    print(f"tests/test_gluon*.py: {tests['verdict']} {tests.get('summary', '')}", flush=True)
    memcheck = run_memcheck(args.out, 120.0) if args.memcheck else {"verdict": "not run (--memcheck)"}
    if args.memcheck:
        print(f"memcheck: {memcheck['verdict']}", flush=True)
        deadline += 120.0
    meta = run_meta(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"), torch.bfloat16,
                    with_triton=True)
    meta.update(routing=args.routing, reps=args.reps, classes=args.classes, configs=args.configs, tests=tests,
                memcheck=memcheck,
                clocks={"graph": "CUDA-graph replays, CUDA events, median",
                        "eager": "eager calls, CUDA events, median"})
    writer = RowWriter(args.out, "gluon_gpu", meta, COLUMNS)

    def on_rows(rows: list[dict]) -> None:
        for row in rows:
            writer.add(row)
        cells = ", ".join(f"{r['system']} {r.get('graph_tflops', 0):.0f}/{r.get('eager_tflops', 0):.0f}"
                          f"{'' if r['status'] == 'ok' else ' ' + r['status']}" for r in rows)
        print(f"{rows[0]['shape']} {rows[0]['cls']}: TFLOP/s graph/eager: {cells}", flush=True)

    if torch.cuda.is_available():
        notes = run_cells(args.routing, args.reps, args.classes, args.cell_timeout, deadline, on_rows,
                          args.out / "gluon_gpu-stderr.txt", args.configs)
    else:
        notes = ["no CUDA device here: the timing was left out"]
    summary = summarize(writer.rows, args.classes)
    meta.update(notes=notes, summary=summary)
    writer.rewrite()
    write_document(args.out / "gluon_gpu-summary.json", {"meta": meta})
    for key, s in summary.items():
        gm = "n/a" if s["geomean_vs_vendor"] is None else f"{s['geomean_vs_vendor']:.2f}x"
        lo = "" if s["min_vs_vendor"] is None else f", lowest cell {s['min_vs_vendor']:.2f}x"
        print(f"{key}: geomean vs vendor {gm} over {s['cells']} cells{lo}")
    for note in notes:
        print(f"note: {note}")
    bad = [r for r in writer.rows if r["system"].startswith("gluon") and r["status"] != "ok"]
    checks_ok = tests["verdict"] in ("passed", "skipped") and memcheck["verdict"] in ("passed", "not run (--memcheck)")
    return 0 if checks_ok and not bad and not notes else 1


if __name__ == "__main__":
    sys.exit(main())
