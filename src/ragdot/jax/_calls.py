"""The custom calls of one signature: the XLA FFI target "ragdot_launch" (`ragdot.jax._ffi`) where its library
builds and the bridge is the prepared one, else `buffer_callback`s running the same bridge; each direction
takes (lhs, rhs, sizes[, dout]) and is built once per (signature, output shape, bridge kind)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.experimental.buffer_callback import buffer_callback

from ragdot.jax import _bridge, _ffi
from ragdot.jax._bridge import Bridge, Signature
from ragdot.native import plan as _plan


def _jax_dtype(dtype: torch.dtype) -> Any:
    return jnp.dtype(str(dtype).removeprefix("torch."))


def _callbacks(sig: Signature, out_shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The forward and backward of one signature: the FFI custom call where its library builds and the
    bridge is the prepared one (`ragdot.jax._ffi`), else buffer callbacks. Both take (lhs, rhs, sizes[, dout])."""
    return _directions(sig, out_shape, _bridge.PREPARED and _ffi.available())


@functools.lru_cache(maxsize=1024)
def _directions(sig: Signature, out_shape: tuple[int, ...], ffi: bool) -> tuple[Any, Any]:
    jdt = _jax_dtype(sig.dtype)
    out = jax.ShapeDtypeStruct(out_shape, _jax_dtype(sig.out_dtype))
    grads = (jax.ShapeDtypeStruct(sig.lhs_shape, jdt), jax.ShapeDtypeStruct(sig.rhs_shape, jdt))
    bridge = Bridge(sig)
    if ffi:
        return _ffi_call(bridge, (out,)), _ffi_call(bridge, grads)
    fwd = buffer_callback(bridge.forward, out, vmap_method="sequential")
    bwd = buffer_callback(bridge.backward, grads, vmap_method="sequential")
    return fwd, bwd


def _ffi_call(bridge: Bridge, results: tuple[Any, ...]) -> Any:
    """One direction of `bridge` as the "ragdot_launch" custom call: its results plus a workspace (bytes)."""
    sig = bridge.sig
    backward = len(results) == 2
    workspace = jax.ShapeDtypeStruct((_plan.workspace_bytes(sig.groups),), jnp.uint8)
    call = jax.ffi.ffi_call(_ffi.TARGET, (*results, workspace), vmap_method="sequential")

    def run(lhs: Any, rhs: Any, sizes: Any, *dout: Any) -> Any:
        arrays = (lhs, rhs, sizes, *dout)
        specs = tuple((tuple(a.shape), _torch_dtype(a.dtype)) for a in arrays) + tuple(
            (tuple(r.shape), _torch_dtype(r.dtype)) for r in (*results, workspace))
        got = call(*arrays, slot=np.int64(_ffi.slot(bridge, backward, specs)))
        return got[0] if not backward else (got[0], got[1])

    return run


def _torch_dtype(dtype: Any) -> torch.dtype:
    return getattr(torch, np.dtype(dtype).name)

