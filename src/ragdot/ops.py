"""The three canonical problems: prepared runners, autograd (reverse and forward mode), and custom ops.

    ragged_m:  c = a . b[g]          da = ragged_m(dc, b^T)        db = ragged_k(a, dc)
    ragged_k:  c[g] = a_g^T . b_g    da = ragged_m(b, dc^T)        db = ragged_m(a, dc)
    batch:     c = a . b             da = batch(dc, b^T)           db = batch(a^T, dc)

A *runner* is one problem prepared for one static signature (shapes, strides, dtypes, device, output dtype,
requested backend and the state a choice depends on): the backend and its config are chosen and prepared
once, so a repeated call is a dictionary lookup plus the backend's launch. `run` is the differentiable entry:
eager calls that need no autograd go straight to the runner; calls that do (input requires grad, forward-mode
dual tensors, torch.func transforms) go through `RaggedProblem`, an `autograd.Function` whose backward and JVP
are again canonical problems through `run`, so double backward, `torch.func.grad/vjp/jvp/jacrev` and vmap
compose. Under `torch.compile` the problems are `torch.library` custom ops with fake kernels
(`ragged_m_op`, ...), whose autograd is the same VJP.

Gradients contract the cotangent in the accumulation dtype (the wider of the cotangent's and the operands'
dtypes) and cast only the results to the operand dtype, so a float32 cotangent of float16 operands is never
rounded to float16 first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.forward_ad as _fwad

from ragdot.backends import get_backend
from ragdot.tune.cache import CACHE
from ragdot.tune.select import plan

__all__ = ["run", "runner", "RaggedProblem", "ragged_m_op", "ragged_k_op", "batch_op", "clear_runners"]

_LIB = "ragdot"
_MAX_RUNNERS = 4096
_profiling = torch._C._autograd._profiler_enabled
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor

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
    """One canonical problem prepared for one static signature; `__call__(a, b, ends) -> c` (contiguous).

    With `auto`, a backend that turns out unable to serve the signature at its first call (NotImplementedError)
    hands over to the next candidate, once and for good."""

    __slots__ = ("problem", "requested", "candidates", "index", "fn", "label", "out_shape", "out_dtype", "groups")

    def __init__(self, problem: str, requested: str, a: torch.Tensor, b: torch.Tensor, num_groups: int,
                 out_dtype: torch.dtype):
        self.problem, self.requested, self.out_dtype, self.groups = problem, requested, out_dtype, num_groups
        self.out_shape = _out_shape(problem, a, b, num_groups)
        self.fn: Callable[..., torch.Tensor] | None = None
        self.label = "zeros"
        self.candidates: list[tuple[str, Any]] = []
        self.index = -1
        if not _empty(problem, a, b, num_groups):
            eager = not (a.is_cuda and torch.cuda.is_current_stream_capturing())
            self.candidates = plan(problem, requested, a, b, num_groups, out_dtype, eager=eager)
            self._advance(a, b, [])

    def _advance(self, a: torch.Tensor, b: torch.Tensor, errors: list[str]) -> None:
        while self.index + 1 < len(self.candidates):
            self.index += 1
            name, config = self.candidates[self.index]
            backend = get_backend(name)
            try:
                self.fn = backend.prepare(self.problem, a, b, self.groups, self.out_dtype, config)
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

    def __call__(self, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor | None) -> torch.Tensor:
        if self.fn is None:
            return a.new_zeros(self.out_shape, dtype=self.out_dtype)
        if _profiling():  # a named range, as the custom ops get, so profiles attribute the kernels to ragdot
            with torch.profiler.record_function(f"{_LIB}::{self.problem}"):
                return self._call(a, b, ends)
        return self._call(a, b, ends)

    def _call(self, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor | None) -> torch.Tensor:
        try:
            return self.fn(a, b, ends)
        except NotImplementedError as exc:
            errors: list[str] = []
            self._fail(self.candidates[self.index][0], exc, errors)
            self._advance(a, b, errors)
            return self._call(a, b, ends)


_RUNNERS: dict[tuple, Runner] = {}


def clear_runners() -> None:
    """Forget every prepared runner (the next call of each signature prepares it again)."""
    _RUNNERS.clear()


def _state(a: torch.Tensor) -> tuple:
    """What a choice depends on beyond the signature: the tuning cache's content, TF32 for float32
    (torch's matmul setting, as torch.matmul reads it) and, on CUDA, whether a graph is being captured."""
    tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    return CACHE.generation, tf32, a.is_cuda and torch.cuda.is_current_stream_capturing()


def runner(problem: str, backend: str, a: torch.Tensor, b: torch.Tensor, num_groups: int,
           out_dtype: torch.dtype) -> Runner:
    """The prepared runner of this signature (built on first use)."""
    key = (problem, backend, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), num_groups, out_dtype,
           _state(a))
    found = _RUNNERS.get(key)
    if found is None:
        if len(_RUNNERS) >= _MAX_RUNNERS:  # many distinct shapes (e.g. serving): start over rather than grow
            _RUNNERS.clear()
        found = _RUNNERS[key] = Runner(problem, backend, a, b, num_groups, out_dtype)
    return found


