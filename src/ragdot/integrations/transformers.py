"""Hugging Face transformers: ragdot as an experts implementation.

    import ragdot.integrations.transformers as ragdot_hf
    ragdot_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="ragdot")
    model.set_experts_implementation("ragdot")          # or switch a model already built

transformers (>= 5) runs the experts of every MoE family whose experts class carries its
``use_experts_implementation`` decorator through ``ExpertsInterface``; ``register`` adds ``experts_forward`` there.
The forward groups the (token, choice) rows by expert with ``ragdot.moe.permute``, runs the up and down
projections with ``ragdot.ragged_dot`` on the model's own weight tensors (no copies: the untransposed layout is a
strided view) and combines the top-k rows with ``ragdot.moe.unpermute``. Nothing is copied to the host, so the
forward works under CUDA graphs and ``torch.compile``.

Memory (docs/integrations.md, "Memory of the experts path"): [E, out, in] weights run through a transposed view,
whose gradient ragged_dot computes in the weight's own layout (eager and compiled: no weight-sized transient, no
transposing copy into the parameter), and in eager autograd the decorator's default SiLU gate runs through
ragdot's SwiGLU function, which keeps only the up projection's output for the backward.

Layout flags the decorator sets, and how they are honoured:

- ``is_transposed``: weights [E, in, out] are used as they are; [E, out, in] through a transposed view.
- ``has_bias``: the per-expert biases ``*_proj_bias`` [E, out] are added to each row of their expert; their
  gradient sums each expert's rows (``ragdot.moe.group_bias``: no atomic scatter, deterministic).
- ``has_gate``: ``gate_up_proj`` followed by the class's ``_apply_gate`` (the model's activation and its
  gate/up split); without it, ``up_proj`` followed by ``act_fn``.
- ``is_concatenated``: the gate/up split is the class's ``_apply_gate``; an interleaved layout
  (``is_concatenated=False``) is refused unless the class defines its own ``_apply_gate``.
- ``has_post_expert_norm``: ``post_expert_norm`` is applied to each expert's output row.
- expert parallelism (``_is_expert_parallel``): ids ``>= num_experts`` mark choices held by another rank; their
  rows get no matmul work, their routing weights are zeroed, and they add nothing to the output or to any
  gradient. Releases
  without the flag (5.17) may pass such ids at any time: they are always handled there.

By default (``fused=None``) an eager training step runs ``ragdot.moe.fused`` where ``ragdot.moe.fused.preferred``
says it measured faster (16-bit CUDA inputs, enough routed work; not under ``torch.compile``); ``fused=True``
(``register("ragdot_fused", fused=True)``) runs it wherever it applies; ``fused=False`` never. It applies where
the layout is plain SwiGLU: gate/up concatenated with the class's default ``_apply_gate``, a SiLU ``act_fn``, no
biases, no post-expert norm, one dtype (or, inside ``torch.autocast``, float32 weights: master weights, below),
Triton present, a CUDA device (or Triton's interpreter). Its forward
gathers the token rows once and runs both projections as ragdot's tuned ragged GEMMs, keeping only the gate|up
pre-activation for the backward. Off-rank choices become expert 0 with weight 0 there (computed, then dropped).
Other layouts take the unfused path.

Inputs in another dtype than the weights are cast to the weights' dtype; the output has the input's. Inside a
``torch.autocast`` region the expert products then run in the region's dtype, as ``ragdot.ragged_dot`` does there
(a matmul's rule: float32 weights are cast per call, and as ragdot's master operands their gradients come from
products with a float32 output), where transformers' "grouped_mm" turns autocast off and multiplies in the
weights' dtype. The fused block takes float32 weights there as master weights: cast once per forward inside it,
their gradients written in float32 by its GEMMs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ragdot import amp
from ragdot.api import _check_backend, _traced_ragged_m, ragged_dot
from ragdot.kernels.interpreter import interpreting
from ragdot.moe.fused import fused_experts, fused_supported, preferred, sort_experts
from ragdot.moe.group_bias import add_group_bias
from ragdot.moe.layer import _SwiGLU, _transformed
from ragdot.moe.permute import permute, unpermute

__all__ = [
    "NAME", "FUSED_NAME", "experts_forward", "fused_applies", "make_experts_forward", "register", "is_registered"
]

NAME = "ragdot"
FUSED_NAME = "ragdot_fused"

_FORWARDS: dict[tuple[str | None, bool | None], Callable] = {}
_SILU = ("SiLU", "SiLUActivation")


def _flag(module: torch.nn.Module, name: str, default: bool) -> bool:
    """A layout flag: a plain attribute of the module or its class (never a parameter, buffer or submodule).
    Read from the instance's ``__dict__`` and then the class, not through ``getattr``: a flag the module lacks
    would go through ``nn.Module.__getattr__``, and under torch.compile every decode step's guard check would
    repeat that failing lookup (a raised AttributeError per flag and layer)."""
    cls = type(module)
    if cls.__getattr__ is not _MODULE_GETATTR:  # a wrapper that answers lookups itself: ask it
        return bool(getattr(module, name, default))
    value = module.__dict__.get(name, _MISSING)
    if value is _MISSING:
        value = getattr(cls, name, default)
        if hasattr(type(value), "__get__"):  # a property or another descriptor: its value is the instance's
            value = getattr(module, name, default)
    return bool(value)


_MISSING = object()
_MODULE_GETATTR = torch.nn.Module.__getattr__


def _check_layout(module: torch.nn.Module) -> None:
    """Raise a one-line error naming the flag when the module's layout is not one this forward handles. (The
    class name is looked up only in the messages: under torch.compile, reading each layer's ``type(module)``
    would add a guard per layer to every compiled call's check.)"""
    num_experts = getattr(module, "num_experts", None)
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"{type(module).__name__}.num_experts must be a positive int, got {num_experts!r}")
    has_gate = _flag(module, "has_gate", True)
    if _flag(module, "has_bias", False):
        for name in ("gate_up_proj_bias" if has_gate else "up_proj_bias", "down_proj_bias"):
            if not isinstance(getattr(module, name, None), torch.Tensor):
                raise ValueError(f"has_bias=True needs {type(module).__name__}.{name}; it is missing")
    if has_gate and not hasattr(module, "_apply_gate"):
        raise ValueError(f"has_gate=True needs {type(module).__name__}._apply_gate; it is missing")
    if has_gate and not _flag(module, "is_concatenated", True) and _uses_default_gate(module):
        raise ValueError(
            f"is_concatenated=False (interleaved gate/up) needs {type(module).__name__} to define its own _apply_gate; "
            "the default one splits a concatenated [gate; up] layout"
        )
    if not has_gate and not callable(getattr(module, "act_fn", None)):
        raise ValueError(f"has_gate=False needs {type(module).__name__}.act_fn; it is missing")
    if _flag(module, "has_post_expert_norm", False) and not callable(getattr(module, "post_expert_norm", None)):
        raise ValueError(f"has_post_expert_norm=True needs {type(module).__name__}.post_expert_norm; it is missing")


