"""Public entry points: argument checking, canonicalization, group offsets, dispatch.

The eager hot path: everything that depends only on a call's static signature (operand shapes, strides,
dtypes and devices, the group sizes' shape/dtype/device, dimension numbers, output dtype, backend, validate)
is checked and resolved once into a `_Call` (the canonical views, the output layout, the prepared runner of
the forward problem, and after the first backward its bound gradient products, `grad_plan`), kept in a
dictionary; a repeated call is that lookup and the backend's prepared call. Checks run only when a
signature is first seen, so every mistake still raises at once and a cached call cannot change a result.
Under `torch.compile` the same checks run while tracing and the problems are custom ops (`ragdot.ops`).
"""

from __future__ import annotations

import torch

from ragdot import amp, grad_plan, ops
from ragdot._memo import remember
from ragdot.backends import BACKEND_NAMES, available_backends, unusable_reason
from ragdot.dimension_numbers import (
    RAGGED_DOT_DN,
    Canonical,
    RaggedDotDimensionNumbers,
    ShapeError,
    canonicalize,
    plan_views,
)
from ragdot.groups import group_ends_from_sizes, validate_requested, validate_sizes
from ragdot.ops import apply_op, dispatch_modes

__all__ = ["ragged_dot", "ragged_dot_general", "backends", "explain", "group_ends_from_sizes"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def backends() -> list[str]:
    """Names of the concrete backends usable on this machine now (pass one as `backend=`)."""
    return available_backends()


def _check_backend(backend: str | None) -> str:
    if backend is None:
        return "auto"
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
    if backend == "auto":
        return backend
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend={backend!r} is unknown; expected one of {', '.join(BACKEND_NAMES)}, 'auto' or None")
    if torch.compiler.is_compiling():  # probing installs is not traceable: an unusable one fails when it runs
        return backend
    usable = available_backends()
    if backend not in usable:
        raise ValueError(
            f"backend={backend!r} is not usable on this machine: {unusable_reason(backend)}; available: "
            f"{', '.join(usable)}"
        )
    return backend


def _as_sizes(group_sizes, lhs):
    """Tensors pass through; a list, tuple or numpy array of ints becomes an int64 tensor on lhs's device."""
    if isinstance(group_sizes, torch.Tensor) or not isinstance(lhs, torch.Tensor):
        return group_sizes
    if isinstance(group_sizes, (list, tuple)) or type(group_sizes).__module__ == "numpy":
        try:
            sizes = torch.as_tensor(group_sizes)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"group_sizes must be a 1-D sequence of ints, got {group_sizes!r}") from None
        if sizes.numel() == 0:
            sizes = sizes.to(torch.int64)
        return sizes.to(lhs.device)
    return group_sizes


def _check_operands(lhs, rhs, group_sizes, preferred_element_type) -> torch.dtype:
    for name, t in (("lhs", lhs), ("rhs", rhs), ("group_sizes", group_sizes)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        # by name (torch.distributed may be absent); where a signature is first seen, so the hot path pays nothing
        if type(t).__name__ == "DTensor":
            raise TypeError(f"{name} is a DTensor: ragdot multiplies local tensors; pass {name}.to_local() (each "
                            "rank's own rows and experts, as torchtitan's grouped experts do)")
    if lhs.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"lhs must be float16, bfloat16, float32 or float64, got {lhs.dtype}")
    if rhs.dtype != lhs.dtype:
        raise TypeError(f"rhs must have lhs's dtype {lhs.dtype}, got {rhs.dtype}; cast one of them first")
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
        raise TypeError(f"group_sizes must be an integer tensor, got {group_sizes.dtype}")
    if group_sizes.ndim != 1:
        raise ShapeError(
            f"group_sizes must be 1-D (one size per group) here, got shape {tuple(group_sizes.shape)} "
            "(ragged_dot_general also takes jax's [slices..., G] form: one row of sizes per slice)"
        )
    if lhs.device != rhs.device:
        raise ValueError(f"lhs and rhs must be on one device, got {lhs.device} and {rhs.device}")
    if preferred_element_type is None:
        return lhs.dtype
    if not isinstance(preferred_element_type, torch.dtype) or preferred_element_type not in _FLOAT_DTYPES:
        raise TypeError(
            "preferred_element_type must be None or one of torch.float16, torch.bfloat16, torch.float32, "
            f"torch.float64, got {preferred_element_type!r}"
        )
    return preferred_element_type


