"""The three canonical problems: prepared runners, autograd (reverse and forward mode), and custom ops.

    ragged_m:  c = a . b[g]          da = ragged_m(dc, b^T)        db = ragged_k(a, dc)
    ragged_k:  c[g] = a_g^T . b_g    da = ragged_m(b, dc^T)        db = ragged_m(a, dc)
    batch:     c = a . b             da = batch(dc, b^T)           db = batch(a^T, dc)

Every problem takes the raw group sizes ([G], any integer dtype) and `scale`, the rows per unit of size
(1 unless the caller merged contracting dimensions); the backends clamp them (negatives count as 0, ends
clamped to the ragged extent), and ragdot's kernels form the prefix sums themselves.

A *runner* is one problem prepared for one static signature (shapes, strides, dtypes, device, output dtype,
requested backend, scale and the state a choice depends on): the backend and its config are chosen and
prepared once, so a repeated call is a dictionary lookup plus the backend's launch. `run` is the
differentiable entry: calls that need no autograd go straight to the runner; eager calls whose inputs require
grad go through `_EagerProblem` (a plain `autograd.Function`: its `apply` skips the argument binding that
functorch-style Functions pay on every call); forward-mode AD and torch.func transforms go through
`RaggedProblem`, whose backward, JVP and vmap rule are again canonical problems through `run`, so double
backward, `torch.func.grad/vjp/jvp/jacrev` and vmap compose. Under `torch.compile` the problems are
`torch.library` custom ops with fake kernels (`ragged_m_op`, ...), whose autograd is the same VJP.

Gradients contract the cotangent in the accumulation dtype (the wider of the cotangent's and the operands'
dtypes) and cast only the results to the operand dtype, so a float32 cotangent of float16 operands is never
rounded to float16 first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.forward_ad as _fwad

from ragdot import amp
from ragdot._memo import remember
from ragdot.backends import get_backend
from ragdot.inductor_lowering import direct_out_name, maybe_install
from ragdot.tune.cache import CACHE
from ragdot.tune.select import plan

__all__ = ["run", "runner", "RaggedProblem", "ragged_m_op", "ragged_k_op", "batch_op"]

_LIB = "ragdot"
_MAX_RUNNERS = 4096
_profiling = torch._C._autograd._profiler_enabled
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
# A profiler range of the kind an op opens (what inductor wraps its kernel launches in): the profiler links the
# CUDA kernels launched inside it to it. A `record_function` range is a user annotation, and kernels launched
# from Python inside one (Triton's, without an aten op between) were linked to the enclosing op instead (the
# autograd Function's), so a profile split by ragdot's names found no ragdot kernels on a GPU.
_OpRange = getattr(torch._C._profiler, "_RecordFunctionFast", None)


def profiled(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs); while a profiler records, inside a range named ``ragdot::<name>``, as the custom ops get, so
    profiles attribute its kernels to ragdot (`ragdot moe-bench` splits a layer's kernels by these names)."""
    if not _profiling():
        return fn(*args, **kwargs)
    label = f"{_LIB}::{name}"
    with _OpRange(label) if _OpRange is not None else torch.profiler.record_function(label):
        return fn(*args, **kwargs)


# ------------------------------------------------------------------------------------------------- runners


def _out_shape(problem: str, a: torch.Tensor, b: torch.Tensor, num_groups: int) -> tuple[int, ...]:
    if problem == "ragged_m":
        return (a.shape[0], a.shape[1], b.shape[3])
    if problem == "ragged_k":
        return (num_groups, a.shape[0], a.shape[2], b.shape[2])
    return (a.shape[0], a.shape[1], b.shape[2])


def _empty(problem: str, a: torch.Tensor, b: torch.Tensor, num_groups: int) -> bool:
    """Zero-size problems (any of M, K, N, R, G, Bt is 0): the output is all zeros, no backend runs."""
    sizes = (*a.shape, *b.shape) + ((num_groups,) if problem != "batch" else ())
    return 0 in sizes


