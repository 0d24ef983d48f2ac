"""The torch side of the bridge: what runs inside XLA's buffer callbacks.

Each callback receives XLA's own buffers. They are wrapped as torch tensors with `torch.from_dlpack` (no
copy) and handed to ragdot's PyTorch code: the forward runs the prepared runner of the call's `_Call` (the
same object `ragdot.ragged_dot_general` caches), the backward runs that `_Call`'s general VJP (`ragdot.ops.vjp`
on the canonical views, the gradients mapped back by its inverse maps). On a GPU everything is launched on
XLA's stream (`torch.cuda.ExternalStream(ctx.stream)`), so no synchronisation is needed either way.

Where the prepared backend can write into a given output (the Triton kernels, direct_kind "address"), the
forward writes straight into XLA's output buffer; otherwise ragdot's result is copied into it (one device
copy of the output).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

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


class Bridge:
    """The callbacks of one signature, with its `_Call` per device (looked up without hashing the signature)."""

    def __init__(self, sig: Signature) -> None:
        self.sig = sig
        self.calls: dict[torch.device, _Call] = {}

    def _call(self, lhs: torch.Tensor, rhs: torch.Tensor, sizes: torch.Tensor) -> _Call:
        found = self.calls.get(lhs.device)
        if found is None:
            sig = self.sig
            found = self.calls[lhs.device] = _Call(lhs, rhs, sizes, sig.dn, sig.out_dtype, sig.backend, False)
        return found

    def forward(self, ctx: Any, out: Any, lhs: Any, rhs: Any, sizes: Any) -> None:
        """out[...] = ragged_dot_general(lhs, rhs, sizes) in the signature's layout, on XLA's stream."""
        with _on_stream(ctx, _device_of(out)):
            out_t, lhs_t, rhs_t, sizes_t = _tensors(out, lhs, rhs, sizes)
            call = self._call(lhs_t, rhs_t, sizes_t)
            used = None if call.mode == "batch" else sizes_t
            runner = call._runner(lhs_t, rhs_t)
            prepared = getattr(runner.fn, "prepared", None)
            if prepared is not None and runner.takes(call.direct):
                prepared(lhs_t, rhs_t, used, out_t)  # zero copy: the kernel writes XLA's output buffer
                return
            out_t.copy_(call.forward(lhs_t, rhs_t, used))

    def backward(self, ctx: Any, outs: Any, lhs: Any, rhs: Any, sizes: Any, dout: Any) -> None:
        """(dlhs, drhs)[...] = the vjp of ragged_dot_general at (lhs, rhs) for the cotangent dout: ragdot's
        general vjp of the signature's `_Call` (canonical views, products, inverse maps)."""
        with _on_stream(ctx, _device_of(lhs)):
            dlhs_t, drhs_t, lhs_t, rhs_t, sizes_t, dout_t = _tensors(*outs, lhs, rhs, sizes, dout)
            call = self._call(lhs_t, rhs_t, sizes_t)
            used = None if call.mode == "batch" else sizes_t
            da, db = call.vjp(lhs_t, rhs_t, used, dout_t, (True, True))
            dlhs_t.copy_(da)
            drhs_t.copy_(db)