def _prepare(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: object,
    dimension_numbers: object,
    preferred_element_type: torch.dtype | None,
    backend: str | None,
) -> tuple[Canonical, torch.Tensor, torch.dtype, str]:
    """Checked arguments of a call: (canonical problem, group sizes tensor, output dtype, backend name)."""
    dn = RaggedDotDimensionNumbers.coerce(dimension_numbers)
    group_sizes = _as_sizes(group_sizes, lhs)
    out_dtype = _check_operands(lhs, rhs, group_sizes, preferred_element_type)
    name = _check_backend(backend)
    can: Canonical = canonicalize(lhs, rhs, group_sizes.shape[0], dn)
    return can, group_sizes, out_dtype, name


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _direct_kind(plan, lhs: torch.Tensor, rhs: torch.Tensor) -> str | None:
    """How the user's tensors relate to the canonical operands, for backends that can skip the views:
    "matrix" (they are the operands without the unit batch axis), "address" (the operands are views that
    start at their first elements), or None; always None when the output needs a permutation."""
    if plan.broadcast != 1 or plan.perm is not None:
        return None
    if plan._perms == (None, None) and plan.lshape == (1, *lhs.shape) and plan.rshape == (1, *rhs.shape):
        return "matrix"
    try:
        a, b = plan.views(lhs, rhs)
        same = a.data_ptr() == lhs.data_ptr() and b.data_ptr() == rhs.data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (transform wrappers, fakes)
        return None
    return "address" if same else None


