"""`ragdot ep-bench`: expert-parallel dispatch and combine against NCCL's own all-to-all, and the layer step.

    torchrun --nproc-per-node=8 -m ragdot ep-bench --configs qwen3-30b-a3b --tokens-per-rank 4096 --out DIR
    python -m ragdot ep-bench --device cpu                  # one process: gloo on the CPU (world size 1)

Started by torchrun, it joins the env:// group (NCCL on GPUs, rank r on cuda:LOCAL_RANK); started alone, it
makes a group of one (NCCL on one GPU, or gloo on the CPU). Every rank routes its own random tokens with the
layer's router (same weights everywhere, tokens seeded by rank). Phases, each timed per rank (CUDA events on a
GPU, the wall clock on a CPU; the median of --steps calls, a barrier before each call):
- `dispatch`: ``ExpertParallel.dispatch``: permute, count exchange, the host read of the splits, the rows'
  all_to_all_single; `combine`: ``ExpertParallel.combine``: the reverse all_to_all_single and the weighted
  top-k sum. Both forward only, without autograd.
- `nccl_dispatch`, `nccl_combine`: the bare ``all_to_all_single`` on the same bytes and splits into
  preallocated buffers (the collective's own ceiling in the same run).
- `layer_fwdbwd`: ``MoELayer(..., ep_group=group)`` forward + backward per step (E/W experts per rank).
- `local_fwdbwd`: a one-device ``MoELayer`` with E/W experts on the same tokens per rank (no exchange):
  the per-rank layer time that expert parallelism is measured against.
- `capacity_fwd`: the layer's forward in the sync-free capacity mode (``path="dense_drop"``), eager; bytes:
  the E*C-row buffer a rank sends. `capacity_fwd_graph` (CUDA, only when named in --phases): the same
  forward captured in one CUDA graph and replayed, which shows that the mode captures.

gbs is the bytes this rank sends (every block, its own included, as NCCL's tests count them) per second;
bus_gbs = gbs * (W-1)/W. Rank 0 writes <out>/ragdot-ep-<gpu>-<commit>-w<W>-<date>.csv and .json, one row per
rank and phase (default out: ./ragdot-results).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ragdot.cli_common import (
    add_device,
    add_dtype,
    add_out,
    add_quiet,
    check_out,
    count,
    error_line,
    parse_device,
    parse_dtype,
)
from ragdot.measure import records
from ragdot.measure.records import safe_name
from ragdot.measure.timing import capture_graph, synchronize, timed_call, warm_off_stream

HELP = "expert parallelism: dispatch/combine GB/s per rank against NCCL all_to_all_single, layer fwd+bwd ms"

DEFAULT_PHASES: tuple[str, ...] = (
    "dispatch", "nccl_dispatch", "combine", "nccl_combine", "layer_fwdbwd", "local_fwdbwd", "capacity_fwd",
)  # fmt: skip
PHASES: tuple[str, ...] = (*DEFAULT_PHASES, "capacity_fwd_graph")  # CUDA only, asked for by name
COLUMNS: tuple[str, ...] = (
    *("gpu", "world_size", "config", "tokens_per_rank", "phase", "ms", "gbs"),
    *("rank", "bytes", "bus_gbs", "steps", "clock", "dtype", "backend", "dist_backend", "commit", "date"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--configs", nargs="+", metavar="NAME", help="ragdot.moe.model configs (default qwen3-30b-a3b; CPU: tiny)")
    add("--tokens-per-rank", type=count(1), nargs="+", metavar="T", help="tokens on each rank (default 4096; CPU: 64)")
    add("--phases", nargs="+", metavar="PHASE",
        help=f"some of {' '.join(PHASES)} (default all but capacity_fwd_graph)")
    add("--backend", help="ragdot backend of the grouped GEMMs (default: the layer's default)")
    add("--dist-backend", choices=("nccl", "gloo"), help="torch.distributed backend (default nccl on CUDA)")
    add("--steps", type=count(1), help="timed calls per phase, the median is kept (default 20; CPU: 3)")
    add("--warmup", type=count(0), help="untimed calls first (default 3)")
    add_dtype(parser, "bf16 on CUDA, fp32 on a CPU")
    add_device(parser, "cuda:LOCAL_RANK if available, else cpu")
    add_out(parser, "ragdot-results", "CSV and JSON (written by rank 0)")
    add_quiet(parser)
    add("--commit", help="commit id for the records (default: git rev-parse --short HEAD)")
    add("--seed", type=int, default=0, help="seed of the weights (tokens: seed + 1 + rank)")


def run(args: argparse.Namespace) -> int:
    try:
        device, created = _init(args)
    except ValueError as exc:
        return error_line("ep-bench", exc)
    try:
        return _run(args, device)
    except ValueError as exc:
        return error_line("ep-bench", exc)
    finally:
        if created:
            dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ setup
def _init(args: argparse.Namespace) -> tuple[torch.device, bool]:
    """The device of this rank and whether a process group was made here (to be destroyed at the end)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device is None and torch.cuda.is_available():
        device = torch.device("cuda", local)
    else:
        device = parse_device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    check_out(args.out)
    if dist.is_initialized():
        return device, False
    backend = args.dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("--dist-backend nccl needs a CUDA --device")
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:  # torchrun
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device, True


