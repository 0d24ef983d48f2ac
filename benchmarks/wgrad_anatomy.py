"""Probe: does the Gluon weight gradient overlap its stores with its main loop? (graph clock)

    python benchmarks/wgrad_anatomy.py [--shapes 32768,2880,5760,128 ...] [--rounds 5] [--out FILE]
    python benchmarks/wgrad_anatomy.py --compile-only      # build every variant for sm_90 on any machine

At the MoE layer's fine-grained widths (gpt-oss-like: 256 token rows an expert at 8192 tokens) each output tile of
the weight gradient has a short main loop, and the output (E x M x N, 4.2 GB for gpt-oss-like's w_gate_up) is written
once. Nsight Compute found neither the tensor cores nor DRAM past 63% busy. If a tile's store and the next tile's
main loop ran side by side, the kernel would take about the longer of the two; if one waits for the other, their
sum. Per shape 'R,M,N,E' (token rows, output rows, output columns, experts; bf16, balanced group sizes), the same
kernel (`ragdot.kernels.gluon.ragged_k`) runs as

- `<tile> <epilogue>`: the whole kernel with each epilogue (`blocked` pointer stores, `tma` one epilogue buffer,
  `tma2` two buffers, so a store waits for the store two tiles before it);
- `<tile> none`: the main loops alone (no store; `EPILOGUE = "none"`);
- `<tile> <epilogue>-stores`: that epilogue's stores alone (every group empty: each tile stores its zeros, no chunk
  is loaded);

beside `vendor` (raw torch._grouped_mm on the same operands, offsets formed beforehand). The report gives, per tile
and epilogue, `overlap` = (none + stores - whole) / min(none, stores): 0 when the two phases run one after the other,
1 when the shorter one hides entirely under the longer. For the ping-pong tiles (`consumers=2`) `none` is no floor:
at gpt-oss-like's w_gate_up the 64x256 tile's main loops alone took 2.528 ms against 2.100 whole
(benchmarks/results/h100-20261207f/), so an overlap above 1 there says nothing. Every whole-kernel variant of a tile
is checked bitwise against the first (same chunks, same order of accumulation).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from wgrad_tiles import _shape  # the same 'R,M,N,E' shapes

from ragdot.cli_common import count
from ragdot.kernels.gluon.config import GluonConfig

TILES = (GluonConfig(128, 256, 32, 6, 8), GluonConfig(128, 256, 32, 4, 8), GluonConfig(128, 128, 64, 4, 4),
         GluonConfig(128, 128, 64, 5, 4, consumers=2), GluonConfig(64, 256, 64, 4, 4, consumers=2))
EPILOGUES = ("blocked", "tma", "tma2")


@contextlib.contextmanager
def switch(name: str, value: object, module: object = None) -> Iterator[None]:
    """The module switch `module.<name>` (default module: `ragdot.kernels.gluon.ragged_k`) set to `value` while
    kernels are prepared."""
    if module is None:
        from ragdot.kernels.gluon import ragged_k as module

    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def epilogue(name: str) -> contextlib.AbstractContextManager[None]:
    """`ragdot.kernels.gluon.ragged_k.EPILOGUE` set to `name` while kernels are prepared."""
    return switch("EPILOGUE", name)


def prepared(a: torch.Tensor, b: torch.Tensor, e: int, cfg: GluonConfig, mode: str) -> object:
    """The Gluon ragged_k of a [R, M] x b [R, N] with `cfg` and EPILOGUE `mode`, or why it does not fit (str)."""
    from ragdot.kernels.gluon.ragged_k import Prepared

    try:
        with epilogue(mode):
            return Prepared(a[None], b[None], e, a.dtype, cfg, from_sizes=True)
    except NotImplementedError as exc:
        return f"{exc}"


def variants(a: torch.Tensor, b: torch.Tensor, e: int, sizes: torch.Tensor, tiles=TILES, epilogues=EPILOGUES,
             parts: bool = True) -> dict[str, object]:
    """name -> a call returning c [E, M, N] (or, where the variant does not fit this GPU, the reason); `parts`: the
    main-loop-only and stores-only variants too."""
    zeros = torch.zeros_like(sizes)
    calls: dict[str, object] = {}
    for cfg in tiles:
        names = (*epilogues, "none", *(f"{ep}-stores" for ep in epilogues)) if parts else epilogues
        for name in names:
            prep = prepared(a, b, e, cfg, name.removesuffix("-stores"))
            use = zeros if name.endswith("-stores") else sizes
            calls[f"{cfg.short()} {name}"] = prep if isinstance(prep, str) else (
                lambda prep=prep, use=use: prep(a[None], b[None], use)[0][:, 0])
    return calls


def _split(name: str) -> tuple[str, str]:
    """'<tile> <kind>' -> (tile, kind); ("vendor", "") for the vendor's row."""
    return (name, "") if name == "vendor" else tuple(name.rsplit(" ", 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", type=_shape,
                        default=[(32768, 2880, 5760, 128), (32768, 2880, 2880, 128), (65536, 2048, 1536, 128)])
    parser.add_argument("--rounds", type=count(1), default=5)
    parser.add_argument("--reps", type=count(1), default=10)
    parser.add_argument("--tiles", nargs="+", type=int, choices=range(len(TILES)), default=list(range(len(TILES))),
                        help="indices into TILES (default: all)")
    parser.add_argument("--epilogues", nargs="+", choices=EPILOGUES, default=list(EPILOGUES))
    parser.add_argument("--no-parts", action="store_true", help="whole kernels only (no main-loop or stores runs)")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.compile_only:
        return _compile_only(args.shapes[0])
    from ragdot.measure.timing import capture_graph, interleaved_ms, warm_off_stream
    from ragdot.routing import group_sizes

    dev = torch.device("cuda")
    rows: list[dict] = []
    for r, m, n, e in args.shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(r, m, generator=gen).to(dev, torch.bfloat16)
        b = torch.randn(r, n, generator=gen).to(dev, torch.bfloat16)
        sizes = group_sizes("balanced", r, e, device=dev).to(torch.int32)
        ends = sizes.cumsum(0).to(torch.int32)
        calls = {"vendor": lambda a=a, b=b, ends=ends: torch._grouped_mm(a.t(), b, offs=ends)}
        calls.update(variants(a, b, e, sizes, [TILES[i] for i in args.tiles], args.epilogues, not args.no_parts))
        graphs, checks, first = {}, {}, {}
        for name, fn in calls.items():
            if isinstance(fn, str):
                checks[name] = f"not run: {fn}"
                continue
            tile, kind = _split(name)
            try:
                warm_off_stream(fn, dev)
                out = fn()
                torch.cuda.synchronize()
                if kind in EPILOGUES:
                    if tile not in first:  # the tile's first epilogue is the reference: one copy a tile
                        first[tile] = out.clone()
                    ref = first[tile]
                    checks[name] = "bitwise" if torch.equal(out, ref) else "differs from the tile's first epilogue"
                else:
                    checks[name] = "-"
                graphs[name] = capture_graph(fn)
            except Exception as exc:  # a variant that fails here is a row with its error
                checks[name] = f"{type(exc).__name__}: {exc}"[:300]
        times = {name: statistics.median(v) for name, v in interleaved_ms(graphs, dev, args.rounds, args.reps).items()}
        print(f"R={r} M={m} N={n} E={e}: graph ms (median of {args.rounds} rounds of {args.reps} replays)")
        flops = 2 * r * m * n
        for name, check in checks.items():
            ms = times.get(name)
            row = {"shape": [r, m, n, e], "system": name, "graph_ms": ms, "check": check}
            if ms is not None:
                row["tflops"] = flops / ms / 1e9
                tile, kind = _split(name)
                alone = (times.get(f"{tile} none"), times.get(f"{tile} {kind}-stores"))
                if kind in EPILOGUES and None not in alone:
                    row["overlap"] = (alone[0] + alone[1] - ms) / min(alone)
            rows.append(row)
            text = "not run" if ms is None else f"{ms:8.3f} ms {flops / ms / 1e9:5.0f} TFLOP/s"
            extra = f"  overlap {row['overlap']:.2f}" if "overlap" in row else ""
            print(f"  {name:32s} {text}{extra}  ({check})", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"device": torch.cuda.get_device_name(dev), "clock": "graph", "rows": rows}
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


def _compile_only(shape: tuple[int, int, int, int]) -> int:
    """Build every variant for sm_90 without a GPU (ragdot.kernels.configs.compile_only); prints registers,
    spills and shared memory per variant."""
    from ragdot.kernels.configs import compile_only, resource_usage

    r, m, n, e = shape
    with compile_only(90):
        a, b = torch.empty(r, m, dtype=torch.bfloat16), torch.empty(r, n, dtype=torch.bfloat16)
        sched = torch.zeros(3, e, dtype=torch.int32)
        for cfg in TILES:
            for name in (*EPILOGUES, "none"):
                prep = prepared(a, b, e, cfg, name)
                if isinstance(prep, str):
                    print(f"{cfg.short()} {name}: not built ({prep})")
                    continue
                handle = prep(a[None], b[None], None, sched=sched)[1]
                print(f"{cfg.short()} {name}:", resource_usage(handle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