class _Call:
    """One static call signature, checked and resolved: canonical views, output layout, forward runner, and
    the inverse maps that take canonical gradients back to the user's layouts (eager autograd records the
    whole call as one node, `_CallFunction`)."""

    __slots__ = ("plan", "mode", "out_dtype", "backend", "validate", "device", "groups", "runner", "state",
                 "lperm_shape", "rperm_shape", "out_shape", "inv_perm", "inv_lperm", "inv_rperm", "direct", "bwd")

    def __init__(self, lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, dimension_numbers: object,
                 preferred_element_type: torch.dtype | None, backend: str | None, validate: bool):
        if not isinstance(validate, bool):
            raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
        dn = RaggedDotDimensionNumbers.coerce(dimension_numbers)
        self.out_dtype = _check_operands(lhs, rhs, group_sizes, preferred_element_type)
        self.backend = _check_backend(backend)
        self.groups = group_sizes.shape[0]
        plan = self.plan = plan_views(lhs.shape, rhs.shape, self.groups, dn)
        self.mode = plan.mode
        self.validate = validate
        self.device = lhs.device
        self.runner: ops.Runner | None = None
        self.state: tuple | None = None
        self.lperm_shape = tuple(lhs.shape[p] for p in plan.lperm)
        self.rperm_shape = tuple(rhs.shape[p] for p in plan.rperm)
        ls, rs = plan.lshape, plan.rshape
        if self.mode == "ragged_m":
            self.out_shape = (ls[0], ls[1], rs[3])
        elif self.mode == "ragged_k":
            self.out_shape = (self.groups, ls[0], ls[2], rs[2])
        else:
            self.out_shape = (ls[0], ls[1], rs[2])
        self.inv_perm = None if plan.perm is None else _inverse(plan.perm)
        lperm, rperm = plan._perms
        self.inv_lperm = None if lperm is None else _inverse(lperm)
        self.inv_rperm = None if rperm is None else _inverse(rperm)
        self.direct = _direct_kind(plan, lhs, rhs)
        self.bwd: dict[tuple, tuple | None] = {}  # backward key -> bound gradient products (grad_plan)

    def _runner(self, lhs: torch.Tensor, rhs: torch.Tensor, into: bool = False) -> ops.Runner:
        """The forward problem's runner (looked up again only when the state a choice depends on changed).
        `into`: for a result that lands in the caller's buffer (`ops.runner`; not cached here: the JAX bridge,
        its one user, keeps it per state)."""
        if into:
            return self._lookup(lhs, rhs, True)
        state = ops._state(lhs)
        if state != self.state:
            self.runner, self.state = self._lookup(lhs, rhs, False), state
        return self.runner

    def _lookup(self, lhs: torch.Tensor, rhs: torch.Tensor, into: bool) -> ops.Runner:
        a, b = self.plan.views(lhs, rhs)
        groups = self.groups if self.mode != "batch" else 0
        return ops.runner(self.mode, self.backend, a, b, groups, self.out_dtype, self.plan.group_scale, into)

    def forward(self, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor | None,
                keep_ends: list | None = None) -> torch.Tensor:
        """The result, without autograd. Where the canonical operands are pure views and the backend reads
        only addresses, no view op runs: the output is allocated in the user's layout. With `keep_ends` (a
        list), a backend that takes offsets forms them here and appends (offsets, their key) for the backward."""
        runner = self._runner(lhs, rhs)
        if runner.takes(self.direct):
            ends = None
            key = getattr(runner.fn, "ends_key", None)
            if keep_ends is not None and key is not None and sizes is not None:
                ends = runner.fn.ends(sizes)
                keep_ends.append((ends, key))
            try:
                return runner.call_direct(lhs, rhs, sizes, self.plan.view_shape, ends)
            except NotImplementedError:  # refused at its first launch under `auto` (`ops.Runner.call_direct`)
                if keep_ends:  # the general path below moves `auto` on to its next backend
                    keep_ends.clear()
        a, b = self.plan.views(lhs, rhs)
        return self.plan.finish(runner(a, b, sizes))

    def backward(self, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor | None, dout: torch.Tensor,
                 needs: tuple[bool, bool], fwd_ends: tuple | None, into: bool = False) -> tuple:
        """(grad lhs, grad rhs) in the user's layouts: the key's bound products (`grad_plan`) where they
        exist; the general path under create_graph (differentiable products) and while profiling. `into`:
        the gradients are copied into the caller's buffers unless a product writes them (the JAX bridge)."""
        if not torch.is_grad_enabled() and not ops._profiling():
            key = self.bwd_key(lhs, dout, needs, into)
            bound = self.bwd.get(key, False)
            if bound:
                return grad_plan.run(bound, lhs, rhs, dout, sizes, fwd_ends)
            if bound is False:  # first backward of this key: computed while binding
                grads, bound = grad_plan.build(self, lhs, rhs, sizes, dout, needs, into)
                remember(self.bwd, key, bound, 64)
                return grads
        return self.vjp(lhs, rhs, sizes, dout, needs)

    @staticmethod
    def bwd_key(lhs: torch.Tensor, dout: torch.Tensor, needs: tuple[bool, bool], into: bool = False) -> tuple:
        """The key of `bwd`: what a backward's bound products depend on beyond the call's signature."""
        return dout.dtype, dout.stride(), needs, ops._state(lhs), into

    def vjp(self, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor | None, dout: torch.Tensor,
            needs: tuple[bool, bool], apply=ops.run, dtypes: tuple = (None, None)) -> tuple:
        """The general backward: the canonical problem's VJP (`ops.vjp`, products through `apply`; `dtypes`:
        gradient dtypes other than the operands') on the canonical views, mapped back to the user's layouts."""
        a, b = self.plan.views(lhs, rhs)
        da, db = ops.vjp(self.mode, a, b, sizes, self.unfinish(dout), self.backend, self.plan.group_scale, needs,
                         apply=apply, dtypes=dtypes)
        return None if da is None else self.grad_lhs(da), None if db is None else self.grad_rhs(db)

    # ---- the inverse maps of the views (for gradients) ---------------------------------------------------
    def unfinish(self, dout: torch.Tensor) -> torch.Tensor:
        """The cotangent of the user's output in the canonical output layout."""
        if self.inv_perm is not None:
            dout = dout.permute(self.inv_perm)
        return dout.reshape(self.out_shape)

    def grad_lhs(self, da: torch.Tensor) -> torch.Tensor:
        da = da.reshape(self.lperm_shape)
        return da if self.inv_lperm is None else da.permute(self.inv_lperm)

    def grad_rhs(self, db: torch.Tensor) -> torch.Tensor:
        if self.plan.broadcast > 1:  # rhs was repeated over extra lhs slices: their gradients add up
            db = db.reshape(-1, self.plan.broadcast, *db.shape[1:]).sum(1)
        db = db.reshape(self.rperm_shape)
        return db if self.inv_rperm is None else db.permute(self.inv_rperm)

    def checked_sizes(self, group_sizes: torch.Tensor) -> torch.Tensor | None:
        """The group sizes a call runs with (validated when asked, on the operands' device), None for batch."""
        if self.mode == "batch":
            return None
        if self.validate or validate_requested():
            validate_sizes(group_sizes, self.plan.extent // self.plan.group_scale)
        if group_sizes.device != self.device or not group_sizes.is_contiguous():
            group_sizes = group_sizes.to(self.device).contiguous()
        return group_sizes

    def __call__(self, lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        sizes = self.checked_sizes(group_sizes)
        if ops.plain_call(lhs, rhs):
            return self.forward(lhs, rhs, sizes)
        if not ops._transformed():  # eager autograd: the whole call is one recorded node
            return _CallFunction.apply(lhs, rhs, sizes, self)
        a, b = plan.views(lhs, rhs)
        return plan.finish(ops.run(self.mode, a, b, sizes, self.out_dtype, self.backend, plan.group_scale))


class _CallFunction(torch.autograd.Function):
    """One eager call with inputs that require grad, recorded as a single autograd node (the views and the
    output layout are inside it, so the backward pays for no view nodes)."""

    @staticmethod
    def forward(ctx, lhs, rhs, sizes, call):
        ctx.call = call
        ctx.save_for_backward(lhs, rhs, sizes)  # the inputs, so that a double backward reaches them
        kept: list = []
        out = call.forward(lhs, rhs, sizes, kept)
        ctx.ends = kept[0] if kept else None
        return out

    @staticmethod
    @amp.autocast_off
    def backward(ctx, dout):
        lhs, rhs, sizes = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:2])
        return (*ctx.call.backward(lhs, rhs, sizes, dout, needs, ctx.ends), None, None)


