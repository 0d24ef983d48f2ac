"""Dynamo's guard check before each compiled decode step of a transformers MoE model, per experts
implementation: the host time torch.compile spends deciding that a cached graph still applies.

    PYTHONPATH=src python3 benchmarks/guard_cost.py [--model gpt-oss] [--full] [--device cuda] [--impls ...]

Builds one model per implementation (tiny CPU configs by default; `--full`: `ragdot bench-models`' widths),
compiles a decode step of each in one process, then times the passing cache entry's guard check directly
(`guard_manager.check` on the step's frame locals), the implementations alternating, min over 40 rounds of 100
checks. Clock: host (perf_counter). Reads dynamo's private cache-entry list, so it follows torch as it changes.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

import ragdot.integrations.transformers as rt
from ragdot.bench.models import MODELS, TINY_MODELS, _cache_of, _ids, build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt-oss")
    p.add_argument("--full", action="store_true", help="the benchmark widths (default: the tiny CPU config)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--impls", nargs="+", default=["grouped_mm", "ragdot"])
    p.add_argument("--layers", type=int, help="override the config's layer count (guards grow with it)")
    args = p.parse_args()
    rt.register()
    dev = torch.device(args.device)
    spec = (MODELS if args.full else TINY_MODELS)[args.model]
    if args.layers is not None:
        spec = replace(spec, config={**spec.config, "num_hidden_layers": args.layers})
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    frames = {}
    code = None
    for impl in args.impls:
        torch.manual_seed(0)
        model = build_model(spec, dev, dtype).eval()
        model.set_experts_implementation(impl)
        run = torch.compile(model)
        with torch.no_grad():
            out = model(_ids(spec, 1, spec.prefill_len, dev), use_cache=True, logits_to_keep=1)
            cache, nxt = _cache_of(out), out.logits[:, -1:].argmax(-1)
            for _ in range(4):
                out = run(nxt, use_cache=True, past_key_values=cache)
                cache, nxt = _cache_of(out), out.logits[:, -1:].argmax(-1)
        forward = type(model).forward  # the frame dynamo compiled: the outermost forward wrapper
        code = forward.__code__
        f_locals = {"self": model, "args": (nxt,), "kwargs": {"use_cache": True, "past_key_values": cache}}
        f_locals.update({n: c.cell_contents for n, c in zip(code.co_freevars, forward.__closure__ or ())})
        frames[impl] = f_locals
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(code)
    best: dict[str, list] = {}
    with torch.no_grad():
        for impl, f_locals in frames.items():
            passing = [e.guard_manager for e in entries if e.guard_manager.check(f_locals)]
            if len(passing) != 1:
                raise SystemExit(f"{impl}: {len(passing)} cache entries pass (expected 1)")
            best[impl] = [passing[0], float("inf")]
        for _ in range(40):
            for impl, f_locals in frames.items():
                check = best[impl][0].check
                t0 = time.perf_counter()
                for _ in range(100):
                    check(f_locals)
                best[impl][1] = min(best[impl][1], (time.perf_counter() - t0) / 100 * 1e6)
    size = "full" if args.full else "tiny"
    layers = spec.config["num_hidden_layers"]
    print(f"guard check per decode step ({args.model} {size}, {layers} layers, {dev.type}; host clock, "
          "min of 40 x 100): "
          + ", ".join(f"{impl} {b[1]:.1f} us" for impl, b in best.items()))


if __name__ == "__main__":
    main()
