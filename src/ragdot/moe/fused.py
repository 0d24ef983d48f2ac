"""The fused sparse expert block: x, routing, router weights -> y, with its backward.

    sizes, order = sort_experts(experts, num_experts)                  # no permuted copy of x
    y = fused_experts(x, order, sizes, weights, w_gate_up, w_down)     # x [T, D] -> y [T, D]

Forward (``forward_kind``, default "gemms"): the token rows of x gathered once into the permuted order, the up
and down projections as ragdot's own tuned ragged GEMMs (``ragdot.ops.run``, ``auto``) with SwiGLU between them
as one elementwise kernel (``ragdot.kernels.fused_moe.swiglu``), and a fixed-order float32 sum of each token's
weighted choices (``routing_kernels.combine``). "fused" runs the index-reading kernels of
``ragdot.kernels.fused_moe`` instead (the up projection gathers token rows through ``order`` and applies SwiGLU in
its epilogue; the down projection multiplies by the router weight and stores each assignment's row at its
(token, choice) slot of a ``[T, k, D]`` buffer). Only the gate|up pre-activation ``[T*k, 2H]`` is kept for the
backward (when one is needed); the activation is recomputed there, inside the dSwiGLU kernel.

Backward (``backward_kind``, default "gemms"): the token rows of ``dy`` gathered once into the permuted order
(those of ``x`` a slice of columns at a time, or read through the index: ``wgrad_rows``), the four products as
ragdot's own ragged GEMMs (``ragdot.ops.run``, ``auto``: the tuned TMA kernels)
around one elementwise kernel (``ragdot.kernels.fused_moe_bwd.swiglu_backward``: dSwiGLU of w * g, the activation
recomputed and scaled by the router weight, the router weights' gradient), the input gradient as a ragged product
in the permuted order and a fixed-order sum over the choices. "fused" runs the index-reading kernels of
``ragdot.kernels.fused_moe_bwd`` instead (slower on an H200: docs/fused-moe.md).

Under ``torch.compile`` and tracers everything is a ``torch.library`` custom op (``ragdot::moe_sort``,
``ragdot::fused_moe``, ``ragdot::fused_moe_backward``) with a fake kernel, so it traces under ``fullgraph=True``;
plain eager autograd runs the same bodies through one ``autograd.Function`` (less host time), whose backward
writes dpre over the saved pre-activation (``backward_in_place``). torch.func transforms and forward-mode AD
are refused with a NotImplementedError (``MoELayer`` does not choose the block under them). No metadata is
copied to the host, so it captures into CUDA graphs. Default mode: no atomics, bitwise reproducible;
``deterministic=False`` opts into float32 atomics for the "fused" forward's combine (the other forwards' combine
has none).
"""

from __future__ import annotations

from typing import Any

import torch

from ragdot import amp
from ragdot import ops as _ops
from ragdot._memo import remember
from ragdot.kernels.interpreter import dot_refusal
from ragdot.moe import routing_kernels as _rk
from ragdot.moe.permute import default_impl
from ragdot.ops import stored_transposed

