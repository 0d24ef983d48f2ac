"""The MoE layer: top-k router, SwiGLU experts, three compute paths (MaxText's sparse, dense dropless and dense drop).

    layer = MoELayer(dim, hidden_dim, num_experts, top_k, path="sparse")
    y = layer(x)                                 # x [..., dim] -> y [..., dim]
    loss = task_loss + layer.aux_loss + layer.z_loss

Parameters (identical for every path, so ``path`` and ``backend`` can be switched at any time):
    router.weight  [E, dim]
    w_gate_up      [E, dim, 2*hidden]   columns [:hidden] gate, [hidden:] up
                                        expert(x) = down(silu(gate) * up)
    w_down         [E, hidden, dim]
    shared_expert  optional dense SwiGLU added to every token's output
    With ep_group (a torch.distributed ProcessGroup of W ranks), rank r holds experts [r*E/W, (r+1)*E/W)
    only (w_gate_up [E/W, ...], w_down [E/W, ...]); see ragdot.moe.ep and docs/expert-parallel.md.

Paths:
    sparse          dropless; permute (counting sort) -> ragged_dot -> SwiGLU -> ragged_dot -> weighted
                    combine.
                    Work ~ T*k rows. Gradients through ragdot's custom ops.
                    ``recompute=True`` keeps neither the permuted rows nor the SwiGLU output for the
                    backward: it gathers and applies SwiGLU again there (eager autograd, not the fused or the
                    expert-parallel path; ragdot.moe.recompute).
                    The fused block (``ragdot.moe.fused``: token rows gathered once, both projections and
                    its backward through ragdot's ragged GEMMs, only the gate|up pre-activation kept) runs
                    where it measured faster: ``fused=None`` (default) runs it in training for 16-bit inputs
                    on CUDA with ``backend`` None or "auto", ``recompute=False`` and a forward of at least
                    ``FUSED_MIN_FLOPS`` or under CUDA-graph capture (``ragdot.moe.fused.preferred``; layer
                    fwd+bwd on an H200, 8192 tokens, graph clock: 0.86-0.96x the unfused path's time on
                    qwen3-30b-a3b, deepseek2-16b, gpt-oss-like and the deepseek3-671b slice;
                    docs/fused-moe.md), the unfused path elsewhere; ``True`` / ``False`` force either.
    dense_dropless  every token through every expert, then the router weights (0 off the top-k) combine
                    them. Work ~ T*E rows.
    dense_drop      capacity C = ceil(S*k/E * capacity_factor) per sequence (S tokens; the whole input is
                    one sequence when x is 2-D); one-hot dispatch/combine masks put the first C assignments
                    of each expert (in token order, then choice order) into a [E, C] buffer and drop the
                    overflow.
                    Work ~ E*C rows plus the mask einsums, as MaxText does it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import ragdot
from ragdot import amp
from ragdot.backends import BACKEND_NAMES
from ragdot.moe import routing_kernels
from ragdot.moe.fused import FUSED_MIN_FLOPS, fused_experts, fused_supported, preferred, sort_experts
from ragdot.moe.permute import IMPLS, combine_rows, permute_rows, resolve_impl
from ragdot.moe.recompute import remade
from ragdot.moe.router import Router, RouterOutput, expert_counts
from ragdot.moe.router_losses import router_losses
from ragdot.ops import _transformed, exporting

__all__ = ["MoELayer", "SwiGLU", "PATHS", "FUSED_MIN_FLOPS"]

PATHS: tuple[str, ...] = ("sparse", "dense_dropless", "dense_drop")


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """[..., 2*hidden] (gate | up) -> [..., hidden]."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


