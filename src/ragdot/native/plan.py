"""A recorded prepared call (`ragdot.kernels.record`) written as the launch program `replay.c` replays.

Every tensor the recorded launches took is placed in one of the call's buffers: the buffers the call was
given (an address inside exactly one of them, the whole extent inside it: XLA's buffers for ragdot.jax, the
operands, group sizes and output for ragdot's eager calls) or, for the call's scratch temporaries, a
workspace buffer (the result every ragdot.jax call carries, `workspace_bytes`; an eager call's per-call
temporary of `scratch_bytes`). Each kernel's
parameters follow the compiled kernel's own signature, as Triton 3.6's CUDA launcher packs them:
constexprs left out, a host tensor descriptor as its tensor map (encoded per call from its buffer's address)
followed by its shape (int32) and strides (int64), the integers at their declared widths, and the two
trailing scratch pointers null (kernels that need scratch memory, clusters or an unknown argument kind are
refused). Anything that cannot be placed raises `Unplannable`: the call then keeps going through Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # ragdot.kernels needs Triton, ragdot.jax does not: imported where a plan is made
    from ragdot.kernels.record import Launch, Record

__all__ = ["Unplannable", "buffer", "program", "scratch_bytes", "workspace_bytes"]

_ALIGN = 256
_INT_BYTES = {"i1": 1, "u1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8}
_STEP_KERNEL, _STEP_ZERO = 0, 1
_PTR, _SCALAR, _NULL, _TMAP = 0, 1, 2, 3


class Unplannable(Exception):
    """The recorded call cannot be replayed from C (the message says why)."""


def workspace_bytes(groups: int) -> int:
    """Bytes of the workspace result of a call over `groups` groups: room for two of the scratch tensors
    ragdot's kernels make per call (the ranking of the weight gradient's groups, int32 [4, G]; the clamped
    group ends, int32 [G])."""
    return 2 * _round(16 * max(groups, 1))


def _round(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _extent(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to the end of its last."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def buffer(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of a tensor as one of a call's buffers: from its first element to the end of its last."""
    return t.data_ptr(), _extent(t)


def scratch_bytes(record: Record) -> int:
    """Bytes of a workspace that holds every scratch temporary of `record`, each at an aligned offset."""
    return sum(_round(_extent(t)) for t in record.scratch)


class _Places:
    """Tensor -> (buffer index, byte offset): the call's buffers by address, its scratch in the workspace."""

    def __init__(self, buffers: list[tuple[int, int]], workspace: int | None, scratch: list[torch.Tensor]):
        self.buffers = buffers
        self.scratch: list[tuple[int, int, int]] = []  # (address, bytes, workspace offset)
        used = 0
        for t in scratch:
            size = _extent(t)
            if workspace is None or used + size > buffers[workspace][1]:
                raise Unplannable("the call's scratch does not fit in its workspace")
            self.scratch.append((t.data_ptr(), size, used))
            used += _round(size)
        self.workspace = workspace

    def __call__(self, t: torch.Tensor) -> tuple[int, int]:
        address, size = t.data_ptr(), _extent(t)
        for start, length, offset in self.scratch:
            if start <= address and address + size <= start + length:
                return self.workspace, offset + address - start
        found = [i for i, (start, length) in enumerate(self.buffers)
                 if i != self.workspace and length > 0 and start <= address and address + size <= start + length]
        if len(found) != 1:
            raise Unplannable(f"a kernel argument at {address:#x} lies in {len(found)} of the call's buffers")
        return found[0], address - self.buffers[found[0]][0]


def _descriptor(desc: Any, meta: dict | None, place: _Places, host_dtype: dict) -> list[int]:
    if meta is None or meta.get("fp4_padded"):
        raise Unplannable("a tensor descriptor without TMA metadata (or fp4-padded)")
    from ragdot.kernels.launch import tma_fill_args

    # fill: CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA (1) or NONE (0)
    swizzle, elem, elem_type, block, shape, strides, fill = tma_fill_args(desc, meta, host_dtype)
    rank = len(shape)
    buffer, offset = place(desc.base)
    words = [_TMAP, buffer, offset, int(elem_type), rank, int(swizzle), fill]
    words += [int(x) for x in reversed(shape)]
    words += [int(elem) * int(strides[j]) for j in reversed(range(rank - 1))]
    words += [int(x) for x in reversed(block)]
    for x in shape:
        words += [_SCALAR, 4, int(x)]
    for x in strides:
        words += [_SCALAR, 8, int(x)]
    return words


def _kernel(launch: Launch, place: _Places, host_dtype: dict, loaded: bool) -> list[int]:
    compiled = launch.compiled
    if compiled is None or not hasattr(compiled, "src"):
        raise Unplannable("a launch without a compiled kernel (interpreter?)")
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise Unplannable("a kernel that needs scratch memory")
    if getattr(meta, "num_ctas", 1) != 1:
        raise Unplannable("a cluster launch")
    function = compiled.function
    if function is None and loaded:
        raise Unplannable("a kernel that is not loaded")
    names = list(compiled.src.fn.arg_names)
    signature = compiled.src.signature
    metas = list(getattr(meta, "tensordesc_meta", None) or [])
    params: list[int] = []
    count = 0
    for name, value in zip(names, launch.args):
        kind = signature[name]
        if kind == "constexpr":  # specialised (e.g. an integer 1): compiled in, not passed
            continue
        if kind.startswith("tensordesc"):
            words = _descriptor(value, metas.pop(0) if metas else None, place, host_dtype)
            count += 1 + len(value.shape) + len(value.strides)
        elif kind.startswith("*"):
            if not isinstance(value, torch.Tensor):
                raise Unplannable(f"pointer argument {name} is not a tensor")
            words = [_PTR, *place(value)]
            count += 1
        elif kind in _INT_BYTES:
            words = [_SCALAR, _INT_BYTES[kind], int(value)]
            count += 1
        else:
            raise Unplannable(f"argument {name} of kind {kind}")
        params += words
    params += [_NULL, _NULL]  # Triton's global and profile scratch pointers
    count += 2
    pdl, cooperative = getattr(meta, "launch_pdl", False), getattr(meta, "launch_cooperative_grid", False)
    flags = int(bool(pdl)) | 2 * int(bool(cooperative))
    g0, g1, g2 = launch.grid
    return [_STEP_KERNEL, int(function or 0), g0, g1, g2, 32 * int(meta.num_warps), int(meta.shared), flags, count,
            *params]


def program(record: Record, buffers: list[tuple[int, int]], workspace: int | None, loaded: bool = True) -> list[int]:
    """The launch program of `record` over `buffers` ((address, bytes) in the handler's order: operands,
    then results); `workspace` is the index of the workspace result. `loaded=False` accepts kernels compiled
    without a GPU (function 0: for checking the program's layout only)."""
    if record.foreign:
        raise Unplannable("the call launched a kernel outside ragdot's recorded launches")
    if not record.steps:
        raise Unplannable("the call launched nothing")
    try:
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST as host_dtype
    except ImportError:  # another Triton's layout
        raise Unplannable("this Triton has no TMA_DTYPE_DEVICE_TO_HOST") from None
    from ragdot.kernels.record import Launch

    place = _Places(buffers, workspace, record.scratch)
    words = [len(record.steps)]
    for step in record.steps:
        if isinstance(step, Launch):
            words += _kernel(step, place, host_dtype, loaded)
            continue
        _, tensor = step
        if not tensor.is_contiguous():
            raise Unplannable("a zero fill of a strided tensor")
        words += [_STEP_ZERO, *place(tensor), _extent(tensor)]
    return words
