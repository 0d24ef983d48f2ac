"""The collectives of expert parallelism: differentiable all-to-alls, the count exchange, the config check.

Every function here is collective: each rank of the group must call it, in the same order.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

__all__ = ["all_to_all", "exchange_counts", "check_same_config", "group_device", "broadcast_"]


def group_device(group: dist.ProcessGroup) -> torch.device:
    """The device a collective of ``group`` takes its tensors on (the current CUDA device for NCCL)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _AllToAll(torch.autograd.Function):
    """rows [sum(in_splits), D] -> [sum(out_splits), D]; the backward is the same exchange reversed."""

    @staticmethod
    def forward(ctx, rows, anchor, out_splits, in_splits, group):  # noqa: ARG004 - anchor only joins the graph
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        return _exchange(rows, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.in_splits, ctx.out_splits, ctx.group), None, None, None, None


def _exchange(rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = rows.new_empty((sum(out_splits), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group)
    return out


def all_to_all(
    rows: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int], group: dist.ProcessGroup
) -> torch.Tensor:
    """Send ``rows[in block r]`` to rank r and receive ``out_splits[r]`` rows from rank r, differentiably.

    While grad mode is on the result always requires grad, so that every rank runs the mirrored exchange in
    its backward even where its own input needs no gradient (the other ranks' backward waits for it).
    """
    anchor = torch.empty(0, device=rows.device, requires_grad=torch.is_grad_enabled())
    return _AllToAll.apply(rows, anchor, list(out_splits), list(in_splits), group)


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """counts int [W*L] (rows for each rank's L local experts) -> int64 [W*L]: rows each rank sends here."""
    out = torch.empty_like(counts, dtype=torch.int64)
    dist.all_to_all_single(out, counts.to(torch.int64), group=group)
    return out


def _code(value: object) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return zlib.crc32(repr(value).encode())


def check_same_config(config: Mapping[str, object], group: dist.ProcessGroup) -> None:
    """Gather ``config`` from every rank and raise ValueError on every rank when one differs (never hangs)."""
    names = sorted(config)
    mine = torch.tensor([_code(config[n]) for n in names], dtype=torch.int64, device=group_device(group))
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    first = gathered[0].tolist()
    for rank, values in enumerate(t.tolist() for t in gathered):
        for name, a, b in zip(names, first, values):
            if a != b:
                where = "" if rank != dist.get_rank(group) else f" (here: {config[name]!r})"
                raise ValueError(
                    f"ep_group: ranks were built with different configs: {name} differs between "
                    f"rank 0 and rank {rank}{where}; build the layer identically on every rank"
                )


def broadcast_(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Overwrite ``tensors`` in place with group rank 0's values (the replicated router, shared expert)."""
    src = dist.get_global_rank(group, 0)
    for t in tensors:
        with torch.no_grad():
            staged = t.detach().to(group_device(group)).contiguous()
            dist.broadcast(staged, src=src, group=group)
            t.copy_(staged)
