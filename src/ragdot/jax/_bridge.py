"""The torch side of the bridge: what runs inside XLA's buffer callbacks.

Each callback receives XLA's own buffers. They are wrapped as torch tensors through DLPack (no copy) and
handed to ragdot's PyTorch code: the forward runs the prepared runner of the call's `_Call` (the same object
`ragdot.ragged_dot_general` caches), the backward that `_Call`'s backward outside grad mode (its gradient
products bound once by `ragdot.grad_plan`). On a GPU everything is launched on XLA's stream (made torch's
current stream for the call), so no synchronisation is needed either way.

Where the prepared backend can write into a given output (the Triton kernels, direct_kind "address"), the
forward writes straight into XLA's output buffer, and so do the backward's Triton products into XLA's
gradient buffers; otherwise ragdot's results are copied into them (one device copy each). The forward's
`auto` choice counts that copy against the backends that need it (`ops.runner(..., into=True)`), and so
does the backward's for its products (bound separately from the PyTorch autograd's, `_Call.bwd_key`).

What does not change between calls is bound at the first call on a device and stream (`_Prepared`: the
stream switch, the DLPack arguments, the `_Call`, the forward launch for the current backend state), so a
call is the DLPack views and the prepared launches. `PREPARED = False` runs the general path of every call
(`forward_general`, `backward_general`): the same bits, kept to measure the difference.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from ragdot import ops
from ragdot.api import _Call
from ragdot.dimension_numbers import RaggedDotDimensionNumbers

__all__ = ["Signature", "Bridge"]


@dataclass(frozen=True)
class Signature:
    """The static part of one call (hashable: it keys the callbacks' caches and the custom_vjp)."""

    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    groups: int
    dtype: torch.dtype  # of lhs and rhs
    dn: RaggedDotDimensionNumbers
    out_dtype: torch.dtype
    backend: str | None


_STREAMS: dict[tuple[int, int], Any] = {}


@contextlib.contextmanager
def _one_cpu_thread():
    """torch single-threaded for the call, then as it was. On the CPU, XLA runs the callback on the caller's
    thread or one of its pool's, with its own threads about: torch's intra-op threads on top oversubscribe
    the cores (several times slower calls on a 2-core machine). The switch costs well under a microsecond;
    with OpenMP (torch's CPU builds) it applies to the calling thread only."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _on_stream(ctx: Any, device: torch.device) -> contextlib.AbstractContextManager:
    """XLA's stream as torch's current stream (GPU); on the CPU, torch single-threaded for the call."""
    if device.type != "cuda":
        return _one_cpu_thread()
    key = (device.index or 0, int(ctx.stream))
    stream = _STREAMS.get(key)
    if stream is None:
        stream = _STREAMS[key] = torch.cuda.ExternalStream(key[1], device=device)
    return torch.cuda.stream(stream)


_DLPACK_CUDA = 2  # DLPack's kDLCUDA device type


def _device_of(buffer: Any) -> torch.device:
    """The torch device of an XLA buffer, read before wrapping it (so the wrap happens on XLA's stream)."""
    kind, index = buffer.__dlpack_device__()
    return torch.device("cuda", int(index)) if int(kind) == _DLPACK_CUDA else torch.device("cpu")


def _tensors(*buffers: Any) -> list[torch.Tensor]:
    return [torch.from_dlpack(b) for b in buffers]


class _Views:
    """The DLPack views of XLA's buffers on one device, made the short way: `buffer.__dlpack__` with the
    arguments `torch.from_dlpack` would pass (DLPack 1.0; on CUDA the consumer stream, which inside a callback
    is XLA's own), then `torch._C._from_dlpack`. It skips `torch.from_dlpack`'s device and stream queries of
    every call (a whole `torch.from_dlpack` measured 1.1-1.4 µs a buffer on the CPU inside a callback,
    benchmarks/jax_host_profile.py). A producer that refuses these arguments (TypeError) gets
    `torch.from_dlpack` from then on."""

    __slots__ = ("kwargs", "plain")

    def __init__(self, device: torch.device, stream: int | None) -> None:
        self.kwargs: dict[str, Any] = {"max_version": (1, 0)}
        if device.type == "cuda":
            self.kwargs["stream"] = 1 if stream == 0 else stream  # DLPack: 1 names CUDA's legacy default stream
        self.plain = False

    def __call__(self, *buffers: Any) -> list[torch.Tensor]:
        if not self.plain:
            try:
                return [_from_capsule(b.__dlpack__(**self.kwargs)) for b in buffers]
            except TypeError:
                self.plain = True
        return [torch.from_dlpack(b) for b in buffers]


_from_capsule = torch._C._from_dlpack


class _Stream:
    """XLA's stream made torch's current one for a callback (CUDA), then the previous stream and device back;
    on the CPU, torch single-threaded for the call. Bound once per (device, stream pointer): a call is two
    stream switches (what `torch.cuda.stream` does, without its Python around them)."""

    __slots__ = ("device", "target", "cpu")

    def __init__(self, device: torch.device, stream: int | None) -> None:
        self.cpu = device.type != "cuda"
        self.device = device.index or 0
        self.target: dict[str, int] = {}
        if not self.cpu:
            ext = torch.cuda.ExternalStream(stream, device=device)
            self.target = {"stream_id": ext.stream_id, "device_index": ext.device_index,
                           "device_type": ext.device_type}

    def enter(self) -> Any:
        if self.cpu:
            threads = torch.get_num_threads()
            if threads != 1:
                torch.set_num_threads(1)
            return threads
        before = (torch._C._cuda_getDevice(), torch._C._cuda_getCurrentStream(self.device))
        torch._C._cuda_setStream(**self.target)  # also makes the stream's device the current one
        return before

    def exit(self, before: Any) -> None:
        if self.cpu:
            if before != 1:
                torch.set_num_threads(before)
            return
        device, (stream_id, device_index, device_type) = before
        torch._C._cuda_setStream(stream_id=stream_id, device_index=device_index, device_type=device_type)
        if device != self.device:
            torch._C._cuda_setDevice(device)


class _Prepared:
    """What one signature's callbacks need on one device and stream, bound at their first call there: the
    stream switch, the DLPack views, the `_Call`, and the forward and backward launches for the state a
    backend choice depends on (`ops._state`: the tuning cache, TF32, graph capture; looked up again when it
    changes). The backward's bound products are the `_Call`'s own (`ragdot.grad_plan`)."""

    __slots__ = ("stream", "views", "call", "batch", "state", "fwd")

    def __init__(self, device: torch.device, stream: int | None) -> None:
        self.stream = _Stream(device, stream)
        self.views = _Views(device, stream)
        self.call: _Call | None = None
        self.batch = False
        self.state: tuple | None = None
        self.fwd: Any = None

    def bind(self, bridge: Bridge, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor) -> _Call:
        call = self.call = bridge._call(lhs, rhs, sizes)
        self.batch = call.mode == "batch"
        return call

    def forward_launch(self, lhs: torch.Tensor, rhs: torch.Tensor) -> Any:
        """out <- the forward, as one prepared call: the Triton kernel writing XLA's buffer where the
        backend reads only addresses, else ragdot's forward and one copy into it."""
        state = ops._state(lhs)
        if state != self.state:
            self.state, self.fwd = state, None
        if self.fwd is None:
            call = self.call
            runner = call._runner(lhs, rhs, into=True)
            prepared = getattr(runner.fn, "prepared", None)
            if prepared is not None and runner.takes(call.direct):
                self.fwd = prepared  # (lhs, rhs, sizes, out): the kernel reads only the addresses
            else:
                self.fwd = _CopyingLaunch(call, runner)
        return self.fwd


class _CopyingLaunch:
    """`call.forward` with its runner bound (the caller checked the state), copied into XLA's buffer. Whether
    the runner takes the user's tensors is asked per call, as `call.forward` does: a runner shared with other
    calls may have handed over to another backend since."""

    __slots__ = ("call", "runner")

    def __init__(self, call: _Call, runner: ops.Runner) -> None:
        self.call, self.runner = call, runner

    def __call__(self, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor | None, out: torch.Tensor) -> None:
        call, runner = self.call, self.runner
        if runner.takes(call.direct):
            out.copy_(runner.call_direct(lhs, rhs, sizes, call.plan.view_shape))
            return
        a, b = call.plan.views(lhs, rhs)
        out.copy_(call.plan.finish(runner(a, b, sizes)))


def _in_place(bound: tuple, outs: tuple[torch.Tensor, ...]) -> bool:
    """Whether every bound gradient product is a Triton kernel whose output is the gradient itself, in the
    memory order and dtype of XLA's contiguous gradient buffer (so it can write that buffer)."""
    return bool(bound) and all(
        p is not None and p.view_shape is None and p.layout is None and hasattr(p.fn, "prepared")
        and dst.is_contiguous()
        and dst.dtype == p.fn.prepared.out_dtype for p, dst in zip(bound, outs))


def _operand(users: tuple[torch.Tensor, ...], source: tuple) -> torch.Tensor:
    i, view = source
    t = users[i]
    return t if view is None else t.as_strided(view[0], view[1], t.storage_offset() + view[2])


class Bridge:
    """The callbacks of one signature: its `_Call` per device and, per device and stream, what a call needs
    bound once (`_Prepared`), so that a call is the DLPack views of XLA's buffers and the prepared launches.
    `PREPARED = False` (module attribute, or RAGDOT_JAX_BRIDGE=general) runs the general path of every call
    instead (the same values; kept to measure the difference)."""

    def __init__(self, sig: Signature) -> None:
        self.sig = sig
        self.calls: dict[torch.device, _Call] = {}
        self.bound: dict[tuple, _Prepared] = {}

    def _call(self, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor) -> _Call:
        found = self.calls.get(lhs.device)
        if found is None:
            sig = self.sig
            found = self.calls[lhs.device] = _Call(lhs, rhs, sizes, sig.dn, sig.out_dtype, sig.backend, False)
        return found

    def _prepared(self, ctx: Any, buffer: Any) -> _Prepared:
        where = buffer.__dlpack_device__()
        stream = int(ctx.stream) if int(where[0]) == _DLPACK_CUDA else None
        key = (where, stream)
        found = self.bound.get(key)
        if found is None:
            found = self.bound[key] = self.prepared_at(_device_of(buffer), stream)
        return found

    def prepared_at(self, device: torch.device, stream: int | None) -> _Prepared:
        """What calls on `device` and XLA's `stream` (None on the CPU) need bound (made at the first)."""
        key = (device, stream)
        found = self.bound.get(key)
        if found is None:
            found = self.bound[key] = _Prepared(device, stream)
        return found

    @property
    def replayable(self) -> bool:
        """Whether a call's launches may be recorded and replayed without Python (the prepared path)."""
        return PREPARED

    # ---- forward ------------------------------------------------------------------------------------------
    def forward(self, ctx: Any, out: Any, lhs: Any, rhs: Any, sizes: Any) -> None:
        """out[...] = ragged_dot_general(lhs, rhs, sizes) in the signature's layout, on XLA's stream."""
        if not PREPARED:
            return self.forward_general(ctx, out, lhs, rhs, sizes)
        p = self._prepared(ctx, out)
        previous = p.stream.enter()
        try:
            if p.call is not None and p.batch:  # group sizes are not read
                out_t, lhs_t, rhs_t = p.views(out, lhs, rhs)
                sizes_t = None
            else:
                out_t, lhs_t, rhs_t, sizes_t = p.views(out, lhs, rhs, sizes)
            self.forward_tensors(p, out_t, lhs_t, rhs_t, sizes_t)
        finally:
            p.stream.exit(previous)

    def forward_tensors(self, p: _Prepared, out: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor,
                        sizes: torch.Tensor | None) -> bool:
        """The forward on torch views of XLA's buffers (the caller made XLA's stream current); whether it was
        a prepared kernel that declares its calls replayable (`ragdot.kernels.record`) writing `out`."""
        if p.call is None:
            p.bind(self, lhs, rhs, sizes)
        launch = p.forward_launch(lhs, rhs)
        launch(lhs, rhs, None if p.batch else sizes, out)
        return getattr(launch, "replayable", False)

    def forward_general(self, ctx: Any, out: Any, lhs: Any, rhs: Any, sizes: Any) -> None:
        """The forward through ragdot's general call path (every step looked up again)."""
        with _on_stream(ctx, _device_of(out)):
            out_t, lhs_t, rhs_t, sizes_t = _tensors(out, lhs, rhs, sizes)
            call = self._call(lhs_t, rhs_t, sizes_t)
            used = None if call.mode == "batch" else sizes_t
            runner = call._runner(lhs_t, rhs_t, into=True)
            prepared = getattr(runner.fn, "prepared", None)
            if prepared is not None and runner.takes(call.direct):
                prepared(lhs_t, rhs_t, used, out_t)  # zero copy: the kernel writes XLA's output buffer
                return
            out_t.copy_(call.forward(lhs_t, rhs_t, used))

    # ---- backward -----------------------------------------------------------------------------------------
    def backward(self, ctx: Any, outs: Any, lhs: Any, rhs: Any, sizes: Any, dout: Any) -> None:
        """(dlhs, drhs)[...] = the vjp of ragged_dot_general at (lhs, rhs) for the cotangent dout, on XLA's
        stream (`backward_tensors`)."""
        if not PREPARED:
            return self.backward_general(ctx, outs, lhs, rhs, sizes, dout)
        p = self._prepared(ctx, lhs)
        previous = p.stream.enter()
        try:
            dlhs_t, drhs_t, lhs_t, rhs_t, sizes_t, dout_t = p.views(*outs, lhs, rhs, sizes, dout)
            self.backward_tensors(p, (dlhs_t, drhs_t), lhs_t, rhs_t, sizes_t, dout_t)
        finally:
            p.stream.exit(previous)

    def backward_tensors(self, p: _Prepared, outs: tuple[torch.Tensor, torch.Tensor], lhs: torch.Tensor,
                         rhs: torch.Tensor, sizes: torch.Tensor, dout: torch.Tensor) -> bool:
        """The backward on torch views of XLA's buffers: the `_Call`'s backward outside grad mode, i.e. its
        bound gradient products (`ragdot.grad_plan`), written straight into `outs` where they are Triton
        kernels (then True where both declare their calls replayable), else computed and copied (False)."""
        grad_mode = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            dlhs, drhs = outs
            call = p.call if p.call is not None else p.bind(self, lhs, rhs, sizes)
            used = None if p.batch else sizes
            bound = call.bwd.get(call.bwd_key(lhs, dout, (True, True), into=True))
            if bound and _in_place(bound, outs):
                users = (lhs, rhs, dout)
                for product, dst in zip(bound, outs):
                    (i, v), (j, w) = product.sources
                    product.fn.prepared(_operand(users, (i, v)), _operand(users, (j, w)), used, dst)
                return all(getattr(product.fn.prepared, "replayable", False) for product in bound)
            da, db = call.backward(lhs, rhs, used, dout, (True, True), None, into=True)
            dlhs.copy_(da)
            drhs.copy_(db)
            return False
        finally:
            torch._C._set_grad_enabled(grad_mode)

    def backward_general(self, ctx: Any, outs: Any, lhs: Any, rhs: Any, sizes: Any, dout: Any) -> None:
        """The backward through the `_Call`'s general VJP (canonical views, products, inverse maps)."""
        with _on_stream(ctx, _device_of(lhs)):
            dlhs_t, drhs_t, lhs_t, rhs_t, sizes_t, dout_t = _tensors(*outs, lhs, rhs, sizes, dout)
            call = self._call(lhs_t, rhs_t, sizes_t)
            used = None if call.mode == "batch" else sizes_t
            da, db = call.vjp(lhs_t, rhs_t, used, dout_t, (True, True))
            dlhs_t.copy_(da)
            drhs_t.copy_(db)


PREPARED = os.environ.get("RAGDOT_JAX_BRIDGE", "ffi") != "general"
