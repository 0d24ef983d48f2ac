"""Probe: which property of a router's group sizes slows the Gluon weight-gradient tiles? (graph clock)

    python benchmarks/wgrad_sizes.py [--shapes 32768,2880,5760,128 ...] [--rounds 5] [--out FILE]

On a uniform router's sizes (`ragdot.routing.routed`: about 256 +- 16 token rows an expert at gpt-oss-like's 8192
tokens) the ping-pong 128x128x64 tile took 1.31x its time on balanced sizes (2.908 against 2.219 ms), the
cooperative 128x256x32 tile 1.02x and the vendor 1.05x (H100, `ragdot tune`, benchmarks/results/h100-20261207g/c/).
A group's last chunk straddles its end whenever its size is not a multiple of the chunk depth, and that chunk's
MMAs run on zero-filled rows: about 12% more MMA work at 64-deep chunks on those sizes, 6% at 32-deep. Each
size pattern below changes one property of the balanced sizes (same total rows and experts):

- `balanced`: every group R / E rows (256 at the default shapes): chunks fill exactly, starts aligned;
- `shifted`: the same sizes but the first group 32 rows shorter and the last 32 longer: every start 32 rows off
  a 64-row chunk, no group's chunk count changed but the first and last;
- `paired`: groups alternate R/E - 64 and R/E + 64 rows: the same chunk count in total, starts still aligned,
  unequal groups (the longest-first schedule walks the long ones first);
- `plus-one`: every group but the last one row longer than balanced: one more, nearly empty chunk a group;
- `routed`: one seeded draw of a uniform router (`ragdot.routing.routed`).

Systems: `vendor` (raw torch._grouped_mm on the same operands, offsets formed beforehand) and the Gluon ragged_k
at each tile of TILES, each also with `trim` (`ragged_k.TRIM_LAST_CHUNK`: a last chunk at most half full runs the
MMAs of its first half alone; its results must equal the untrimmed ones). Rows are the median over rounds of the
median of `--reps` CUDA-graph replays; every Gluon result is compared with the vendor's (normalised error).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from wgrad_anatomy import switch
from wgrad_tiles import _shape  # the same 'R,M,N,E' shapes

from ragdot.cli_common import count
from ragdot.kernels.gluon.config import GluonConfig

TILES = (GluonConfig(128, 128, 64, 4, 4, consumers=2), GluonConfig(128, 256, 32, 6, 8),
         GluonConfig(128, 256, 64, 3, 8), GluonConfig(128, 128, 64, 4, 4))
PATTERNS = ("balanced", "shifted", "paired", "plus-one", "routed")


def pattern_sizes(name: str, r: int, e: int) -> list[int]:
    """The group sizes of pattern `name` (module docstring) for r token rows over e groups (sum r)."""
    from ragdot.routing import balanced, routed

    if name == "routed":
        return routed(r, e).tolist()
    sizes = balanced(r, e).tolist()
    if name == "shifted":
        step = min(32, sizes[0])
        sizes[0] -= step
        sizes[-1] += step
    elif name == "paired":
        for i in range(0, e - 1, 2):
            step = min(64, sizes[i])
            sizes[i] -= step
            sizes[i + 1] += step
    elif name == "plus-one":
        extra = min(e - 1, sizes[-1])
        sizes = [s + 1 for s in sizes[:-1]] + [sizes[-1] - extra]
    elif name != "balanced":
        raise ValueError(f"pattern: expected one of {', '.join(PATTERNS)}, got {name!r}")
    return sizes


def run_shape(r: int, m: int, n: int, e: int, patterns: list[str], rounds: int, reps: int) -> list[dict]:
    """Time every system on every pattern of one shape (interleaved rounds); print the table; its rows."""
    from ragdot.kernels.gluon.ragged_k import Prepared
    from ragdot.measure.checks import normalised_error
    from ragdot.measure.timing import capture_graph, interleaved_ms, warm_off_stream

    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(r, m, generator=gen).to(dev, torch.bfloat16)
    b = torch.randn(r, n, generator=gen).to(dev, torch.bfloat16)
    preps = {}
    for cfg in TILES:
        for trim in (False, True):  # `trim`: ragged_k.TRIM_LAST_CHUNK, read when the kernel is prepared
            with switch("TRIM_LAST_CHUNK", trim):
                preps[cfg.short() + (" trim" if trim else "")] = Prepared(a[None], b[None], e, a.dtype, cfg,
                                                                          from_sizes=True)
    c = torch.empty((e, 1, m, n), dtype=a.dtype, device=dev)  # one output for every Gluon graph (4 GB each)
    graphs, errors, same, inputs = {}, {}, {}, []
    for pattern in patterns:
        sizes = torch.tensor(pattern_sizes(pattern, r, e), dtype=torch.int32, device=dev)
        ends = sizes.cumsum(0).to(torch.int32)
        inputs.append((sizes, ends))  # the graphs read them at their addresses: alive until every replay is done
        calls = {"vendor": lambda ends=ends: torch._grouped_mm(a.t(), b, offs=ends)}
        for name, prep in preps.items():
            calls[name] = lambda prep=prep, sizes=sizes: prep(a[None], b[None], sizes, c)[0][:, 0]
        ref = untrimmed = None
        for name, fn in calls.items():
            warm_off_stream(fn, dev)
            out = fn()
            if ref is None:
                ref = out
            else:
                errors[(pattern, name)] = normalised_error(out, ref)
                if name.endswith(" trim"):  # the skipped products are exact zeros: equal values (-0 == +0)
                    same[(pattern, name)] = bool((out == untrimmed).all())
                    untrimmed = None
                else:
                    untrimmed = out.clone()
            graphs[f"{pattern}|{name}"] = capture_graph(fn)
            del out
        del ref, untrimmed
    times = {k: statistics.median(v) for k, v in interleaved_ms(graphs, dev, rounds, reps).items()}
    systems = ["vendor", *preps]
    print(f"R={r} M={m} N={n} E={e}: graph ms (median of {rounds} rounds of {reps} replays); "
          "in brackets the ratio to the same system on balanced sizes")
    print(f"  {'pattern':10s}" + "".join(f"{s:>30s}" for s in systems))
    rows = []
    for pattern in patterns:
        cells = []
        for system in systems:
            ms = times[f"{pattern}|{system}"]
            base = times.get(f"balanced|{system}")
            cells.append(f"{ms:.3f}" + (f" ({ms / base:.3f}x)" if base else ""))
            rows.append({"shape": [r, m, n, e], "pattern": pattern, "system": system, "graph_ms": ms,
                         "error": errors.get((pattern, system)), "equals_untrimmed": same.get((pattern, system))})
        print(f"  {pattern:10s}" + "".join(f"{cell:>30s}" for cell in cells), flush=True)
    print(f"  largest normalised error against the vendor: {max(errors.values()):.2e}; trimmed last chunks equal "
          f"to whole ones in {sum(same.values())} of {len(same)} (pattern, tile) cases")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", type=_shape, default=[(32768, 2880, 5760, 128)])
    parser.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS))
    parser.add_argument("--rounds", type=count(1), default=5)
    parser.add_argument("--reps", type=count(1), default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for shape in args.shapes:
        rows += run_shape(*shape, args.patterns, args.rounds, args.reps)
        torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"device": torch.cuda.get_device_name(), "clock": "graph", "rows": rows}
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
