"""ragdot.jax on single bench cells: time per call outside the bench, the kernels a call runs, the backend it picks.

    python benchmarks/jax_cell_probe.py --out DIR      # GPU; writes DIR/jax_cell_probe.json

Sections, each printed as JSON lines as it finishes (`loop` and `kernels` only when asked for):
- `per_call` (3840x2048x1408 with 64 and with 8 groups, 16384x4096x4096 with 8 groups, bf16): a jitted
  `ragdot.jax.ragged_dot` on one operand set, rotating over six, and over six shared from torch through
  DLPack (as `ragdot bench` makes them); jitted `jax.lax.ragged_dot`; ragdot's PyTorch call (triton and
  auto). Clocks: the JAX calls, host wall time of a batch of 50 calls (5 for jax.lax) ending in one wait,
  per call, median of 5 batches; ragdot's PyTorch call, `ragdot.measure.host.time_host`'s host, eager and
  device time per call. With the kernels of 10 jitted calls from torch's profiler (CUPTI sees XLA's stream
  too).
- `backends` (mixtral-8x7b's weight gradient, wgrad_wi: 15360x6144 by 15360x20480 into 32 groups): the
  jitted call with backend None (auto), "triton" and "torch", each with the kernels one call runs; ragdot's
  PyTorch call with the same three. Clocks as above, batches of 10 calls (one batch for the JAX calls).
  (The first system timed in a process ran about 2.5x slower than its own kernels in both runs of this
  section on the H200; read the kernel times beside the wall times.)
- `loop` (128x128x128x8, deepseek3-test's 5120x512x512x256, 3840x2048x1408x64): the program clock's cost
  per turn for ragdot.jax on triton beside ragdot's PyTorch call's device time, with the kernels of a
  10-turn program, and XLA's own floor per turn (a tiny fusion as the call).
- `kernels` (the 48 anchor cells, balanced, bf16): a call's device time as the sum of its kernels' durations
  (CUPTI) for the bench's ragdot-jax system and its triton system.

Written to explain two findings of the 48-cell JAX bench: cells timed at 0.4-1.5 ms a call whose kernels
run 0.1 ms (a clock that waited after every call; fixed in ragdot.measure.timing), and mixtral-8x7b's
weight gradient 25% slower than ragdot's PyTorch call (the auto choice's copy into XLA's buffer).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.30")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import ragdot  # noqa: E402
import ragdot.jax as rj  # noqa: E402
from ragdot.dimension_numbers import RaggedDotDimensionNumbers  # noqa: E402
from ragdot.measure.host import async_us_per_call, time_host  # noqa: E402

CPU = torch.device("cpu")  # the JAX calls' clock: the host's (their stream is XLA's)


def _per_call_us(fn, args_list, calls: int, batches: int = 5) -> float:
    """Host wall time per call of `calls` jitted calls rotating over `args_list`, ending in one wait
    (median of `batches` such batches, after warm-up calls)."""
    return async_us_per_call(fn, args_list, calls, repeats=batches, warmup=2)


def _torch_us(call, calls: int) -> dict[str, float | None]:
    """ragdot's PyTorch call: host, eager (CUDA events, host included) and device time per call, µs."""
    t = time_host(call, torch.device("cuda"), calls=calls, repeats=5, warmup=3)
    return {"host_us": t.host_us, "eager_us": t.eager_us, "device_us": t.device_us}


