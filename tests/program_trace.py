"""Launch programs checked without a GPU: ragdot's kernels compiled for sm_90 (`compile_only`), their launches
recorded, the program written over the recording's buffers (`ragdot.native.plan`) and replayed by ragdot's C
interpreter in trace mode over buffers at other addresses: every pointer must move with its buffer, every
integer and tensor map be the kernel's. Shared by the eager replay's and ragdot.jax's tests."""

from __future__ import annotations

import ctypes

import torch

from ragdot import native
from ragdot.kernels import record


def trace(words: list[int], ptrs: list[int]) -> list[int]:
    """The library's trace of replaying program `words` over buffers at `ptrs` (nothing reaches the driver)."""
    lib = native.library()
    program = (ctypes.c_int64 * len(words))(*words)
    buffers = (ctypes.c_uint64 * len(ptrs))(*ptrs)
    out = (ctypes.c_int64 * 4096)()
    written = ctypes.c_int64(0)
    message = ctypes.create_string_buffer(256)
    error = lib.ragdot_replay(program, len(words), buffers, len(ptrs), 0, out, 4096, ctypes.byref(written), message,
                              256)
    assert error is None, error
    return list(out[: written.value])


def moved(t: torch.Tensor, tensors: list[torch.Tensor], new: list[int]) -> int:
    """Where `t`'s first element lies once the buffer holding it is at its new address."""
    for base, address in zip(tensors, new):
        start = base.data_ptr()
        if start <= t.data_ptr() < start + base.numel() * base.element_size():
            return address + t.data_ptr() - start
    raise AssertionError("not in any buffer")


def expected(launch: record.Launch, tensors: list[torch.Tensor], new: list[int]) -> list[int]:
    """The trace the library must write for one recorded launch (see ragdot_replay): grid, threads,
    shared bytes, flags, the parameter count, then per parameter its value (a tensor map: -3, its address,
    type, rank, swizzle, fill, dims, byte strides, box; then the descriptor's shape and strides)."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    compiled = launch.compiled
    meta = compiled.metadata
    words: list[int] = []
    count = 2  # the two scratch pointers
    metas = list(meta.tensordesc_meta or [])
    for name, value in zip(compiled.src.fn.arg_names, launch.args):
        kind = compiled.src.signature[name]
        if kind == "constexpr":
            continue
        if kind.startswith("tensordesc"):
            m, rank = metas.pop(0), len(value.shape)
            words += [-3, moved(value.base, tensors, new), TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], rank,
                      m["swizzle"], 0, *reversed(value.shape),
                      *(m["elem_size"] * value.strides[j] for j in reversed(range(rank - 1))),
                      *reversed(m["block_size"]), *value.shape, *value.strides]
            count += 1 + 2 * rank
        else:
            words.append(moved(value, tensors, new) if kind.startswith("*") else int(value))
            count += 1
    return [*launch.grid, 32 * meta.num_warps, meta.shared, 0, count, *words, 0, 0]


def recorded(run, workspace: int | None = None):
    """What `run` launches, compiled for sm_90 (a Prepared must be made inside: it asks the target for TMA);
    `workspace`: the bytes a replay offers the call's scratch (`record.recording`)."""
    from ragdot.kernels import compile_only

    with compile_only(90), record.recording(workspace) as rec:
        run()
    return rec


def buffers(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    return [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]


NEW = [0x7000_0000_0000 + (i << 32) for i in range(8)]  # the buffers' addresses on the replayed call