class _SwiGLU(torch.autograd.Function):
    """swiglu that saves only h for the backward (autograd's ``swiglu`` also keeps silu(gate), [..., hidden]:
    a third more activation memory) and recomputes silu(gate) there. Its backward writes both halves of dh into
    one buffer: the gate half by silu_backward in place of grad * up, the up half as silu(gate) * grad. The same
    elementwise ops as autograd's backward of ``swiglu`` (so the same bits: the recomputed silu is the
    forward's), without its grad_silu temporary and the final cat of the two halves."""

    @staticmethod
    def forward(ctx, h):
        gate, up = h.chunk(2, dim=-1)
        ctx.save_for_backward(h)
        return F.silu(gate) * up

    @staticmethod
    @amp.autocast_off
    def backward(ctx, grad):
        (h,) = ctx.saved_tensors
        if torch.is_grad_enabled() or grad.dtype != h.dtype:  # create_graph or a mixed dtype: autograd's own
            with torch.enable_grad():
                (dh,) = torch.autograd.grad(swiglu(h), h, grad, create_graph=torch.is_grad_enabled())
            return dh
        gate, up = h.chunk(2, dim=-1)
        hidden = up.shape[-1]
        dh = torch.empty_like(h, memory_format=torch.contiguous_format)
        d_gate, d_up = dh[..., :hidden], dh[..., hidden:]
        torch.mul(grad, up, out=d_gate)  # dL/ds
        torch.ops.aten.silu_backward.grad_input(d_gate, gate, grad_input=d_gate)
        torch.ops.aten.silu.out(gate, out=d_up)  # silu(gate) again, in place of the saved copy
        d_up.mul_(grad)
        return dh


# The lean backward saves the cat's copy of dh (2 * bytes of h of memory traffic) and keeps a third less for the
# backward (h, not h and silu(gate)) but runs as a Python autograd node, which costs host time on autograd's
# device thread (about 10-20 µs on an H200 host) where autograd's own backward is three C++ nodes: it pays from
# rows of this many bytes on (a copy of 64 MiB: ~18 µs at 3.5 TB/s).
_LEAN_SWIGLU_BYTES = 32 << 20


def _swiglu_rows(h: torch.Tensor) -> torch.Tensor:
    """swiglu of the sparse path's rows: the lean backward for large rows in eager autograd, else plain ops."""
    if (
        h.numel() * h.element_size() < _LEAN_SWIGLU_BYTES
        or not (torch.is_grad_enabled() and h.requires_grad)
        or torch.compiler.is_compiling()
        or _transformed()
    ):
        return swiglu(h)
    return _SwiGLU.apply(h)


