"""Eager calls of ragdot's Triton kernels replayed from C: a repeated call without Python launch work.

A prepared call (`ragged_m.Prepared`, `ragged_k.Prepared`: one static signature) launches the same compiled
kernels with the same integers on every call; only the tensors' addresses change. `Replayed` wraps one: a
later call than its first is recorded (`ragdot.kernels.record`) and written as a launch program over the
call's buffers (`ragdot.native.plan`: a, b, the group sizes, the output and, where the call makes scratch
temporaries, a workspace), and from then on a call hands those addresses and the current stream to the C
interpreter (`ragdot.native.library()`: one ctypes call, which encodes the TMA descriptors and launches with
cuLaunchKernelEx) instead of running the prepared call's Python, its descriptors and Triton's launcher.
Autograd's device thread, where each line of Python costs more than on the calling thread, gains most.

A call is replayed only where the recorded call is what the prepared call would launch: the current CUDA
device is the call's, the group sizes have the record's dtype, every address is 16-byte aligned (Triton
specializes on it and the prepared calls pick TMA by it; the record was taken so), no Triton launch hook is
installed (a profiler listening there sees Triton's own launches), no record is being taken (ragdot.jax's,
in any thread) and no `compile_only` target is set. Any other call takes the Python path, which gives the
same bits. A signature whose call cannot be written as a program (`plan.Unplannable`) or a machine where
the library cannot be built (no C compiler; `ragdot.native.reason()`) keeps the Python path for good.
RAGDOT_REPLAY=0, read when a prepared call is made, turns replay off; `set_active(False)` pauses it in this
process (calls take the Python path, nothing is recorded) until `set_active(True)`: for A/B measurements of
the same prepared calls (benchmarks/replay_ab.py) and for debugging.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import torch

from ragdot import native
from ragdot.kernels import configs
from ragdot.kernels import record as _record
from ragdot.kernels.launch import hooked
from ragdot.native import plan as _plan

__all__ = ["Replayed", "enabled", "set_active"]

RECORD_AT = 2  # the call recorded: the first compiles (and may step its pipeline down), the second is settled
_TRIES = 3  # calls that may find the recording conditions unmet before the signature stays on Python


_active = True


def enabled() -> bool:
    """Whether new prepared calls replay from C ($RAGDOT_REPLAY, default on; "0" turns it off)."""
    return os.environ.get("RAGDOT_REPLAY", "1").strip() != "0"


def set_active(active: bool) -> bool:
    """Pause (False) or resume (True) replaying and recording in this process; returns the previous setting."""
    global _active
    if not isinstance(active, bool):
        raise TypeError(f"active must be a bool, got {type(active).__name__}")
    previous, _active = _active, active
    return previous


class Replayed:
    """`prepared(a, b, sizes, out)[0]`, replayed from C once a call was recorded.

    Calls take the operands (or any tensors starting at their addresses, as the prepared call does), the raw
    group sizes [G] and the output, allocated by the caller; they return the output."""

    __slots__ = ("prepared", "device", "program", "workspace", "sizes_dtype", "ptrs", "run", "kept", "calls", "why")

    def __init__(self, prepared: Any):
        self.prepared = prepared
        index = prepared.device.index
        self.device = index if index is not None else torch.cuda.current_device()
        self.program: ctypes.Array | None = None  # the launch program (int64 words), once recorded
        self.workspace = 0  # bytes of the per-call workspace of the call's scratch
        self.sizes_dtype: torch.dtype | None = None
        self.ptrs: Any = None  # the ctypes array type of the buffers' addresses
        self.run: Any = None  # the library's ragdot_replay_run
        self.kept: list[Any] = []  # the compiled kernels whose CUfunction handles the program holds
        self.calls = 0
        self.why: str | None = None if enabled() else "RAGDOT_REPLAY=0"  # why calls stay on Python for good

    def __call__(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        program = self.program
        if not _active:
            return self.prepared(a, b, sizes, out)[0]
        if program is not None:
            pa, pb, ps, pc = a.data_ptr(), b.data_ptr(), sizes.data_ptr(), out.data_ptr()
            if (pa | pb | ps | pc) & 15 == 0 and sizes.dtype is self.sizes_dtype and self._plain_launch():
                if self.workspace:
                    ws = torch.empty(self.workspace, dtype=torch.uint8, device=out.device)
                    ptrs = self.ptrs(pa, pb, ps, pc, ws.data_ptr())
                else:
                    ptrs = self.ptrs(pa, pb, ps, pc)
                error = self.run(program, len(program), ptrs, len(ptrs),
                                 torch._C._cuda_getCurrentRawStream(self.device))
                if error is not None:
                    raise RuntimeError(f"ragdot: replaying a recorded kernel launch failed: {error.decode()}")
                return out
        elif self.why is None:
            self.calls += 1
            if self.calls >= RECORD_AT:
                return self._record(a, b, sizes, out)
        return self.prepared(a, b, sizes, out)[0]

    def _record(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The call, recorded and written as this signature's program where the conditions hold."""
        tensors = (a, b, sizes, out)
        ready = (all(t.data_ptr() % 16 == 0 for t in tensors) and self._plain_launch()
                 and not torch.cuda.is_current_stream_capturing())
        if not ready:
            if self.calls >= RECORD_AT + _TRIES:
                self.why = "no call met the conditions of a recording"
            return self.prepared(a, b, sizes, out)[0]
        lib = native.library()
        if lib is None:
            self.why = f"no replay library: {native.reason()}"
            return self.prepared(a, b, sizes, out)[0]
        with _record.recording() as rec:
            c = self.prepared(a, b, sizes, out)[0]
        workspace = _plan.scratch_bytes(rec)
        buffers = [_plan.buffer(t) for t in tensors] + ([(0, workspace)] if workspace else [])
        try:
            words = _plan.program(rec, buffers, len(tensors) if workspace else None)  # the workspace follows them
        except _plan.Unplannable as e:
            self.why = str(e)
            return c
        self.kept = [step.compiled for step in rec.steps if isinstance(step, _record.Launch)]
        self.workspace, self.sizes_dtype = workspace, sizes.dtype
        self.ptrs = ctypes.c_uint64 * len(buffers)
        self.run = lib.ragdot_replay_run
        self.program = (ctypes.c_int64 * len(words))(*words)
        return c

    def _plain_launch(self) -> bool:
        """Whether the prepared call would launch as recorded now, address alignment and sizes dtype aside: the
        current CUDA device is the call's, no record is being taken (ragdot.jax's, in any thread: it must see the
        launches; a recording waits for another thread's), no `compile_only` target, no Triton launch hook."""
        return (torch._C._cuda_getDevice() == self.device and _record._ACTIVE is None
                and configs._AOT_TARGET is None and not hooked())