class _MasterFunction(torch.autograd.Function):
    """An eager call under torch.autocast whose float32 operands that require grad are master operands: the
    products take their 16-bit casts (made here, outside autograd), and their gradients come from products
    with a float32 output (the accumulator itself), not from 16-bit gradients cast by autograd's cast node."""

    @staticmethod
    def forward(ctx, lhs, rhs, lhs16, rhs16, sizes, call):
        ctx.call = call
        ctx.save_for_backward(lhs16, rhs16, sizes)
        ctx.dtypes = tuple(t.dtype if t is not c else None for t, c in ((lhs, lhs16), (rhs, rhs16)))
        return call.forward(lhs16, rhs16, sizes)

    @staticmethod
    @amp.autocast_off
    def backward(ctx, dout):
        lhs16, rhs16, sizes = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:2])
        return (*ctx.call.vjp(lhs16, rhs16, sizes, dout, needs, dtypes=ctx.dtypes), None, None, None, None)


_AMP_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _masters(lhs, rhs, group_sizes, dtype: torch.dtype) -> bool:
    """Whether an eager call in an autocast region of 16-bit `dtype` has float32 operands to keep as master
    operands: one of them float32 and requiring grad (both float16, bfloat16 or float32), grad mode on, no
    transform, one row of group sizes."""
    if not (isinstance(rhs, torch.Tensor) and isinstance(group_sizes, torch.Tensor) and group_sizes.ndim == 1):
        return False
    if dtype not in (torch.float16, torch.bfloat16) or not torch.is_grad_enabled():
        return False
    if lhs.dtype not in _AMP_DTYPES or rhs.dtype not in _AMP_DTYPES:
        return False
    if not any(t.dtype == torch.float32 and t.requires_grad for t in (lhs, rhs)):
        return False
    return not (torch.compiler.is_compiling() or ops._transformed())


