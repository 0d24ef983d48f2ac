"""Expert parallelism over a torch.distributed ProcessGroup: experts sharded over W ranks, tokens exchanged.

    layer = MoELayer(dim, hidden, num_experts, top_k, ep_group=group)   # rank r holds experts
    y = layer(x)                                                        # [r*E/W, (r+1)*E/W)

Each rank routes its own tokens with the replicated router; the token rows travel to the ranks that hold
their experts and back with ``all_to_all_single``. Two modes, picked by the layer's ``path``:

``sparse`` (dropless): permute the rows by global expert (rows for rank r are then one block), exchange the
    per-expert counts (one all-to-all of W*L ints), read the split sizes on the host ONCE per dispatch (the
    only host synchronisation: ``all_to_all_single`` takes its splits as Python ints), exchange the rows,
    regroup the received rows from (source rank, local expert) to (local expert, source rank) order, run the
    two grouped GEMMs with ``ragdot.ragged_dot``, undo the regrouping, exchange back with the splits
    reversed, and combine with ``unpermute`` (float32 sums in a fixed order: deterministic).
``dense_drop`` (capacity, sync-free): a static buffer of C = ``layer.capacity(seq_len)`` rows per expert and
    sequence; the first C assignments of each expert in each sequence (token order, then choice order) are
    kept and the overflow is dropped, exactly as the single-device dense_drop path drops. Every exchange has
    equal splits known without looking at the data, so nothing reads the device: usable under CUDA-graph
    capture. Every rank must pass the same input shape.

The backward of every exchange is the mirrored exchange (``ep_comm.all_to_all``). Every rank must call the
forward and the backward of the layer the same number of times (as with DDP); a rank with no tokens still
takes part, with empty blocks, in the dropless mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

import ragdot
from ragdot.moe import ep_comm
from ragdot.moe.permute import Routing, permute, unpermute
from ragdot.moe.router import RouterOutput
from ragdot.moe.routing_kernels import inverse_permutation

MoELayer = torch.nn.Module  # the layer (ragdot.moe.layer imports this module, not the other way round)

__all__ = ["ExpertParallel", "Dispatch"]


@dataclass(frozen=True)
class Dispatch:
    """What the combine of one dropless dispatch needs: the routing, the counts and the host split sizes."""

    routing: Routing
    recv_sizes: torch.Tensor  # int64 [W, L]: rows received from each source rank for each local expert
    send_splits: list[int]  # rows sent to each rank
    recv_splits: list[int]  # rows received from each rank


class ExpertParallel:
    """The expert-parallel side of one ``MoELayer``: its group, its expert shard and the two exchange modes."""

    def __init__(self, group: dist.ProcessGroup, num_experts: int, config: Mapping[str, object]) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("ep_group needs an initialised torch.distributed process group")
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"ep_group must be a torch.distributed ProcessGroup, got {type(group).__name__}")
        self.group = group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        ep_comm.check_same_config({**config, "num_experts": num_experts, "ep_world_size": self.world_size}, group)
        if num_experts % self.world_size:
            raise ValueError(
                f"num_experts={num_experts} must be a multiple of the ep_group size {self.world_size}"
            )
        self.num_experts = num_experts
        self.local_experts = num_experts // self.world_size
        self.first_expert = self.rank * self.local_experts

    def __repr__(self) -> str:
        return (
            f"ExpertParallel(rank={self.rank}, world_size={self.world_size}, "
            f"experts=[{self.first_expert}, {self.first_expert + self.local_experts}))"
        )

    def replicate(self, layer: MoELayer) -> None:
        """Give every rank group rank 0's router (and shared expert) weights."""
        params = [layer.router.weight]
        if layer.shared_expert is not None:
            params += [layer.shared_expert.w_gate_up, layer.shared_expert.w_down]
        ep_comm.broadcast_(params, self.group)

    # ---------------------------------------------------------------------------------- dropless mode
    def sparse(self, layer: MoELayer, x2: torch.Tensor, r: RouterOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """Dropless dispatch, local experts, combine: x2 [T, D] -> (y [T, D], counts int32 [E])."""
        recv, plan = self.dispatch(x2, r.experts, layer.routing_impl)
        out = self._local_ragged(layer, recv, plan.recv_sizes, sum(plan.recv_splits))
        return self.combine(out, plan, r.weights), plan.routing.group_sizes

    def dispatch(
        self, x2: torch.Tensor, experts: torch.Tensor, impl: str | None = None
    ) -> tuple[torch.Tensor, Dispatch]:
        """x2 [T, D], experts int [T, k] -> (the rows this rank's experts get, in (source, expert) blocks; plan)."""
        w, lx = self.world_size, self.local_experts
        rows, routing = permute(x2, experts, self.num_experts, impl=impl)
        sizes = routing.group_sizes  # int32 [E]: rows for each global expert, rank by rank
        recv_sizes = ep_comm.exchange_counts(sizes, self.group).view(w, lx)  # [source rank, local expert]
        send_splits, recv_splits = self._host_splits(sizes.view(w, lx), recv_sizes)
        recv = ep_comm.all_to_all(rows, recv_splits, send_splits, self.group)
        return recv, Dispatch(routing, recv_sizes, send_splits, recv_splits)

    def combine(self, out: torch.Tensor, plan: Dispatch, weights: torch.Tensor) -> torch.Tensor:
        """The experts' output rows (dispatch's order) -> back to their ranks -> weighted top-k sum [T, D]."""
        back = ep_comm.all_to_all(out, plan.send_splits, plan.recv_splits, self.group)
        return unpermute(back, plan.routing, weights)

    @staticmethod
    def _host_splits(send: torch.Tensor, recv: torch.Tensor) -> tuple[list[int], list[int]]:
        """The one host read of a dispatch: rows to send to and to receive from each rank."""
        both = torch.stack([send.sum(1).to(torch.int64), recv.sum(1)]).tolist()
        return both[0], both[1]

    def _local_ragged(
        self, layer: MoELayer, recv: torch.Tensor, recv_sizes: torch.Tensor, total: int
    ) -> torch.Tensor:
        """recv rows in (source, expert) blocks -> the SwiGLU experts' output in the same order."""
        if self.world_size > 1 and self.local_experts > 1:
            order = _block_transpose(recv_sizes, total)  # (source, expert) rows -> (expert, source) order
            grouped = recv.index_select(0, order)
        else:
            order, grouped = None, recv
        sizes = recv_sizes.sum(0).to(torch.int32)  # [L]
        w_gate_up, w_down = layer.expert_weights(grouped.dtype)
        h = ragdot.ragged_dot(grouped, w_gate_up, sizes, backend=layer.backend)
        out = ragdot.ragged_dot(_swiglu(h), w_down, sizes, backend=layer.backend)
        if order is None:
            return out
        return out.index_select(0, inverse_permutation(order))

    # ---------------------------------------------------------------------------------- capacity mode
    def capacity(
        self, layer: MoELayer, x2: torch.Tensor, r: RouterOutput, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sync-free dispatch with a static capacity per expert and sequence; overflow dropped as dense_drop."""
        tokens, k, e = x2.shape[0], layer.top_k, self.num_experts
        groups, cap = tokens // seq_len, layer.capacity(seq_len)
        slot, counts = _capacity_slots(r.experts.view(groups, seq_len * k), e, cap)  # [T*k]: flat slot
        buf_rows = e * groups * cap
        source = torch.full((buf_rows + 1,), tokens * k, dtype=torch.int64, device=x2.device)
        source.scatter_(0, slot, torch.arange(tokens * k, device=x2.device))  # buffer slot -> assignment
        assigned = x2.unsqueeze(1).expand(tokens, k, x2.shape[1]).reshape(tokens * k, -1)
        padded = torch.cat([assigned, assigned.new_zeros((1, x2.shape[1]))])
        buf = padded.index_select(0, source[:buf_rows])  # [E * B*C, D]: rank by rank, equal blocks
        splits = [buf_rows // self.world_size] * self.world_size
        recv = ep_comm.all_to_all(buf, splits, splits, self.group)  # [W, L, B*C, D]
        out = self._local_dense(layer, recv.view(self.world_size, self.local_experts, groups * cap, -1))
        back = ep_comm.all_to_all(out, splits, splits, self.group)  # [E * B*C, D]
        back = torch.cat([back, back.new_zeros((1, back.shape[1]))])  # the dropped read zeros
        picked = back.index_select(0, slot).view(tokens, k, -1)
        weights = r.weights.to(picked.dtype).unsqueeze(-1)
        return (picked * weights).sum(1), counts

    def _local_dense(self, layer: MoELayer, recv: torch.Tensor) -> torch.Tensor:
        """recv [W, L, N, D] -> expert outputs [W*L*N, D] in the same order (two batched GEMMs)."""
        w, lx, n, d = recv.shape
        x = recv.transpose(0, 1).reshape(lx, w * n, d)
        w_gate_up, w_down = layer.expert_weights(x.dtype)
        h = torch.bmm(x, w_gate_up)
        out = torch.bmm(_swiglu(h), w_down)  # [L, W*N, D]
        return out.view(lx, w, n, d).transpose(0, 1).reshape(w * lx * n, d)

    # ---------------------------------------------------------------------------------- empty input
    def empty(self, layer: MoELayer, x2: torch.Tensor) -> torch.Tensor:
        """A rank with no tokens still joins the exchanges (dropless mode): returns y [0, D] in the graph."""
        r = layer.router(x2)
        y, _ = self.sparse(layer, x2, r)
        return y


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _block_transpose(sizes: torch.Tensor, total: int) -> torch.Tensor:
    """sizes [W, L]: int64 [total], for each row of the (expert, source) order its row in (source, expert) order."""
    w, lx = sizes.shape
    flat = sizes.reshape(-1)
    src_start = torch.cumsum(flat, 0) - flat  # row-major block starts
    by_expert = sizes.t().reshape(-1)
    dst_start = (torch.cumsum(by_expert, 0) - by_expert).view(lx, w).t().reshape(-1)
    block = torch.repeat_interleave(torch.arange(w * lx, device=sizes.device), flat, output_size=total)
    position = torch.arange(total, device=sizes.device) - src_start[block]
    dst = dst_start[block] + position  # row i of (source, expert) order lands at dst[i]
    return inverse_permutation(dst)


def _capacity_slots(experts: torch.Tensor, num_experts: int, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """experts [B, S*k] -> (slot int64 [B*S*k] in an [E, B, C] buffer, E*B*C for a drop; counts int32 [E])."""
    groups = experts.shape[0]
    onehot = (experts[..., None] == torch.arange(num_experts, device=experts.device)).to(torch.int32)
    position = (onehot.cumsum(dim=1) * onehot).sum(-1) - 1  # [B, S*k]: place in its expert's queue
    batch = torch.arange(groups, device=experts.device)[:, None]
    slot = (experts * groups + batch) * cap + position
    dropped = torch.full_like(slot, num_experts * groups * cap)
    slot = torch.where(position < cap, slot, dropped)
    return slot.reshape(-1), onehot.sum(dim=(0, 1)).to(torch.int32)
