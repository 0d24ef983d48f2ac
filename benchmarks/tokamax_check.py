"""tokamax's `ragged_dot` on this GPU, checked before it is benchmarked beside ragdot.

    PYTHONPATH=src:SITE python3 benchmarks/tokamax_check.py [--out FILE]

Prints (and with --out writes) one JSON line per case:
- forward, 4096x1024x512 with 8 groups summing to 3984 of 4096 rows (a tail): tokamax's default
  implementation, "mosaic" and "xla", each against `jax.lax.ragged_dot` in float32 (max error over the
  largest reference value), the largest magnitude in the tail rows, and the time per call (host clock: wall
  time of 20 jitted calls ending in one `block_until_ready`, median of 3 such batches, after a first call
  that compiles).
- weight gradient (tokamax's own `jax.vjp` with respect to rhs), 3840x512 by 3840x256 into 64 groups, with
  every group 60 rows and with groups of 64 rows: per-group error against a float64 oracle, how many groups
  are off by more than 2e-2, and jax.lax's own error for scale.

tokamax needs Python >= 3.12 and jax >= 0.11.1; `benchmarks/tokamax_site.sh` installs it from wheels into a
directory of its own on a machine without a package index.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def _emit(row: dict, out) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")


def _batch_seconds(call, calls: int) -> float:
    """Seconds per call of `calls` jitted calls ending in one wait, on the host clock (median of 3 batches)."""
    from ragdot.measure.host import async_us_per_call

    return async_us_per_call(call, [()], calls, repeats=3) / 1e6


def forward(tokamax, out) -> None:
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    m, kk, n, g = 4096, 1024, 512, 8
    lhs = jax.random.normal(k[0], (m, kk), jnp.bfloat16)
    rhs = jax.random.normal(k[1], (g, kk, n), jnp.bfloat16)
    sizes = jnp.array([512] * 7 + [400], jnp.int32)  # 3984 rows: a 112-row tail
    ref = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    for impl in (None, "mosaic", "xla"):
        try:
            fn = jax.jit(lambda a, b, s, impl=impl: tokamax.ragged_dot(a, b, s, implementation=impl))
            t = time.perf_counter()
            got = fn(lhs, rhs, sizes).block_until_ready()
            first = time.perf_counter() - t
            err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
            tail = float(jnp.max(jnp.abs(got[int(sizes.sum()):].astype(jnp.float32))))
            per = _batch_seconds(lambda fn=fn: fn(lhs, rhs, sizes), 20)
            _emit({"case": "forward", "impl": impl, "first_call_s": round(first, 2), "rel_err": err,
                   "tail_max": tail, "ms_per_call": round(per * 1e3, 3),
                   "tflops": round(2 * int(sizes.sum()) * kk * n / per / 1e12, 1)}, out)
        except Exception as exc:  # an implementation this GPU or jax does not take
            _emit({"case": "forward", "impl": impl, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}, out)


def weight_gradient(tokamax, out) -> None:
    m, kk, n, g = 3840, 512, 256, 64
    k = jax.random.split(jax.random.PRNGKey(1), 2)
    lhs = jax.random.normal(k[0], (m, kk), jnp.bfloat16)
    dout = jax.random.normal(k[1], (m, n), jnp.bfloat16)
    lhs64, dout64 = np.asarray(lhs, np.float64), np.asarray(dout, np.float64)
    for sizes in (jnp.full((g,), m // g, jnp.int32), jnp.full((g,), 64, jnp.int32).at[-1].add(m - 64 * g)):
        w = jnp.zeros((g, kk, n), jnp.bfloat16)
        oracle = np.zeros((g, kk, n))
        start = 0
        for i, s in enumerate(np.asarray(sizes)):
            oracle[i] = lhs64[start:start + s].T @ dout64[start:start + s]
            start += s
        scale = np.abs(oracle).max()
        lax_grad = jax.vjp(lambda w, s=sizes: jax.lax.ragged_dot(lhs, w, s, preferred_element_type=jnp.float32), w)[1](
            dout.astype(jnp.float32))[0]
        lax_err = float(np.abs(np.asarray(lax_grad, np.float64) - oracle).max() / scale)
        for impl in (None, "mosaic", "xla"):
            try:
                fn = jax.jit(lambda a, w, d, s, impl=impl: jax.vjp(
                    lambda w: tokamax.ragged_dot(a, w, s, implementation=impl), w)[1](d)[0])
                got = np.asarray(fn(lhs, w, dout, sizes), np.float64)
                per_group = np.abs(got - oracle).max(axis=(1, 2)) / scale
                bad = np.nonzero(per_group > 2e-2)[0]
                _emit({"case": "weight_gradient", "impl": impl, "rows_per_group": int(sizes[0]),
                       "err": float(per_group.max()), "groups_bad": int(bad.size),
                       "first_bad": [int(i) for i in bad[:8]], "lax_err": lax_err}, out)
            except Exception as exc:
                _emit({"case": "weight_gradient", "impl": impl, "error": f"{type(exc).__name__}: {str(exc)[:300]}"},
                      out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the JSON lines to this file")
    args = parser.parse_args(argv)
    try:
        import tokamax
    except Exception as exc:
        print(f"tokamax does not import: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    from tokamax._src.ops.ragged_dot import api

    out = open(args.out, "w") if args.out else None  # noqa: SIM115 (closed below)
    try:
        _emit({"tokamax": tokamax.__version__, "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
               "implementations": list(api.IMPLEMENTATIONS), "default_order": list(api._DEFAULT_IMPLEMENTATIONS)},
              out)
        forward(tokamax, out)
        weight_gradient(tokamax, out)
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
