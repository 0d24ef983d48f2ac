"""The eager backward of one call signature, resolved once: each gradient product bound to its prepared call.

Eager autograd records a ragdot call as one node (`api._CallFunction`), and its backward runs on autograd's
device thread, where every line of Python costs more than on the calling thread (measured on an H200 host:
ragdot's forward+backward 428 µs with the engine's device threads, 233 µs with them disabled; a minimal
Python autograd.Function around torch._grouped_mm 239 / 156 µs). So the backward of a signature is resolved
once, like its forward: the first backward for a key (cotangent dtype and strides, which gradients are
needed, the state a backend choice depends on) computes the gradients through `ops.vjp`'s products, and
binds each product when

- its operands are views of the user's tensors (lhs, rhs, cotangent): the backend then takes the user's
  tensor as it is (a backend that reads only addresses, when the view starts where the tensor does) or
  re-created by one `as_strided` (a backend that takes matrices);
- its gradient is the product's output itself (same memory), in the user's shape: contiguous, or a
  permutation of the product's contiguous output (ragged_m's weight gradient of a transposed weight view,
  `ops._RAGGED_M_DB_T`), re-created by one `as_strided`; and
- the cotangent and the operands share one dtype (no cast before contracting).

A later backward of the key is then two prepared calls. The `torch` backend's offsets are formed once per
call: the forward's when it ran on `torch` too, else once for both products. A product that cannot be bound
leaves the key on the general path (`ops.vjp`), which gives the same values.
"""

from __future__ import annotations

from typing import Any

import torch

from ragdot import ops

__all__ = ["Bound", "build", "run"]


class Bound:
    """One gradient product of a signature, bound: the prepared call, where its operands come from, and the
    shapes of its output and of the gradient."""

    __slots__ = ("fn", "sources", "out_shape", "view_shape", "layout", "ends_key")

    def __init__(self, fn: Any, sources: tuple, out_shape: tuple[int, ...], view_shape: tuple[int, ...] | None,
                 layout: tuple | None = None):
        self.fn = fn
        self.sources = sources  # per operand: (index into (lhs, rhs, cotangent), None or (size, stride, offset))
        self.out_shape = out_shape
        self.view_shape = view_shape
        self.layout = layout  # (size, stride) of a gradient that permutes the product's output, else None
        self.ends_key = getattr(fn, "ends_key", None)  # the offsets a `torch` product takes (None: raw sizes)

    def __call__(self, users: tuple[torch.Tensor, ...], sizes: torch.Tensor | None,
                 ends: torch.Tensor | None) -> torch.Tensor:
        (i, v), (j, w) = self.sources
        x = users[i] if v is None else users[i].as_strided(v[0], v[1], users[i].storage_offset() + v[2])
        y = users[j] if w is None else users[j].as_strided(w[0], w[1], users[j].storage_offset() + w[2])
        out = self.fn.direct(x, y, sizes, self.out_shape, ends)
        if self.layout is not None:
            return out.as_strided(*self.layout)
        return out if self.view_shape is None else out.view(self.view_shape)


def _source(t: torch.Tensor, users: tuple[torch.Tensor, ...], address: bool) -> tuple[int, Any] | None:
    """Where operand `t` (a canonical operand; for a matrix backend without its unit batch axis) comes from."""
    for i, u in enumerate(users):
        if t.untyped_storage().data_ptr() != u.untyped_storage().data_ptr():
            continue
        same = t.data_ptr() == u.data_ptr() and (address or (t.shape == u.shape and t.stride() == u.stride()))
        return i, None if same else (tuple(t.shape), tuple(t.stride()), t.storage_offset() - u.storage_offset())
    return None


def _bind(runner: ops.Runner, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, grad: torch.Tensor,
          users: tuple[torch.Tensor, ...]) -> Bound | None:
    """The bound form of one product (operands x, y; canonical output `out`; the user's gradient `grad`)."""
    fn = runner.fn
    kind = getattr(fn, "direct_kind", None)
    if kind is None or grad.data_ptr() != out.data_ptr() or not out.is_contiguous() or grad.numel() != out.numel():
        return None
    address = kind == "address"
    if not address and (x.shape[0] != 1 or y.shape[0] != 1):
        return None
    operands = (x, y) if address else (x[0], y[0])
    sources = tuple(_source(t, users, address) for t in operands)
    if None in sources:
        return None
    # a matrix backend returns the product without the unit batch axis ([M, N] or [G, M, N])
    direct_shape = out.shape if address else out.shape[1:] if runner.problem != "ragged_k" else (
        out.shape[0], *out.shape[2:])
    if not grad.is_contiguous():  # views of the contiguous output (same memory, same count): a permutation
        return Bound(fn, sources, tuple(direct_shape), None, (tuple(grad.shape), tuple(grad.stride())))
    if address:
        return Bound(fn, sources, tuple(grad.shape), None)
    return Bound(fn, sources, tuple(grad.shape), None if direct_shape == grad.shape else tuple(grad.shape))


def _distinct(*tensors: torch.Tensor) -> bool:
    ptrs = [t.untyped_storage().data_ptr() for t in tensors]
    return len(set(ptrs)) == len(ptrs)


def build(call: Any, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor | None, dout: torch.Tensor,
          needs: tuple[bool, bool], into: bool = False) -> tuple[tuple, tuple | None]:
    """(the gradients, the bound products or None) for the first backward of a key of `call` (an api._Call):
    its general VJP, with each product's prepared runner recorded and then bound. Runs outside grad mode and
    transforms, as every backward that binds does. `into`: the gradients land in the caller's buffers
    (`ops.runner`'s copy-aware choice)."""
    groups = 0 if sizes is None else sizes.shape[0]
    made: list[tuple] = []  # (runner, operands x and y, canonical output) of each product, in order

    def apply(product, x, y, sizes_, dtype, backend, scale):
        runner = ops.runner(product, backend, x, y, groups, dtype, scale, into)
        out = runner(x, y, sizes_)
        made.append((runner, x, y, out))
        return out

    grads = call.vjp(lhs, rhs, sizes, dout, needs, apply=apply)
    # no cast before contracting (the accumulation dtype is every operand's own), no shared storage
    if not (lhs.dtype == rhs.dtype == dout.dtype and _distinct(lhs, rhs, dout)):
        return grads, None
    users, records = (lhs, rhs, dout), iter(made)
    bound = tuple(None if g is None else _bind(*next(records), g, users) for g in grads)
    ok = all(p is not None for p, g in zip(bound, grads) if g is not None)
    return grads, (bound if ok else None)


def run(bound: tuple, lhs: torch.Tensor, rhs: torch.Tensor, dout: torch.Tensor, sizes: torch.Tensor | None,
        fwd_ends: tuple | None) -> tuple:
    """The gradients through the bound products; `fwd_ends` is (offsets, ends_key) of the forward or None."""
    users = (lhs, rhs, dout)
    ends = key = None
    if fwd_ends is not None:
        ends, key = fwd_ends
    grads = []
    for product in bound:
        if product is None:
            grads.append(None)
            continue
        want = product.ends_key
        if want is not None and want != key:  # this product's offsets: formed once, shared with the next
            ends, key = product.fn.ends(sizes), want
        grads.append(product(users, sizes, ends if want is not None else None))
    return tuple(grads)