class SwiGLU(nn.Module):
    """Dense SwiGLU feed-forward (the shared expert, or a reference FFN)."""

    def __init__(self, dim: int, hidden_dim: int, *, dtype=None, device=None) -> None:
        super().__init__()
        self.w_gate_up = nn.Parameter(torch.empty((dim, 2 * hidden_dim), dtype=dtype, device=device))
        self.w_down = nn.Parameter(torch.empty((hidden_dim, dim), dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal weights with standard deviation fan_in ** -0.5 (what the constructor draws)."""
        _init_fan_in(self.w_gate_up, self.w_down)

    def extra_repr(self) -> str:
        return f"dim={self.w_gate_up.shape[0]}, hidden_dim={self.w_down.shape[0]}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x @ self.w_gate_up) @ self.w_down


def _init_fan_in(w_gate_up: torch.Tensor, w_down: torch.Tensor) -> None:
    """w_gate_up [..., dim, 2H] and w_down [..., H, dim] drawn from normals of standard deviation fan_in ** -0.5."""
    nn.init.normal_(w_gate_up, std=w_gate_up.shape[-2] ** -0.5)
    nn.init.normal_(w_down, std=w_down.shape[-2] ** -0.5)


def _one_hot(index: torch.Tensor, classes: int) -> torch.Tensor:
    """int32 one-hot by comparison (F.one_hot checks its input's range with a host sync); >= classes -> 0."""
    return (index[..., None] == torch.arange(classes, device=index.device)).to(torch.int32)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class MoELayer(nn.Module):
    """Mixture-of-Experts SwiGLU layer with a switchable compute path and ragdot backend.

    After each forward, ``aux_loss`` (load balancing, times ``aux_loss_coef``), ``z_loss`` (router z-loss,
    times ``z_loss_coef``) and ``expert_counts`` (int32 [E], assignments per expert before any drop) hold
    this call's values; add the losses to the training loss. Under activation checkpointing use
    ``torch.utils.checkpoint(..., use_reentrant=False)``: the reentrant form runs the checkpointed forward without
    autograd, so the losses it leaves here carry no gradient (the router then trains without them); the
    non-reentrant form gives the gradients of an unchecked step exactly. Copies (``copy.deepcopy``, pickle) leave
    the last step's losses out.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        num_experts: int,
        top_k: int,
        *,
        path: str = "sparse",
        capacity_factor: float = 1.25,
        backend: str | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        normalize_weights: bool = True,
        num_shared_experts: int = 0,
        shared_hidden_dim: int | None = None,
        aux_loss_coef: float = 0.01,
        z_loss_coef: float = 0.001,
        routing_impl: str | None = None,
        fused: bool | None = None,
        recompute: bool = False,
        ep_group: torch.distributed.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.dim = _positive_int("dim", dim)
        self.hidden_dim = _positive_int("hidden_dim", hidden_dim)
        self.num_experts = _positive_int("num_experts", num_experts)
        self.top_k = _positive_int("top_k", top_k)
        if top_k > num_experts:
            raise ValueError(f"top_k={top_k} must not exceed num_experts={num_experts}")
        if (
            isinstance(num_shared_experts, bool)
            or not isinstance(num_shared_experts, int)
            or num_shared_experts < 0
        ):
            raise ValueError(f"num_shared_experts must be an int >= 0, got {num_shared_experts!r}")
        self.path = path
        self.capacity_factor = capacity_factor
        self.backend = backend
        self.routing_impl = routing_impl
        self.fused = fused
        self.recompute = recompute
        self.aux_loss_coef, self.z_loss_coef = float(aux_loss_coef), float(z_loss_coef)
        self.ep = None  # ragdot.moe.ep.ExpertParallel when the experts are sharded over ep_group
        if ep_group is not None:
            from ragdot.moe.ep import ExpertParallel

            shared = (num_shared_experts, shared_hidden_dim)
            config = dict(dim=dim, hidden_dim=hidden_dim, top_k=top_k, path=path, dtype=str(dtype), shared=shared,
                          capacity_factor=capacity_factor, normalize_weights=normalize_weights)  # fmt: skip
            self.ep = ExpertParallel(ep_group, num_experts, config)
        local = num_experts if self.ep is None else self.ep.local_experts
        self.router = Router(dim, num_experts, top_k, normalize=normalize_weights, dtype=dtype, device=device)
        self.w_gate_up = nn.Parameter(torch.empty((local, dim, 2 * hidden_dim), dtype=dtype, device=device))
        self.w_down = nn.Parameter(torch.empty((local, hidden_dim, dim), dtype=dtype, device=device))
        self.reset_parameters()
        self.shared_expert: SwiGLU | None = None
        if num_shared_experts:
            shared = shared_hidden_dim if shared_hidden_dim is not None else num_shared_experts * hidden_dim
            self.shared_expert = SwiGLU(
                dim, _positive_int("shared_hidden_dim", shared), dtype=dtype, device=device
            )
        self.aux_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None
        self.expert_counts: torch.Tensor | None = None
        if self.ep is not None:
            self.ep.replicate(self)

    def reset_parameters(self) -> None:
        """The experts' weights drawn again as the constructor draws them (normals of standard deviation
        fan_in ** -0.5); the router and the shared expert have their own `reset_parameters` (the convention that
        initialises a model built on the meta device: `to_empty`, then each module's `reset_parameters`)."""
        _init_fan_in(self.w_gate_up, self.w_down)

    def __getstate__(self) -> dict:
        """The layer as `copy.deepcopy`, `pickle` and `torch.save` see it: without the last step's losses, which
        hold that step's autograd graph (a tensor that is not a graph leaf can be neither deep-copied nor
        pickled, so a copy of a layer that had run a training step failed). A copy starts with no losses, as a new
        layer does; its next forward sets them."""
        state = self.__dict__.copy()
        state["aux_loss"] = state["z_loss"] = None
        return state

    # -------------------------------------------------------------------------------------- settings
    @property
    def path(self) -> str:
        return self._path

    @path.setter
    def path(self, value: str) -> None:
        if value not in PATHS:
            raise ValueError(f"path={value!r} is unknown; expected one of {', '.join(PATHS)}")
        self._path = value

    @property
    def capacity_factor(self) -> float:
        return self._capacity_factor

    @capacity_factor.setter
    def capacity_factor(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"capacity_factor must be a number > 0, got {value!r}")
        self._capacity_factor = float(value)

    @property
    def backend(self) -> str | None:
        return self._backend

    @backend.setter
    def backend(self, value: str | None) -> None:
        names = (*BACKEND_NAMES, "auto")
        if value is not None and value not in names:
            raise ValueError(f"backend={value!r} is unknown; expected one of {', '.join(names)} or None")
        self._backend = value

    @property
    def routing_impl(self) -> str | None:
        return self._routing_impl

    @routing_impl.setter
    def routing_impl(self, value: str | None) -> None:
        if value is not None and value not in IMPLS:
            raise ValueError(f"routing_impl={value!r} is unknown; expected one of {IMPLS} or None")
        self._routing_impl = value

    @property
    def fused(self) -> bool | None:
        return self._fused

    @fused.setter
    def fused(self, value: bool | None) -> None:
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"fused must be True, False or None, got {value!r}")
        self._fused = value

    @property
    def recompute(self) -> bool:
        return self._recompute

    @recompute.setter
    def recompute(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"recompute must be True or False, got {value!r}")
        self._recompute = value

    def expert_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_gate_up, w_down) in `dtype`: the parameters themselves, or their casts where the experts compute in
        another dtype (torch.autocast; autograd takes the gradients back to the parameters' dtype)."""
        if self.w_gate_up.dtype == dtype:
            return self.w_gate_up, self.w_down
        return self.w_gate_up.to(dtype), self.w_down.to(dtype)

    def uses_fused(self, x: torch.Tensor) -> bool:
        """Whether the sparse path runs the fused block for input x [tokens, dim]: never under torch.func
        transforms or forward-mode AD (the block has no rules for them); as ``fused`` says when it is a bool; for
        None, no backend asked for by name, no ``recompute``, and ``ragdot.moe.fused.preferred``: where the block
        measured faster than the unfused path (training, 16-bit inputs on CUDA, a routed forward of at least
        ``FUSED_MIN_FLOPS`` or a CUDA-graph capture)."""
        if _transformed():
            return False
        if self.fused is not None:
            return self.fused
        if self.backend not in (None, "auto") or self.recompute:
            return False
        # float32 parameters of a 16-bit x (torch.autocast) are the block's master weights: it casts them itself
        return preferred(x, self.top_k, self.w_gate_up, self.w_down)

    def capacity(self, seq_len: int) -> int:
        """Rows per expert and sequence on the dense_drop path."""
        return max(1, math.ceil(seq_len * self.top_k / self.num_experts * self.capacity_factor))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, hidden_dim={self.hidden_dim}, num_experts={self.num_experts}, "
            f"top_k={self.top_k}, "
            f"path={self.path!r}, backend={self.backend!r}, capacity_factor={self.capacity_factor}, "
            f"fused={self.fused!r}, recompute={self.recompute!r}"
        )

    # -------------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a tensor of shape [..., dim={self.dim}], got {shape}")
        compute = amp.autocast_dtype(x)  # torch.autocast on x's device: the experts run in its dtype
        if compute is None and x.dtype != self.w_gate_up.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the layer's weights are {self.w_gate_up.dtype}")
        # The previous step's losses go first: kept until now, they hold that step's autograd graph, whose
        # AccumulateGrad nodes (recorded on that step's stream) this step would otherwise reuse; an eager
        # step on the default stream then breaks a CUDA-graph capture on a side stream.
        self.aux_loss = self.z_loss = None
        x2 = x.reshape(-1, self.dim)
        if x2.shape[0] == 0:
            y0 = None if self.ep is None else self.ep.empty(self, x2)  # the other ranks exchange with this one
            return self._empty(x) if y0 is None else self._empty(x) + y0.reshape(x.shape)
        routed = self.router(x2)  # float32 logits under autocast too
        # Under autocast the experts take x and their weights cast once to its dtype, then run with it off (the
        # paths' own ops pick their dtypes); the shared expert is ordinary autocast code.
        xe = x2 if compute is None else amp.cast(x2, compute)
        with amp.off_for(x):
            if self.path == "sparse":
                y, counts = self._sparse(xe, routed)
            elif self.path == "dense_dropless":
                y, counts = self._dense_dropless(xe, routed)
            else:
                seq_len = x.shape[-2] if x.dim() >= 3 else x2.shape[0]
                y, counts = self._dense_drop(xe, routed, seq_len)
        if self.shared_expert is not None:
            y = y + self.shared_expert(x2)
        if exporting():  # an exported program has no module state to update: y alone
            return y.reshape(x.shape)
        self.expert_counts = counts.detach()
        total = routed.experts.numel() if self.ep is None else None  # every assignment counted once
        with amp.off_for(x):
            self.aux_loss, self.z_loss = router_losses(
                routed.logits, routed.probs, counts, total, self.aux_loss_coef, self.z_loss_coef
            )
        return y.reshape(x.shape)

    def _empty(self, x: torch.Tensor) -> torch.Tensor:
        zero = x.new_zeros((), dtype=torch.float32)
        self.aux_loss, self.z_loss = zero, zero.clone()
        self.expert_counts = torch.zeros((self.num_experts,), dtype=torch.int32, device=x.device)
        return x.new_zeros(x.shape)

    def _sparse(self, x2: torch.Tensor, r: RouterOutput) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ep is not None:
            return self.ep.sparse(self, x2, r)
        if self.uses_fused(x2):
            # float32 parameters under autocast go in as they are: the block multiplies their casts and writes
            # their gradients in float32 from its GEMMs (no 16-bit gradients, no cast kernels in the backward)
            w_gate_up, w_down = self.w_gate_up, self.w_down
            if not fused_supported(x2, w_gate_up, w_down):  # e.g. float16 parameters in a bfloat16 region
                w_gate_up, w_down = self.expert_weights(x2.dtype)
            sizes, order = sort_experts(r.experts, self.num_experts, impl=self.routing_impl)
            return fused_experts(x2, order, sizes, r.weights, w_gate_up, w_down), sizes
        w_gate_up, w_down = self.expert_weights(x2.dtype)
        # x2 and the router's experts are checked already: the unchecked permute and combine
        impl = resolve_impl(self.routing_impl, x2.device)
        rows, sizes, slots = permute_rows(x2, r.experts, self.num_experts, impl)
        if self.recompute and torch.is_grad_enabled() and not (torch.compiler.is_compiling() or _transformed()):
            with remade() as keep:  # the rows and the SwiGLU output, remade in the backward
                x_in, experts = x2.detach(), r.experts
                keep(rows, lambda: routing_kernels.sort_and_dispatch(x_in, experts, self.num_experts, impl)[0])
                out = self._experts(rows, sizes, w_gate_up, w_down, keep)
        else:
            out = self._experts(rows, sizes, w_gate_up, w_down)
        return combine_rows(out, slots, r.weights, self.top_k, impl), sizes

    def _experts(self, rows: torch.Tensor, sizes: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                 keep=None) -> torch.Tensor:
        """rows [T*k, dim] grouped by expert -> down(swiglu(up(rows))) [T*k, dim] with the experts' weights in rows'
        dtype (`expert_weights`); with `keep` (a `remade` block's), the SwiGLU output is registered to be remade
        from the pre-activation in the backward."""
        h = ragdot.ragged_dot(rows, w_gate_up, sizes, backend=self.backend)  # [T*k, 2H]
        a = _swiglu_rows(h)
        if keep is not None:
            h_in = h.detach()
            keep(a, lambda: swiglu(h_in))
        return ragdot.ragged_dot(a, w_down, sizes, backend=self.backend)  # [T*k, dim]

    def _dense_dropless(self, x2: torch.Tensor, r: RouterOutput) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ep is not None:
            raise ValueError("path='dense_dropless' has no expert-parallel form; use 'sparse' or 'dense_drop'")
        tokens, e = x2.shape[0], self.num_experts
        w_gate_up, w_down = self.expert_weights(x2.dtype)
        w_flat = w_gate_up.permute(1, 0, 2).reshape(self.dim, -1)  # [dim, E*2H]
        h = (x2 @ w_flat).view(tokens, e, -1)  # [T, E, 2H]: every token, every expert
        out = torch.bmm(swiglu(h).transpose(0, 1), w_down)  # [E, T, dim]
        dense_w = torch.zeros((tokens, e), dtype=r.weights.dtype, device=x2.device)
        dense_w = dense_w.scatter(1, r.experts, r.weights)  # [T, E]: router weight, 0 off the top-k
        y = torch.bmm(dense_w.to(out.dtype).unsqueeze(1), out.transpose(0, 1)).squeeze(1)  # [T, dim]
        return y, expert_counts(r.experts, e)

    def _dense_drop(
        self, x2: torch.Tensor, r: RouterOutput, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ep is not None:
            return self.ep.capacity(self, x2, r, seq_len)
        tokens, e, k = x2.shape[0], self.num_experts, self.top_k
        groups, cap = tokens // seq_len, self.capacity(seq_len)
        onehot = _one_hot(r.experts.view(groups, seq_len * k), e)  # [B, S*k, E]: assignment order t*k + j
        position = (onehot.cumsum(dim=1) * onehot).sum(-1) - 1  # [B, S*k]: place in its expert's queue
        kept_slot = torch.where(position < cap, position, cap)  # overflow -> the discarded slot `cap`
        slot_onehot = _one_hot(kept_slot, cap)  # [B, S*k, C]: all zero for the overflow
        expert_onehot = onehot.view(groups, seq_len, k, e).to(x2.dtype)
        slot_onehot = slot_onehot.view(groups, seq_len, k, cap).to(x2.dtype)
        dispatch = torch.einsum("bsje,bsjc->bsec", expert_onehot, slot_onehot)  # [B, S, E, C] 0/1
        weights = r.weights.view(groups, seq_len, k, 1).to(x2.dtype)
        combine = torch.einsum("bsje,bsjc->bsec", expert_onehot * weights, slot_onehot)  # [B, S, E, C]
        x3 = x2.view(groups, seq_len, self.dim)
        buf = torch.einsum("bsd,bsec->ebcd", x3, dispatch).reshape(e, groups * cap, self.dim)
        w_gate_up, w_down = self.expert_weights(x2.dtype)
        h = torch.bmm(buf, w_gate_up)  # [E, B*C, 2H]
        out = torch.bmm(swiglu(h), w_down).view(e, groups, cap, self.dim)
        y = torch.einsum("ebcd,bsec->bsd", out, combine).reshape(tokens, self.dim)
        return y, onehot.sum(dim=(0, 1)).to(torch.int32)