def _expert_parallel(module: torch.nn.Module) -> bool:
    """Whether expert ids may hold the off-rank sentinel ``num_experts``.

    Newer transformers releases (5.24) set ``_is_expert_parallel`` on every decorated experts module (False
    unless expert parallelism is configured); older 5.x ones (5.17) have no flag and may pass sentinels at any
    time, so without the flag the sentinels are always handled (a few element-wise ops on [T, k])."""
    return _flag(module, "_is_expert_parallel", True)


def _uses_default_gate(module: torch.nn.Module) -> bool:
    fn = getattr(type(module), "_apply_gate", None)
    return getattr(fn, "__name__", "") == "_default_apply_gate"


def _checked_weight(weight: torch.Tensor, name: str, num_experts: int) -> torch.Tensor:
    if weight.dim() != 3 or weight.shape[0] != num_experts:
        raise ValueError(f"{name} must have shape [num_experts={num_experts}, ., .], got {tuple(weight.shape)}")
    return weight


def _as_rhs(weight: torch.Tensor, is_transposed: bool, name: str, num_experts: int) -> torch.Tensor:
    """The [E, in, out] operand of ragged_dot: the weight itself, or a transposed view of [E, out, in]."""
    weight = _checked_weight(weight, name, num_experts)
    return weight if is_transposed else weight.transpose(1, 2)