__all__ = ["sort_experts", "fused_experts", "fused_supported", "preferred", "FUSED_MIN_FLOPS"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def fused_supported(x: torch.Tensor, *weights: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """Whether the block can run these operands: Triton present, x float16/bfloat16/float32 and each weight in
    x's dtype or, for a 16-bit x, float32 (master weights: `fused_experts` multiplies their casts), and not a
    dtype Triton's interpreter multiplies wrong where it runs (`kernels.interpreter.dot_refusal`). `dtype`: the
    dtype x will be cast to first (torch.autocast's), if not its own."""
    dtype = x.dtype if dtype is None else dtype
    return (_rk.HAS_TRITON and dtype in _DTYPES and all(_weight_ok(dtype, w) for w in weights)
            and dot_refusal(dtype) is None)


def _weight_ok(dtype: torch.dtype, w: torch.Tensor) -> bool:
    return w.dtype == dtype or (w.dtype == torch.float32 and dtype in (torch.float16, torch.bfloat16))


def _compute_weights(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The weights in x's dtype: themselves, or their casts (same memory order; no autograd node)."""
    return tuple(w if w.dtype == x.dtype else w.detach().to(x.dtype) for w in weights)


# Where the block is the default (`preferred`): the routed experts' forward FLOPs (6 x tokens x top-k x dim x hidden)
# from which it runs outside CUDA graphs. Measured on an H200 (eager train steps, one process): the block was
# faster from 3.1e11 (qwen3-30b-a3b, gemma4-26b, deepseek2-16b steps: 1-7% less time); at 5.2e10 (deepseek3-test,
# a host-bound step) it was slower through the custom ops (25.7 against 21.1 ms) and level without them (21.3 ms
# both), and faster on graph replays (9.5 against 10.5 ms): no eager win measured there.
FUSED_MIN_FLOPS = 1e11


def preferred(x: torch.Tensor, top_k: int, w_gate_up: torch.Tensor, w_down: torch.Tensor,
              dtype: torch.dtype | None = None) -> bool:
    """Whether the block is the default for x [T, D] routed to top_k of the experts w_gate_up [E, D, 2H] (any
    view), w_down [E, H, D]: where it measured faster than the unfused path, i.e. in training (grad enabled and
    x or a weight requires it: it was measured as forward+backward), 16-bit inputs on CUDA that the kernels
    take (`dtype`: the one x is cast to first, if not its own), and a routed forward of at least
    ``FUSED_MIN_FLOPS`` or a CUDA-graph capture (no host time there). Never under torch.func transforms or
    forward-mode AD (the block has no rules for them)."""
    dtype = x.dtype if dtype is None else dtype
    if _ops._transformed() or not (x.is_cuda and dtype in (torch.float16, torch.bfloat16)):
        return False
    if not (fused_supported(x, w_gate_up, w_down, dtype=dtype) and torch.is_grad_enabled()):
        return False
    if not any(t.requires_grad for t in (x, w_gate_up, w_down)):
        return False
    if 6 * x.shape[0] * top_k * w_gate_up.shape[1] * w_down.shape[1] >= FUSED_MIN_FLOPS:
        return True
    return not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing()


def _kernels():
    from ragdot.kernels import fused_moe, fused_moe_bwd

    return fused_moe, fused_moe_bwd


# ------------------------------------------------------------------------------------------------ sort
@torch.library.custom_op("ragdot::moe_sort", mutates_args=())
def _sort_op(experts: torch.Tensor, num_experts: int, impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _rk.sort_order(experts, num_experts, impl)


@_sort_op.register_fake
def _(experts, num_experts, impl):
    return (experts.new_empty((num_experts,), dtype=torch.int32), experts.new_empty((experts.numel(),),
            dtype=torch.int32))


def sort_experts(experts: torch.Tensor, num_experts: int, impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """experts int [T, k] -> (sizes int32 [E], order int32 [T*k]): rows grouped by expert, stable in t*k + j.

    Expert ids are clamped into [0, num_experts)."""
    if not isinstance(experts, torch.Tensor) or experts.dim() != 2 or experts.is_floating_point():
        raise TypeError(f"experts must be an integer tensor [tokens, top_k], got {experts!r:.60}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if impl is None:
        impl = default_impl(experts.device)
    if impl not in ("triton", "torch") or (impl == "triton" and not _rk.HAS_TRITON):
        raise ValueError(f"impl={impl!r} is unknown or unavailable; expected 'triton' (needs triton), 'torch' or None")
    if _ops.plain_eager(experts):  # the body itself, without the custom op's dispatch
        return _ops.profiled("moe_sort", _rk.sort_order, experts, num_experts, impl)
    return torch.ops.ragdot.moe_sort(experts, num_experts, impl)


# ------------------------------------------------------------------------------------------------ forward
# Which forward runs: "gemms" gathers the token rows of x once into the permuted order, runs both products as
# ragdot's tuned ragged GEMMs (TMA kernels where the device has them) with SwiGLU as one elementwise kernel
# between them, and sums each token's weighted choices in a fixed order (`routing_kernels.combine`); "fused"
# runs the index-reading kernels of `ragdot.kernels.fused_moe` (the gather in the up projection's loads, SwiGLU
# in its epilogue, the router weight and the scatter in the down projection's; 0-8% slower on an H200,
# docs/fused-moe.md). Each keeps only the pre-activation [T*k, 2H] for the backward. `deterministic=False`
# (float32 atomics) changes "fused" only.
FORWARDS = ("gemms", "fused")
forward_kind = "gemms"


def _permuted(t: torch.Tensor, order: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """t [T, D] -> (its token rows in the permuted order [A, D], the token of each permuted row, the permuted row
    of each assignment)."""
    tokens, slots = _rk.routing_index(order, top_k, default_impl(t.device))
    return t.index_select(0, tokens), tokens, slots


def _combine(rows: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor | None, top_k: int) -> torch.Tensor:
    return _ops.profiled("moe_combine", _rk.combine, rows, slots, weights, top_k, default_impl(rows.device))


def _forward(x, order, sizes, weights, w_gate_up, w_down, top_k, save, deterministic):
    fm, _ = _kernels()
    x, weights = x.contiguous(), weights.contiguous()
    if forward_kind == "gemms":
        rows, _, slots = _ops.profiled("moe_gather", _permuted, x, order, top_k)
        pre = _ragged_m(rows, w_gate_up, sizes)  # [A, 2H]
        del rows
        act = fm.swiglu(pre)
        if not save:  # a new empty tensor, not a view that would keep the whole buffer alive
            pre = pre.new_empty((0, pre.shape[1]))
    else:
        act, pre = _ops.profiled("fused_up", fm.up_swiglu, x, w_gate_up, order, sizes, top_k, save)
        w_flat = weights.reshape(-1)
        if not deterministic:
            out = _ops.profiled("fused_down", fm.down_scatter, act, w_down, order, sizes, w_flat, top_k, atomic=True)
            return out.to(x.dtype), pre
        rows = _ops.profiled("fused_down", fm.down_scatter, act, w_down, order, sizes, w_flat, top_k)
        return _ops.profiled("moe_combine", fm.sum_choices, rows, top_k), pre
    rows = _ragged_m(act, w_down, sizes)  # [A, D]
    del act
    return _combine(rows, slots, weights, top_k), pre


@torch.library.custom_op("ragdot::fused_moe", mutates_args=())
def _fused_op(
    x: torch.Tensor,
    order: torch.Tensor,
    sizes: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    save: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    _refuse_wrong_dots(x.dtype)  # traced `_check` cannot ask the interpreter (`kernels.interpreter`): asked here
    return _forward(x, order, sizes, weights, w_gate_up, w_down, top_k, save, deterministic)


@_fused_op.register_fake
def _(x, order, sizes, weights, w_gate_up, w_down, top_k, save, deterministic):
    a = order.numel() if save else 0
    return x.new_empty(x.shape), x.new_empty((a, w_gate_up.shape[2]))


def _fused_setup(ctx, inputs, output) -> None:
    x, order, sizes, weights, w_gate_up, w_down, top_k, _save, _det = inputs
    ctx.save_for_backward(x, order, sizes, weights, w_gate_up, w_down, output[1])
    ctx.top_k = top_k


def _grads(ctx, grad_y) -> tuple:
    """(dx or None, None, None, dweights, dw_gate_up, dw_down) from the tensors the forward saved; the weight
    gradients in `ctx.weight_dtype` where the forward set it (master weights), else in the saved weights' dtype."""
    if getattr(ctx, "pre_overwritten", False):
        raise RuntimeError(
            "the fused MoE block's backward already ran for this graph and wrote its gradients over the saved "
            "pre-activation (less memory): a second backward through a retained graph needs "
            "ragdot.moe.fused.backward_in_place = False, or MoELayer(fused=False)")
    x, order, sizes, weights, w_gate_up, w_down, pre = ctx.saved_tensors
    if pre.shape[0] != order.numel():
        raise RuntimeError("fused_moe: the forward ran without saving its activations (save=False)")
    need_dx = bool(ctx.needs_input_grad[0])
    tensors = (grad_y, x, order, sizes, weights, w_gate_up, w_down, pre)
    if _ops.plain_eager(grad_y, pre):  # the body itself, dpre written over pre, which only this backward reads
        dx, dw, dwgu, dwd = _backward_op_body(*tensors, ctx.top_k, need_dx, in_place=backward_in_place,
                                              weight_dtype=getattr(ctx, "weight_dtype", None))
        del tensors
        ctx.pre_overwritten = backward_in_place and backward_kind == "gemms"
    else:  # functional: what the compilers and tracers see
        dx, dw, dwgu, dwd = torch.ops.ragdot.fused_moe_backward(*tensors, ctx.top_k, need_dx)
    return (dx if need_dx else None), None, None, dw.to(weights.dtype), dwgu, dwd


@amp.autocast_off
def _fused_backward(ctx, grad_y, _grad_pre):
    return *_grads(ctx, grad_y), None, None, None


_fused_op.register_autograd(_fused_backward, setup_context=_fused_setup)


class _FusedEager(torch.autograd.Function):
    """The fused block in plain eager autograd: the forward and backward bodies called directly, without the
    custom ops' dispatch and their autograd wrapper (host time per layer); the same values as the ops. Float32
    master weights of a 16-bit x are cast here, once, and the casts saved for the backward, whose GEMMs write
    the weights' gradients in float32 (no 16-bit gradient, no cast kernel, no autograd cast node)."""

    @staticmethod
    def forward(ctx, x, order, sizes, weights, w_gate_up, w_down, top_k, deterministic):
        wgu, wd = _compute_weights(x, w_gate_up, w_down)
        y, pre = _forward(x, order, sizes, weights, wgu, wd, top_k, True, deterministic)
        ctx.save_for_backward(x, order, sizes, weights, wgu, wd, pre)
        ctx.mark_non_differentiable(pre)
        # pre has no gradient: without this autograd would hand the backward a zero-filled [T*k, 2H] for it
        # (a fill kernel and one more such buffer at the backward's peak)
        ctx.set_materialize_grads(False)
        ctx.top_k = top_k
        ctx.weight_dtype = w_gate_up.dtype if wgu is not w_gate_up else None
        return y, pre

    @staticmethod
    @amp.autocast_off
    def backward(ctx, grad_y, _grad_pre):
        if grad_y is None:  # y's gradient undefined: nothing flows back
            return (None,) * 8
        return *_grads(ctx, grad_y), None, None


# ------------------------------------------------------------------------------------------------ backward
# Which backward runs: "gemms" gathers the token rows of x and dy once into the permuted order and runs the four
# products as ragdot's own tuned ragged GEMMs (TMA kernels where the device has them) around one elementwise
# dSwiGLU kernel; "fused" runs the index-reading kernels of `ragdot.kernels.fused_moe_bwd` (pointer loads).
BACKWARDS = ("gemms", "fused")
backward_kind = "gemms"
# Whether the eager "gemms" backward writes dpre over the saved pre-activation (the forward op's second output,
# which `fused_experts` never hands out): its peak then holds that [T*k, 2H] buffer once instead of twice, and a
# second backward through a retained graph is refused (False allows it).
backward_in_place = True
# How the "gemms" backward's last product, w_gate_up's weight gradient, gets the token rows of x (a [T*k, D] copy
# of them sat beside dpre and every weight gradient at the backward's peak: `moe-bench --layer`'s act_peak_mib):
# "chunks" gathers them a slice of D columns at a time (`_chunks`: about a third of the copy alive, one slice
# at a time) and writes each slice of the gradient in place with the Gluon weight-gradient kernel (sm_90, 16-bit);
# "index" has ragdot's Triton ragged_k read x through the token index (no copy at all; on an H200 its product ran
# 1.14-1.32x the copy's time: docs/history.md, 2026-12-04 night); "copy" gathers all rows once and runs ragdot's
# chosen backend (`auto`); "gather" has the Gluon weight-gradient kernel copy x's token rows into its shared memory
# itself (`ragdot.kernels.gluon.ragged_k_gather`: no copy in memory, dpre read once; at the tune cache's Gluon
# tile, ping-pong included, its layer step took 1.004-1.046x "chunks"' on four layers, H100, eager clock,
# benchmarks/results/h100-20261207g/, for an activation peak of 0.50x `peer`'s against 0.58x). "chunks" and
# "gather" read through the index where the Gluon kernel does not run; "gather" takes "chunks" where its kernel
# refuses the layout (weights stored [E, 2H, D]).
WGRAD_ROWS = ("chunks", "gather", "index", "copy")
wgrad_rows = "chunks"


def _backward(dy, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx, in_place, weight_dtype=None):
    """weight_dtype: the dtype of the weights' gradients (None: the weights' own; float32 for master weights,
    whose 16-bit casts, the block's own, the in-place backward frees as soon as it has read them)."""
    wdt = w_gate_up.dtype if weight_dtype is None else weight_dtype
    if backward_kind == "gemms":
        release = in_place and wdt != w_gate_up.dtype
        return _backward_gemms(dy, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx, in_place, wdt,
                               release)
    dx, dw, dwgu, dwd = _backward_fused(dy, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx)
    return dx, dw, dwgu.to(wdt), dwd.to(wdt)


def _ragged_m(a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """a [A, K] rows grouped by expert, b [E, K, N] (any view) -> [A, N] through ragdot's chosen backend."""
    return _ops.run("ragged_m", a[None], b[None], sizes, a.dtype, "auto")[0]


def _k_operands(w: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(the side left lands on, a, b): the ragged_k operands [1, A, .] of the sum over rows of left^T right in w's
    memory order; a weight stored [E, Q, P] (`stored_transposed`) takes right^T left, which its caller transposes
    back (see `_weight_grad`)."""
    if stored_transposed(w):
        return "b", right[None], left[None]
    return "a", left[None], right[None]


def _ragged_k(left: torch.Tensor, right: torch.Tensor, sizes: torch.Tensor, w: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
    """Per expert, left^T right over its rows -> [E, P, Q] in `dtype`, in w's memory order (see `_weight_grad`)."""
    side, a, b = _k_operands(w, left, right)
    c = _ops.run("ragged_k", a, b, sizes, dtype, "auto")[:, 0]
    return c.transpose(1, 2) if side == "b" else c


def _backward_gemms(dy, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx, in_place, wdt,
                    release=False):
    """The transients are freed as soon as they are used and the largest weight gradient comes last; with
    `in_place`, dpre is written over pre (its version bumped; `_grads` refuses a second backward through a
    retained graph): the peak then holds pre's memory once. The weight gradients are written in `wdt`. With
    `release` (the weights are the block's own casts of master weights, under `in_place`), each cast's memory is
    freed after its last read, before the float32 gradients that follow are allocated."""
    _, fb = _kernels()
    dy_rows, tokens, slots = _ops.profiled("moe_gather", _permuted, dy, order, top_k)  # [A, D]: dy of each row's token
    g = _ragged_m(dy_rows, w_down.transpose(1, 2), sizes)  # [A, H]
    if release:
        _free_storage(w_down)  # its shape and strides stay: they give dw_down's memory order below
    # w * act written over g (a transient of this backward only): the peak holds one [A, H] buffer less
    dpre, act_w, dw = fb.swiglu_backward(g, pre, order, weights.reshape(-1), in_place=in_place, act_over_g=True)
    if in_place:
        torch.autograd.graph.increment_version(pre)
    del g
    dwd = _ragged_k(act_w, dy_rows, sizes, w_down, wdt)  # sum over rows of (w * act)^T dy
    del act_w, dy_rows
    dx = x.new_empty((0, x.shape[1]))
    if need_dx:
        rows = _ragged_m(dpre, w_gate_up.transpose(1, 2), sizes)  # [A, D]
        dx = _combine(rows, slots, None, top_k)
        del rows
    if release:
        _free_storage(w_gate_up)
    dwgu = _wgrad_from_rows(x, tokens, dpre, sizes, w_gate_up, wdt)
    return dx, dw.view(weights.shape), dwgu, dwd


def _free_storage(t: torch.Tensor) -> None:
    """Free t's memory now (stream-ordered, as any free: the kernels queued before still read it), whatever still
    refers to it; only for tensors the block made and no one else reads (the casts of master weights)."""
    t.untyped_storage().resize_(0)


_PREPARED: dict[tuple, object] = {}


def _prepared(key: tuple, build):
    found = _PREPARED.get(key)
    if found is None:
        found = remember(_PREPARED, key, build(), 1024)
    return found


# How many column slices the "chunks" weight gradient cuts D into, at most (`_chunks`). Three, not four: on an H100
# (benchmarks/results/h100-20261207c/) the product took 2.838 against 2.907 ms at gpt-oss-like's widths and 0.874
# against 0.951 at qwen3-30b-a3b's (graph clock; every slice re-reads dpre), the layer's eager step 0.996x / 0.978x,
# for a slice a third wider alive at the backward's peak (gpt-oss-like: 474 against 458 MiB, 0.58x `peer`'s).
CHUNK_SLICES = 3


def _chunks(d: int) -> list[tuple[int, int]]:
    """Column slices [d0, d1) of D for the "chunks" weight gradient: widths a multiple of 256 (whole tiles of
    the Gluon kernel's either side), at least 512, else D / `CHUNK_SLICES` rounded up; the last takes the rest.
    Few slices: each slice's launch reads all of dpre again (on an H200, seven slices of the deepseek3-671b
    slice's 7168 columns took 1.25x the one copy's time for the product, four slices of qwen3-30b-a3b's 1.18x)."""
    width = max(512, -(-d // CHUNK_SLICES // 256) * 256)
    return [(d0, min(d0 + width, d)) for d0 in range(0, d, width)]


def _wgrad_from_rows(x: torch.Tensor, tokens: torch.Tensor, right: torch.Tensor, sizes: torch.Tensor,
                     w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per expert, the sum over its rows of x[token]^T right: x [T, D], tokens int32 [A], right [A, Q] ->
    [E, D, Q] in `dtype`, in w's memory order (see `_weight_grad`), by `wgrad_rows`."""
    mode = wgrad_rows
    if mode not in WGRAD_ROWS:
        raise ValueError(f"ragdot.moe.fused.wgrad_rows={mode!r}: expected one of {', '.join(WGRAD_ROWS)}")
    if mode == "copy":
        return _ragged_k(_ops.profiled("moe_gather", x.index_select, 0, tokens), right, sizes, w, dtype)
    if mode in ("chunks", "gather") and x.dtype in (torch.float16, torch.bfloat16) and _gluon_runs(x.device):
        try:
            if mode == "gather" and not stored_transposed(w):
                return _wgrad_gather(x, tokens, right, sizes, dtype)
            return _wgrad_chunks(x, tokens, right, sizes, w, dtype)
        except NotImplementedError:  # the Gluon kernel does not take this layout: read through the index
            pass
    return _wgrad_index(x, tokens, right, sizes, w, dtype)


def _gluon_runs(device: torch.device) -> bool:
    from ragdot.kernels.gluon import unavailable_reason

    return device.type == "cuda" and unavailable_reason(device) is None


def _wgrad_index(x, tokens, right, sizes, w, dtype) -> torch.Tensor:
    """ragdot's Triton ragged_k reading x [T, D] through the token index (its `gather_config` tile), no copy."""
    from ragdot.kernels import ragged_k as rk_kernel

    side, a, b = _k_operands(w, x, right)
    key = ("index", side, a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device, sizes.shape[0], dtype)
    prepared = _prepared(key, lambda: rk_kernel.Prepared(a, b, sizes.shape[0], dtype, None, from_sizes=True,
                                                         gather=side))
    c = _ops.profiled("ragged_k", prepared, a, b, sizes, index=tokens)[0][:, 0]
    return c.transpose(1, 2) if side == "b" else c


def _wgrad_gather(x, tokens, right, sizes, dtype) -> torch.Tensor:
    """[E, D, Q]: the Gluon weight-gradient kernel with x's token rows copied in by its producer (no gathered copy
    of x, dpre read once), at the Gluon tile the tune cache holds for the whole product on gathered rows (its
    ping-pong tiles included), else at the kernel's default tile."""
    from ragdot.kernels.gluon.ragged_k_gather import Prepared as GatherPrepared

    e = sizes.shape[0]
    a, b = x[None], right[None]
    key = ("gather", a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device, e, dtype)
    prepared = _prepared(key, lambda: _gather_kernel(a, b, e, dtype, GatherPrepared))
    return _ops.profiled("ragged_k", prepared, a, b, sizes, None, None, tokens)[0][:, 0]


def _gather_kernel(a: torch.Tensor, b: torch.Tensor, e: int, dtype: torch.dtype, kernel: Any) -> Any:
    """`kernel` (the gathering Prepared) for x a [1, T, D] and right b [1, A, Q] at the tune cache's Gluon config
    for the product on a gathered [1, A, D] copy, or at its default tile where there is none or it refuses it."""
    from ragdot.tune.select import plan

    rows = a.new_empty((1, 1, a.shape[2])).expand(1, b.shape[1], a.shape[2])  # the copy's shape, no memory
    config = plan("ragged_k", "gluon", rows, b, e, dtype)[0][1]
    if config is not None:
        try:
            return kernel(a, b, e, dtype, config, from_sizes=True)
        except NotImplementedError:
            pass
    return kernel(a, b, e, dtype, None, from_sizes=True)


def _wgrad_chunks(x, tokens, right, sizes, w, dtype) -> torch.Tensor:
    """The gradient a slice of D at a time: the slice's token rows gathered ([A, width]), the Gluon kernel
    writing the gradient's matching rows (columns, for weights stored [E, Q, D]) through a strided view, at its
    default tile. Not the tile the tune cache picks for the whole product: on an H100 gpt-oss-like's (a Triton
    tile, 2.47 ms for the whole product) ran four slices in 3.04 ms against the Gluon default's 2.91 (graph
    clock, `benchmarks/wgrad_rows.py`; benchmarks/results/h100-20261207c/)."""
    from ragdot.kernels.gluon.ragged_k import Prepared as GluonPrepared
    from ragdot.kernels.ragged_k import schedule

    e, d, q = sizes.shape[0], x.shape[1], right.shape[1]
    transposed = stored_transposed(w)
    out = torch.empty((e, q, d) if transposed else (e, d, q), dtype=dtype, device=x.device)
    sched = _ops.profiled("ragged_k", schedule, sizes, right.shape[0])  # the groups' order and row ranges, once
    for d0, d1 in _chunks(d):
        rows = _ops.profiled("moe_gather", x[:, d0:d1].index_select, 0, tokens)  # [A, d1 - d0]
        side, a, b = _k_operands(w, rows, right)
        view = (out[:, :, d0:d1] if transposed else out[:, d0:d1])[:, None]
        strides = (view.stride(0), view.stride(2))
        key = ("chunks", side, a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device, e, dtype, strides)
        prepared = _prepared(key, lambda a=a, b=b, strides=strides: GluonPrepared(
            a, b, e, dtype, None, from_sizes=True, out_strides=strides))
        _ops.profiled("ragged_k", prepared, a, b, sizes, view, sched)
        del rows, a, b  # before the next slice's copy: one slice alive at a time
    return out.transpose(1, 2) if transposed else out


def _backward_fused(dy, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx):
    fm, fb = _kernels()
    w_flat = weights.reshape(-1)
    dpre, act, dw = _ops.profiled("fused_down_backward", fb.down_bwd_swiglu, dy, w_down, order, sizes, w_flat, pre,
                                  top_k)
    # per expert, the sum over its rows of (w * act)^T dy and x^T dpre; the router weight scales either factor
    dwd = _weight_grad(fb, w_down, (act, False), (dy, True), order, sizes, w_flat, top_k)
    dwgu = _weight_grad(fb, w_gate_up, (x, True), (dpre, False), order, sizes, None, top_k)
    if not need_dx:
        return x.new_empty((0, x.shape[1])), dw.view(weights.shape), dwgu, dwd
    rows = _ops.profiled("fused_down", fm.down_scatter, dpre, w_gate_up.transpose(1, 2), order, sizes, None, top_k)
    dx = _ops.profiled("moe_combine", fm.sum_choices, rows, top_k)
    return dx, dw.view(weights.shape), dwgu, dwd


def _weight_grad(fb, w, left, right, order, sizes, w_flat, top_k) -> torch.Tensor:
    """The gradient of w [E, P, Q] = sum left^T right over each expert's rows, in w's memory order (a weight
    stored [E, Q, P], as transformers' [E, out, in] parameters give, gets it so: AccumulateGrad keeps it);
    left, right: (rows, gathered through the token index)."""
    (lt, lg), (rt, rg) = left, right
    if stored_transposed(w):
        return _ops.profiled("fused_wgrad", fb.weight_grad, rt, lt, order, sizes, w_flat, top_k, gather_left=rg,
                             gather_right=lg).transpose(1, 2)
    return _ops.profiled("fused_wgrad", fb.weight_grad, lt, rt, order, sizes, w_flat, top_k, gather_left=lg,
                         gather_right=rg)


def _like(w: torch.Tensor) -> torch.Tensor:
    """A new tensor of w's shape in the memory order `_weight_grad` gives."""
    if stored_transposed(w):
        return w.new_empty((w.shape[0], w.shape[2], w.shape[1])).transpose(1, 2)
    return w.new_empty(w.shape)


@torch.library.custom_op("ragdot::fused_moe_backward", mutates_args=())
def _fused_backward_op(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    order: torch.Tensor,
    sizes: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    pre: torch.Tensor,
    top_k: int,
    need_dx: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_op_body(grad_y, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx)


def _backward_op_body(grad_y, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx, in_place=False,
                      weight_dtype=None):
    dy = grad_y.to(x.dtype).contiguous()
    return _backward(dy, x.contiguous(), order, sizes, weights.contiguous(), w_gate_up, w_down, pre, top_k,
                     need_dx, in_place, weight_dtype)


@_fused_backward_op.register_fake
def _(grad_y, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx):
    return (x.new_empty(x.shape if need_dx else (0, x.shape[1])), weights.new_empty(weights.shape, dtype=torch.float32),
            _like(w_gate_up), _like(w_down))


# FLOPs for torch.utils.flop_counter (`ops.register_flops`): A routed rows (order [A]), x [T, D], w_down [E, H, D];
# the forward's two products 2AD(2H) + 2AHD, the backward's four (the input gradient's only when asked)
def _forward_flops(x, order, sizes, weights, w_gate_up, w_down, *args, out_shape=None, **kwargs) -> int:
    return 6 * order[0] * x[1] * w_down[1]


def _backward_flops(grad_y, x, order, sizes, weights, w_gate_up, w_down, pre, top_k, need_dx, *args, out_shape=None,
                    **kwargs) -> int:
    return (12 if need_dx else 8) * order[0] * x[1] * w_down[1]


_ops.register_flops(torch.ops.ragdot.fused_moe, _forward_flops)
_ops.register_flops(torch.ops.ragdot.fused_moe_backward, _backward_flops)


# ------------------------------------------------------------------------------------------------ public API
def fused_experts(
    x: torch.Tensor,
    order: torch.Tensor,
    sizes: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    deterministic: bool = True,
) -> torch.Tensor:
    """y[t] = sum_j weights[t, j] * expert_{e(t,j)}(x[t]), expert(v) = (silu(v wg) * (v wu)) w_down.

    x [T, D]; order, sizes from ``sort_experts``; weights float [T, k]; w_gate_up [E, D, 2H] (gate | up);
    w_down [E, H, D], in x's dtype or, for a 16-bit x, float32 (master weights, as under torch.autocast: the block
    multiplies their casts to x's dtype, made once per forward, and in eager autograd writes their gradients in
    float32 straight from its GEMMs). Differentiable in x, weights, w_gate_up and w_down; y has x's dtype."""
    _check(x, order, sizes, weights, w_gate_up, w_down)
    top_k = weights.shape[1]
    grads = (x, weights, w_gate_up, w_down)
    save = torch.is_grad_enabled() and any(t.requires_grad for t in grads)
    if _ops.plain_eager(x):  # without the custom op's dispatch
        if save:
            return _FusedEager.apply(x, order, sizes, weights, w_gate_up, w_down, top_k, deterministic)[0]
        wgu, wd = _compute_weights(x, w_gate_up, w_down)
        return _forward(x, order, sizes, weights, wgu, wd, top_k, False, deterministic)[0]
    if _ops._transformed() and not torch.compiler.is_compiling():
        raise NotImplementedError("fused_experts does not run under torch.func transforms or forward-mode AD; "
                                  "MoELayer takes its unfused path there (or pass fused=False)")
    if w_gate_up.dtype != x.dtype:  # the ops take one dtype: master weights cast through autograd here
        w_gate_up, w_down = w_gate_up.to(x.dtype), w_down.to(x.dtype)
    y, _ = torch.ops.ragdot.fused_moe(x, order, sizes, weights, w_gate_up, w_down, top_k, save, deterministic)
    return y


def _check(x, order, sizes, weights, w_gate_up, w_down) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a tensor [tokens, dim], got {getattr(x, 'shape', type(x).__name__)}")
    t, d = x.shape
    if w_gate_up.dim() != 3 or w_gate_up.shape[1] != d or w_gate_up.shape[2] % 2:
        raise ValueError(f"w_gate_up must have shape [E, {d}, 2*hidden], got {tuple(w_gate_up.shape)}")
    e, h = w_gate_up.shape[0], w_gate_up.shape[2] // 2
    if tuple(w_down.shape) != (e, h, d):
        raise ValueError(f"w_down must have shape {(e, h, d)}, got {tuple(w_down.shape)}")
    if weights.dim() != 2 or weights.shape[0] != t or not weights.is_floating_point():
        raise ValueError(f"weights must be a float tensor [{t}, top_k], got {tuple(weights.shape)}")
    if order.dtype != torch.int32 or order.numel() != weights.numel():
        raise ValueError(f"order must be int32 [{weights.numel()}] from sort_experts, got {tuple(order.shape)}")
    if sizes.dtype != torch.int32 or tuple(sizes.shape) != (e,):
        raise ValueError(f"sizes must be int32 [{e}] from sort_experts, got {tuple(sizes.shape)}")
    if not fused_supported(x, w_gate_up, w_down) or w_gate_up.dtype != w_down.dtype:
        _refuse_wrong_dots(x.dtype)  # the reason where it is the interpreter's (fused_supported asked it too)
        raise TypeError(f"fused experts need triton, x float16/bfloat16/float32 and both weights in x's dtype (or "
                        f"float32 for a 16-bit x), got x {x.dtype}, w_gate_up {w_gate_up.dtype}, w_down {w_down.dtype}")


def _refuse_wrong_dots(dtype: torch.dtype) -> None:
    """NotImplementedError where Triton's interpreter multiplies `dtype` wrong (`kernels.interpreter`)."""
    reason = dot_refusal(dtype)
    if reason is not None:
        raise NotImplementedError(f"fused experts: {reason}")
