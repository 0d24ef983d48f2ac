"""Where the host time of a jitted ragdot.jax call on the buffer-callback bridge goes, and whether the GIL
hand-over holds the callback up.

The script profiles that bridge (it sets RAGDOT_JAX_BRIDGE=callback unless the variable is set): ragdot.jax's
default, the FFI custom call, runs Python only on a signature's first call on a device (`ragdot.jax._ffi`);
its host time per call is `benchmarks/jax_gpu.py`'s host step, beside this bridge's.

    PYTHONPATH=src python3 benchmarks/jax_host_profile.py --out DIR [--cpu] [--calls 200] [--shapes M,K,N,G ...]

Clock: host wall time (`ragdot.measure.host.time_host` on the host device, so no CUDA events): one timed
call is a batch of `--calls` jitted calls dispatched back to back and ending in one `block_until_ready`;
the per-call time is the batch's wall time / calls (median of 5 batches; 3 in the gil section). Sections
(rows of host_profile.csv):

- per_call: jax.lax.ragged_dot, an empty buffer_callback, the callback with the DLPack views of its four
  buffers, ragdot.jax.ragged_dot and both gradients (jax.lax and ragdot.jax), all jitted; ragdot.jax through
  the general path of every call (`ragdot.jax._bridge.PREPARED = False`: before) and the prepared bridge
  (after), in one process; and the programs compiled ahead of time (`jit(f).lower(...).compile()`, as
  `ragdot bench` timed every JAX system), called directly.
- inside: the wall time spent inside ragdot's forward callback per call (perf_counter around the body, on the
  thread XLA runs it on; which thread that is: the main one or another), and the cost of one
  `torch.from_dlpack` of each buffer and of reading `ctx.stream`, from inside a callback.
- gil (first shape and the sync shape): batches of at most 200 calls with the default switch interval
  (sys.getswitchinterval(), 5 ms) and with 1e-5 s, the main thread waiting in `block_until_ready` (blocks,
  releases the GIL) or spinning in Python on `is_ready()` (holds it); and one call at a time (each waited for).
- sync: a shape whose device time dwarfs the host's (16384x4096x4096, 8 groups on a GPU): for jax.lax,
  ragdot.jax jitted and ragdot.jax compiled ahead, a batch's dispatch-only time against its dispatch-and-
  wait time (equal when each call waits for its own work: no overlap), the time inside the callback, the
  gil rows (ragdot.jax only), and ragdot's PyTorch call of that shape (triton): host, eager (CUDA events)
  and device time.
- program: the cost of one turn inside one jitted program of 100 turns (`ragdot.bench.xla.us_per_turn`,
  the bench's program clock: a static loop, operands behind an optimization barrier) for jax.lax.ragged_dot,
  an empty buffer_callback, the callback with its four DLPack views, and ragdot.jax.ragged_dot: what a call
  costs the host where no dispatch is paid per call (the floor of ragdot.jax's program clock).
- ffi: an XLA FFI custom call whose C++ handler does nothing (`benchmarks/ffi_empty.cc`, built here with the C++
  compiler in $CXX or on PATH and `jax.ffi.include_dir()`'s headers), jitted and as one turn of the program
  section's loop: the host cost of a custom call with no Python in it, beside the empty buffer_callback's rows.
  Without a compiler the section has one row saying so.
- a cProfile of the forward callback (profile-<shape>.txt), collected on XLA's thread.

Runs on the CPU (jax CPU build, `--cpu`, float32) and on a GPU (bfloat16). Writes host_profile.csv/json
(`ragdot.measure.records`) and the profiles under --out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

PREPARED_DEFAULT = os.environ.get("RAGDOT_JAX_BRIDGE", "prepared") != "general"
SWITCH_FAST = 1e-5  # seconds: the short switch interval of the gil section
GIL_CALLS = 200  # at most this many calls per batch in the gil section
LAX_SYNC_CALLS = 5  # jax.lax's calls per batch at the sync shape (XLA's default lowering is slow there)
COLUMNS = ("section", "what", "M", "K", "N", "G", "dtype", "us_per_call", "calls", "note")


def _jax(cpu: bool) -> Any:
    """jax with the environment every ragdot JAX measurement uses (`ragdot.bench.xla.import_jax`: no
    preallocation, at most 0.30 of the GPU unless set, XLA's log quiet); `cpu`: XLA's CPU platform and
    Triton's interpreter."""
    if cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from ragdot.bench.xla import import_jax

    return import_jax()


def _per_call_us(fn: Callable[..., Any], args: tuple, calls: int, wait: str = "block", repeats: int = 5) -> float:
    """Host µs per call of batches of `calls` calls on `args` ending in one wait (`async_us_per_call`)."""
    from ragdot.measure.host import async_us_per_call

    return async_us_per_call(fn, [args], calls, repeats=repeats, wait=wait)


class _Inside:
    """Wraps the forward callback of ragdot.jax: wall time inside it and, optionally, a cProfile of it."""

    def __init__(self) -> None:
        self.seconds, self.count, self.profile = 0.0, 0, None
        self.threads: set[str] = set()

    def install(self) -> Callable[[], None]:
        from ragdot.jax import _bridge

        original = _bridge.Bridge.forward

        def forward(bridge, *args):
            self.threads.add("main" if threading.current_thread() is threading.main_thread() else "other")
            start = time.perf_counter()
            if self.profile is not None:
                self.profile.runcall(original, bridge, *args)
            else:
                original(bridge, *args)
            self.seconds += time.perf_counter() - start
            self.count += 1

        _bridge.Bridge.forward = forward

        def undo() -> None:
            _bridge.Bridge.forward = original

        return undo

    def reset(self, profile: bool = False) -> None:
        self.seconds, self.count = 0.0, 0
        self.profile = cProfile.Profile() if profile else None


def _dlpack_costs(jax: Any, bcb: Any, x: Any, w: Any, s: Any, out_struct: Any, reps: int) -> dict[str, float]:
    """µs per torch.from_dlpack of each buffer, timed inside a callback (XLA's thread, the buffers live)."""
    import torch

    found: dict[str, float] = {}

    def probe(ctx, out, *ins):
        for name, buf in zip(("out", "lhs", "rhs", "sizes"), (out, *ins)):
            start = time.perf_counter()
            for _ in range(reps):
                torch.from_dlpack(buf)
            found[name] = (time.perf_counter() - start) / reps * 1e6
        try:
            start = time.perf_counter()
            for _ in range(reps):
                ctx.stream  # noqa: B018 - the stream attribute read of every call
            found["ctx.stream"] = (time.perf_counter() - start) / reps * 1e6
        except Exception:  # the CPU context has no stream
            pass

    jax.jit(bcb(probe, out_struct))(x, w, s).block_until_ready()
    return found


def _fresh_jit(rj: Any) -> Callable[..., Any]:
    """A newly jitted ragdot.jax.ragged_dot whose callbacks are built anew (after a wrapper was installed)."""
    import jax

    from ragdot.jax import _calls

    _calls._directions.cache_clear()
    return jax.jit(lambda a, b, c: rj.ragged_dot(a, b, c))


def _profile_text(profile: cProfile.Profile, calls: int, top: int = 30) -> str:
    """The `top` functions by own time, in µs per callback call (pstats prints milliseconds at best)."""
    stats = pstats.Stats(profile, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    lines = [f"cProfile of the forward callback, {calls} calls; us per callback call (own, cumulative), calls per call",
             f"{'own us':>9} {'cum us':>9} {'n':>5}  function"]
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    for (path, line, name), (_, ncalls, own, cum, _) in ranked:
        where = f"{Path(path).name}:{line}({name})" if line else name
        lines.append(f"{own / calls * 1e6:9.2f} {cum / calls * 1e6:9.2f} {ncalls / calls:5.1f}  {where}")
    return "\n".join(lines) + "\n"


class _Rows:
    """The rows of one shape, printed as they come."""

    def __init__(self, mkng: tuple[int, int, int, int], dtype: str, calls: int) -> None:
        m, k, n, g = mkng
        self.base = {"M": m, "K": k, "N": n, "G": g, "dtype": dtype, "calls": calls}
        self.rows: list[dict] = []

    def add(self, section: str, what: str, us: float | None, note: str = "") -> None:
        self.rows.append({"section": section, "what": what, **self.base,
                          "us_per_call": None if us is None else round(us, 2), "note": note})
        shown = "     n/a" if us is None else f"{us:9.2f}"
        print(f"{section:9s} {what:58s} {shown} us  {note}", flush=True)


def _operands(jax: Any, mkng: tuple[int, int, int, int], dt: Any) -> tuple[Any, Any, Any]:
    m, k, n, g = mkng
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (m, k), dt)
    w = (jax.random.normal(kw, (g, k, n), jax.numpy.float32) * k**-0.5).astype(dt)
    return x, w, jax.numpy.full((g,), m // g, jax.numpy.int32)


def _empty(ctx: Any, out: Any, *args: Any) -> None:
    """A buffer callback that does nothing."""


def _wraps(ctx: Any, out: Any, *args: Any) -> None:
    """A buffer callback that only views its buffers as torch tensors (what the bridge does before ragdot)."""
    import torch

    for buf in (out, *args):
        torch.from_dlpack(buf)


def _program(jax: Any, rows: _Rows, ops: tuple) -> None:
    """One turn of a jitted 100-turn loop (the program clock's program) per op."""
    from jax.experimental.buffer_callback import buffer_callback

    import ragdot.jax as rj
    from ragdot.bench.xla import PROGRAM_TURNS, us_per_turn

    x, w, _ = ops
    struct = jax.ShapeDtypeStruct((x.shape[0], w.shape[2]), x.dtype)
    for label, op in (("jax.lax.ragged_dot", jax.lax.ragged_dot), ("empty buffer_callback",
                      buffer_callback(_empty, struct)), ("buffer_callback + 4 DLPack views",
                      buffer_callback(_wraps, struct)), ("ragdot.jax.ragged_dot", rj.ragged_dot)):
        rows.add("program", f"{label}, one turn of a {PROGRAM_TURNS}-turn jitted loop", us_per_turn(jax, op, ops))


FFI_TARGET = "ragdot_empty_call"


def _ffi_empty(jax: Any, cpu: bool, build: Path) -> tuple[Callable[..., Any] | None, str]:
    """The empty FFI call as `op(lhs, rhs, sizes)` (built into `build` and registered once), or (None, why)."""
    import ctypes
    import shutil

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        return None, "no C++ compiler (set CXX)"
    library = build / "libragdot_ffi_empty.so"
    if not library.exists():
        command = [compiler, "-O2", "-shared", "-fPIC", "-std=c++17", f"-I{jax.ffi.include_dir()}",
                   str(ROOT / "benchmarks" / "ffi_empty.cc"), "-o", str(library)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"build failed: {type(exc).__name__}: {exc}"[:200]
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1][:160] if done.stderr.strip() else f"exit {done.returncode}"
            return None, f"build failed: {last}"
    if FFI_TARGET not in _REGISTERED:
        handler = ctypes.CDLL(str(library)).RagdotEmptyCall
        jax.ffi.register_ffi_target(FFI_TARGET, jax.ffi.pycapsule(handler), platform="cpu" if cpu else "CUDA")
        _REGISTERED.add(FFI_TARGET)

    def op(lhs: Any, rhs: Any, sizes: Any) -> Any:
        return jax.ffi.ffi_call(FFI_TARGET, jax.ShapeDtypeStruct((lhs.shape[0], rhs.shape[2]), lhs.dtype))(
            lhs, rhs, sizes)

    return op, ""


_REGISTERED: set[str] = set()


def _ffi(jax: Any, rows: _Rows, ops: tuple, calls: int, cpu: bool, build: Path) -> None:
    """An empty FFI custom call: per jitted call and per turn of the program section's loop."""
    from ragdot.bench.xla import PROGRAM_TURNS, us_per_turn

    op, why = _ffi_empty(jax, cpu, build)
    if op is None:
        rows.add("ffi", "empty FFI custom call", None, why)
        return
    rows.add("ffi", "empty FFI custom call (jit)", _per_call_us(jax.jit(op), ops, calls))
    rows.add("ffi", f"empty FFI custom call, one turn of a {PROGRAM_TURNS}-turn jitted loop", us_per_turn(jax, op, ops))


def _per_call(jax: Any, rows: _Rows, ops: tuple, calls: int) -> None:
    """Host time per jitted call: jax.lax, the empty and the DLPack-viewing callback, ragdot.jax before
    (general bridge) and after (prepared bridge), and both gradients."""
    from jax.experimental.buffer_callback import buffer_callback

    import ragdot.jax as rj
    from ragdot.jax import _bridge

    jnp = jax.numpy
    x, w, s = ops
    struct = jax.ShapeDtypeStruct((x.shape[0], w.shape[2]), x.dtype)

    lax_f, rj_f = jax.jit(jax.lax.ragged_dot), jax.jit(rj.ragged_dot)
    empty = jax.jit(buffer_callback(_empty, struct))
    wrapped = jax.jit(buffer_callback(_wraps, struct))
    rows.add("per_call", "jax.lax.ragged_dot (jit)", _per_call_us(lax_f, ops, calls))
    rows.add("per_call", "empty buffer_callback (jit)", _per_call_us(empty, ops, calls))
    rows.add("per_call", "buffer_callback + 4 DLPack views (jit)", _per_call_us(wrapped, ops, calls))
    grad_calls = max(calls // 4, 10)
    lax_g = jax.jit(jax.grad(lambda a, b: jax.lax.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1)))
    rj_g = jax.jit(jax.grad(lambda a, b: rj.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1)))
    try:
        for prepared in (False, True):  # the general path of every call (before), the prepared bridge (after)
            _bridge.PREPARED = prepared
            tag = "prepared bridge" if prepared else "general bridge"
            rows.add("per_call", f"ragdot.jax.ragged_dot (jit), {tag}", _per_call_us(rj_f, ops, calls))
            rows.add("per_call", f"grad ragdot.jax (jit), {tag}", _per_call_us(rj_g, (x, w), grad_calls))
    finally:
        _bridge.PREPARED = PREPARED_DEFAULT
    rows.add("per_call", "grad jax.lax (jit)", _per_call_us(lax_g, (x, w), grad_calls))
    for label, fn in (("jax.lax.ragged_dot", lax_f), ("empty buffer_callback", empty),
                      ("ragdot.jax.ragged_dot", rj_f)):  # how `ragdot bench` called the programs until now
        note = "" if fn is lax_f else "a compiled program with a host callback: no C++ fast path"
        rows.add("per_call", f"{label} (jit(...).lower(...).compile() called)",
                 _per_call_us(fn.lower(*ops).compile(), ops, calls), note)


def _inside(jax: Any, rows: _Rows, ops: tuple, calls: int, profile: Path | None) -> None:
    """Wall time inside the forward callback (and the thread it runs on) against the batch's wall time per
    call and the time of only dispatching the calls; optionally a cProfile of the callback."""
    import ragdot.jax as rj

    inside = _Inside()
    undo = inside.install()
    try:
        rj_f = _fresh_jit(rj)  # traced again, so that its callback is the wrapped one
        rj_f(*ops).block_until_ready()
        inside.reset()
        start = time.perf_counter()
        for _ in range(calls):
            result = rj_f(*ops)
        issued = time.perf_counter() - start
        result.block_until_ready()
        total = time.perf_counter() - start
        rows.add("inside", "ragdot.jax forward callback body", inside.seconds / inside.count * 1e6,
                 f"{inside.count} calls; callback thread: {'+'.join(sorted(inside.threads))}")
        rows.add("inside", "the same batch: dispatch only", issued / calls * 1e6, "the calls issued, not waited for")
        rows.add("inside", "the same batch: dispatch and wait", total / calls * 1e6, "ending in block_until_ready")
        if profile is not None:
            inside.reset(profile=True)
            for _ in range(calls):
                result = rj_f(*ops)
            result.block_until_ready()
            profile.write_text(_profile_text(inside.profile, inside.count))
    finally:
        undo()
        from ragdot.jax import _calls

        _calls._directions.cache_clear()  # later sections get callbacks without the wrapper


def _dlpack_rows(jax: Any, rows: _Rows, ops: tuple) -> None:
    from jax.experimental.buffer_callback import buffer_callback

    x, w, s = ops
    struct = jax.ShapeDtypeStruct((x.shape[0], w.shape[2]), x.dtype)
    for name, us in _dlpack_costs(jax, buffer_callback, x, w, s, struct, 200).items():
        rows.add("inside", f"torch.from_dlpack({name})" if name != "ctx.stream" else "ctx.stream read", us)


def _gil(jax: Any, rows: _Rows, ops: tuple, calls: int, with_lax: bool = True) -> None:
    """Hypothesis (a): the batch with the default and a short switch interval, the main thread blocking,
    spinning in Python, or waiting for each call (ragdot.jax and, `with_lax`, jax.lax)."""
    import ragdot.jax as rj

    fns = [("ragdot.jax.ragged_dot", _fresh_jit(rj))]
    if with_lax:
        fns.insert(0, ("jax.lax.ragged_dot", jax.jit(jax.lax.ragged_dot)))
    calls = min(calls, GIL_CALLS)  # a call that waits a whole switch interval costs 5 ms
    default = sys.getswitchinterval()
    try:
        for interval in (default, SWITCH_FAST):
            sys.setswitchinterval(interval)
            note = f"switch interval {interval:g} s"
            for wait in ("block", "spin", "each"):
                for label, fn in fns:
                    us = _per_call_us(fn, ops, calls, wait, repeats=3)
                    rows.add("gil", f"{label}, wait={wait}", us, f"{note}; median of 3 batches of {calls}")
    finally:
        sys.setswitchinterval(default)


def _dispatch_split(fn: Callable[..., Any], ops: tuple, calls: int, repeats: int = 3) -> tuple[float, float]:
    """(µs per call to issue a batch of calls, µs per call to issue and wait for it), medians of `repeats`
    batches after one warm-up call: equal when a call waits for its own work before returning."""
    fn(*ops).block_until_ready()
    issued, total = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            result = fn(*ops)
        issued.append((time.perf_counter() - start) / calls * 1e6)
        result.block_until_ready()
        total.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(issued), statistics.median(total)


def _torch_eager(rows: _Rows, ops_shape: tuple[int, int, int, int], dtype: Any, cpu: bool, calls: int) -> None:
    """ragdot's PyTorch call of the same shape (triton on a GPU): host, eager (CUDA events) and device time."""
    import torch

    import ragdot
    from ragdot.measure.host import time_host

    m, k, n, g = ops_shape
    dev = torch.device("cpu" if cpu else "cuda")
    tdt = getattr(torch, dtype)
    x = torch.randn(m, k, device=dev, dtype=tdt)
    w = torch.randn(g, k, n, device=dev, dtype=tdt).mul_(k**-0.5)
    s = torch.full((g,), m // g, dtype=torch.int32, device=dev)
    backend = None if cpu else "triton"
    t = time_host(lambda: ragdot.ragged_dot(x, w, s, backend=backend), dev, calls=calls, repeats=5, warmup=5)
    label = f"ragdot.ragged_dot torch eager ({backend or 'auto'})"
    rows.add("sync", f"{label}: host", t.host_us, "ragdot.measure.host: wall time of back-to-back calls")
    rows.add("sync", f"{label}: eager", t.eager_us, "CUDA events around the same calls")
    rows.add("sync", f"{label}: device", t.device_us, "CUDA events, launches queued behind a spin kernel")


def measure_shape(jax: Any, mkng: tuple[int, int, int, int], cpu: bool, calls: int, out: Path,
                  gil: bool = True) -> list[dict]:
    """Every section at one small shape (the host dominates); the gil section where `gil`."""
    dt = jax.numpy.float32 if cpu else jax.numpy.bfloat16
    rows = _Rows(mkng, jax.numpy.dtype(dt).name, calls)
    ops = _operands(jax, mkng, dt)
    _per_call(jax, rows, ops, calls)
    _inside(jax, rows, ops, calls, out / f"profile-{'x'.join(map(str, mkng))}.txt")
    _dlpack_rows(jax, rows, ops)
    _program(jax, rows, ops)
    _ffi(jax, rows, ops, calls, cpu, out)
    if gil:
        _gil(jax, rows, ops, calls)
    return rows.rows


def measure_sync(jax: Any, mkng: tuple[int, int, int, int], cpu: bool, calls: int, out: Path) -> list[dict]:
    """A shape whose device time dwarfs the host's: does the host wait for the device inside a call? The
    batch against only dispatching it, the time inside the callback, the gil rows, and ragdot's PyTorch
    call's host, eager and device time for comparison."""
    dt = jax.numpy.float32 if cpu else jax.numpy.bfloat16
    rows = _Rows(mkng, jax.numpy.dtype(dt).name, calls)
    ops = _operands(jax, mkng, dt)
    import ragdot.jax as rj

    lax_f = jax.jit(jax.lax.ragged_dot)

    aot = jax.jit(rj.ragged_dot).lower(*ops).compile()
    for label, fn, n, note in (
            ("jax.lax.ragged_dot (jit)", lax_f, min(calls, LAX_SYNC_CALLS), "XLA's lowering: fewer calls"),
            ("ragdot.jax.ragged_dot (jit)", jax.jit(rj.ragged_dot), calls, ""),
            ("ragdot.jax.ragged_dot (compiled ahead, called)", aot, calls, "how ragdot bench timed it")):
        note = f"median of 3 batches of {n}" + (f"; {note}" if note else "")
        try:
            issued, total = _dispatch_split(fn, ops, n)
        except Exception as exc:  # e.g. XLA's lowering out of memory: the other rows still count
            rows.add("sync", f"{label}: failed", None, f"{type(exc).__name__}: {exc}"[:300])
            continue
        rows.add("sync", f"{label}: dispatch only", issued, note)
        rows.add("sync", f"{label}: dispatch and wait", total, note)
    _inside(jax, rows, ops, calls, out / f"profile-{'x'.join(map(str, mkng))}.txt")
    _gil(jax, rows, ops, calls, with_lax=False)  # XLA's own lowering is slow at this shape
    _torch_eager(rows, mkng, jax.numpy.dtype(dt).name, cpu, calls)
    return rows.rows


def _shape(spec: str, flag: str) -> tuple[int, int, int, int]:
    try:
        mkng = tuple(int(v) for v in spec.split(","))
    except ValueError:
        mkng = ()
    if len(mkng) != 4:
        raise SystemExit(f"{flag}: expected M,K,N,G, got {spec!r}")
    return mkng  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    """The sections, with RAGDOT_JAX_BRIDGE=callback (the bridge profiled) unless it is set; the environment
    as it was afterwards."""
    from ragdot.jax._ffi import bridge_mode

    with bridge_mode(os.environ.get("RAGDOT_JAX_BRIDGE") or "callback"):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for host_profile.csv/json and profiles")
    parser.add_argument("--cpu", action="store_true", help="jax's CPU build, float32 (else the GPU, bfloat16)")
    parser.add_argument("--calls", type=int, default=0, help="calls per timed batch (default 200 CPU, 1000 GPU)")
    parser.add_argument("--shapes", nargs="+", default=None, help="M,K,N,G each (default two small shapes)")
    parser.add_argument("--sync-shape", default=None, help="M,K,N,G of the sync section ('none': skip it)")
    parser.add_argument("--sync-calls", type=int, default=0, help="calls per batch there (default 50)")
    args = parser.parse_args(argv)
    jax = _jax(args.cpu)
    import torch

    from ragdot.measure.records import run_meta, write_csv, write_json

    args.out.mkdir(parents=True, exist_ok=True)
    calls = args.calls or (200 if args.cpu else 1000)
    default = ["64,32,32,4", "256,128,128,8"] if args.cpu else ["128,128,128,8", "512,256,256,8"]
    rows: list[dict] = []
    device = torch.device("cpu" if args.cpu else "cuda")
    meta = {**run_meta(device, with_triton=True), "jax": jax.__version__, "clock": "host wall time, batch of calls "
            "ending in block_until_ready (ragdot.measure.host.time_host), median of 5", "cpus": os.cpu_count()}

    def save() -> None:  # after every shape, so that a step cut short keeps what it measured
        write_csv(rows, args.out / "host_profile.csv", COLUMNS)
        write_json(args.out / "host_profile.json", meta, rows, COLUMNS)

    for i, spec in enumerate(args.shapes or default):  # the gil section at the first shape only
        rows += measure_shape(jax, _shape(spec, "--shapes"), args.cpu, calls, args.out, gil=i == 0)
        save()
    sync = args.sync_shape or ("1024,256,256,8" if args.cpu else "16384,4096,4096,8")
    if sync != "none":
        rows += measure_sync(jax, _shape(sync, "--sync-shape"), args.cpu, args.sync_calls or 50, args.out)
        save()
    print(f"results under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