def _eager_grad(*tensors: torch.Tensor) -> bool:
    """Eager autograd (no torch.compile trace, no torch.func transform) with a tensor that needs a gradient."""
    if torch.compiler.is_compiling() or _transformed() or not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in tensors)


def _matmul(rows, weight, is_transposed, sizes, backend):
    """ragged_dot of rows with a weight [E, in, out] (is_transposed) or [E, out, in] (transformers' default,
    through a transposed view: ragged_dot computes that weight's gradient in its own [E, out, in] layout)."""
    w = weight if is_transposed else weight.transpose(1, 2)
    if torch.compiler.is_compiling() and not amp.active():  # ragdot's own counts and operands: nothing to check
        return _traced_ragged_m(rows, w, sizes, _check_backend(backend))
    return ragged_dot(rows, w, sizes, backend=backend)


def _linear(
    rows: torch.Tensor,
    weight: torch.Tensor,
    is_transposed: bool,
    bias: torch.Tensor | None,
    sizes: torch.Tensor,
    row_experts: torch.Tensor | None,
    backend: str | None,
) -> torch.Tensor:
    out = _matmul(rows, weight, is_transposed, sizes, backend)
    if bias is not None:  # its gradient sums each expert's rows (ragdot.moe.group_bias), no atomic scatter
        out = add_group_bias(out, bias, row_experts, sizes)
    return out