# ------------------------------------------------------------------------------------------------ autograd


def needs_autograd(*tensors: torch.Tensor) -> bool:
    """Whether a call must be recorded: an input requires grad, forward-mode AD is active, or a
    torch.func transform wraps the inputs."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return True
    return _fwad._current_level >= 0 or torch._C._are_functorch_transforms_active()


def _plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` without torch.func wrappers of levels that have exited (a backward run after `torch.func.vjp`
    returned gets its saved tensors so wrapped); the values are the same."""
    while t is not None and _wrapped(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def run(problem: str, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor | None, out_dtype: torch.dtype,
        backend: str, prepared: Runner | None = None) -> torch.Tensor:
    """One canonical problem, differentiable in a and b. `prepared` may pass the runner of exactly these
    operands' signature when the caller already holds it."""
    if needs_autograd(a, b):
        return RaggedProblem.apply(a, b, ends, (problem, out_dtype, backend))
    if _wrapped(a) or _wrapped(b) or (ends is not None and _wrapped(ends)):
        a, b, ends, prepared = _plain(a), _plain(b), _plain(ends), None
    if prepared is None:
        prepared = runner(problem, backend, a, b, 0 if ends is None else ends.shape[0], out_dtype)
    return prepared(a, b, ends)


def vjp(problem: str, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor | None, dc: torch.Tensor,
        backend: str, needs: tuple[bool, bool], apply: Callable[..., torch.Tensor] = run):
    """(da, db) of one canonical problem, as canonical problems through `apply(problem, a, b, ends, dtype,
    backend)`; the cotangent is contracted in the accumulation dtype."""
    acc = torch.promote_types(dc.dtype, a.dtype)
    dc = dc if dc.dtype == acc else dc.to(acc)
    a_acc = a if a.dtype == acc else a.to(acc)
    b_acc = b if b.dtype == acc else b.to(acc)
    da = db = None
    if problem == "ragged_m":  # a [Bt, M, K], b [Bt, G, K, N], dc [Bt, M, N]
        if needs[0]:
            da = apply("ragged_m", dc, b_acc.transpose(-1, -2), ends, a.dtype, backend)
        if needs[1]:
            db = apply("ragged_k", a_acc, dc, ends, b.dtype, backend).transpose(0, 1)
    elif problem == "ragged_k":  # a [Bt, R, M], b [Bt, R, N], dc [G, Bt, M, N]
        if needs[0]:
            da = apply("ragged_m", b_acc, dc.permute(1, 0, 3, 2), ends, a.dtype, backend)
        if needs[1]:
            db = apply("ragged_m", a_acc, dc.transpose(0, 1), ends, b.dtype, backend)
    else:  # a [Bt, M, K], b [Bt, K, N], dc [Bt, M, N]
        if needs[0]:
            da = apply("batch", dc, b_acc.transpose(-1, -2), None, a.dtype, backend)
        if needs[1]:
            db = apply("batch", a_acc.transpose(-1, -2), dc, None, b.dtype, backend)
    return da, db


def jvp(problem: str, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor | None, ta: torch.Tensor | None,
        tb: torch.Tensor | None, out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    """The tangent of one canonical problem: the bilinear product's two terms, each a problem of its kind."""
    acc = torch.promote_types(out_dtype, a.dtype)
    terms = []
    if ta is not None:
        terms.append(run(problem, ta, b, ends, acc, backend))
    if tb is not None:
        terms.append(run(problem, a, tb, ends, acc, backend))
    if not terms:
        shape = _out_shape(problem, a, b, 0 if ends is None else ends.shape[0])
        return a.new_zeros(shape, dtype=out_dtype)
    total = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    return total.to(out_dtype)


class RaggedProblem(torch.autograd.Function):
    """One canonical problem with reverse mode, forward mode and a vmap rule. spec = (problem, out_dtype,
    backend)."""

    @staticmethod
    def forward(a, b, ends, spec):
        problem, out_dtype, backend = spec
        return runner(problem, backend, a, b, 0 if ends is None else ends.shape[0], out_dtype)(a, b, ends)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, ends, spec = inputs
        ctx.spec = spec
        ctx.save_for_backward(a, b, ends)
        ctx.save_for_forward(a, b, ends)

    @staticmethod
    def backward(ctx, dc):
        a, b, ends = ctx.saved_tensors
        problem, _, backend = ctx.spec
        da, db = vjp(problem, a, b, ends, dc, backend, tuple(ctx.needs_input_grad[:2]))
        return da, db, None, None

    @staticmethod
    def jvp(ctx, ta, tb, _t_ends, _t_spec):
        a, b, ends = ctx.saved_tensors
        problem, out_dtype, backend = ctx.spec
        return jvp(problem, a, b, ends, ta, tb, out_dtype, backend)

    @staticmethod
    def vmap(info, in_dims, a, b, ends, spec):
        def pick(t, dim, i):
            return t if dim is None or t is None else t.select(dim, i)

        outs = [RaggedProblem.apply(pick(a, in_dims[0], i), pick(b, in_dims[1], i), pick(ends, in_dims[2], i), spec)
                for i in range(info.batch_size)]
        return torch.stack(outs), 0


# ------------------------------------------------------------------------- custom ops (torch.compile path)


@torch.library.custom_op(f"{_LIB}::ragged_m", mutates_args=())
def ragged_m_op(
    a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype, backend: str
) -> torch.Tensor:
    """a [Bt, M, K] x b [Bt, G, K, N] -> [Bt, M, N]; rows >= group_ends[-1] are zero."""
    return runner("ragged_m", backend, a, b, group_ends.shape[0], out_dtype)(a, b, group_ends)


@ragged_m_op.register_fake
def _(a, b, group_ends, out_dtype, backend):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[3]), dtype=out_dtype)


