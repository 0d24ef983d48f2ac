"""Probe Gluon's Hopper primitives on this GPU, each step in its own subprocess with a timeout.

    python benchmarks/gluon_probe.py --out DIR [--timeout 90] [--steps pipelined ws4 ws8 ragged_k ragged_m]

Steps (src/ragdot/kernels/gluon):
- pipelined: plain matmul, TMA ring + mbarriers + async wgmma, no warp specialization;
- ws4: the same ring under gl.warp_specialize: a one-warp TMA producer, one consumer warpgroup (128x128);
- ws8: producer plus two consumer warpgroups cooperating on a 128x256 tile;
- ragged_k: the persistent warp-specialized weight-gradient kernel on a small skewed case with empty
  groups, a NaN-poisoned tail and group edges inside chunks, against a float64 reference;
- ragged_m: the persistent warp-specialized forward kernel (and its data-gradient layout) on the same groups:
  rows past the last group must be exact zeros;
- carry24, carry48, plain24: benchmarks/gluon_carry.py, the reproducer of the ragged-M prefetch's hang: a
  one-warp producer carrying eight table values from one item to the next across its mbarrier loop (24 or 48
  registers), and the same producer loading them per item (plain), about 8 items a program.

Each step compiles, runs, checks against torch.matmul on float32 copies (normalised error within the bf16
bound of ragdot.measure.checks) and times bf16 4096^3 and M=8192,N=2048,K=512 next to torch.mm: CUDA events
around eager calls, median of 20 after 2 warm-up calls (ragdot.measure.timing.median_ms). The verdict of a
step is ok / wrong / hang (no answer within --timeout; the child is killed) / compile error / error, with
the message. Writes DIR/gluon_probe.json and DIR/gluon_probe.txt (one verdict line per step).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("pipelined", "ws4", "ws8", "ragged_k", "ragged_m", "carry24", "carry48", "plain24")
SHAPES = ((4096, 4096, 4096), (8192, 2048, 512))  # (M, N, K)
KERNEL_ARGS = {
    "pipelined": dict(warp_specialized=False, block=(128, 128, 64), stages=4, num_warps=4),
    "ws4": dict(warp_specialized=True, block=(128, 128, 64), stages=4, num_warps=4),
    "ws8": dict(warp_specialized=True, block=(128, 256, 64), stages=3, num_warps=8),
}
MARK = "PROBE-RESULT "


def _matmul_row(name: str, m: int, n: int, k: int, gen) -> dict:
    import torch

    from ragdot.kernels.gluon.matmul import matmul
    from ragdot.measure.checks import normalised_error, within_tolerance
    from ragdot.measure.timing import median_ms

    dev = torch.device("cuda")
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16, generator=gen)
    out = matmul(a, b, **KERNEL_ARGS[name])
    torch.cuda.synchronize()
    err = normalised_error(out, a.float() @ b.float())
    again = matmul(a, b, **KERNEL_ARGS[name])
    ms = median_ms(lambda: matmul(a, b, **KERNEL_ARGS[name]), dev, graph=False)
    ms_mm = median_ms(lambda: torch.mm(a, b), dev, graph=False)
    flop = 2 * m * n * k
    return dict(m=m, n=n, k=k, error=err, ok=within_tolerance(err, torch.bfloat16),
                bitwise_repeat=bool(torch.equal(out, again)), ms=ms, tflops=flop / ms / 1e9,
                torch_mm_ms=ms_mm, torch_mm_tflops=flop / ms_mm / 1e9, vs_torch_mm=ms_mm / ms)


def _matmul_step(name: str) -> dict:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = [_matmul_row(name, m, n, k, gen) for m, n, k in SHAPES]
    return {"rows": rows, "ok": all(r["ok"] and r["bitwise_repeat"] for r in rows)}


def _ragged_k_step() -> dict:
    import torch

    from ragdot.kernels.gluon.ragged_k import ragged_k
    from ragdot.measure.checks import normalised_error, within_tolerance

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    r, m, n = 1000, 256, 192
    sizes = torch.tensor([300, 0, 17, 64, 0, 129, 200, 90], dtype=torch.int64)  # sum 800 < R: NaN tail
    ends = torch.cumsum(sizes, 0).to(device=dev, dtype=torch.int32)
    a = torch.randn(1, r, m, device=dev, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(1, r, n, device=dev, dtype=torch.bfloat16, generator=gen)
    a[:, 800:] = float("nan")
    b[:, 800:] = float("nan")
    out = ragged_k(a, b, ends)
    again = ragged_k(a, b, ends)
    torch.cuda.synchronize()
    bounds = [0, *torch.cumsum(sizes, 0).tolist()]
    ref = torch.stack([a[0, s:e].double().T @ b[0, s:e].double() for s, e in zip(bounds[:-1], bounds[1:])])
    err = normalised_error(out[:, 0], ref)
    empty_zero = bool((out[1] == 0).all() and (out[4] == 0).all())
    ok = within_tolerance(err, torch.bfloat16) and empty_zero and bool(torch.equal(out, again))
    return {"rows": [dict(r=r, m=m, n=n, sizes=sizes.tolist(), error=err, empty_groups_zero=empty_zero,
                          bitwise_repeat=bool(torch.equal(out, again)), ok=ok)], "ok": ok}


def _ragged_m_step() -> dict:
    import torch

    from ragdot.kernels.gluon.ragged_m import ragged_m
    from ragdot.measure.checks import normalised_error, within_tolerance

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(2)
    m, k, n = 1000, 256, 192
    sizes = [300, 0, 17, 64, 0, 129, 200, 90]  # sum 800 < M: rows 800+ are NaN and must come out 0
    ends = torch.tensor(sizes).cumsum(0).to(device=dev, dtype=torch.int32)
    a = torch.randn(1, m, k, device=dev, dtype=torch.bfloat16, generator=gen)
    a[:, 800:] = float("nan")
    rows = []
    for layout in ("fwd", "dgrad"):
        shape = (1, len(sizes), k, n) if layout == "fwd" else (1, len(sizes), n, k)
        b = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=gen)
        b = b if layout == "fwd" else b.transpose(2, 3)
        out, again = ragged_m(a, b, ends), ragged_m(a, b, ends)
        torch.cuda.synchronize()
        ref = torch.zeros(m, n, dtype=torch.float64, device=dev)
        bounds = [0, *ends.tolist()]
        for g, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
            ref[s:e] = a[0, s:e].double() @ b[0, g].double()
        err = normalised_error(out[0], ref)
        tail_zero = bool((out[0, 800:] == 0).all())
        ok = within_tolerance(err, torch.bfloat16) and tail_zero and bool(torch.equal(out, again))
        rows.append(dict(layout=layout, m=m, k=k, n=n, sizes=sizes, error=err, tail_zero=tail_zero,
                         bitwise_repeat=bool(torch.equal(out, again)), ok=ok))
    return {"rows": rows, "ok": all(r["ok"] for r in rows)}


def _carry_step(variant: str) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gluon_carry import variant_results

    return variant_results(variant)


STEP_FUNCTIONS = {"ragged_k": _ragged_k_step, "ragged_m": _ragged_m_step,
                  **{v: (lambda v=v: _carry_step(v)) for v in ("carry24", "carry48", "plain24")}}


def child(step: str) -> int:
    from ragdot.kernels.gluon.common import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"UNAVAILABLE {reason}", file=sys.stderr)
        return 2
    result = STEP_FUNCTIONS[step]() if step in STEP_FUNCTIONS else _matmul_step(step)
    print(MARK + json.dumps(result), flush=True)
    return 0


def _verdict(proc: subprocess.CompletedProcess | None, seconds: float, timeout: float) -> dict:
    if proc is None:
        return {"verdict": "hang", "message": f"no answer within {timeout:.0f} s; the process was killed"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode == 0 and lines:
        result = json.loads(lines[-1][len(MARK):])
        return {"verdict": "ok" if result["ok"] else "wrong", **result}
    if proc.returncode == 2 and "UNAVAILABLE " in proc.stderr:
        return {"verdict": "unavailable", "message": proc.stderr.split("UNAVAILABLE ", 1)[1].strip()}
    text = (proc.stderr or proc.stdout).strip().splitlines()
    last = next((ln for ln in reversed(text) if ln.strip()), f"exit status {proc.returncode}")
    kind = "compile error" if "CompilationError" in proc.stderr or "compil" in last.lower() else "error"
    return {"verdict": kind, "message": last[-500:], "stderr_tail": proc.stderr[-4000:]}


def run_step(step: str, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", step], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc = None
    seconds = time.perf_counter() - t0
    return {"step": step, "seconds": round(seconds, 1), **_verdict(proc, seconds, timeout)}


def _line(res: dict) -> str:
    head = f"{res['step']}: {res['verdict']}"
    if "message" in res:
        return f"{head} ({res['message']})"
    parts = []
    for r in res.get("rows", []):
        if "tflops" in r:
            parts.append(f"{r['m']}x{r['n']}x{r['k']} err {r['error']:.1e} {r['tflops']:.0f} TFLOP/s "
                         f"(torch.mm {r['torch_mm_tflops']:.0f}, {r['vs_torch_mm']:.2f}x)")
        elif "variant" in r:
            parts.append(f"{r['items']} items on {r['programs']} programs, max relative error {r['max_rel_error']:.1e}")
        elif "tail_zero" in r:
            parts.append(f"{r['layout']} err {r['error']:.1e} tail rows zero {r['tail_zero']} "
                         f"bitwise repeat {r['bitwise_repeat']}")
        else:
            parts.append(f"err {r['error']:.1e} empty groups zero {r['empty_groups_zero']} "
                         f"bitwise repeat {r['bitwise_repeat']}")
    timed = any("tflops" in r for r in res.get("rows", []))
    return f"{head}: " + "; ".join(parts) + (" [CUDA events around eager calls, median of 20]" if timed else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="directory for gluon_probe.json and gluon_probe.txt")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per step before it counts as a hang")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    ap.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.out is None:
        ap.error("--out: a directory is required")
    sys.path.insert(0, str(ROOT / "src"))
    from ragdot.measure.records import run_meta, write_document

    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for step in args.steps:
        res = run_step(step, args.timeout)
        results.append(res)
        print(_line(res), flush=True)
    import torch

    meta = run_meta(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"), with_triton=True)
    write_document(args.out / "gluon_probe.json", {"meta": meta, "steps": results})
    (args.out / "gluon_probe.txt").write_text("".join(_line(r) + "\n" for r in results))
    return 0 if all(r["verdict"] == "ok" for r in results) else 1


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
