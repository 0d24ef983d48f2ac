"""ragdot.jax on a GPU in one command: correctness, host time per jitted call, and the bench cells.

    python benchmarks/jax_gpu.py --out /tmp/jax-gpu            # on the H200 (about 6-8 minutes)
    python benchmarks/jax_gpu.py --out /tmp/jax-cpu --cpu      # the same steps on the CPU, tiny shapes

Steps, each in its own process under a time limit (a step that hangs or crashes is recorded and the next one
runs; the whole run stays within --budget seconds):

1. env: versions, devices, whether buffer_callback's execution context has a stream.
2. check: forward, grad and jvp of ragdot.jax under jax.jit against jax.lax.ragged_dot_general (and a float64
   oracle where jax has no gradient: contracting and batch modes), bf16 and f32, every canonical mode, sum <
   M with a NaN tail, results chained inside one jitted program (the stream order), and whether the forward
   wrote XLA's output buffer in place (zero copy).
3. host: host time per jitted call of ragdot.jax against a jitted jax.lax.ragged_dot of the same shapes
   (small shapes, so the host dominates), plus an empty buffer_callback and ragdot's eager PyTorch call: the
   JAX calls as batches ending in one wait, interleaved pass by pass, medians of 5 (before 2026-12-01's
   last commits: the best of 5, one system after another).
4. profile: benchmarks/jax_host_profile.py (where a call's host time goes: the bridge before and after its
   calls were prepared, the time inside the callback and on which thread, the DLPack views, the GIL
   hand-over under two switch intervals, and a large shape where the device dominates), under profile/.
5. bench: `ragdot bench` over the 48 anchor cells with triton, xla, ragdot-jax and (if it imports) tokamax,
   side by side (triton: graph and eager clocks; the JAX systems: the batch and program clocks), in four
   parts; up to 300 iterations a cell and clock (0.4 s at most), so a JAX batch or program holds up to 100
   calls per wait. tokamax imports where benchmarks/tokamax_site.sh put it on PYTHONPATH.

Everything lands under --out: env.json, check.json, host.csv/json, profile/, bench/ (the bench's CSV/JSON/summary),
steps.json (each step's status, seconds and log tail) and one log per step.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("env", "check", "host", "profile", "bench")
LIMITS = {"env": 60, "check": 150, "host": 90, "profile": 150, "bench": 200}  # seconds per step (bench: per part)
SYSTEMS = ("triton", "xla", "ragdot-jax", "tokamax")  # the bench step's systems
BENCH_PARTS = 4  # the bench runs in parts of 2 anchor shapes: a part cut by its limit loses only its cells
# The H200 ceilings measured at d2e757e (benchmarks/results/h200-eager-path-20261201/bench-log-d2e757e.txt),
# given so that each part does not measure them again.
H200_CEILINGS = ("--peak-tflops", "794.8", "--bandwidth-gbs", "4272")


# ------------------------------------------------------------------------------------------------ helpers


def _setup_path() -> None:
    for p in (ROOT / "src", ROOT / "tests"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))


def _jax(cpu: bool):
    """jax with the environment every ragdot JAX measurement uses (`ragdot.bench.xla.import_jax`); `cpu`:
    XLA's CPU platform and Triton's interpreter."""
    _setup_path()
    if cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from ragdot.bench.xla import import_jax

    return import_jax()


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


# --------------------------------------------------------------------------------------------------- env


def step_env(out: Path, cpu: bool) -> None:
    jax = _jax(cpu)
    import inspect

    import torch
    from jax.experimental.buffer_callback import buffer_callback

    info: dict[str, object] = {
        "python": sys.version.split()[0], "jax": jax.__version__, "torch": torch.__version__,
        "jax_devices": [str(d) for d in jax.devices()], "torch_cuda": torch.cuda.is_available(),
        "torch_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "buffer_callback": str(inspect.signature(buffer_callback)),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        import tokamax

        info["tokamax"] = getattr(tokamax, "__version__", "imports")
    except Exception as exc:
        info["tokamax"] = f"does not import: {type(exc).__name__}: {exc}"[:200]
    seen: dict[str, object] = {}

    def probe(ctx, out_buf, x):
        seen["stage"] = str(ctx.stage)
        try:
            seen["stream"] = int(ctx.stream)
        except Exception as exc:
            seen["stream"] = f"{type(exc).__name__}: {exc}"
        seen["dlpack_device"] = out_buf.__dlpack_device__()

    x = jax.numpy.ones((4,), jax.numpy.float32)
    jax.jit(lambda v: buffer_callback(probe, jax.ShapeDtypeStruct(v.shape, v.dtype))(v))(x).block_until_ready()
    info["callback_context"] = seen
    _setup_path()
    from ragdot.jax import _ffi

    info["ragdot_jax_bridge"] = "ffi" if _ffi.available() else f"buffer_callback ({_ffi.reason()})"
    _write_json(out / "env.json", info)
    print(json.dumps(info, indent=2, default=str))


# ------------------------------------------------------------------------------------------------- check

# name: (lhs shape, rhs shape, dimension numbers (contracting, batch), lhs ragged, rhs group)
_CHECKS = {
    "fwd_wi": ((2048, 512), (8, 512, 384), (((1,), (1,)), ((), ())), (0,), (0,)),
    "dgrad_wo": ((2048, 512), (8, 384, 512), (((1,), (2,)), ((), ())), (0,), (0,)),
    "wgrad_wi": ((2048, 512), (2048, 384), (((0,), (0,)), ((), ())), (0,), ()),
    "batched_ragged_m": ((2, 1024, 256), (2, 8, 256, 128), (((2,), (2,)), ((0,), (0,))), (1,), (1,)),
    "batch_mode": ((4, 256, 256), (4, 256, 128), (((2,), (1,)), ((0,), (0,))), (0,), ()),
}
_TOL = {"bfloat16": 2e-2, "float32": 1e-4}


def _nerr(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / den) if den > 0 else float(np.linalg.norm(a - b))


def _check_case(jax, name: str, dtype: str, cpu: bool) -> dict[str, object]:
    import numpy as np
    import torch

    import ragdot.jax as rj
    from oracle import ragged_dot_general_oracle
    from ragdot import RaggedDotDimensionNumbers

    jnp = jax.numpy
    lshape, rshape, ddn, lrag, rgrp = _CHECKS[name]
    if cpu:  # tiny shapes on the CPU
        lshape, rshape = tuple(min(s, 24) for s in lshape), tuple(min(s, 24) for s in rshape)
        if rgrp:
            rshape = tuple(3 if i == rgrp[0] else s for i, s in enumerate(rshape))
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal(lshape), dtype)
    rhs = jnp.asarray(rng.standard_normal(rshape), dtype)
    extent = lshape[lrag[0]]
    groups = rshape[rgrp[0]] if rgrp else 8 if not cpu else 3
    sizes_np = np.full(groups, (extent * 3 // 4) // groups, np.int32)  # sum < extent: a tail
    sizes = jnp.asarray(sizes_np)
    total = int(sizes_np.sum())
    jdn = jax.lax.RaggedDotDimensionNumbers(ddn, list(lrag), list(rgrp))
    dn = RaggedDotDimensionNumbers(ddn, lrag, rgrp)
    batch_mode = lrag[0] in ddn[1][0]
    if not batch_mode:  # poison the tail rows: they must not reach any output
        tail = (slice(None),) * lrag[0] + (slice(total, None),)
        lhs = lhs.at[tail].set(jnp.nan)
    hi = jax.lax.Precision.HIGHEST
    out = jax.jit(lambda a, b, s: rj.ragged_dot_general(a, b, s, jdn))(lhs, rhs, sizes)
    clean = jnp.nan_to_num(lhs, nan=0.0)

    def oracle(a, b):  # the float64 oracle of the product (torch), as numpy
        a, b = (torch.from_numpy(np.asarray(x.astype(jnp.float32), np.float64)) for x in (a, b))
        return ragged_dot_general_oracle(a, b, torch.tensor(sizes_np), dn).numpy()

    try:
        want = jax.jit(lambda a, b, s: jax.lax.ragged_dot_general(a, b, s, jdn, precision=hi))(clean, rhs, sizes)
        lax_ok, ref_name = True, "jax.lax"
    except Exception as exc:  # XLA rejects jax's own lowering of some modes on some GPUs: check against the oracle
        want, lax_ok = oracle(clean, rhs), False
        ref_name = f"float64 oracle (jax.lax failed: {str(exc).splitlines()[0][:160]})"
    res: dict[str, object] = {"case": name, "dtype": dtype, "shape": [lshape, rshape], "tail_rows": extent - total,
                              "ref": ref_name,
                              "fwd_vs_lax": _nerr(out.astype(jnp.float32), want.astype(jnp.float32)),
                              "fwd_nan": bool(jnp.isnan(out).any()),
                              "out_dtype_ok": out.dtype == (want.dtype if lax_ok else lhs.dtype)}
    dout = jnp.asarray(rng.standard_normal(out.shape), jnp.float32).astype(out.dtype)

    def loss(fn):
        return lambda a, b: jnp.vdot(fn(a, b, sizes, jdn).astype(jnp.float32), dout.astype(jnp.float32))

    dl, dr = jax.jit(jax.grad(loss(rj.ragged_dot_general), (0, 1)))(lhs, rhs)
    res["grad_nan"] = bool(jnp.isnan(dr).any())
    if lrag[0] not in ddn[0][0] and not batch_mode and lax_ok:  # non-contracting: jax has its own gradient
        lax_fn = lambda a, b, s, d: jax.lax.ragged_dot_general(a, b, s, d, precision=hi)
        ll, lr = jax.jit(jax.grad(loss(lax_fn), (0, 1)))(clean, rhs)
        res["grad_ref"] = "jax.lax"
    else:
        a = torch.from_numpy(np.asarray(clean.astype(jnp.float32), np.float64)).requires_grad_()
        b = torch.from_numpy(np.asarray(rhs.astype(jnp.float32), np.float64)).requires_grad_()
        ref = ragged_dot_general_oracle(a, b, torch.tensor(sizes_np), dn)
        ll, lr = torch.autograd.grad(ref, (a, b), torch.from_numpy(np.asarray(dout.astype(jnp.float32), np.float64)))
        ll, lr = ll.numpy(), lr.numpy()
        res["grad_ref"] = "float64 oracle"
    if not batch_mode:  # the tail rows' lhs gradient is not compared (NaN in, defined by the contract)
        keep = (slice(None),) * lrag[0] + (slice(0, total),)
        dl, ll = dl[keep], np.asarray(ll)[keep]
    res["dlhs"] = _nerr(dl.astype(jnp.float32), ll)
    res["drhs"] = _nerr(dr.astype(jnp.float32), lr)
    # forward mode: the tangent P(lhs', rhs) + P(lhs, rhs') (lhs' poisoned in the tail as lhs is) against jax.lax's
    t_lhs, t_rhs = (jnp.asarray(rng.standard_normal(x.shape), dtype) for x in (lhs, rhs))
    t_lhs = jnp.where(jnp.isnan(lhs), jnp.nan, t_lhs)

    def tangent(fn, a, ta):
        return jax.jit(lambda a, b, ta, tb: jax.jvp(lambda x, y: fn(x, y, sizes, jdn), (a, b), (ta, tb))[1])(
            a, rhs, ta, t_rhs)

    got_t = tangent(rj.ragged_dot_general, lhs, t_lhs)
    if lax_ok:
        want_t = tangent(lambda a, b, s, d: jax.lax.ragged_dot_general(a, b, s, d, precision=hi), clean,
                         jnp.nan_to_num(t_lhs, nan=0.0))
    else:  # the product is bilinear: its tangent is P(lhs', rhs) + P(lhs, rhs')
        want_t = oracle(jnp.nan_to_num(t_lhs, nan=0.0), rhs) + oracle(clean, t_rhs)
    res["jvp"] = _nerr(got_t.astype(jnp.float32), want_t.astype(jnp.float32))
    res["jvp_nan"] = bool(jnp.isnan(got_t).any())
    tol = _TOL[dtype]
    res["ok"] = bool(res["fwd_vs_lax"] < tol and res["dlhs"] < tol and res["drhs"] < tol and res["jvp"] < tol
                     and not res["fwd_nan"] and not res["grad_nan"] and not res["jvp_nan"] and res["out_dtype_ok"])
    return res


def _check_chained(jax, cpu: bool) -> dict[str, object]:
    """Results feeding each other inside one program: wrong if a kernel ran off XLA's stream order."""
    import numpy as np

    import ragdot.jax as rj

    jnp = jax.numpy
    m, k, g = (256, 256, 4) if cpu else (4096, 1024, 8)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((m, k)) * 0.1, jnp.float32)
    w = jnp.asarray(rng.standard_normal((g, k, k)) / np.sqrt(k), jnp.float32)
    s = jnp.full((g,), m // g, jnp.int32)

    def chain(fn):
        def run(x):
            for _ in range(8):
                x = jnp.tanh(fn(x, w, s)) + 0.5 * x
            return x

        return jax.jit(run)

    hi = lambda a, b, c: jax.lax.ragged_dot(a, b, c, precision=jax.lax.Precision.HIGHEST)
    got, want = chain(rj.ragged_dot)(x), chain(hi)(x)
    return {"case": "chained_8_calls", "err": _nerr(got, want), "ok": _nerr(got, want) < 1e-4}


def _check_zero_copy(jax, cpu: bool) -> dict[str, object]:
    """Whether the forward of a Triton-served call wrote XLA's buffer in place."""
    import ragdot.jax._bridge as bridge

    taken: list[bool] = []
    original = bridge.Bridge._call

    def spy(self, lhs, rhs, sizes):
        call = original(self, lhs, rhs, sizes)
        runner = call._runner(lhs, rhs)
        taken.append(getattr(runner.fn, "prepared", None) is not None and runner.takes(call.direct))
        return call

    bridge.Bridge._call = spy
    try:
        import ragdot.jax as rj

        jnp = jax.numpy
        dt = jnp.float16 if cpu else jnp.bfloat16
        x, w = jnp.ones((64, 32), dt), jnp.ones((4, 32, 48), dt)
        out = jax.jit(lambda a, b: rj.ragged_dot(a, b, jnp.full((4,), 16, jnp.int32), backend="triton"))(x, w)
        out.block_until_ready()
    finally:
        bridge.Bridge._call = original
    return {"case": "zero_copy_forward_triton", "in_place": bool(taken and all(taken)), "ok": bool(taken)}


def step_check(out: Path, cpu: bool) -> None:
    jax = _jax(cpu)
    _setup_path()
    results = []
    for name in _CHECKS:
        for dtype in ("bfloat16", "float32"):
            if cpu and dtype == "bfloat16":
                continue
            try:
                results.append(_check_case(jax, name, dtype, cpu))
            except Exception as exc:
                results.append({"case": name, "dtype": dtype, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            print(json.dumps(results[-1], default=str), flush=True)
    for fn in (_check_chained, _check_zero_copy):
        try:
            results.append(fn(jax, cpu))
        except Exception as exc:
            results.append({"case": fn.__name__, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(results[-1], default=str), flush=True)
    _write_json(out / "check.json", {"all_ok": all(r["ok"] for r in results), "results": results})


# -------------------------------------------------------------------------------------------------- host


def _host_timings(jax, rj, ragdot, buffer_callback, torch, mkng, dt, tdt, dev, calls) -> dict[str, float]:
    """Host µs per call: the JAX calls as batches ending in one wait, interleaved pass by pass (median of 5
    passes each, `ragdot.measure.host`), and ragdot's eager PyTorch call (`time_host`)."""
    from ragdot.measure.host import async_batch, time_host, time_host_interleaved

    jnp = jax.numpy
    m, k, n, g = mkng
    x, w = jnp.ones((m, k), dt), jnp.ones((g, k, n), dt)
    s = jnp.full((g,), m // g, jnp.int32)
    noop = buffer_callback(lambda ctx, o, *a: None, jax.ShapeDtypeStruct((m, n), dt))

    def wrap(ctx, o, *a):  # what the bridge adds before ragdot runs: the buffers as torch tensors
        for buf in (o, *a):
            torch.from_dlpack(buf)

    wraps = buffer_callback(wrap, jax.ShapeDtypeStruct((m, n), dt))
    tx, tw = torch.ones(m, k, dtype=tdt, device=dev), torch.ones(g, k, n, dtype=tdt, device=dev)
    ts = torch.full((g,), m // g, dtype=torch.int32, device=dev)
    grad_calls = max(calls // 4, 20)
    jg = jax.jit(jax.grad(lambda a, b: jax.lax.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1)))
    rg = jax.jit(jax.grad(lambda a, b: rj.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1)))
    # ragdot.jax on the buffer-callback bridge beside its default (the FFI custom call): traced with
    # RAGDOT_JAX_BRIDGE=callback (the bridge is chosen when a call is traced)
    cf = _traced_with(jax, "callback", jax.jit(lambda a, b, c: rj.ragged_dot(a, b, c)), (x, w, s))
    cg = _traced_with(jax, "callback", jax.jit(jax.grad(
        lambda a, b: rj.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1))), (x, w))
    jobs = {  # name: (jitted function, its arguments, calls per batch)
        "jax.lax.ragged_dot (jit)": (jax.jit(jax.lax.ragged_dot), (x, w, s), calls),
        "empty buffer_callback (jit)": (jax.jit(noop), (x, w, s), calls),
        "buffer_callback + 4 DLPack wraps (jit)": (jax.jit(wraps), (x, w, s), calls),
        "ragdot.jax.ragged_dot (jit)": (jax.jit(rj.ragged_dot), (x, w, s), calls),
        "ragdot.jax.ragged_dot, buffer_callback bridge (jit)": (cf, (x, w, s), calls),
        "grad jax.lax (jit)": (lambda a, b: jg(a, b)[1], (x, w), grad_calls),
        "grad ragdot.jax (jit)": (lambda a, b: rg(a, b)[1], (x, w), grad_calls),
        "grad ragdot.jax, buffer_callback bridge (jit)": (lambda a, b: cg(a, b)[1], (x, w), grad_calls),
    }
    # the JAX batches interleaved pass by pass, so a slow phase of the host lands on all of them
    batches = {name: async_batch(fn, [args], n) for name, (fn, args, n) in jobs.items()}
    got = time_host_interleaved(batches, torch.device("cpu"), calls=1, repeats=5, warmup=2)
    timings = {name: got[name].host_us / jobs[name][2] for name in jobs}
    eager = time_host(lambda: ragdot.ragged_dot(tx, tw, ts), torch.device(dev), calls=calls, repeats=5, warmup=20)
    timings["ragdot.ragged_dot (torch eager)"] = eager.host_us
    return timings


def _traced_with(jax, bridge: str, fn, args):
    """`fn` (jitted) traced and run once with RAGDOT_JAX_BRIDGE=`bridge` (`ragdot.jax._ffi.bridge_mode`)."""
    from ragdot.jax._ffi import bridge_mode

    with bridge_mode(bridge):
        jax.block_until_ready(fn(*args))
    return fn


def step_host(out: Path, cpu: bool) -> None:
    jax = _jax(cpu)
    _setup_path()
    import torch
    from jax.experimental.buffer_callback import buffer_callback

    import ragdot
    import ragdot.jax as rj

    jnp = jax.numpy
    calls = 200 if cpu else 2000
    dt = jnp.float32 if cpu else jnp.bfloat16
    tdt = torch.float32 if cpu else torch.bfloat16
    dev = "cpu" if cpu else "cuda"
    rows: list[dict[str, object]] = []
    for m, k, n, g in ((64, 32, 32, 4), (256, 128, 128, 8)) if cpu else ((128, 128, 128, 8), (512, 256, 256, 8)):
        timings = _host_timings(jax, rj, ragdot, buffer_callback, torch, (m, k, n, g), dt, tdt, dev, calls)
        for what, us in timings.items():
            rows.append({"M": m, "K": k, "N": n, "G": g, "dtype": jnp.dtype(dt).name, "what": what,
                         "us_per_call": round(us, 2)})
            print(rows[-1], flush=True)
        delta = timings["ragdot.jax.ragged_dot (jit)"] - timings["jax.lax.ragged_dot (jit)"]
        rows.append({"M": m, "K": k, "N": n, "G": g, "dtype": jnp.dtype(dt).name, "what": "ragdot.jax - jax.lax",
                     "us_per_call": round(delta, 2)})
        print(rows[-1], flush=True)
    with open(out / "host.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _write_json(out / "host.json", rows)


# ----------------------------------------------------------------------------------------------- profile


def step_profile(out: Path, cpu: bool) -> None:
    _jax(cpu)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax_host_profile

    code = jax_host_profile.main(["--out", str(out / "profile"), *(["--cpu"] if cpu else [])])
    if code:
        raise SystemExit(code)


# ------------------------------------------------------------------------------------------------- bench


def step_bench(out: Path, cpu: bool, part: int, systems: list[str]) -> None:
    _jax(cpu)
    _setup_path()
    from ragdot.cli import main
    from ragdot.shapes import shapes_with_tag

    names = [s.name for s in shapes_with_tag("tiny" if cpu else "anchor")]
    size = -(-len(names) // BENCH_PARTS)
    shapes = names[part * size:(part + 1) * size]
    if not shapes:
        return
    argv = ["bench", "--shapes", *shapes, "--backends", *systems, "--no-vendor", "--out", str(out / "bench"),
            "--warmup", "3", "--iters", "300", "--max-seconds", "0.4", "--no-plots"]
    argv += ["--device", "cpu", "--quick"] if cpu else list(H200_CEILINGS)
    code = main(argv)
    if code:
        raise SystemExit(code)


# -------------------------------------------------------------------------------------------------- main


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _run_step(name: str, args: argparse.Namespace, part: int | None, remaining: float) -> dict[str, object]:
    limit = max(5.0, min(LIMITS[name], remaining))
    label = name if part is None else f"{name}-{part}"
    cmd = [sys.executable, __file__, "--out", str(args.out), "--step", name]
    cmd += ["--cpu"] if args.cpu else []
    cmd += [] if part is None else ["--part", str(part)]
    cmd += ["--systems", *args.systems]
    start = time.perf_counter()
    log = args.out / f"{label}.log"
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT)
        text, status = res.stdout + res.stderr, "ok" if res.returncode == 0 else f"exit {res.returncode}"
    except subprocess.TimeoutExpired as exc:
        text = _text(exc.stdout) + _text(exc.stderr)
        status = f"timed out after {limit:.0f} s"
    log.write_text(text)
    seconds = time.perf_counter() - start
    print(f"[{label}] {status} in {seconds:.0f} s", flush=True)
    print("\n".join(text.strip().splitlines()[-15:]), flush=True)
    return {"step": label, "status": status, "seconds": round(seconds, 1), "log_tail": text[-3000:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU with tiny shapes (checks the script)")
    parser.add_argument("--budget", type=float, default=470.0, help="seconds for the whole run (default 470)")
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS), help="steps to run")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                        help="the bench step's systems (default: all; triton's rows are the device-time reference)")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)  # one step, in this process
    parser.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step:
        if args.step == "bench":
            step_bench(args.out, args.cpu, args.part, args.systems)
        else:
            steps = {"env": step_env, "check": step_check, "host": step_host, "profile": step_profile}
            steps[args.step](args.out, args.cpu)
        return 0
    start = time.perf_counter()
    report = []
    for name in args.steps:
        for part in range(BENCH_PARTS) if name == "bench" else (None,):
            remaining = args.budget - (time.perf_counter() - start)
            if remaining < 10:
                report.append({"step": name, "status": "skipped: out of budget"})
                continue
            report.append(_run_step(name, args, part, remaining))
            _write_json(args.out / "steps.json", report)
    _write_json(args.out / "steps.json", report)
    print(f"done in {time.perf_counter() - start:.0f} s; results under {args.out}")
    return 0 if all(r["status"] == "ok" for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