@torch.library.custom_op(f"{_LIB}::ragged_k", mutates_args=())
def ragged_k_op(
    a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype, backend: str
) -> torch.Tensor:
    """a [Bt, R, M] x b [Bt, R, N] -> [G, Bt, M, N]; group g contracts rows [ends[g-1], ends[g])."""
    return runner("ragged_k", backend, a, b, group_ends.shape[0], out_dtype)(a, b, group_ends)


@ragged_k_op.register_fake
def _(a, b, group_ends, out_dtype, backend):
    return a.new_empty((group_ends.shape[0], a.shape[0], a.shape[2], b.shape[2]), dtype=out_dtype)


@torch.library.custom_op(f"{_LIB}::batch", mutates_args=())
def batch_op(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    """a [Bt, M, K] x b [Bt, K, N] -> [Bt, M, N]."""
    return runner("batch", backend, a, b, 0, out_dtype)(a, b, None)


@batch_op.register_fake
def _(a, b, out_dtype, backend):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=out_dtype)


def apply_op(problem: str, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor | None, out_dtype: torch.dtype,
             backend: str) -> torch.Tensor:
    """One canonical problem through its custom op (what torch.compile traces)."""
    if problem == "batch":
        return batch_op(a, b, out_dtype, backend)
    op = ragged_m_op if problem == "ragged_m" else ragged_k_op
    return op(a, b, ends, out_dtype, backend)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))
    ctx.backend = inputs[-1]


def _op_backward(problem: str):
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        a, b, ends = (saved[0], saved[1], saved[2] if problem != "batch" else None)
        da, db = vjp(problem, a, b, ends, grad, ctx.backend, tuple(ctx.needs_input_grad[:2]), apply=apply_op)
        return (da, db, None, None, None) if problem != "batch" else (da, db, None, None)

    return backward


for _name in ("ragged_m", "ragged_k", "batch"):
    torch.library.register_autograd(f"{_LIB}::{_name}", _op_backward(_name), setup_context=_setup)