class Runner:
    """One canonical problem prepared for one static signature; `__call__(a, b, sizes) -> c` (contiguous).

    With `auto`, a backend that turns out unable to serve the signature at its first call (NotImplementedError)
    hands over to the next candidate, once and for good."""

    __slots__ = ("problem", "requested", "candidates", "index", "fn", "label", "out_shape", "out_dtype", "groups",
                 "scale")

    def __init__(self, problem: str, requested: str, a: torch.Tensor, b: torch.Tensor, num_groups: int,
                 out_dtype: torch.dtype, scale: int = 1, into: bool = False, replay: bool = False):
        self.problem, self.requested, self.out_dtype, self.groups = problem, requested, out_dtype, num_groups
        self.scale = scale
        self.out_shape = _out_shape(problem, a, b, num_groups)
        self.fn: Callable[..., torch.Tensor] | None = None
        self.label = "zeros"
        self.candidates: list[tuple[str, Any]] = []
        self.index = -1
        if not _empty(problem, a, b, num_groups):
            eager = not (a.is_cuda and torch.cuda.is_current_stream_capturing())
            copy = copy_ms(self.out_shape, out_dtype, a.device) if into else 0.0
            self.candidates = plan(problem, requested, a, b, num_groups, out_dtype, eager=eager, copy_ms=copy,
                                   replay=replay)
            self._advance(a, b, [])

    def _advance(self, a: torch.Tensor, b: torch.Tensor, errors: list[str]) -> None:
        while self.index + 1 < len(self.candidates):
            self.index += 1
            name, config = self.candidates[self.index]
            backend = get_backend(name)
            try:
                self.fn = backend.prepare(self.problem, a, b, self.groups, self.out_dtype, config, self.scale)
            except NotImplementedError as exc:
                self._fail(name, exc, errors)
                continue
            self.label = backend.config_label(config)
            return
        raise NotImplementedError(f"no backend can compute this {self.problem} problem ({'; '.join(errors)})")

    def _fail(self, name: str, exc: Exception, errors: list[str]) -> None:
        if self.requested != "auto":
            raise NotImplementedError(f"backend {name!r} cannot compute this {self.problem} problem: {exc}") from exc
        errors.append(f"{name}: {exc}")

    def __call__(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
        """a, b: the canonical operands of the prepared signature; sizes: raw group sizes [G] (None: batch)."""
        if self.fn is None:
            return a.new_zeros(self.out_shape, dtype=self.out_dtype)
        if _profiling():  # a named range, as the custom ops get, so profiles attribute the kernels to ragdot
            return profiled(self.problem, self._call, a, b, sizes)
        return self._call(a, b, sizes)

    def takes(self, kind: str | None) -> bool:
        """Whether `call_direct` serves a call whose operands are of `kind`: "matrix" (the user's tensors are
        the canonical operands without their unit batch axis) or "address" (they start where the canonical
        views start). A backend's prepared call says what it reads (`direct_kind`)."""
        have = getattr(self.fn, "direct_kind", None)
        return kind is not None and (have == "address" or have == kind)

    def call_direct(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None,
                    out_shape: tuple[int, ...], ends: torch.Tensor | None = None) -> torch.Tensor:
        """The prepared call on the user's tensors, returning the output in `out_shape` (the user's layout);
        `ends`: the offsets `self.fn.ends(sizes)` where the caller formed them already. A backend that refuses
        at its first launch (NotImplementedError, e.g. a kernel too large for the device) fails as in
        `__call__`: a named backend says so; under `auto` the error goes back to the caller, whose canonical
        call (`__call__`) then moves on to the next candidate."""
        try:
            if _profiling():
                return profiled(self.problem, self.fn.direct, a, b, sizes, out_shape, ends)
            return self.fn.direct(a, b, sizes, out_shape, ends)
        except NotImplementedError as exc:
            self._fail(self.candidates[self.index][0], exc, [])
            raise

    def _call(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
        try:
            return self.fn(a, b, sizes)
        except NotImplementedError as exc:
            errors: list[str] = []
            self._fail(self.candidates[self.index][0], exc, errors)
            self._advance(a, b, errors)
            return self._call(a, b, sizes)


_RUNNERS: dict[tuple, Runner] = {}


def _state(a: torch.Tensor) -> tuple:
    """What a choice depends on beyond the signature: the tuning cache's content, TF32 for float32
    (torch's matmul setting, as torch.matmul reads it) and, on CUDA, whether a graph is being captured."""
    if not a.is_cuda:  # TF32 is a CUDA setting; nothing is captured elsewhere
        return CACHE.generation, False, False
    tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    return CACHE.generation, tf32, torch.cuda.is_current_stream_capturing()


def runner(problem: str, backend: str, a: torch.Tensor, b: torch.Tensor, num_groups: int,
           out_dtype: torch.dtype, scale: int = 1, into: bool = False, replay: bool | None = None) -> Runner:
    """The prepared runner of this signature (built on first use). `into`: the caller needs the result in a
    buffer of its own, so `auto` charges a copy of it to backends that cannot write there (`copy_ms`).
    `replay` (default: `into`, the JAX bridge's case): its launches are recorded and replayed (no gluon)."""
    replay = into if replay is None else replay
    key = (problem, backend, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), num_groups, out_dtype,
           scale, _state(a), into, replay)
    found = _RUNNERS.get(key)
    if found is None:
        found = remember(_RUNNERS, key, Runner(problem, backend, a, b, num_groups, out_dtype, scale, into, replay),
                         _MAX_RUNNERS)
    return found


_BANDWIDTH: dict[torch.device, float] = {}
_FALLBACK_BANDWIDTH = 2e12  # bytes/s where the device reports no memory clock


def copy_ms(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> float:
    """Milliseconds to copy a result of this shape once (read and write) at the device's nominal memory
    bandwidth (memory clock x bus width x 2, from its properties; 0 off CUDA, where nothing is tuned)."""
    if device.type != "cuda":
        return 0.0
    bw = _BANDWIDTH.get(device)
    if bw is None:
        props = torch.cuda.get_device_properties(device)
        clock_khz = getattr(props, "memory_clock_rate", 0) or 0
        bus_bits = getattr(props, "memory_bus_width", 0) or 0
        bw = _BANDWIDTH[device] = 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else _FALLBACK_BANDWIDTH
    return 2 * math.prod(shape) * dtype.itemsize / bw * 1e3


# ------------------------------------------------------------------------------------------------ autograd


def _plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` without torch.func wrappers of levels that have exited (a backward run after `torch.func.vjp`
    returned gets its saved tensors so wrapped); the values are the same."""
    while t is not None and _wrapped(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def plain_call(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a call needs no autograd recording: no input requires grad (or grad mode is off) and no
    forward-mode AD or torch.func transform is active."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return False
    return not _transformed()


def run(problem: str, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None, out_dtype: torch.dtype,
        backend: str, scale: int = 1) -> torch.Tensor:
    """One canonical problem, differentiable in a and b."""
    spec = (problem, out_dtype, backend, scale)
    if _transformed():
        return RaggedProblem.apply(a, b, sizes, spec)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _EagerProblem.apply(a, b, sizes, spec)
    if _wrapped(a) or _wrapped(b) or (sizes is not None and _wrapped(sizes)):
        a, b, sizes = _plain(a), _plain(b), _plain(sizes)
    return _forward(a, b, sizes, spec)


def exporting() -> bool:
    """Whether torch.export is tracing (strict or not), and not torch.compile. torch.compiler.is_exporting() says
    that on torch 2.13, but torch 2.11's dynamo folds it to True under any torch.compile (a compiled MoELayer then
    kept none of its losses); the flag export sets is what this reads where the torch has it."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


def _transformed() -> bool:
    """Forward-mode AD or a torch.func transform is active."""
    return _fwad._current_level >= 0 or torch._C._are_functorch_transforms_active()


_get_mode = torch._C._get_dispatch_mode
_MODE_KEYS = torch._C._TorchDispatchModeKey
# how many TorchDispatchModes are active on this thread (one C call): where ragdot's eager paths take their
# custom ops instead, so that such modes (FakeTensorMode, FlopCounterMode, checkpointing policies) see them
dispatch_modes = torch._C._len_torch_dispatch_stack


def fake_tracing() -> bool:
    """Whether a fake or proxy tracing mode is active (FakeTensorMode, make_fx): no kernel launched from Python may
    run then (its tensors have no memory); other TorchDispatchModes (FLOP counters, checkpointing policies) leave
    such launches alone, as they do not see them."""
    return _get_mode(_MODE_KEYS.FAKE) is not None or _get_mode(_MODE_KEYS.PROXY) is not None


def plain_eager(*tensors: torch.Tensor) -> bool:
    """Whether code runs eagerly on real tensors: no compiler, tracer, dispatch mode (fake, proxy, functional) or
    torch.func transform is active and the tensors are plain (where a hand-written autograd.Function or a kernel
    body called directly may stand in for what the tracers must see as ops)."""
    if torch.compiler.is_compiling() or _transformed() or dispatch_modes():
        return False
    return all(type(t) is torch.Tensor for t in tensors)


# The backward products of each problem: for (da, db), the problem they are, their operands from the canonical
# (a, b, dc) in the accumulation dtype, and the view that takes the product's output to the gradient's layout.
_VJP_PRODUCTS: dict[str, tuple[tuple[str, Callable, Callable | None], tuple[str, Callable, Callable | None]]] = {
    # a [Bt, M, K], b [Bt, G, K, N], dc [Bt, M, N]
    "ragged_m": (("ragged_m", lambda a, b, dc: (dc, b.transpose(-1, -2)), None),
                 ("ragged_k", lambda a, b, dc: (a, dc), lambda g: g.transpose(0, 1))),
    # a [Bt, R, M], b [Bt, R, N], dc [G, Bt, M, N]
    "ragged_k": (("ragged_m", lambda a, b, dc: (b, dc.permute(1, 0, 3, 2)), None),
                 ("ragged_m", lambda a, b, dc: (a, dc.transpose(0, 1)), None)),
    # a [Bt, M, K], b [Bt, K, N], dc [Bt, M, N]
    "batch": (("batch", lambda a, b, dc: (dc, b.transpose(-1, -2)), None),
              ("batch", lambda a, b, dc: (a.transpose(-1, -2), dc), None)),
}
# ragged_m's db for a b stored [.., N, K] (a transposed view, as nn.Linear-style [E, out, in] weights give):
# db^T = ragged_k(dc, a) [G, Bt, N, K], so db comes in b's own memory order and AccumulateGrad keeps it as is
# (in b's view order it would be copied into the parameter's layout: a weight-sized transient and a slow
# transposing copy).
_RAGGED_M_DB_T = ("ragged_k", lambda a, b, dc: (dc, a), lambda g: g.transpose(0, 1).transpose(-1, -2))


def stored_transposed(t: torch.Tensor) -> bool:
    """Whether the matrices of t [.., K, N] are stored transposed ([.., N, K] memory, K contiguous), K, N > 1:
    the layout whose gradients ragdot computes in that memory order (here and in ragdot.moe.fused)."""
    k, n = t.shape[-2], t.shape[-1]
    return k > 1 and n > 1 and t.stride(-2) == 1 and t.stride(-1) >= k


def _products(problem: str, b: torch.Tensor) -> tuple:
    """The (da, db) products of `problem` (`_VJP_PRODUCTS`), each gradient in its operand's memory order."""
    products = _VJP_PRODUCTS[problem]
    if problem == "ragged_m" and stored_transposed(b):
        return products[0], _RAGGED_M_DB_T
    return products


def vjp(problem: str, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None, dc: torch.Tensor,
        backend: str, scale: int, needs: tuple[bool, bool], apply: Callable[..., torch.Tensor] = run,
        dtypes: tuple[torch.dtype | None, torch.dtype | None] = (None, None)):
    """(da, db) of one canonical problem, as canonical problems through `apply(problem, a, b, sizes, dtype,
    backend, scale)`; the cotangent is contracted in the accumulation dtype. `dtypes`: the gradients' dtypes
    where not the operands' own (float32 gradients of 16-bit casts of float32 master operands)."""
    acc_dtype = torch.promote_types(dc.dtype, a.dtype)  # the wider of the cotangent's and the operands'
    acc = tuple(t if t.dtype == acc_dtype else t.to(acc_dtype) for t in (a, b, dc))
    grads = []
    out_dtypes = tuple(t.dtype if d is None else d for t, d in zip((a, b), dtypes))
    for need, dtype, (product, operands, view) in zip(needs, out_dtypes, _products(problem, b)):
        if not need:
            grads.append(None)
            continue
        x, y = operands(*acc)
        g = apply(product, x, y, sizes, dtype, backend, scale)  # sizes is None for batch
        grads.append(g if view is None else view(g))
    return tuple(grads)


def jvp(problem: str, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None, ta: torch.Tensor | None,
        tb: torch.Tensor | None, out_dtype: torch.dtype, backend: str, scale: int) -> torch.Tensor:
    """The tangent of one canonical problem: the bilinear product's two terms, each a problem of its kind."""
    acc = torch.promote_types(out_dtype, a.dtype)
    terms = []
    if ta is not None:
        terms.append(run(problem, ta, b, sizes, acc, backend, scale))
    if tb is not None:
        terms.append(run(problem, a, tb, sizes, acc, backend, scale))
    if not terms:
        shape = _out_shape(problem, a, b, 0 if sizes is None else sizes.shape[0])
        return a.new_zeros(shape, dtype=out_dtype)
    total = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    return total.to(out_dtype)


def _forward(a, b, sizes, spec) -> torch.Tensor:
    problem, out_dtype, backend, scale = spec
    return runner(problem, backend, a, b, 0 if sizes is None else sizes.shape[0], out_dtype, scale)(a, b, sizes)


@amp.autocast_off
def _backward(ctx, dc):
    a, b, sizes = ctx.saved_tensors
    problem, _, backend, scale = ctx.spec
    return vjp(problem, a, b, sizes, dc, backend, scale, tuple(ctx.needs_input_grad[:2]))


class _EagerProblem(torch.autograd.Function):
    """One canonical problem in eager autograd (inputs that require grad, no transform active).
    spec = (problem, out_dtype, backend, scale)."""

    @staticmethod
    def forward(ctx, a, b, sizes, spec):
        ctx.spec = spec
        ctx.save_for_backward(a, b, sizes)
        return _forward(a, b, sizes, spec)

    @staticmethod
    def backward(ctx, dc):
        return *_backward(ctx, dc), None, None


class RaggedProblem(torch.autograd.Function):
    """One canonical problem with reverse mode, forward mode and a vmap rule, for torch.func transforms and
    forward-mode AD. spec = (problem, out_dtype, backend, scale)."""

    @staticmethod
    def forward(a, b, sizes, spec):
        return _forward(a, b, sizes, spec)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, sizes, spec = inputs
        ctx.spec = spec
        ctx.save_for_backward(a, b, sizes)
        ctx.save_for_forward(a, b, sizes)

    @staticmethod
    def backward(ctx, dc):
        return *_backward(ctx, dc), None, None

    @staticmethod
    @amp.autocast_off
    def jvp(ctx, ta, tb, _t_sizes, _t_spec):
        a, b, sizes = ctx.saved_tensors
        problem, out_dtype, backend, scale = ctx.spec
        return jvp(problem, a, b, sizes, ta, tb, out_dtype, backend, scale)

    @staticmethod
    def vmap(info, in_dims, a, b, sizes, spec):
        def pick(t, dim, i):
            return t if dim is None or t is None else t.select(dim, i)

        outs = [RaggedProblem.apply(pick(a, in_dims[0], i), pick(b, in_dims[1], i), pick(sizes, in_dims[2], i), spec)
                for i in range(info.batch_size)]
        return torch.stack(outs), 0


# ------------------------------------------------------------------------- custom ops (torch.compile path)


@torch.library.custom_op(f"{_LIB}::ragged_m", mutates_args=())
def ragged_m_op(
    a: torch.Tensor, b: torch.Tensor, group_sizes: torch.Tensor, out_dtype: torch.dtype, backend: str, scale: int
) -> torch.Tensor:
    """a [Bt, M, K] x b [Bt, G, K, N] -> [Bt, M, N]; rows past the groups' end are zero."""
    return runner("ragged_m", backend, a, b, group_sizes.shape[0], out_dtype, scale)(a, b, group_sizes)


@ragged_m_op.register_fake
def _(a, b, group_sizes, out_dtype, backend, scale):
    maybe_install()
    return a.new_empty((a.shape[0], a.shape[1], b.shape[3]), dtype=out_dtype)


@torch.library.custom_op(f"{_LIB}::ragged_k", mutates_args=())
def ragged_k_op(
    a: torch.Tensor, b: torch.Tensor, group_sizes: torch.Tensor, out_dtype: torch.dtype, backend: str, scale: int
) -> torch.Tensor:
    """a [Bt, R, M] x b [Bt, R, N] -> [G, Bt, M, N]; group g contracts only its own token rows."""
    return runner("ragged_k", backend, a, b, group_sizes.shape[0], out_dtype, scale)(a, b, group_sizes)


@ragged_k_op.register_fake
def _(a, b, group_sizes, out_dtype, backend, scale):
    maybe_install()
    return a.new_empty((group_sizes.shape[0], a.shape[0], a.shape[2], b.shape[2]), dtype=out_dtype)


@torch.library.custom_op(f"{_LIB}::batch", mutates_args=())
def batch_op(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    """a [Bt, M, K] x b [Bt, K, N] -> [Bt, M, N]."""
    return runner("batch", backend, a, b, 0, out_dtype)(a, b, None)


@batch_op.register_fake
def _(a, b, out_dtype, backend):
    maybe_install()
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=out_dtype)


def apply_op(problem: str, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None, out_dtype: torch.dtype,
             backend: str, scale: int = 1) -> torch.Tensor:
    """One canonical problem through its custom op (what torch.compile traces)."""
    if problem == "batch":
        return batch_op(a, b, out_dtype, backend)
    op = ragged_m_op if problem == "ragged_m" else ragged_k_op
    return op(a, b, sizes, out_dtype, backend, scale)


# ---- out variants: inductor lowers a functional custom op that has a `.out` overload (same arguments, one
# keyword `out`, which it returns) to a call of that overload on a buffer it allocates and plans itself
# (`ExternKernelOut`, through `ragdot.inductor_lowering`; torch releases after 2.11 also do it natively), so its
# peak-memory ordering sees the output's size (why that matters: `ragdot.inductor_lowering`).


def run_into(problem: str, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor | None, out_dtype: torch.dtype,
             backend: str, scale: int, out: torch.Tensor) -> torch.Tensor:
    """One canonical problem written into `out` (its contiguous canonical output): the kernel writes there
    where the chosen backend's prepared calls can (`writes_into`), else the result is copied."""
    # compiled code's buffer, written by the kernel itself: every backend that writes in place may serve (gluon too)
    r = runner(problem, backend, a, b, 0 if sizes is None else sizes.shape[0], out_dtype, scale, into=True,
               replay=False)
    kernel = getattr(r.fn, "prepared", None)
    if kernel is not None and out.is_contiguous() and tuple(out.shape) == r.out_shape and out.dtype == out_dtype:
        try:
            kernel(a, b, sizes, out)
            return out
        except NotImplementedError:
            pass  # the runner's own call moves `auto` on to the next candidate
    return out.copy_(r(a, b, sizes))


_OUT_LIB = torch.library.Library(_LIB, "FRAGMENT")
_OUT_TAGS = tuple(getattr(torch.Tag, t) for t in ("out", "out_variant") if hasattr(torch.Tag, t))


def _define_out(name: str, args: str, problem: str) -> None:
    if problem == "batch":
        def impl(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, backend: str, *,
                 out: torch.Tensor) -> torch.Tensor:
            return run_into(problem, a, b, None, out_dtype, backend, 1, out)
    else:
        def impl(a: torch.Tensor, b: torch.Tensor, group_sizes: torch.Tensor, out_dtype: torch.dtype, backend: str,
                 scale: int, *, out: torch.Tensor) -> torch.Tensor:
            return run_into(problem, a, b, group_sizes, out_dtype, backend, scale, out)

    # returns `out` (torch requires an `out`-tagged overload to return its mutable argument); only inductor's
    # generated code calls it, after functionalization (which cannot take custom ops returning aliases)
    _OUT_LIB.define(f"{name}.out({args}, *, Tensor(a!) out) -> Tensor(a!)", tags=_OUT_TAGS)
    _OUT_LIB.impl(f"{name}.out", impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_LIB}::{name}.out", lambda *args, out: out, lib=_OUT_LIB)
    # an attribute of the op namespace, so generated code reaches it through `torch` alone, in any process
    # that runs ragdot's ops (a cached compiled graph included)
    setattr(getattr(torch.ops, _LIB), direct_out_name(name), impl)


_RAGGED_ARGS = "Tensor a, Tensor b, Tensor group_sizes, ScalarType out_dtype, str backend, SymInt scale"
_define_out("ragged_m", _RAGGED_ARGS, "ragged_m")
_define_out("ragged_k", _RAGGED_ARGS, "ragged_k")
_define_out("batch", "Tensor a, Tensor b, ScalarType out_dtype, str backend", "batch")


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))
    ragged = len(inputs) == 6  # (a, b, sizes, out_dtype, backend, scale); batch: (a, b, out_dtype, backend)
    ctx.backend = inputs[4] if ragged else inputs[3]
    ctx.scale = inputs[5] if ragged else 1


def _op_backward(problem: str):
    @amp.autocast_off
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        a, b, sizes = (saved[0], saved[1], saved[2] if problem != "batch" else None)
        needs = tuple(ctx.needs_input_grad[:2])
        da, db = vjp(problem, a, b, sizes, grad, ctx.backend, ctx.scale, needs, apply=apply_op)
        return (da, db, None, None, None, None) if problem != "batch" else (da, db, None, None)

    return backward


for _name in ("ragged_m", "ragged_k", "batch"):
    torch.library.register_autograd(f"{_LIB}::{_name}", _op_backward(_name), setup_context=_setup)


# ---- FLOP counts: torch.utils.flop_counter.FlopCounterMode sees ragdot's products as these ops (eager calls take
# them while a TorchDispatchMode is active: `api.ragged_dot_general`), each counted as its dense product, every
# row in a group (a shape cannot say how many rows lie past sum(group_sizes); the kernels skip those).


def register_flops(op: Any, count: Callable[..., int]) -> None:
    """Register `count(*shapes_and_args, out_shape=...)` as the FLOP formula of the op packet `op` (once)."""
    try:
        from torch.utils.flop_counter import flop_registry, register_flop_formula
    except ImportError:  # a torch without the flop counter
        return
    if op not in flop_registry:
        register_flop_formula(op)(count)


def _ragged_m_flops(a, b, *args, out_shape=None, **kwargs) -> int:
    return 2 * a[0] * a[1] * a[2] * b[3]  # a [Bt, M, K], b [Bt, G, K, N]


def _contraction_flops(a, b, *args, out_shape=None, **kwargs) -> int:
    return 2 * a[0] * a[1] * a[2] * b[2]  # ragged_k: a [Bt, R, M], b [Bt, R, N]; batch: a [Bt, M, K], b [Bt, K, N]


register_flops(torch.ops.ragdot.ragged_m, _ragged_m_flops)
register_flops(torch.ops.ragdot.ragged_k, _contraction_flops)
register_flops(torch.ops.ragdot.batch, _contraction_flops)