def _pick(values: list[Any] | None, default: list[Any]) -> list[Any]:
    return list(values) if values else default


def _settings(args: argparse.Namespace, cuda: bool) -> dict[str, Any]:
    phases = _pick(args.phases, list(DEFAULT_PHASES))
    for p in phases:
        if p not in PHASES:
            raise ValueError(f"--phases: {p!r} is unknown; expected some of {', '.join(PHASES)}")
    if "capacity_fwd_graph" in phases and not cuda:
        raise ValueError("--phases capacity_fwd_graph needs a CUDA device (it replays a CUDA graph)")
    tokens = _pick(args.tokens_per_rank, [4096 if cuda else 64])
    steps = args.steps if args.steps is not None else (20 if cuda else 3)
    warmup = args.warmup if args.warmup is not None else 3
    return {
        "configs": _pick(args.configs, ["qwen3-30b-a3b" if cuda else "tiny"]),
        "tokens": tokens, "phases": phases, "steps": steps, "warmup": warmup,
        "dtype": parse_dtype(args.dtype, "bf16" if cuda else "fp32"),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------ timing
def _time(fn: Callable[[], Any], device: torch.device, steps: int, warmup: int) -> tuple[float, int]:
    """Median ms of fn() over `steps` calls, each after a barrier (the ranks start together)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    ms = []
    for _ in range(steps):
        dist.barrier()
        synchronize(device)
        ms.append(timed_call(fn, device)[0])
    return statistics.median(ms), len(ms)


def _layers(cfg: Any, world: int, dtype: torch.dtype, device: torch.device, args: argparse.Namespace):
    from ragdot.moe.layer import MoELayer

    torch.manual_seed(args.seed)
    common = dict(dtype=dtype, device=device, backend=args.backend)
    ep = MoELayer(cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, ep_group=dist.group.WORLD, **common)
    local_experts = cfg.num_experts // world
    local = MoELayer(cfg.dim, cfg.moe_hidden, local_experts, min(cfg.top_k, local_experts), **common)
    return ep, local


def _measure_config(cfg: Any, tokens: int, s: dict[str, Any], device: torch.device, args) -> list[dict[str, Any]]:
    """This rank's rows of one config and token count."""
    world = dist.get_world_size()
    ep_layer, local_layer = _layers(cfg, world, s["dtype"], device, args)
    ep = ep_layer.ep
    gen = torch.Generator(device=device).manual_seed(args.seed + 1 + dist.get_rank())
    x = torch.randn((tokens, cfg.dim), generator=gen, device=device, dtype=s["dtype"])
    dy = torch.randn_like(x)
    with torch.no_grad():
        routed = ep_layer.router(x)
        recv, plan = ep.dispatch(x, routed.experts, ep_layer.routing_impl)
    itemsize = x.element_size()
    sent = sum(plan.send_splits) * cfg.dim * itemsize
    received = sum(plan.recv_splits) * cfg.dim * itemsize
    rows_in, rows_out = x.new_empty((sum(plan.send_splits), cfg.dim)), torch.empty_like(recv)

    def no_grad(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            with torch.no_grad():
                return fn()
        return call

    def step(layer) -> Callable[[], Any]:
        def call() -> None:
            layer.zero_grad(set_to_none=True)
            layer(x).backward(dy)
        return call

    def capacity() -> None:  # the sync-free mode, forward only
        ep_layer.path = "dense_drop"
        try:
            with torch.no_grad():
                ep_layer(x)
        finally:
            ep_layer.path = "sparse"

    cap_bytes = cfg.num_experts * ep_layer.capacity(tokens) * cfg.dim * itemsize
    calls: dict[str, tuple[Callable[[], Any], int | None]] = {
        "dispatch": (no_grad(lambda: ep.dispatch(x, routed.experts, ep_layer.routing_impl)), sent),
        "nccl_dispatch": (lambda: dist.all_to_all_single(rows_out, rows_in, plan.recv_splits, plan.send_splits), sent),
        "combine": (no_grad(lambda: ep.combine(recv, plan, routed.weights)), received),
        "nccl_combine": (lambda: dist.all_to_all_single(rows_in, rows_out, plan.send_splits, plan.recv_splits),
                         received),
        "layer_fwdbwd": (step(ep_layer), None),
        "local_fwdbwd": (step(local_layer), None),
        "capacity_fwd": (capacity, cap_bytes),
    }  # fmt: skip
    rows = []
    for phase in s["phases"]:
        if phase == "capacity_fwd_graph":
            warm_off_stream(capacity, device)
            fn, nbytes = capture_graph(capacity), cap_bytes
        else:
            fn, nbytes = calls[phase]
        ms, steps = _time(fn, device, s["steps"], s["warmup"])
        gbs = None if nbytes is None or ms <= 0 else nbytes / ms / 1e6
        bus = None if gbs is None else gbs * (world - 1) / world
        rows.append({"config": cfg.name, "tokens_per_rank": tokens, "phase": phase, "ms": round(ms, 4),
                     "gbs": _round(gbs), "rank": dist.get_rank(), "bytes": nbytes, "bus_gbs": _round(bus),
                     "steps": steps, "clock": "event" if device.type == "cuda" else "wall"})  # fmt: skip
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ------------------------------------------------------------------------------------------ run
def _run(args: argparse.Namespace, device: torch.device) -> int:
    from ragdot.moe.model import get_config

    s = _settings(args, device.type == "cuda")
    world, rank = dist.get_world_size(), dist.get_rank()
    try:
        configs = [get_config(name) for name in s["configs"]]
    except ValueError as exc:
        raise ValueError(f"--configs: {exc}") from None
    for cfg in configs:
        if cfg.num_experts % world:
            raise ValueError(f"--configs {cfg.name}: {cfg.num_experts} experts do not split over {world} ranks")
    say = (lambda text: None) if args.quiet or rank else (lambda text: print(text, flush=True))
    mine: list[dict[str, Any]] = []
    for cfg in configs:
        for tokens in s["tokens"]:
            mine += _measure_config(cfg, tokens, s, device, args)
            say(f"{cfg.name} tokens/rank={tokens}: done")
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        _write(args, device, s, world, [row for part in gathered for row in part], say)
    return 0


def _write(args, device: torch.device, s: dict[str, Any], world: int, rows: list[dict[str, Any]], say) -> None:
    meta = records.run_meta(device, s["dtype"], commit_id=args.commit)
    common = {"gpu": meta["gpu"], "world_size": world, "dtype": meta["dtype"], "backend": args.backend,
              "dist_backend": dist.get_backend(), "commit": meta["commit"], "date": meta["date"]}  # fmt: skip
    rows = [{**common, **row} for row in rows]
    meta.update(world_size=world, argv=sys.argv[1:], steps=s["steps"], warmup=s["warmup"],
                gbs="bytes this rank sends (all blocks) / ms; bus_gbs = gbs * (W-1)/W")  # fmt: skip
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    stem = records.new_stem(out, f"ragdot-ep-{safe_name(meta['gpu'])}-{safe_name(meta['commit'])}-w{world}")
    csv_path, json_path = out / f"{stem}.csv", out / f"{stem}.json"
    records.write_csv(rows, csv_path, COLUMNS)
    records.write_json(json_path, meta, rows, COLUMNS, newline=True)
    for row in rows:
        if not args.quiet:
            gbs = "" if row["gbs"] is None else f"  {row['gbs']:8.2f} GB/s"
            print(f"rank {row['rank']} {row['config']} T={row['tokens_per_rank']} {row['phase']:>14}: "
                  f"{row['ms']:9.3f} ms{gbs}")  # fmt: skip
    say(f"wrote {csv_path}, {json_path}")


def main(argv: list[str] | None = None) -> int:
    """Run without the ragdot command line: ``torchrun ... -m ragdot.bench.ep ...``."""
    from ragdot.cli_common import OneLineParser

    parser = OneLineParser(prog="ragdot ep-bench", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
