"""A/B of the eager calls' C replay (`ragdot.kernels.replay`) in one process: the same prepared calls with
replay active and paused (`replay.set_active`), beside raw `torch._grouped_mm` with its cumsum, interleaved.

    python benchmarks/replay_ab.py --shapes deepseek3-test qwen3-30b-a3b --repeats 9 --out DIR

Systems: `raw+cumsum` (the baseline of `ragdot host-bench`), and `ragdot.ragged_dot` on `--backends` (default
triton and auto), each `:replay` and `:python`; phases `fwd` (one forward call) and `fwdbwd` (forward, then
`.backward(dy)` with both inputs requiring grad; their `.grad` reset before each call). Every call of every
system runs inside the same wrapper (setting the replay switch), so the wrapper's cost is the same for all.
Clocks: host (wall clock around back-to-back calls, per call; median of `--repeats` passes, the systems'
passes alternating; `ragdot.measure.host.time_host_interleaved`), eager (CUDA events around the same chunks)
and device (the GPU held until a chunk is queued). Before the timing, each ragdot system's output and
gradients are compared bitwise with and without replay. Writes DIR/replay-ab.json and prints a table. CUDA
only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from ragdot.bench.host import make_call, make_operands  # noqa: E402
from ragdot.kernels import replay  # noqa: E402
from ragdot.measure.host import time_host_interleaved  # noqa: E402
from ragdot.shapes import get_shape  # noqa: E402


def _switched(call, active: bool):
    def run():
        replay.set_active(active)
        return call()

    return run


def _bits(backend: str, ops) -> list[torch.Tensor]:
    import ragdot

    x, w = ops.x_leaf, ops.w_leaf
    x.grad = w.grad = None
    y = ragdot.ragged_dot(x, w, ops.group_sizes, backend=backend)
    y.backward(ops.dy)
    return [y.detach().clone(), x.grad.clone(), w.grad.clone()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["deepseek3-test", "qwen3-30b-a3b"])
    p.add_argument("--backends", nargs="+", default=["triton", "auto"])
    p.add_argument("--phases", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("replay_ab.py: needs a CUDA device")
    device = torch.device("cuda")
    rows = []
    for name in args.shapes:
        ops = make_operands(get_shape(name), torch.bfloat16, device, "balanced", seed=0)
        for backend in args.backends:  # bitwise: replay against the Python path (after warm-up, both settled)
            replay.set_active(False)
            for _ in range(3):
                want = _bits(backend, ops)
            replay.set_active(True)
            for _ in range(3):
                got = _bits(backend, ops)
            same = all(torch.equal(a, b) for a, b in zip(want, got))
            rows.append({"shape": name, "system": f"ragdot-{backend}", "check": "bitwise", "equal": same})
            print(f"{name} {backend}: replay and Python path bitwise equal: {same}")
        for phase in args.phases:
            named = {"raw+cumsum": _switched(make_call("raw+cumsum", phase, ops), True)}
            for backend in args.backends:
                call = make_call(f"ragdot-{backend}", phase, ops)
                named[f"ragdot-{backend}:replay"] = _switched(call, True)
                named[f"ragdot-{backend}:python"] = _switched(call, False)
            timed = time_host_interleaved(named, device, calls=args.calls, repeats=args.repeats, warmup=20,
                                          chunk=args.chunk)
            replay.set_active(True)
            base = timed["raw+cumsum"].host_us
            print(f"{name} {phase}: host µs per call (x raw+cumsum), eager µs, device µs")
            for system, t in timed.items():
                print(f"  {system:24} {t.host_us:8.1f} ({t.host_us / base:.2f}x)  eager {t.eager_us or 0:8.1f}"
                      f"  device {t.device_us or 0:8.1f}")
                rows.append({"shape": name, "phase": phase, "system": system, "host_us": round(t.host_us, 2),
                             "ratio": round(t.host_us / base, 3), "eager_us": t.eager_us, "device_us": t.device_us,
                             "calls": t.calls})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bfloat16",
                "routing": "balanced", "clock": "host: wall clock per call; eager/device: CUDA events"}
        (args.out / "replay-ab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
