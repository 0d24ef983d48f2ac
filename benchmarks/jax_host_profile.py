"""Where the host time of a jitted ragdot.jax call goes, and whether the GIL hand-over holds the callback up.

    PYTHONPATH=src python3 benchmarks/jax_host_profile.py --out DIR [--cpu] [--calls 200] [--shapes M,K,N,G ...]

Clock: host wall time (`ragdot.measure.host.time_host` on the host device, so no CUDA events): one timed
call is a batch of `--calls` jitted calls dispatched back to back and ending in one `block_until_ready`;
the per-call time is the batch's wall time / calls (median of 5 batches). Sections (rows of host_profile.csv):

- per_call: jax.lax.ragged_dot, an empty buffer_callback, the callback with the DLPack views of its four
  buffers, ragdot.jax.ragged_dot and both gradients (jax.lax and ragdot.jax), all jitted; ragdot.jax through
  the general path of every call (`ragdot.jax._bridge.PREPARED = False`: before) and the prepared bridge
  (after), in one process.
- inside: the wall time spent inside ragdot's forward callback per call (perf_counter around the body, on the
  thread XLA runs it on; which thread that is: the main one or another), and the cost of one
  `torch.from_dlpack` of each buffer and of reading `ctx.stream`, from inside a callback.
- gil: the batch of calls with the default switch interval (sys.getswitchinterval(), 5 ms) and with 1e-5 s,
  the main thread waiting in `block_until_ready` (blocks, releases the GIL) or spinning in Python on
  `is_ready()` (holds it); and one call at a time (each call waited for).
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
COLUMNS = ("section", "what", "M", "K", "N", "G", "dtype", "us_per_call", "calls", "note")


def _jax(cpu: bool) -> Any:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import jax

    return jax


def _batch(fn: Callable[..., Any], args: tuple, calls: int, wait: str = "block") -> Callable[[], None]:
    """One timed unit: `calls` jitted calls back to back, then a wait ("block": block_until_ready; "spin": a
    Python loop on is_ready(); "each": every call waited for in turn)."""

    def run() -> None:
        if wait == "each":
            for _ in range(calls):
                fn(*args).block_until_ready()
            return
        for _ in range(calls):
            out = fn(*args)
        leaf = out[-1] if isinstance(out, (tuple, list)) else out
        if wait == "spin":
            while not leaf.is_ready():
                pass
        leaf.block_until_ready()

    return run


def _per_call_us(fn: Callable[..., Any], args: tuple, calls: int, wait: str = "block") -> float:
    import torch

    from ragdot.measure.host import time_host

    run = _batch(fn, args, calls, wait)
    timing = time_host(run, torch.device("cpu"), calls=1, repeats=5, warmup=2)
    return timing.host_us / calls


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

    from ragdot.jax import _api

    _api._callbacks.cache_clear()
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


def measure_shape(jax: Any, mkng: tuple[int, int, int, int], cpu: bool, calls: int, out: Path) -> list[dict]:
    import torch
    from jax.experimental.buffer_callback import buffer_callback

    import ragdot.jax as rj
    from ragdot.jax import _bridge

    jnp = jax.numpy
    m, k, n, g = mkng
    dt = jnp.float32 if cpu else jnp.bfloat16
    base = {"M": m, "K": k, "N": n, "G": g, "dtype": jnp.dtype(dt).name, "calls": calls}
    rows: list[dict] = []

    def add(section: str, what: str, us: float, note: str = "") -> None:
        rows.append({"section": section, "what": what, **base, "us_per_call": round(us, 2), "note": note})
        print(f"{section:9s} {what:58s} {us:9.2f} us  {note}", flush=True)

    x, w = jnp.ones((m, k), dt), jnp.ones((g, k, n), dt)
    s = jnp.full((g,), m // g, jnp.int32)
    struct = jax.ShapeDtypeStruct((m, n), dt)

    def wraps(ctx, o, *a):
        for buf in (o, *a):
            torch.from_dlpack(buf)

    lax_f = jax.jit(jax.lax.ragged_dot)
    rj_f = jax.jit(rj.ragged_dot)
    empty = jax.jit(buffer_callback(lambda ctx, o, *a: None, struct))
    wrapped = jax.jit(buffer_callback(wraps, struct))
    add("per_call", "jax.lax.ragged_dot (jit)", _per_call_us(lax_f, (x, w, s), calls))
    add("per_call", "empty buffer_callback (jit)", _per_call_us(empty, (x, w, s), calls))
    add("per_call", "buffer_callback + 4 DLPack views (jit)", _per_call_us(wrapped, (x, w, s), calls))
    grad_calls = max(calls // 4, 10)
    lax_g = jax.jit(jax.grad(lambda a, b: jax.lax.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1)))
    rj_g = jax.jit(jax.grad(lambda a, b: rj.ragged_dot(a, b, s).astype(jnp.float32).sum(), (0, 1)))
    for prepared in (False, True):  # the general path of every call (before), the prepared bridge (after)
        _bridge.PREPARED = prepared
        tag = "prepared bridge" if prepared else "general bridge"
        add("per_call", f"ragdot.jax.ragged_dot (jit), {tag}", _per_call_us(rj_f, (x, w, s), calls))
        add("per_call", f"grad ragdot.jax (jit), {tag}", _per_call_us(rj_g, (x, w), grad_calls))
    _bridge.PREPARED = PREPARED_DEFAULT
    add("per_call", "grad jax.lax (jit)", _per_call_us(lax_g, (x, w), grad_calls))

    inside = _Inside()
    undo = inside.install()
    try:
        inside.reset()
        rj_f = _fresh_jit(rj)  # traced again, so that its callback is the wrapped one
        rj_f(x, w, s).block_until_ready()
        inside.reset()
        run = _batch(rj_f, (x, w, s), calls)
        start = time.perf_counter()
        run()
        total = time.perf_counter() - start
        add("inside", "ragdot.jax forward callback body", inside.seconds / inside.count * 1e6,
            f"{inside.count} calls; batch wall {total / calls * 1e6:.1f} us per call; callback thread: "
            f"{'+'.join(sorted(inside.threads))}")
        inside.reset(profile=True)
        _batch(rj_f, (x, w, s), calls)()
        (out / f"profile-{m}x{k}x{n}x{g}.txt").write_text(_profile_text(inside.profile, inside.count))
    finally:
        undo()
    for name, us in _dlpack_costs(jax, buffer_callback, x, w, s, struct, 200).items():
        add("inside", f"torch.from_dlpack({name})" if name != "ctx.stream" else "ctx.stream read", us)

    default = sys.getswitchinterval()
    try:
        for interval in (default, SWITCH_FAST):
            sys.setswitchinterval(interval)
            note = f"switch interval {interval:g} s"
            for wait in ("block", "spin", "each"):
                for label, fn in (("jax.lax.ragged_dot", lax_f), ("ragdot.jax.ragged_dot", rj_f)):
                    add("gil", f"{label}, wait={wait}", _per_call_us(fn, (x, w, s), calls, wait), note)
    finally:
        sys.setswitchinterval(default)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for host_profile.csv/json and profiles")
    parser.add_argument("--cpu", action="store_true", help="jax's CPU build, float32 (else the GPU, bfloat16)")
    parser.add_argument("--calls", type=int, default=0, help="calls per timed batch (default 200 CPU, 1000 GPU)")
    parser.add_argument("--shapes", nargs="+", default=None, help="M,K,N,G each (default two small shapes)")
    args = parser.parse_args(argv)
    jax = _jax(args.cpu)
    import torch

    from ragdot.measure.records import run_meta, write_csv, write_json

    args.out.mkdir(parents=True, exist_ok=True)
    calls = args.calls or (200 if args.cpu else 1000)
    default = ["64,32,32,4", "256,128,128,8"] if args.cpu else ["128,128,128,8", "512,256,256,8"]
    rows: list[dict] = []
    for spec in args.shapes or default:
        mkng = tuple(int(v) for v in spec.split(","))
        if len(mkng) != 4:
            raise SystemExit(f"--shapes: expected M,K,N,G, got {spec!r}")
        rows += measure_shape(jax, mkng, args.cpu, calls, args.out)
    device = torch.device("cpu" if args.cpu else "cuda")
    meta = {**run_meta(device, with_triton=True), "jax": jax.__version__, "clock": "host wall time, batch of calls "
            "ending in block_until_ready (ragdot.measure.host.time_host), median of 5", "cpus": os.cpu_count()}
    write_csv(rows, args.out / "host_profile.csv", COLUMNS)
    write_json(args.out / "host_profile.json", meta, rows, COLUMNS)
    print(f"results under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