def _kernels(run) -> dict[str, list]:
    """{kernel name: [count, device µs per launch]} of what `run()` launches."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    found = {}
    for e in prof.key_averages():
        total = getattr(e, "self_device_time_total", 0)
        # device events only: a host op range (ragdot::ragged_k, aten::...) carries its kernels' time too
        if total > 0 and str(getattr(e, "device_type", "CUDA")).endswith(("CUDA", "PrivateUse1")):
            found[e.key[:80]] = [e.count, round(total / max(e.count, 1), 1)]
    return found


def _jax_sets(m: int, k: int, n: int, g: int, sets: int, via_torch: bool) -> list[tuple]:
    out = []
    for s in range(sets):
        sizes = [m // g] * g
        sizes[-1] += m - sum(sizes)
        if via_torch:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(g, k, n, device="cuda", dtype=torch.bfloat16)
            sz = torch.tensor(sizes, device="cuda", dtype=torch.int32)
            torch.cuda.synchronize()
            out.append(tuple(jax.dlpack.from_dlpack(t) for t in (a, b, sz)))
        else:
            key = jax.random.split(jax.random.PRNGKey(s), 2)
            out.append((jax.random.normal(key[0], (m, k), jnp.bfloat16),
                        jax.random.normal(key[1], (g, k, n), jnp.bfloat16), jnp.array(sizes, jnp.int32)))
    return out


def per_call(emit) -> None:
    fn = jax.jit(lambda a, b, s: rj.ragged_dot(a, b, s))
    lax = jax.jit(lambda a, b, s: jax.lax.ragged_dot(a, b, s))
    for m, k, n, g in [(3840, 2048, 1408, 64), (3840, 2048, 1408, 8), (16384, 4096, 4096, 8)]:
        row: dict = {"section": "per_call", "shape": f"{m}x{k}x{n}x{g}"}
        one, six = _jax_sets(m, k, n, g, 1, False), _jax_sets(m, k, n, g, 6, False)
        shared = _jax_sets(m, k, n, g, 6, True)
        row["ragdot_jax_one_set_us"] = _per_call_us(fn, one, 50)
        row["ragdot_jax_six_sets_us"] = _per_call_us(fn, six, 50)
        row["ragdot_jax_six_dlpack_sets_us"] = _per_call_us(fn, shared, 50)
        row["jax_lax_us"] = _per_call_us(lax, one, 5)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(g, k, n, device="cuda", dtype=torch.bfloat16)
        sz = torch.full((g,), m // g, device="cuda", dtype=torch.int32)
        for backend in ("triton", None):
            row[f"torch_{backend or 'auto'}"] = _torch_us(
                lambda a=a, b=b, sz=sz, backend=backend: ragdot.ragged_dot(a, b, sz, backend=backend), 50)

        def ten_calls(six=six):
            out = None
            for i in range(10):
                out = fn(*six[i % 6])
            out.block_until_ready()

        row["kernels_of_10_calls"] = _kernels(ten_calls)
        emit(row)


def backends(emit) -> None:
    m, k, n, g = 15360, 6144, 20480, 32
    jdn = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((0,), (0,)), ((), ())),
                                            lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
    key = jax.random.split(jax.random.PRNGKey(0), 2)
    lhs = jax.random.normal(key[0], (m, k), jnp.bfloat16)
    rhs = jax.random.normal(key[1], (m, n), jnp.bfloat16)
    sizes = jnp.full((g,), m // g, jnp.int32)
    for backend in (None, "triton", "torch"):
        fn = jax.jit(lambda a, b, s, backend=backend: rj.ragged_dot_general(a, b, s, jdn, backend=backend))
        row = {"section": "backends", "system": "ragdot.jax", "backend": backend or "auto"}
        try:
            row["ms_per_call"] = _per_call_us(fn, [(lhs, rhs, sizes)], 10, batches=1) / 1e3
            row["kernels_of_1_call"] = _kernels(lambda fn=fn: fn(lhs, rhs, sizes).block_until_ready())
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        emit(row)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    sz = torch.full((g,), m // g, device="cuda", dtype=torch.int32)
    tdn = RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), (0,), ())
    for backend in (None, "triton", "torch"):
        times = _torch_us(lambda backend=backend: ragdot.ragged_dot_general(a, b, sz, tdn, backend=backend), 10)
        emit({"section": "backends", "system": "ragdot (torch)", "backend": backend or "auto", **times})


def loop(emit) -> None:
    """Per turn of the program clock's loop (`ragdot.bench.xla.us_per_turn`, 100 turns) for ragdot.jax on
    triton, beside ragdot's PyTorch call's device time (launches queued behind a spin kernel) and the kernels
    of a 10-turn program; and the loop's own floor: a turn whose call is one tiny XLA fusion (a [8] array
    scaled), and ragdot.jax at a tiny shape (where the turn is the host's)."""
    from ragdot.bench.xla import looped, us_per_turn

    scale = lambda a, b, s: a * 1.0001
    tiny = jnp.ones((8,), jnp.bfloat16), jnp.ones((8,), jnp.bfloat16), jnp.ones((1,), jnp.int32)
    emit({"section": "loop", "what": "XLA's floor: a [8] scale per turn",
          "us_per_turn": us_per_turn(jax, scale, tiny)})
    fn = lambda a, b, s: rj.ragged_dot(a, b, s, backend="triton")
    for m, k, n, g in [(128, 128, 128, 8), (5120, 512, 512, 256), (3840, 2048, 1408, 64)]:
        (args,) = _jax_sets(m, k, n, g, 1, False)
        row: dict = {"section": "loop", "shape": f"{m}x{k}x{n}x{g}",
                     "ragdot_jax_us_per_turn": us_per_turn(jax, fn, args)}
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(g, k, n, device="cuda", dtype=torch.bfloat16)
        sz = torch.full((g,), m // g, device="cuda", dtype=torch.int32)
        row["torch_triton"] = _torch_us(lambda a=a, b=b, sz=sz: ragdot.ragged_dot(a, b, sz, backend="triton"), 50)
        program = looped(jax, fn)
        program(*args, n=10).block_until_ready()
        row["kernels_of_10_turns"] = _kernels(lambda p=program, a=args: p(*a, n=10).block_until_ready())
        emit(row)


def _wait(out) -> None:
    if hasattr(out, "block_until_ready"):
        out.block_until_ready()
    elif torch.cuda.is_available():
        torch.cuda.synchronize()


def _kernel_us(run, calls: int) -> tuple[float, dict[str, list]]:
    """Device µs per call summed over every kernel and copy `run()` (`calls` calls) launches (CUPTI)."""
    found = _kernels(run)
    return sum(n * us for n, us in found.values()) / calls, found


def kernels(emit, device: str = "cuda", tag: str = "anchor") -> None:
    """Per anchor cell (48, balanced routing, bf16): the device time of a call as the sum of its kernels'
    durations (CUPTI, 10 calls, after warm-up), for ragdot.jax's jitted call (`ragdot bench`'s ragdot-jax
    system) and ragdot's PyTorch call on triton (its triton system): the bridge's device cost, apart from
    the host's and XLA's loop's."""
    from ragdot.bench.ceilings import Ceilings
    from ragdot.bench.jax_system import RagdotJaxSystem
    from ragdot.bench.runner import BenchConfig, make_operands
    from ragdot.bench.systems import RagdotSystem
    from ragdot.measure.classes import CLASSES
    from ragdot.shapes import shapes_with_tag

    where = torch.device(device)
    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    cfg = BenchConfig(where, dtype, Ceilings(1.0, 1.0))  # operands only: no ceilings needed
    systems = {"ragdot-jax": RagdotJaxSystem(where), "triton": RagdotSystem("triton")}
    for shape in shapes_with_tag(tag):
        for cls in CLASSES:
            sets = [make_operands(cls, shape, "balanced", cfg)]
            row: dict = {"section": "kernels", "shape": shape.name, "cls": cls.name}
            for name, system in systems.items():
                (call,) = system.prepare(cls, sets, dtype)
                for _ in range(3):
                    call()
                _wait(call())

                def ten(call=call):
                    for _ in range(9):
                        call()
                    _wait(call())

                row[f"{name}_kernel_us"], row[f"{name}_kernels"] = _kernel_us(ten, 10)
                system.release()
            row["ratio"] = row["triton_kernel_us"] / max(row["ragdot-jax_kernel_us"], 1e-9)
            emit(row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", nargs="+", choices=("per_call", "backends", "loop", "kernels"),
                        default=["per_call", "backends"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("jax_cell_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "jax_cell_probe.json").write_text(json.dumps(rows, indent=1))

    for name in args.sections:
        {"per_call": per_call, "backends": backends, "loop": loop, "kernels": kernels}[name](emit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