def _gate(module: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The module's gate on the up projection's rows. The decorator's default gate with a SiLU activation runs
    ragdot's SwiGLU in eager autograd: the same elementwise ops (the same bits), but only h is saved for the
    backward (silu(gate) is recomputed there), where the plain ops also keep silu(gate) [S, H]."""
    if _eager_grad(h) and _uses_default_gate(module) and type(getattr(module, "act_fn", None)).__name__ in _SILU:
        return _SwiGLU.apply(h)
    return module._apply_gate(h)


def _forward(
    module: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    backend: str | None,
) -> torch.Tensor:
    _check_layout(module)
    num_experts = module.num_experts
    has_gate, has_bias = _flag(module, "has_gate", True), _flag(module, "has_bias", False)
    is_transposed = _flag(module, "is_transposed", False)
    ep = _expert_parallel(module)
    prefix = "gate_up_proj" if has_gate else "up_proj"
    w_up = _checked_weight(getattr(module, prefix), prefix, num_experts)
    w_down = _checked_weight(module.down_proj, "down_proj", num_experts)
    b_up = getattr(module, f"{prefix}_bias") if has_bias else None
    b_down = module.down_proj_bias if has_bias else None

    x = hidden_states.to(w_up.dtype)
    ids = top_k_index.clamp(max=num_experts) if ep else top_k_index
    # One extra group at the tail collects the off-rank choices; ragged_dot leaves its rows at zero.
    rows, routing = permute(x, ids, num_experts + 1 if ep else num_experts)
    sizes = routing.group_sizes[:num_experts] if ep else routing.group_sizes
    row_experts = None
    if has_bias:
        # Each permuted row's expert: the choice's id scattered to the row it was permuted to (one launch).
        # Off-rank rows (id num_experts) take expert num_experts - 1's bias; ragged_dot leaves their products at
        # zero and their routing weights are zeroed below, so they add nothing to the output or to any gradient.
        flat = ids.reshape(-1)
        row_experts = flat.new_empty(flat.shape).index_put_((routing.slots,), flat)
        if ep:
            row_experts = row_experts.clamp(max=num_experts - 1)

    h = _linear(rows, w_up, is_transposed, b_up, sizes, row_experts, backend)
    h = _gate(module, h) if has_gate else module.act_fn(h)
    out = _linear(h.to(w_down.dtype), w_down, is_transposed, b_down, sizes, row_experts, backend)
    if _flag(module, "has_post_expert_norm", False):
        out = module.post_expert_norm(out)

    weights = top_k_weights
    if ep:
        # Off-rank choices sort to the tail, whose products ragged_dot leaves at zero; a bias or a post-expert
        # norm can make those rows non-zero, so their weights are zeroed (no routing-weight gradient either), and
        # after a post-expert norm (which could turn them into NaN) the rows themselves are masked.
        weights = weights.masked_fill(top_k_index >= num_experts, 0.0)
        if _flag(module, "has_post_expert_norm", False):
            tail = torch.arange(out.shape[0], device=out.device) >= sizes.sum()
            out = out.masked_fill(tail.unsqueeze(-1), 0.0)
    return unpermute(out, routing, weights).to(hidden_states.dtype)


def fused_applies(module: torch.nn.Module, hidden_states: torch.Tensor) -> bool:
    """Whether ``ragdot.moe.fused`` can run this experts module: plain SwiGLU, no bias, no post norm, one dtype
    (float32 weights under autocast), on a CUDA device (or anywhere under Triton's interpreter,
    ``TRITON_INTERPRET=1``)."""
    if not _flag(module, "has_gate", True) or _flag(module, "has_bias", False):
        return False
    if _flag(module, "has_post_expert_norm", False) or not _flag(module, "is_concatenated", True):
        return False
    if not _uses_default_gate(module) or type(getattr(module, "act_fn", None)).__name__ not in _SILU:
        return False
    w_up, w_down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(w_up, torch.Tensor) or not isinstance(w_down, torch.Tensor):
        return False
    on_device = hidden_states.device.type == "cuda" or interpreting()
    region = amp.autocast_dtype(hidden_states)  # under torch.autocast float32 weights are master weights
    if not on_device or (region is None and hidden_states.dtype != w_up.dtype):
        return False
    return fused_supported(hidden_states, w_up, w_down, dtype=region)


def _fused_weights(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's operands: w_gate_up [E, D, 2H] and w_down [E, H, D], the module's weights or views of them."""
    is_transposed = _flag(module, "is_transposed", False)
    return (_as_rhs(module.gate_up_proj, is_transposed, "gate_up_proj", module.num_experts),
            _as_rhs(module.down_proj, is_transposed, "down_proj", module.num_experts))


def _fused_forward(
    module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    num_experts = module.num_experts
    w_up, w_down = _fused_weights(module)
    ids, weights = top_k_index, top_k_weights
    if _expert_parallel(module):
        # Off-rank choices run on expert 0 with weight 0: they add nothing to the output or to any gradient.
        off_rank = top_k_index >= num_experts
        ids, weights = ids.masked_fill(off_rank, 0), weights.masked_fill(off_rank, 0.0)
    sizes, order = sort_experts(ids, num_experts)
    region = amp.autocast_dtype(hidden_states)
    if region is None:
        return fused_experts(hidden_states, order, sizes, weights, w_up, w_down).to(hidden_states.dtype)
    # torch.autocast: x cast to the region's dtype, the float32 weights taken as master weights (the block casts
    # them once and writes their gradients in float32), autocast off inside
    with amp.off_for(hidden_states):
        y = fused_experts(amp.cast(hidden_states, region), order, sizes, weights, w_up, w_down)
    return y.to(hidden_states.dtype)


def _use_fused(module: torch.nn.Module, hidden_states: torch.Tensor, top_k: int, fused: bool | None,
               backend: str | None) -> bool:
    """Whether this call runs ``ragdot.moe.fused``: where ``fused_applies``, always for ``fused=True``; for None
    (the default) with ragged_dot's ``auto`` backend, outside ``torch.compile``, where ``ragdot.moe.fused.preferred``
    says the block measured faster (training, 16-bit CUDA inputs, enough routed work). Compiled whole models
    measured mixed on an H200 (Qwen3-MoE 0.99x, DeepSeek-V3-like 1.02x the unfused path's step, the latter with
    1.04x its peak memory: docs/integrations.md), so compiled code keeps the unfused path unless asked."""
    if fused is False:
        return False
    if fused is None and (backend is not None or not torch.is_grad_enabled() or torch.compiler.is_compiling()):
        return False  # inference (decode) leaves here first: no layout checks on its host time
    _check_layout(module)
    if not fused_applies(module, hidden_states):
        return False
    if fused:
        return True
    return preferred(hidden_states, top_k, *_fused_weights(module), dtype=amp.autocast_dtype(hidden_states))


def make_experts_forward(backend: str | None = None, *, fused: bool | None = None) -> Callable:
    """The experts forward for ``ExpertsInterface`` running ragged_dot on ``backend`` (None: ragdot's ``auto``).

    ``fused``: True runs ``ragdot.moe.fused`` wherever ``fused_applies`` (the backend is then not used); None (the
    default) where it also measured faster (``_use_fused``); False never. The ragged_dot path elsewhere. One
    function object per (backend, fused), so registering twice changes nothing.
    """
    if fused not in (None, True, False):
        raise TypeError(f"fused must be None, True or False, got {fused!r}")
    key = (backend, fused)
    if key not in _FORWARDS:
        _check_backend(backend)  # unknown or unusable here: one clear error now, not inside a model's forward

        def forward(
            self: torch.nn.Module,
            hidden_states: torch.Tensor,
            top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor,
        ) -> torch.Tensor:
            if _use_fused(self, hidden_states, top_k_index.shape[-1], fused, backend):
                return _fused_forward(self, hidden_states, top_k_index, top_k_weights)
            return _forward(self, hidden_states, top_k_index, top_k_weights, backend)

        forward.__name__ = forward.__qualname__ = "ragdot_fused_experts_forward" if fused else "ragdot_experts_forward"
        forward.__doc__ = f"ragdot experts forward (ragged_dot backend {backend or 'auto'!r}, fused={fused})."
        _FORWARDS[key] = forward
    return _FORWARDS[key]


def experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Experts forward with the signature of transformers' experts implementations (backend ``auto``).

    hidden_states [T, D], top_k_index int [T, k], top_k_weights [T, k] -> [T, D] in hidden_states' dtype.
    """
    return make_experts_forward(None)(self, hidden_states, top_k_index, top_k_weights)


def _interface():
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as e:
        raise ImportError(
            f"ragdot.integrations.transformers needs transformers >= 5 (pip install 'ragdot[transformers]'): {e}"
        ) from None
    return ExpertsInterface


def register(name: str = NAME, *, backend: str | None = None, fused: bool | None = None) -> str:
    """Register the ragdot experts forward in transformers' ExpertsInterface under ``name``; returns ``name``.

    ``fused``: see ``make_experts_forward`` (None: the fused block where it measured faster; True: wherever it
    applies, as ``FUSED_NAME`` registers it; False: never). Idempotent: calling it again with
    the same arguments changes nothing. Afterwards
    ``experts_implementation=name`` works in ``from_pretrained``, in a config and in ``set_experts_implementation``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    interface = _interface()
    builtin = {"eager", "grouped_mm", "batched_mm", "deepgemm", "sonicmoe"}
    if name in builtin:
        raise ValueError(f"name={name!r} is one of transformers' own experts implementations; pick another name")
    fn = make_experts_forward(backend, fused=fused)
    current = interface._global_mapping.get(name)
    if current is not None and current not in _FORWARDS.values():
        raise ValueError(f"name={name!r} is already registered to {current!r} in ExpertsInterface; pick another name")
    if current is not fn:
        interface.register(name, fn)
    return name


def is_registered(name: str = NAME) -> bool:
    """Whether ``name`` is currently registered in transformers' ExpertsInterface by this module."""
    interface = _interface()
    return interface._global_mapping.get(name) in _FORWARDS.values()