def _master_call(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate,
                 dtype: torch.dtype) -> torch.Tensor:
    """`_MasterFunction` over the operands: float32 ones as masters (cast here, outside autograd), the others cast
    through autograd as in the region's ordinary path (a no-op for operands already in `dtype`)."""
    given, low = [], []
    for t in (lhs, rhs):
        if t.dtype == torch.float32:
            given.append(t)
            low.append(t.detach().to(dtype))
        else:
            given.append(t.to(dtype))
            low.append(given[-1])
    call = _lookup(*low, group_sizes, dimension_numbers, preferred_element_type, backend, validate)
    return _MasterFunction.apply(*given, *low, call.checked_sizes(group_sizes), call)


_CALLS: dict[tuple, _Call] = {}
_MAX_CALLS = 4096


def _traced(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate) -> torch.Tensor:
    """The call under torch.compile, a TorchDispatchMode or on meta tensors: the same checks while tracing, then
    the problems' custom ops."""
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
    common = _common_dtype(lhs, rhs)
    if common is not None:
        lhs, rhs = lhs.to(common), rhs.to(common)
    if isinstance(group_sizes, torch.Tensor) and group_sizes.ndim > 1:
        return _stacked(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate)
    can, group_sizes, out_dtype, name = _prepare(
        lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend
    )
    sizes = None
    if can.mode != "batch":
        if (validate or validate_requested()) and not group_sizes.is_meta:  # meta sizes hold no values to check
            validate_sizes(group_sizes, can.extent // can.group_scale)
        sizes = group_sizes.to(lhs.device).contiguous()
    # `apply_op` by its own name: reached through the `ops` module object, dynamo would also guard that module
    # against its own globals' name for it (one more Python guard on every compiled call)
    return can.finish(apply_op(can.mode, can.a, can.b, sizes, out_dtype, name, can.group_scale))


def _traced_ragged_m(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, backend: str) -> torch.Tensor:
    """`ragged_dot` under torch.compile (autocast off) for operands correct by construction: lhs [M, K], rhs
    [G, K, N] of lhs's dtype and device, group_sizes int [G] on that device (a permutation's counts, so never
    past M), backend a checked name. The problem's custom op without the checks and canonical views `_traced`
    traces: each module and global they read is one more guard in every compiled call's check (the
    transformers integration's compiled decode step, whose check is part of each step's host time)."""
    return apply_op("ragged_m", lhs[None], rhs[None], group_sizes, lhs.dtype, backend, 1)[0]


def ragged_dot_general(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    ragged_dot_dimension_numbers: RaggedDotDimensionNumbers,
    *,
    preferred_element_type: torch.dtype | None = None,
    backend: str | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """`jax.lax.ragged_dot_general` for PyTorch tensors, differentiable in lhs and rhs.

    Modes (by where the lhs ragged dimension sits): non-contracting (rhs has a group dimension; output is the
    dot_general shape without it), contracting (output `(G,) + dot shape`; group g contracts only over its
    slice), batch (a plain batched dot; group_sizes is not read). Indices at or past sum(group_sizes) belong
    to no group: their output rows are zero and they contribute to no group, whatever they hold.

    group_sizes is int [G] (one partition shared by every slice of the operands) or, as in jax, one row per
    slice: shape `(lhs.shape[d] for d in prefix) + (G,)` with `prefix` the lhs batch dimensions and then the
    lhs dimensions of the ragged dimension's kind that precede it (`ragdot.stacked`; one call per slice).
    Shape mistakes raise `ragdot.ShapeError`, both a ValueError and, as in jax, a TypeError. Floating operands
    of different dtypes are promoted to a common one first, as jax does (a cast per call: pass one dtype to
    avoid it). Inside a `torch.autocast` region floating operands (not float64) are cast to its dtype, as for a
    matmul; in eager autograd float32 operands that require grad are master operands there (their gradients
    come from float32 products, not from 16-bit gradients cast up).
    """
    if amp.active() and isinstance(lhs, torch.Tensor):  # torch.autocast: cast as for a matmul, then autocast off
        dtype = amp.autocast_dtype(lhs)
        if dtype is not None:
            with amp.off_for(lhs):
                if _masters(lhs, rhs, group_sizes, dtype):  # float32 operands' gradients straight in float32
                    return _master_call(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type,
                                        backend, validate, dtype)
                return ragged_dot_general(
                    amp.cast(lhs, dtype), amp.cast(rhs, dtype) if isinstance(rhs, torch.Tensor) else rhs, group_sizes,
                    ragged_dot_dimension_numbers, preferred_element_type=preferred_element_type, backend=backend,
                    validate=validate)
    if torch.compiler.is_compiling() or dispatch_modes():
        # traced, or under a TorchDispatchMode (FakeTensorMode, FlopCounterMode, selective checkpointing, memory
        # trackers): the problems' custom ops, which such modes see as one op each (their fake kernels for fakes)
        return _traced(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type, backend,
                       validate)
    key, call = _cached(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type, backend,
                        validate)
    if call is None:
        if _on_meta(lhs, rhs):  # shapes only (no kernel runs): the custom ops' fake kernels, as under tracing
            return _traced(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type, backend,
                           validate)
        cacheable = key is not None and isinstance(group_sizes, torch.Tensor)
        group_sizes = _as_sizes(group_sizes, lhs)
        common = _common_dtype(lhs, rhs)
        if common is not None:  # mixed float operands: promoted as jax promotes them (never cached: a cast each call)
            return ragged_dot_general(lhs.to(common), rhs.to(common), group_sizes, ragged_dot_dimension_numbers,
                                      preferred_element_type=preferred_element_type, backend=backend,
                                      validate=validate)
        if isinstance(group_sizes, torch.Tensor) and group_sizes.ndim > 1:  # jax's [slices..., G] form
            return _stacked(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type, backend,
                            validate)
        call = _new_call(key if cacheable else None, lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                         preferred_element_type, backend, validate)
    return call(lhs, rhs, group_sizes)


def _on_meta(lhs, rhs) -> bool:
    """Whether an operand is a meta tensor (a call is never cached for one, so the hot path never asks)."""
    return any(isinstance(t, torch.Tensor) and t.is_meta for t in (lhs, rhs))


def _cached(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate) -> tuple:
    """(the call's key, its cached `_Call` or None); (None, None) for arguments that cannot key a call."""
    try:
        key = (lhs.shape, lhs.stride(), lhs.dtype, lhs.device, rhs.shape, rhs.stride(), rhs.dtype, rhs.device,
               group_sizes.shape, group_sizes.dtype, group_sizes.device, dimension_numbers,
               preferred_element_type, backend, validate)
        return key, _CALLS.get(key)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, unhashable arguments: checked by the caller
        return None, None


def _new_call(key, lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate) -> _Call:
    """A checked `_Call`, kept under `key` unless that is None."""
    call = _Call(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate)
    if key is not None:
        remember(_CALLS, key, call, _MAX_CALLS)
    return call


def _lookup(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate) -> _Call:
    """The `_Call` of one-dtype tensor operands and 1-D group sizes: cached, or checked and built now."""
    key, call = _cached(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate)
    if call is None:
        call = _new_call(key, lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate)
    return call


def _common_dtype(lhs, rhs) -> torch.dtype | None:
    """The dtype both operands are promoted to when they are floating tensors of different dtypes (jax's
    rule, which torch.promote_types gives for these four: e.g. bfloat16 with float32 is float32), else None."""
    if not (isinstance(lhs, torch.Tensor) and isinstance(rhs, torch.Tensor)) or lhs.dtype == rhs.dtype:
        return None
    if lhs.dtype not in _FLOAT_DTYPES or rhs.dtype not in _FLOAT_DTYPES:
        return None
    return torch.promote_types(lhs.dtype, rhs.dtype)


def _stacked(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type, backend, validate) -> torch.Tensor:
    from ragdot.stacked import ragged_dot_stacked

    if not isinstance(lhs, torch.Tensor) or not isinstance(rhs, torch.Tensor):
        raise TypeError(f"lhs and rhs must be torch.Tensors, got {type(lhs).__name__} and {type(rhs).__name__}")
    out_dtype = preferred_element_type or lhs.dtype
    return ragged_dot_stacked(lhs, rhs, group_sizes, dimension_numbers, ragged_dot_general, preferred_element_type,
                              out_dtype, backend=backend, validate=validate)


def explain(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    ragged_dot_dimension_numbers: RaggedDotDimensionNumbers = RAGGED_DOT_DN,
    *,
    preferred_element_type: torch.dtype | None = None,
    backend: str | None = None,
) -> dict[str, object]:
    """What `ragged_dot_general` with these arguments would run (forward only), without running it.

    Returns {"problem", "key", "tuned", "plan"}: the canonical problem (ragged_m / ragged_k / batch), the
    tuning-cache key of the call (None off CUDA), whether a measured entry exists for it, and the ordered
    (backend, Triton config or None) pairs the call tries, the first one being what normally runs.
    """
    from ragdot.tune.cache import CACHE
    from ragdot.tune.key import key_for
    from ragdot.tune.select import plan

    can, group_sizes, out_dtype, name = _prepare(
        lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type, backend
    )
    groups = 0 if can.mode == "batch" else group_sizes.shape[0]
    key = key_for(can.mode, can.a, can.b, groups, out_dtype) if can.a.device.type == "cuda" else None
    return {
        "problem": can.mode,
        "key": key.text() if key is not None else None,
        "tuned": key is not None and CACHE.get(key.text(), key.device) is not None,
        "plan": plan(can.mode, name, can.a, can.b, groups, out_dtype),
    }


def ragged_dot(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    *,
    preferred_element_type: torch.dtype | None = None,
    backend: str | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """`jax.lax.ragged_dot`: lhs [M, K], rhs [G, K, N], group_sizes int [G] -> [M, N].

    Rows of lhs are split into consecutive groups; row i of group g is multiplied by rhs[g]. Rows at or past
    sum(group_sizes) produce zeros.
    """
    if not (isinstance(lhs, torch.Tensor) and lhs.ndim == 2 and isinstance(rhs, torch.Tensor) and rhs.ndim == 3):
        for name, t, rank in (("lhs", lhs, 2), ("rhs", rhs, 3)):
            if isinstance(t, torch.Tensor) and t.ndim != rank:
                raise ValueError(
                    f"ragged_dot expects {name} of rank {rank} (lhs [M, K], rhs [G, K, N]), got shape "
                    f"{tuple(t.shape)}; use ragged_dot_general for other layouts"
                )
    return ragged_dot_general(
        lhs,
        rhs,
        group_sizes,
        RAGGED_DOT_DN,
        preferred_element_type=preferred_element_type,
        backend=backend,
        validate=validate,
    )
